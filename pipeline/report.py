"""`report.html`: one self-contained page about the newest run in an output directory.

`deepseek-tfx run` writes it after the summary; `deepseek-tfx report --output DIR`
rebuilds it. Everything comes from ML Metadata (`run_summary.latest_run`,
`mlmd_report.lineage`) and the artifacts it points to:

  pipeline   each component's status and duration, as a left-to-right graph
             (columns = distance from the first component, from the MLMD events)
  data       cleaning_report.json (read / kept / dropped by reason), the TFDV
             anomalies (ExampleValidator) and the drift findings (DriftValidator)
  training   TensorBoard events of the Trainer (`train/*` scalars) and
             training_summary.json
  moe        the `moe/<layer>/expert_load` tensor summaries (a heatmap per MoE
             layer) and the `router_bias/<layer>/*` scalars
  eval       LmEvaluator's metrics.json against `eval.max_bits_per_byte` and the
             baseline, and the blessing
  samples    greedy generations of the pushed SavedModel, made now
  lineage    from the pushed model back to the input files

A section whose data does not exist (`--until`, a failed run) says why instead.
The page has no external resources: figures are inline PNGs (`report_plots.py`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import html
import json
import os
import re
import time
from collections import defaultdict

import numpy as np

from pipeline import mlmd_report
from pipeline.run_summary import ComponentRun, latest_run, open_store

REPORT_FILE = "report.html"
SECTIONS = ("pipeline", "data", "training", "moe", "eval", "samples", "lineage")
SAMPLE_NEW_TOKENS = 40
FALLBACK_PROMPTS = ("The ", "Once upon a time")


class Unavailable(Exception):
    """A section's data does not exist; the message says why."""


@dataclasses.dataclass
class RunData:
    """What the sections read: the paths, the store and the newest run's executions."""

    paths: dict
    store: object
    executions: list[dict]  # mlmd_report execution dicts of the newest run, in id order
    components: dict[str, ComponentRun]  # run_summary view: outputs by artifact type

    def output(self, component: str, artifact_type: str) -> dict:
        """{"uri", custom properties...} of a component's output in this run.

        Raises:
          Unavailable: the component did not run (or not to the end) in this run.
        """
        run = self.components.get(component)
        if run is None:
            raise Unavailable(f"{component} did not run in the newest run (it stopped "
                              "before it: --until, or an earlier component failed)")
        if artifact_type not in run.outputs:
            raise Unavailable(f"{component} has no {artifact_type} output "
                              f"(state {run.state.lower()})")
        return run.outputs[artifact_type]


# ----------------------------------------------------------------------------- data


def read_events(log_dir: str) -> tuple[dict[str, tuple[list[int], list[float]]],
                                          dict[str, tuple[list[int], list[np.ndarray]]]]:
    """The summaries in the TensorBoard event files of `log_dir` (not its subdirectories).

    Returns:
      (scalars, tensors): {tag: (steps, values)} sorted by step; a tag written twice
      at one step keeps the later value. Scalars are 0-d summaries, tensors the rest.

    Raises:
      Unavailable: no event files in `log_dir`.
    """
    import tensorflow as tf

    files = sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")))
    if not files:
        raise Unavailable(f"no TensorBoard event files in {log_dir}")
    by_tag: dict[str, dict[int, object]] = defaultdict(dict)
    for path in files:
        # = tf.compat.v1.train.summary_iterator, without its deprecation warning
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    by_tag[value.tag][event.step] = float(value.simple_value)
                elif value.HasField("tensor"):
                    by_tag[value.tag][event.step] = tf.make_ndarray(value.tensor)
    scalars, tensors = {}, {}
    for tag, points in by_tag.items():
        steps = sorted(points)
        values = [points[s] for s in steps]
        if all(np.ndim(v) == 0 for v in values):
            scalars[tag] = (steps, [float(v) for v in values])
        else:
            tensors[tag] = (steps, [np.asarray(v) for v in values])
    return scalars, tensors


def expert_load(tensors: dict) -> list[tuple[str, list[int], np.ndarray]]:
    """Per MoE layer (in tag order): (layer, window steps, load / mean load
    [n_experts, n_windows]) from the `moe/<layer>/expert_load` summaries; 1.0 = balanced,
    a window that routed nothing is all 0."""
    out = []
    for tag in sorted(tensors):
        if not (tag.startswith("moe/") and tag.endswith("/expert_load")):
            continue
        steps, loads = tensors[tag]
        matrix = np.stack([np.asarray(v, np.float64) for v in loads], axis=1)  # (E, W)
        mean = matrix.mean(axis=0, keepdims=True)  # (1, W)
        out.append((tag[len("moe/"):-len("/expert_load")], steps,
                    np.divide(matrix, mean, out=np.zeros_like(matrix), where=mean > 0)))
    return out


