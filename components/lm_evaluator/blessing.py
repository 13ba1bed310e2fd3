"""The LmEvaluator's blessing rule (`eval` section of the config): bits per byte against
an absolute threshold and the last blessed model, benchmark task scores against
`eval.min_scores` and the last blessed model's scores. Kept apart from the executor so
that it is tested without importing TFX.
"""

from __future__ import annotations

from config import PipelineConfig
from savedmodel.tasks import PRIMARY_METRIC


def task_checks(metrics: dict, baseline: dict | None, config: PipelineConfig) -> list[str]:
    """The task-score conditions of the blessing that fail, one sentence each: a score
    below its `eval.min_scores` threshold, or, against the baseline, a gated score
    (each task's primary metric and every metric named in min_scores) more than
    `eval.task_tolerance` below the baseline's."""
    scores = metrics.get("tasks", {})
    failures = []
    gated: dict[str, set[str]] = {name: {PRIMARY_METRIC[m["type"]]} for name, m in scores.items()}
    for key, minimum in config.eval.min_scores.items():
        name, _, metric = key.partition("/")
        metric = metric or PRIMARY_METRIC[scores[name]["type"]]
        gated.setdefault(name, set()).add(metric)
        value = scores[name][metric]
        if not value >= minimum:
            failures.append(f"task {name} {metric} {value:.4f} < eval.min_scores[{key!r}] "
                            f"{minimum:.4f}")
    base = (baseline or {}).get("tasks", {})
    tolerance = config.eval.task_tolerance
    for name in sorted(gated):
        for metric in sorted(gated[name]):
            if name in base and metric in base[name]:
                value, previous = scores[name][metric], base[name][metric]
                if not value >= previous - tolerance:
                    failures.append(
                        f"task {name} {metric} {value:.4f} is worse than the last blessed "
                        f"model's {previous:.4f} (allowed down to {previous - tolerance:.4f}, "
                        f"eval.task_tolerance {tolerance})")
    return failures


def decide_blessing(metrics: dict, baseline: dict | None, config: PipelineConfig) -> tuple[bool, str]:
    """Blessed iff bits/byte <= the absolute threshold and not worse than the baseline,
    and every task check holds (`task_checks`). The message names each failed
    condition with both numbers, or, when blessed, the conditions met."""
    bpb, limit = metrics["bits_per_byte"], config.eval.max_bits_per_byte
    failures = []
    if not bpb <= limit:
        failures.append(f"bits_per_byte {bpb:.4f} > eval.max_bits_per_byte {limit:.4f}")
    if baseline is not None:
        allowed = baseline["bits_per_byte"] * (1 + config.eval.baseline_tolerance)
        if not bpb <= allowed:
            failures.append(
                f"bits_per_byte {bpb:.4f} is worse than the last blessed model's "
                f"{baseline['bits_per_byte']:.4f} (allowed up to {allowed:.4f})")
    failures += task_checks(metrics, baseline, config)
    if failures:
        return False, "; ".join(failures)
    tasks = metrics.get("tasks", {})
    scored = "".join(f"; task {name} {PRIMARY_METRIC[m['type']]} "
                     f"{m[PRIMARY_METRIC[m['type']]]:.4f}" for name, m in tasks.items())
    gates = f" and eval.min_scores met ({len(config.eval.min_scores)})" \
        if config.eval.min_scores else ""
    if baseline is not None:
        return True, (
            f"bits_per_byte {bpb:.4f} <= {limit:.4f} and <= baseline "
            f"{baseline['bits_per_byte']:.4f} x (1 + {config.eval.baseline_tolerance})"
            f"{gates}{scored}")
    return True, f"bits_per_byte {bpb:.4f} <= {limit:.4f} (no blessed baseline yet){gates}{scored}"
