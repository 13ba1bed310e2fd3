"""Reads a finished run back from ML Metadata: what ran, how long, what came out.

`latest_run` returns it; `print_summary` (after `deepseek-tfx run`) and
`print_data_report` (after `deepseek-tfx validate`) print it on stdout.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from google.protobuf import json_format
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from common.json_file import read_json
from reporting.comparison import display_width, primary_metrics
from reporting.mixture_report import summary_lines

_STATES = {v: k for k, v in metadata_store_pb2.Execution.State.items()}


@dataclasses.dataclass
class ComponentRun:
    component: str
    state: str
    duration_s: float
    outputs: dict[str, dict]
    start_s: float = 0.0  # unix time the execution was registered


def open_store(metadata_path: str) -> metadata_store.MetadataStore:
    config = metadata_store_pb2.ConnectionConfig()
    config.sqlite.filename_uri = metadata_path
    config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(config)


def property_value(v: metadata_store_pb2.Value) -> Any:
    """An ML Metadata property value as Python: a number or string as it is, a JSON value
    property (struct) as its JSON value."""
    kind = v.WhichOneof("value")
    if kind in ("int_value", "double_value", "string_value", "bool_value"):
        return getattr(v, kind)
    if kind == "struct_value":
        value = json_format.MessageToDict(v.struct_value)
        # TFX wraps JSON values that are not objects as {"__value__": value}.
        if set(value) == {"__value__"}:
            inner = value["__value__"]
            if isinstance(inner, str):
                try:
                    return json.loads(inner)
                except json.JSONDecodeError:
                    return inner
            return inner
        return value
    if kind == "proto_value":
        return f"<{v.proto_value.type_url}>"
    return None


def _custom_properties(artifact) -> dict:
    return {key: property_value(value) for key, value in artifact.custom_properties.items()
            if value.WhichOneof("value") in ("int_value", "double_value", "string_value",
                                             "bool_value", "struct_value")}


def latest_run(metadata_path: str) -> list[ComponentRun]:
    """Component executions of the newest pipeline run, in execution order."""
    store = open_store(metadata_path)
    runs = store.get_contexts_by_type("pipeline_run")
    if not runs:
        return []
    run = max(runs, key=lambda c: c.create_time_since_epoch)
    executions = sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
    result = []
    for execution in executions:
        node = next(
            (c.name.split(".", 1)[-1] for c in store.get_contexts_by_execution(execution.id)
             if c.type_id == store.get_context_type("node").id),
            "?",
        )
        events = store.get_events_by_execution_ids([execution.id])
        output_ids = [e.artifact_id for e in events if e.type == metadata_store_pb2.Event.OUTPUT]
        outputs = {}
        for artifact in store.get_artifacts_by_id(output_ids):
            type_name = store.get_artifact_types_by_id([artifact.type_id])[0].name
            outputs[type_name] = {"uri": artifact.uri, **_custom_properties(artifact)}
        duration = (execution.last_update_time_since_epoch - execution.create_time_since_epoch) / 1000
        result.append(ComponentRun(node, _STATES.get(execution.last_known_state, "?"), duration,
                                   outputs, execution.create_time_since_epoch / 1000))
    return result


def pruning_line(model: dict) -> str:
    """The Trainer's expert pruning, from the Model's properties (`train.prune_keep_experts`)."""
    return (f"experts pruned: {model.get('n_routed_experts_before')} -> "
            f"{model['pruned_experts_kept']} per MoE layer (router load on "
            f"{model.get('pruning_tokens')} eval tokens)")


def print_summary(metadata_path: str, wall_s: float) -> list[str]:
    """Prints the newest run's components (state, seconds), records kept and dropped,
    the Trainer's throughput and MFU, the evaluation, the blessing, a mixture's figures
    per source (`mixture_report.summary_lines`: records, trained token share vs weight,
    bits per byte before and after) and the pushed model.

    Args:
      metadata_path: the run's ML Metadata SQLite file.
      wall_s: the run's wall time in seconds, printed as the total.

    Returns:
      The components whose execution is neither COMPLETE nor CACHED (empty: all ran).
    """
    runs = latest_run(metadata_path)
    print()
    print(f"{'component':<34} {'status':<10} {'seconds':>8}")
    for r in runs:
        print(f"{r.component:<34} {r.state.lower():<10} {r.duration_s:>8.1f}")
    print(f"{'total wall time':<45} {wall_s:>8.1f}")
    by_name = {r.component: r for r in runs}
    cleaner = by_name.get("TextCleaner")
    if cleaner:
        props = cleaner.outputs.get("Examples", {})
        drops = {k[len('dropped_'):]: v for k, v in props.items() if k.startswith("dropped_")}
        print(f"\nrecords: read {props.get('records_read')}, kept {props.get('records_kept')}, "
              f"dropped {props.get('records_dropped')} {drops or ''}")
    trainer = by_name.get("Trainer")
    model = trainer.outputs.get("Model", {}) if trainer else {}
    if "train_steps" in model:
        print(f"trainer: {model['train_steps']} steps (resumed from {model.get('resumed_from_step')}), "
              f"{model.get('strategy')} x {model.get('num_replicas')} replica(s), "
              f"{model.get('precision')}, XLA {'on' if model.get('jit_compile') else 'off'}, "
              f"{model.get('tokens_per_second', 0):.0f} tokens/s, "
              f"MFU {100 * model.get('mfu', 0):.1f}% (steady state "
              f"{100 * model.get('steady_mfu', 0):.1f}%) of a peak of "
              f"{model.get('peak_flops', 0) / 1e9:.1f} GFLOP/s "
              f"({model.get('peak_flops_source', 'unknown')})")
        if "trainable_weights_dtype" in model:
            print(f"         precision: frozen weights {model.get('frozen_weights_dtype')}, "
                  f"trained weights {model.get('trainable_weights_dtype')}, optimizer states "
                  f"{model.get('optimizer_states_dtype')}, compute "
                  f"{model.get('compute_dtype')}, exported "
                  f"{model.get('exported_weights_dtype')}")
        if model.get("restarts"):
            print(f"         restarts of the worker group: {model['restarts']} "
                  f"({model.get('restart_reasons', '')})")
        if model.get("pruned_experts_kept"):
            print(f"         {pruning_line(model)}")
        if model.get("moe_dropped_fraction") or model.get("skipped_steps"):
            print(f"         MoE pairs dropped by the capacity: "
                  f"{100 * model.get('moe_dropped_fraction', 0):.2f}%; steps skipped (not "
                  f"finite): {model.get('skipped_steps', 0)}")
    evaluator = by_name.get("LmEvaluator")
    metrics: dict = {}
    if evaluator:
        ev = evaluator.outputs.get("ModelEvaluation", {})
        bl = evaluator.outputs.get("ModelBlessing", {})
        metrics = _evaluation_metrics(ev.get("uri"))
        print(f"eval: bits_per_byte {ev.get('bits_per_byte', float('nan')):.4f}, "
              f"perplexity {ev.get('perplexity', float('nan')):.2f}, "
              f"tokens {ev.get('eval_tokens')}, bytes {ev.get('eval_bytes')}")
        for line in task_lines(metrics):
            print(line)
        print(f"blessed: {bool(bl.get('blessed'))} ({bl.get('blessing_message', '')})")
    # A mixture's figures per source (none for a one-source run).
    for line in summary_lines(model, metrics,
                              cleaner.outputs.get("Examples", {}) if cleaner else {}):
        print(line)
    pusher = by_name.get("Pusher")
    pushed = pusher.outputs.get("PushedModel", {}) if pusher else {}
    if pushed.get("pushed"):
        print(f"pushed model: {pushed.get('pushed_destination')}")
    elif pusher:
        print("pushed model: none (not blessed)")
    print(f"ML Metadata: {metadata_path}")
    return [r.component for r in runs if r.state not in ("COMPLETE", "CACHED")]


def _evaluation_metrics(uri: str | None) -> dict:
    """The LmEvaluator's metrics.json under `uri`, or {} when it cannot be read (the run
    summary never fails on it)."""
    path = os.path.join(uri, "metrics.json") if uri else ""
    try:
        return read_json(path, "the LmEvaluator's metrics") if os.path.isfile(path) else {}
    except (OSError, ValueError):
        return {}


def near_chance(value: float, stderr: float | None, chance: float) -> bool:
    """Whether a score is within two standard errors of the chance level (a random model's
    score: no evidence the model does better). Without a stderr (one example), whether
    it is at most the chance level."""
    if stderr is None or stderr != stderr:  # None or NaN
        return value <= chance
    return abs(value - chance) <= 2 * stderr


def _score(metrics: dict, metric: str) -> str:
    stderr = metrics.get(f"{metric}_stderr")
    spread = f" ±{stderr:.4f}" if isinstance(stderr, float) and stderr == stderr else ""
    return f"{metric} {metrics[metric]:.4f}{spread}"


def task_lines(metrics: dict) -> list[str]:
    """The run summary's lines for the benchmark tasks of metrics.json ({"candidate":
    {..., "tasks": {task: metrics}}, "baseline": ... or None}): per task the candidate's
    primary scores (multiple choice: acc, acc_norm; generation: exact_match) with their
    standard error, the chance level beside them (and "near chance" when every score is
    within two standard errors of it), n, and the baseline's scores when it has the task.
    [] when the candidate has no tasks (eval.tasks empty, or a run from before tasks)."""
    tasks = (metrics.get("candidate") or {}).get("tasks") or {}
    if not tasks:
        return []
    baseline = (metrics.get("baseline") or {}).get("tasks") or {}
    width = max(display_width(name) for name in tasks)
    lines = ["tasks:"]
    for name, m in tasks.items():
        names = primary_metrics(m)
        chance = m.get("chance")
        line = (f"  {name}{' ' * (width - display_width(name))}  "
                + ", ".join(_score(m, metric) for metric in names))
        if isinstance(chance, float | int):
            near = names and all(near_chance(m[k], m.get(f"{k}_stderr"), chance) for k in names)
            line += f"; chance {chance:.4f}{' (near chance)' if near else ''}"
        line += f"; n {m.get('n')}"
        b = baseline.get(name)
        if b and all(k in b for k in names):
            line += "; baseline " + ", ".join(f"{k} {b[k]:.4f}" for k in names)
        lines.append(line)
    return lines


def print_data_report(metadata_path: str) -> None:
    """Prints the data side of the newest run: where the examples, statistics (TFDV) and
    anomalies are; records read, kept and dropped by reason with samples, and repairs
    (TextCleaner's cleaning_report.json); the drift verdict and Jensen-Shannon
    divergences against the latest blessed run (DriftValidator). Prints only what the
    run got to; nothing when `metadata_path` does not exist.
    """
    runs = {r.component: r for r in latest_run(metadata_path)} if os.path.exists(
        metadata_path) else {}
    examples = runs.get("TextExampleGen")
    if examples:
        print(f"examples: {examples.outputs.get('Examples', {}).get('uri')}")
    statistics = runs.get("StatisticsGen")
    if statistics:
        print(f"statistics (TFDV): {statistics.outputs.get('ExampleStatistics', {}).get('uri')}")
    validator = runs.get("ExampleValidator")
    if validator:
        print(f"anomalies: {validator.outputs.get('ExampleAnomalies', {}).get('uri')}")
    cleaner = runs.get("TextCleaner")
    uri = cleaner.outputs.get("Examples", {}).get("uri") if cleaner else None
    report_path = os.path.join(uri, "cleaning_report.json") if uri else ""
    if report_path and os.path.isfile(report_path):
        report = read_json(report_path, "TextCleaner's cleaning report")
        print(f"cleaning report: {report_path}")
        total = report["total"]
        print(f"records: read {total['read']}, kept {total['kept']}, dropped {total['dropped']}")
        for reason, n in sorted(total["dropped_by_reason"].items(), key=lambda kv: -kv[1]):
            where = ", ".join(f"{src} record {rec}"
                              for src, rec in report["rejected_samples"].get(reason, []))
            print(f"  dropped {reason:<28} {n:>8}   e.g. {where}")
        for repair, n in sorted(total.get("repaired", {}).items(), key=lambda kv: -kv[1]):
            print(f"  repaired {repair:<27} {n:>8}")
    drift = runs.get("DriftValidator")
    anomalies = drift.outputs.get("ExampleAnomalies", {}) if drift else {}
    if anomalies:
        measured = {k[len("drift_"):]: v for k, v in anomalies.items()
                    if k.startswith("drift_") and isinstance(v, float)}
        if not anomalies.get("baseline_statistics"):
            print("drift: no blessed run to compare with (text profile recorded)")
        else:
            verdict = "DRIFT" if anomalies.get("drift_detected") else "no drift"
            print(f"drift vs the latest blessed run: {verdict} (Jensen-Shannon divergence, "
                  f"baseline {anomalies['baseline_statistics']})")
            for name, value in sorted(measured.items()):
                print(f"  {name:<36} {value:.4f}")