def pipeline_graph(store, executions: list[dict]) -> list[list[dict]]:
    """The executions in columns: column k holds those whose longest chain of producers
    within the run is k long. Each execution dict gains "after": its producers' names."""
    from ml_metadata.proto import metadata_store_pb2

    ids = [e["id"] for e in executions]
    events = store.get_events_by_execution_ids(ids) if ids else []
    producer = {ev.artifact_id: ev.execution_id for ev in events
                if ev.type == metadata_store_pb2.Event.OUTPUT}
    by_id = {e["id"]: {**e, "after": []} for e in executions}
    parents: dict[int, set[int]] = defaultdict(set)
    for ev in events:
        if ev.type == metadata_store_pb2.Event.INPUT:
            p = producer.get(ev.artifact_id)
            if p is not None and p != ev.execution_id:
                parents[ev.execution_id].add(p)
    depth: dict[int, int] = {}

    def column(i: int, seen=()) -> int:
        if i not in depth:
            depth[i] = 1 + max((column(p, (*seen, i)) for p in parents[i] if p not in seen),
                               default=-1)
        return depth[i]

    columns: list[list[dict]] = []
    for i in ids:
        k = column(i)
        columns += [[] for _ in range(k + 1 - len(columns))]
        by_id[i]["after"] = sorted(by_id[p]["component"] for p in parents[i])
        columns[k].append(by_id[i])
    return columns


def load_run(output_dir: str) -> RunData:
    """The newest run of `output_dir` as the sections read it.

    Raises:
      FileNotFoundError: no metadata.db under `output_dir`.
    """
    from pipeline.local_runner import run_paths

    paths = run_paths(output_dir)
    if not os.path.isfile(paths["metadata_path"]):
        raise FileNotFoundError(f"{paths['metadata_path']}: no ML Metadata store (no run here)")
    store = open_store(paths["metadata_path"])
    if not store.get_contexts_by_type("pipeline_run"):  # a store no run has written to yet
        return RunData(paths, store, [], {})
    executions = mlmd_report.runs(store)[-1]["executions"]
    components = {r.component: r for r in latest_run(paths["metadata_path"])}
    return RunData(paths, store, executions, components)


# ----------------------------------------------------------------------------- html


def _e(value) -> str:
    return html.escape(str(value))


