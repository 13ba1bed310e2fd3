"""The LmEvaluator's blessing rule (`eval` section of the config): bits per byte against
an absolute threshold and the last blessed model, benchmark task scores against
`eval.min_scores` and the last blessed model's scores, and for preference training
(`data.task` dpo or grpo, issue 29) its own held-out figures (`preference_checks`). Kept
apart from the executor so that it is tested without importing TFX.
"""

from __future__ import annotations

import math

from config import PipelineConfig
from evaluation.tasks import PRIMARY_METRIC

NOISE_STDERRS = 2.0  # a drop within this many standard errors of the difference is noise
PREFERENCE_TASKS = ("dpo", "grpo")  # data.task values gated by `preference_checks`


def _stderr(values: dict, metric: str) -> float:
    """The metric's standard error (0 when absent or NaN: one example)."""
    se = values.get(f"{metric}_stderr")
    return se if isinstance(se, (int, float)) and math.isfinite(se) else 0.0


def task_checks(metrics: dict, baseline: dict | None, config: PipelineConfig) -> list[str]:
    """The task-score conditions of the blessing that fail, one sentence each.

    - A score below its `eval.min_scores` threshold.
    - Against the baseline, a gated score (each task's primary metric and every metric
      named in min_scores) lower than the baseline's by more than the allowed drop,
      max(`eval.task_tolerance`, NOISE_STDERRS x sqrt(se_candidate^2 + se_baseline^2)):
      on 100 examples an accuracy's standard error is about 0.045, so two models of the
      same quality often differ by several points, and such a difference is not a
      regression (the harness's `acc_stderr`; the two-sample z-test at ~95%).
    """
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
                noise = NOISE_STDERRS * math.hypot(_stderr(scores[name], metric),
                                                   _stderr(base[name], metric))
                allowed = previous - max(tolerance, noise)
                if not value >= allowed:
                    failures.append(
                        f"task {name} {metric} {value:.4f} is worse than the last blessed "
                        f"model's {previous:.4f} (allowed down to {allowed:.4f}: the larger "
                        f"of eval.task_tolerance {tolerance} and {NOISE_STDERRS:g} standard "
                        f"errors of the difference, {noise:.4f})")
    return failures


def source_checks(metrics: dict, config: PipelineConfig) -> tuple[list[str], list[str]]:
    """(failed, met) sentences of the per-source thresholds
    `eval.max_bits_per_byte_by_source` against `metrics["by_source"]` ({source:
    {"bits_per_byte", ...}}, absent = no source scored).

    A threshold naming a source with no eval documents fails (not blessed, with that
    reason, rather than an error): the evaluation is still recorded, and a model the
    rule cannot be checked on is not pushed. It is a misspelt name, or a source too
    small to have eval documents."""
    by_source = metrics.get("by_source") or {}
    failed, met = [], []
    for name, limit in sorted(config.eval.max_bits_per_byte_by_source.items()):
        key = f"eval.max_bits_per_byte_by_source[{name!r}]"
        if name not in by_source:
            scored = ", ".join(repr(s) for s in sorted(by_source)) or "none"
            failed.append(f"{key} = {limit:.4f} names a source with no eval documents "
                          f"(sources scored: {scored})")
            continue
        bpb = by_source[name]["bits_per_byte"]
        if bpb <= limit:
            met.append(f"bits per byte on source {name!r} {bpb:.4f} <= {limit:.4f}")
        else:
            failed.append(f"bits per byte on source {name!r} {bpb:.4f} > {key} = {limit:.4f}")
    return failed, met


def _metric(metrics: dict, name: str, task: str) -> float:
    """metrics[name], or a ValueError naming the missing figure and the task."""
    if name not in metrics:
        raise ValueError(f"data.task={task}: the evaluation has no {name!r} to gate on "
                         f"(figures: {sorted(metrics)})")
    return metrics[name]


def preference_checks(metrics: dict, baseline: dict | None,
                      config: PipelineConfig) -> tuple[list[str], list[str]]:
    """(failed, met) sentences of the held-out figures of preference training
    (`components/lm_evaluator/preference_scoring.py`); no sentences for other tasks.

    - dpo: `reward_accuracy` (share of eval pairs whose chosen response gets the larger
      implicit reward, strictly) >= `eval.min_reward_accuracy`.
    - grpo: `pass_at_1` (greedy, exact_match) >= `eval.min_pass_at_1` and, with a
      baseline that has one, not lower than the baseline's `pass_at_1` by more than
      max(`eval.task_tolerance`, NOISE_STDERRS x sqrt(se_candidate^2 + se_baseline^2)),
      the rule of `task_checks`.

    Raises:
      ValueError: the figure the task gates on is missing from `metrics`.
    """
    task, failed, met = config.data.task, [], []
    if task == "dpo":
        accuracy, least = _metric(metrics, "reward_accuracy", task), config.eval.min_reward_accuracy
        if accuracy >= least:
            met.append(f"reward_accuracy {accuracy:.4f} >= eval.min_reward_accuracy "
                       f"{least:.4f} (reward_margin {metrics.get('reward_margin', math.nan):.4f})")
        else:
            failed.append(f"reward_accuracy {accuracy:.4f} < eval.min_reward_accuracy {least:.4f}")
    elif task == "grpo":
        value, least = _metric(metrics, "pass_at_1", task), config.eval.min_pass_at_1
        if value >= least:
            met.append(f"pass_at_1 {value:.4f} >= eval.min_pass_at_1 {least:.4f}")
        else:
            failed.append(f"pass_at_1 {value:.4f} < eval.min_pass_at_1 {least:.4f}")
        if baseline is not None and "pass_at_1" in baseline:
            previous, tolerance = baseline["pass_at_1"], config.eval.task_tolerance
            noise = NOISE_STDERRS * math.hypot(_stderr(metrics, "pass_at_1"),
                                               _stderr(baseline, "pass_at_1"))
            allowed = previous - max(tolerance, noise)
            if value >= allowed:
                met.append(f"pass_at_1 {value:.4f} vs the baseline's {previous:.4f} "
                           f"(allowed down to {allowed:.4f})")
            else:
                failed.append(
                    f"pass_at_1 {value:.4f} is worse than the last blessed model's "
                    f"{previous:.4f} (allowed down to {allowed:.4f}: the larger of "
                    f"eval.task_tolerance {tolerance} and {NOISE_STDERRS:g} standard errors "
                    f"of the difference, {noise:.4f})")
    return failed, met


def decide_blessing(metrics: dict, baseline: dict | None, config: PipelineConfig) -> tuple[bool, str]:
    """Blessed iff bits/byte <= the absolute threshold and not worse than the baseline,
    each source's bits/byte <= its `eval.max_bits_per_byte_by_source` threshold
    (`source_checks`; `metrics["by_source"]`), every task check holds (`task_checks`)
    and, for dpo and grpo, every preference check holds (`preference_checks`). The
    message names each failed condition with both numbers (and the source), or, when
    blessed, the conditions met.

    For `data.task` dpo and grpo, bits/byte is that of the chosen responses (dpo) or of
    the reference answers (grpo), scored as SFT responses, and is held to
    `eval.max_bits_per_byte` only: the relative rule against the baseline does not
    apply, because preference training moves likelihoods by design (DPO lowers the
    likelihood of rejected and often of chosen responses too; GRPO sharpens the policy
    on its own completions), so a rise in bits/byte over the base model is expected and
    is not a regression."""
    bpb, limit = metrics["bits_per_byte"], config.eval.max_bits_per_byte
    preference = config.data.task in PREFERENCE_TASKS
    failures = []
    source_failures, source_met = source_checks(metrics, config)
    preference_failures, preference_met = preference_checks(metrics, baseline, config)
    if not bpb <= limit:
        failures.append(f"bits_per_byte {bpb:.4f} > eval.max_bits_per_byte {limit:.4f}")
    if baseline is not None and not preference:
        allowed = baseline["bits_per_byte"] * (1 + config.eval.baseline_tolerance)
        if not bpb <= allowed:
            failures.append(
                f"bits_per_byte {bpb:.4f} is worse than the last blessed model's "
                f"{baseline['bits_per_byte']:.4f} (allowed up to {allowed:.4f})")
    failures += preference_failures
    failures += source_failures
    failures += task_checks(metrics, baseline, config)
    if failures:
        return False, "; ".join(failures)
    tasks = metrics.get("tasks", {})
    scored = "".join(f"; {line}" for line in preference_met + source_met)
    scored += "".join(f"; task {name} {PRIMARY_METRIC[m['type']]} "
                      f"{m[PRIMARY_METRIC[m['type']]]:.4f}" for name, m in tasks.items())
    gates = f" and eval.min_scores met ({len(config.eval.min_scores)})" \
        if config.eval.min_scores else ""
    if preference:
        return True, (f"bits_per_byte {bpb:.4f} <= {limit:.4f} (data.task="
                      f"{config.data.task}: no rule against the baseline's bits_per_byte)"
                      f"{gates}{scored}")
    if baseline is not None:
        return True, (
            f"bits_per_byte {bpb:.4f} <= {limit:.4f} and <= baseline "
            f"{baseline['bits_per_byte']:.4f} x (1 + {config.eval.baseline_tolerance})"
            f"{gates}{scored}")
    return True, f"bits_per_byte {bpb:.4f} <= {limit:.4f} (no blessed baseline yet){gates}{scored}"