def _table(header: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _breakable(name: str) -> str:
    """`name` escaped, with line-break opportunities after "_" and before a capital that
    follows a small letter (ExampleValidator, latest_blessed_model_resolver)."""
    return re.sub(r"(_|(?<=[a-z])(?=[A-Z]))", r"\1<wbr>", _e(name))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_STATUS = {"COMPLETE": "done", "CACHED": "cached", "FAILED": "failed", "RUNNING": "running",
           "NEW": "not run", "CANCELED": "canceled"}


def section_pipeline(run: RunData) -> str:
    if not run.executions:
        raise Unavailable("ML Metadata records no pipeline run")
    columns = pipeline_graph(run.store, run.executions)
    cols = []
    for column in columns:
        boxes = []
        for e in column:
            status = _STATUS.get(e["state"], e["state"].lower())
            after = f'<div class="after">after {_e(", ".join(e["after"]))}</div>' if e["after"] else ""
            boxes.append(f'<div class="node {status.replace(" ", "-")}"><b>{_breakable(e["component"])}</b>'
                         f'<div>{_e(status)} · {e["duration_s"]:.1f} s</div>{after}</div>')
        cols.append('<div class="col">' + "".join(boxes) + "</div>")
    total = sum(e["duration_s"] for e in run.executions)
    failed = [e["component"] for e in run.executions if e["state"] not in ("COMPLETE", "CACHED")]
    verdict = (f'<p class="bad">not finished: {_e(", ".join(failed))}</p>' if failed
               else "<p>every component done or cached.</p>")
    return (f'<div class="flow">{"<span class=arrow>→</span>".join(cols)}</div>{verdict}'
            f"<p>sum of component durations {total:.1f} s (from the executions' create and "
            "last-update times in ML Metadata).</p>")


def section_data(run: RunData) -> str:
    parts = []
    try:
        uri = run.output("TextCleaner", "Examples")["uri"]
        path = os.path.join(uri, "cleaning_report.json")
        if not os.path.isfile(path):
            raise Unavailable(f"no {path}")
        with open(path) as f:
            report = json.load(f)
        total = report["total"]
        rows = [["read", total["read"], ""], ["kept", total["kept"], ""],
                ["dropped", total["dropped"], ""]]
        for reason, n in sorted(total["dropped_by_reason"].items(), key=lambda kv: -kv[1]):
            where = ", ".join(f"{src} record {rec}"
                              for src, rec in report.get("rejected_samples", {}).get(reason, [])[:3])
            rows.append([f"dropped: {reason}", n, where])
        for repair, n in sorted(total.get("repaired", {}).items(), key=lambda kv: -kv[1]):
            rows.append([f"repaired: {repair}", n, ""])
        splits = [[s, v["read"], v["kept"], v["dropped"]]
                  for s, v in sorted(report.get("splits", {}).items())]
        parts.append("<h3>Records (TextCleaner)</h3>" + _table(["", "records", "e.g."], rows)
                     + _table(["split", "read", "kept", "dropped"], splits))
    except Unavailable as e:
        parts.append(_unavailable("records", str(e)))
    parts.append(_anomalies(run))
    parts.append(_drift(run))
    return "".join(parts)


def _anomalies(run: RunData) -> str:
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    try:
        uri = run.output("ExampleValidator", "ExampleAnomalies")["uri"]
    except Unavailable as e:
        return _unavailable("TFDV anomalies", str(e))
    rows = []
    for path in sorted(glob.glob(os.path.join(uri, "Split-*", "SchemaDiff.pb"))):
        anomalies = anomalies_pb2.Anomalies()
        with open(path, "rb") as f:
            anomalies.ParseFromString(f.read())
        split = os.path.basename(os.path.dirname(path))[len("Split-"):]
        for feature, info in sorted(anomalies.anomaly_info.items()):
            rows.append([split, feature, info.short_description, info.description])
        if anomalies.HasField("dataset_anomaly_info"):
            info = anomalies.dataset_anomaly_info
            rows.append([split, "(dataset)", info.short_description, info.description])
    if not rows:
        return "<h3>TFDV anomalies (ExampleValidator)</h3><p>none: every split matches the schema.</p>"
    return ("<h3>TFDV anomalies (ExampleValidator)</h3>"
            + _table(["split", "feature", "anomaly", "description"], rows))


def _drift(run: RunData) -> str:
    try:
        anomalies = run.output("DriftValidator", "ExampleAnomalies")
    except Unavailable as e:
        return _unavailable("drift", str(e))
    head = "<h3>Drift (DriftValidator, Jensen-Shannon divergence)</h3>"
    if not anomalies.get("baseline_statistics"):
        return head + "<p>no blessed run to compare with (the text profile is recorded).</p>"
    verdict = "DRIFT" if anomalies.get("drift_detected") else "no drift"
    accepted = " (accepted)" if anomalies.get("drift_accepted") else ""
    rows = [[k[len("drift_"):], f"{v:.4f}"] for k, v in sorted(anomalies.items())
            if k.startswith("drift_") and isinstance(v, float)]
    return (head + f"<p>vs. the latest blessed run: <b>{verdict}</b>{accepted}; baseline "
            f"{_e(anomalies['baseline_statistics'])}</p>"
            + _table(["split / feature", "divergence"], rows))


def _trainer_dirs(run: RunData) -> tuple[str, str]:
    """(model_run dir with the events, Model artifact dir with training_summary.json)."""
    return (run.output("Trainer", "ModelRun")["uri"], run.output("Trainer", "Model")["uri"])


def section_training(run: RunData, events) -> str:
    from pipeline import report_plots

    scalars, _ = events
    train = {tag[len("train/"):]: series for tag, series in scalars.items()
             if tag.startswith("train/")}
    if not train:
        raise Unavailable("the Trainer's events hold no train/* scalars")
    losses = {k: train[k] for k in ("loss", "lm_loss", "mtp_loss", "distill_loss")
              if k in train and any(v != 0 for v in train[k][1])}
    panels = [("loss terms (nats/token)", losses)] if losses else []
    for key, title, scale in (
            ("balance_loss", "balance loss (MoE)", 1), ("learning_rate", "learning rate", 1),
            ("grad_norm", "grad norm", 1), ("tokens_per_second", "tokens / s", 1),
            ("mfu", "MFU (%)", 100), ("moe_dropped_fraction", "MoE pairs dropped (%)", 100)):
        if key in train and any(train[key][1]):  # a term that is 0 throughout is left out
            steps, values = train[key]
            panels.append((title, {key: (steps, [scale * v for v in values])}))
    out = report_plots.training_curves(panels)
    _, model_uri = _trainer_dirs(run)
    path = os.path.join(model_uri, "training_summary.json")
    if os.path.isfile(path):
        with open(path) as f:
            summary = json.load(f)
        keys = ("train_steps", "resumed_from_step", "tokens_seen", "train_wall_s",
                "tokens_per_second", "steady_tokens_per_second", "mfu", "steady_mfu",
                "final_loss", "strategy", "num_replicas", "precision", "global_batch_size",
                "trainable_params", "total_params", "jit_compile", "skipped_steps")
        cells = "".join(f"<div><span>{_e(k)}</span> {_e(_fmt(summary[k]))}</div>"
                        for k in keys if k in summary)
        out += f'<h3>training_summary.json</h3><div class="figures">{cells}</div>'
    return out


def section_moe(run: RunData, events) -> str:
    from pipeline import report_plots

    scalars, tensors = events
    layers = expert_load(tensors)
    bias: dict[str, dict] = defaultdict(dict)
    for tag, series in scalars.items():
        if tag.startswith("router_bias/"):
            _, layer, stat = tag.split("/")
            bias[layer][stat] = series
    if not layers and not bias:
        raise Unavailable("no MoE summaries in the Trainer's events (no MoE layer, or a run "
                          "from before the expert load was logged)")
    out = ""
    if layers:
        out += ("<p>Each panel: one MoE layer; a cell is an expert's share of the routed "
                "(token, expert) pairs in a logging window over the mean share (1.0 = "
                "balanced).</p>" + report_plots.expert_load_heatmaps(layers))
    else:
        out += _unavailable("expert load", "no moe/*/expert_load summaries")
    complete = [(layer, s) for layer, s in sorted(bias.items())
                if {"min", "max", "mean_abs"} <= set(s)]
    if complete:
        out += report_plots.router_bias(complete)
    return out


def section_eval(run: RunData) -> str:
    from pipeline import report_plots

    uri = run.output("LmEvaluator", "ModelEvaluation")["uri"]
    path = os.path.join(uri, "metrics.json")
    if not os.path.isfile(path):
        raise Unavailable(f"no {path}")
    with open(path) as f:
        metrics = json.load(f)
    config = _execution_config(run, "LmEvaluator")
    candidate, baseline = metrics["candidate"], metrics.get("baseline")
    keys = [k for k in ("bits_per_byte", "perplexity", "loss", "response_bits_per_byte",
                        "response_perplexity", "tokens", "bytes") if k in candidate]
    rows = [[k, _fmt(candidate[k]), _fmt(baseline[k]) if baseline and k in baseline else "—"]
            for k in keys]
    verdict = "blessed" if metrics.get("blessed") else "NOT blessed"
    out = (f'<p class="{"good" if metrics.get("blessed") else "bad"}"><b>{verdict}</b>: '
           f'{_e(metrics.get("message", ""))}</p>'
           + _table(["metric", "candidate", "baseline (last blessed)"], rows, "narrow"))
    if config:
        ev = config.get("eval", {})
        out += (f"<p>thresholds: eval.max_bits_per_byte = {_e(ev.get('max_bits_per_byte'))}, "
                f"eval.baseline_tolerance = {_e(ev.get('baseline_tolerance'))}</p>")
        bars = {"candidate": candidate["bits_per_byte"]}
        if baseline:
            bars["baseline"] = baseline["bits_per_byte"]
        if ev.get("max_bits_per_byte") is not None:
            out += report_plots.bits_per_byte(bars, float(ev["max_bits_per_byte"]))
    return out


def _execution_config(run: RunData, component: str) -> dict:
    """The pipeline config a component ran with (its `pipeline_config` property), or {}."""
    ids = [e["id"] for e in run.executions if e["component"] == component]
    for execution in run.store.get_executions_by_id(ids):
        for props in (execution.properties, execution.custom_properties):
            if "pipeline_config" in props:
                return json.loads(props["pipeline_config"].string_value)
    return {}


def _pushed_dir(run: RunData) -> str:
    pushed = run.output("Pusher", "PushedModel")
    if not pushed.get("pushed"):
        raise Unavailable("the model was not pushed (not blessed)")
    return pushed["pushed_destination"]


def sample_prompts(run: RunData, n: int = 3, chars: int = 40) -> list[str]:
    """The first `chars` characters (cut at a space) of the first `n` eval documents,
    or `FALLBACK_PROMPTS` when they cannot be read."""
    import tensorflow as tf

    try:
        uri = run.output("TextCleaner", "Examples")["uri"]
        files = sorted(glob.glob(os.path.join(uri, "Split-eval", "*")))
        prompts = []
        for record in tf.data.TFRecordDataset(files, compression_type="GZIP").take(n):
            example = tf.train.Example.FromString(record.numpy())
            text = example.features.feature["text"].bytes_list.value[0].decode("utf-8")
            cut = text[:chars]
            prompts.append(cut[: cut.rfind(" ") + 1] if " " in cut else cut)
        return [p for p in prompts if p.strip()] or list(FALLBACK_PROMPTS)
    except (Unavailable, tf.errors.OpError, IndexError, UnicodeDecodeError):
        return list(FALLBACK_PROMPTS)


def section_samples(run: RunData) -> str:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (the SavedModel's tokenizer ops)

    from serving.export import has_tokenizer

    destination = _pushed_dir(run)
    if not has_tokenizer(destination):
        raise Unavailable(f"{destination} has no tokenizer (logits only)")
    loaded = tf.saved_model.load(destination)
    prompts = sample_prompts(run)
    n = len(prompts)
    out = loaded.signatures["generate"](
        prompt=tf.constant(prompts),
        max_new_tokens=tf.fill([n], SAMPLE_NEW_TOKENS),
        temperature=tf.zeros([n], tf.float32),  # greedy
        top_k=tf.zeros([n], tf.int32),
        top_p=tf.ones([n], tf.float32),
        seed=tf.zeros([n], tf.int32),
    )
    items = []
    for prompt, text in zip(prompts, out["text"].numpy(), strict=True):
        text = text.decode("utf-8", "replace")
        text = text[len(prompt):] if text.startswith(prompt) else text  # the continuation
        items.append(f'<div class="sample"><span class="prompt">{_newlines(prompt)}</span>'
                     f"{_newlines(text)}</div>")
    return (f"<p>greedy, {SAMPLE_NEW_TOKENS} new tokens, from {_e(destination)} (prompt in "
            f"bold: the start of eval documents; ↵ = a line break)</p>{''.join(items)}")


def _newlines(text: str) -> str:
    return _e(text).replace("\n", '<span class="nl">↵</span> ')


def section_lineage(run: RunData) -> str:
    destination = _pushed_dir(run)
    try:
        data = mlmd_report.lineage(run.store, destination)
    except LookupError as e:
        raise Unavailable(str(e)) from e
    rows = []
    for step in data["steps"]:
        e = step["execution"]
        inputs = "; ".join(f"{a['type']} {a['uri']}" for a in step["inputs"]) or "—"
        if "input_base" in e:
            inputs = f"read {e['input_base']} ({e.get('input_fingerprint')})"
        rows.append([e["component"], e["id"], e["state"].lower(), inputs])
    files = [[f.get("sha256"), int(f.get("bytes", 0)), f["path"]] for f in data["input_files"]]
    return (f"<p>{_e(data['model']['type'])} {_e(destination)}, back to the input files:</p>"
            + _table(["component", "execution", "state", "inputs"], rows)
            + _table(["sha256", "bytes", "input file"], files))


# ----------------------------------------------------------------------------- page


_TITLES = {"pipeline": "Pipeline", "data": "Data: records, anomalies, drift",
           "training": "Training curves", "moe": "MoE: expert load and router bias",
           "eval": "Evaluation and blessing", "samples": "Sample generations",
           "lineage": "Lineage of the pushed model"}

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2430;background:#f5f6f8}
header{background:#1d2430;color:#fff;padding:12px 24px}
header h1{font-size:20px;margin:0}header p{margin:2px 0 0;color:#c8cdd6}
nav{padding:6px 24px;background:#e6e9ee;position:sticky;top:0}
nav a{margin-right:14px;color:#1d4f91;text-decoration:none}
main{max-width:1300px;margin:0 auto;padding:8px 24px 40px}
section{background:#fff;border:1px solid #d9dde3;border-radius:6px;margin:14px 0;padding:6px 18px 14px}
h2{font-size:17px;margin:8px 0}h3{font-size:14px;margin:12px 0 4px}
img{max-width:100%;height:auto;display:block;margin:8px 0}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
td,th{border:1px solid #d9dde3;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f0f2f5;white-space:nowrap}td:not(:last-child){white-space:nowrap}
table.narrow{min-width:360px}
.figures{display:grid;grid-template-columns:repeat(4,1fr);gap:2px 16px;font-size:13px}
.figures span{color:#5d6675}
.flow{display:flex;align-items:center;overflow-x:auto;padding:4px 0}
.col{display:flex;flex-direction:column;gap:8px}.arrow{font-size:20px;color:#8a93a3;padding:0 6px}
.node{border:2px solid;border-radius:6px;padding:4px 8px;font-size:12px;min-width:110px;max-width:180px}
.node b{overflow-wrap:normal}.node .after{color:#5d6675;font-size:11px}
.done{border-color:#2e8b57;background:#eaf6ef}.cached{border-color:#4a78b5;background:#eaf0f8}
.failed{border-color:#c0392b;background:#fbeaea}.node.running,.not-run,.canceled{border-color:#999;background:#f2f2f2}
.missing{color:#8a5a00;background:#fff6e0;border-left:4px solid #e0a800;padding:6px 10px}
.bad{color:#a12a1e}.good{color:#1e7a45}
.sample{font-family:ui-monospace,monospace;white-space:pre-wrap;overflow-wrap:anywhere;background:#f7f7f9;border:1px solid #e1e4e8;padding:6px 10px;margin:6px 0;font-size:13px}
.prompt{font-weight:bold}.nl{color:#9aa3b2}
"""


def _unavailable(what: str, why: str) -> str:
    return f'<p class="missing">{_e(what)} not available: {_e(why)}</p>'


def build_html(output_dir: str) -> str:
    """The report page of the newest run under `output_dir` (a string of HTML).

    A section whose data is missing, or whose building raises, says so in place.

    Raises:
      FileNotFoundError: no metadata.db under `output_dir`.
    """
    run = load_run(output_dir)
    events = None

    def trainer_events():
        nonlocal events
        if events is None:
            events = read_events(_trainer_dirs(run)[0])
        return events

    builders = {
        "pipeline": lambda: section_pipeline(run),
        "data": lambda: section_data(run),
        "training": lambda: section_training(run, trainer_events()),
        "moe": lambda: section_moe(run, trainer_events()),
        "eval": lambda: section_eval(run),
        "samples": lambda: section_samples(run),
        "lineage": lambda: section_lineage(run),
    }
    body = []
    for name in SECTIONS:
        try:
            content = builders[name]()
        except Unavailable as e:
            content = _unavailable(_TITLES[name], str(e))
        except Exception as e:  # noqa: BLE001 (one section's failure must not lose the page)
            content = _unavailable(_TITLES[name], f"{type(e).__name__}: {e}")
        body.append(f'<section id="{name}"><h2>{_e(_TITLES[name])}</h2>{content}</section>')
    nav = "".join(f'<a href="#{n}">{_e(_TITLES[n].split(":")[0])}</a>' for n in SECTIONS)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    run_name = mlmd_report.runs(run.store)[-1]["run"] if run.executions else "none recorded"
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>deepseek-tfx run report</title><style>{_CSS}</style></head><body>"
            f"<header><h1>deepseek-tfx run report</h1><p>{_e(run.paths['output_dir'])} · "
            f"run {_e(run_name)} · written {when}</p></header><nav>{nav}</nav>"
            f"<main>{''.join(body)}</main></body></html>")


def write_report(output_dir: str) -> str:
    """Writes `report.html` under `output_dir` (see `build_html`); returns its path.

    Raises:
      FileNotFoundError: no metadata.db under `output_dir`.
      OSError: the file cannot be written.
    """
    path = os.path.join(os.path.abspath(output_dir), REPORT_FILE)
    page = build_html(output_dir)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def write_report_quietly(output_dir: str) -> str | None:
    """`write_report`, printing `report: <path>` or one line with the error; never raises
    (a run's exit code does not depend on its report). Returns the path or None."""
    try:
        path = write_report(output_dir)
    except Exception as e:  # noqa: BLE001 (the report is never a reason for a run to fail)
        print(f"report: not written ({type(e).__name__}: {e})")
        return None
    print(f"report: {path}")
    return path


@contextlib.contextmanager
def written_on_failure(output_dir: str):
    """A context that writes the report (quietly) when its body raises, then re-raises:
    a failed run gets a report of what it did."""
    try:
        yield
    except Exception:
        write_report_quietly(output_dir)
        raise
