"""The run report's data: the newest run of an output directory as plain Python values.

Reads ML Metadata (`run_summary.latest_run`, `mlmd_report`), the artifacts it points to
(cleaning_report.json, the TFDV anomalies, training_summary.json, metrics.json, the pushed
SavedModel) and the Trainer's TensorBoard events. No HTML here: `reporting/report.py` turns
these values into the page, `reporting/report_plots.py` into figures.

A value that does not exist (`--until`, a failed run, nothing pushed) raises `Unavailable`
with the reason, which the page shows in place of the section.
"""

from __future__ import annotations

import codecs
import dataclasses
import glob
import json
import os
from collections import defaultdict

import numpy as np

from common.json_file import read_json
from reporting import mlmd_report
from reporting.run_summary import ComponentRun, latest_run, open_store

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


def run_name(run: RunData) -> str:
    """The newest run's name (its pipeline_run context), or "none recorded"."""
    return mlmd_report.runs(run.store)[-1]["run"] if run.executions else "none recorded"


def _available(path: str) -> str:
    """`path`; raises Unavailable when there is no such file."""
    if not os.path.isfile(path):
        raise Unavailable(f"no {path}")
    return path


# ----------------------------------------------------------------------------- pipeline


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


def execution_config(run: RunData, component: str) -> dict:
    """The pipeline config a component ran with (its `pipeline_config` property), or {}."""
    ids = [e["id"] for e in run.executions if e["component"] == component]
    for execution in run.store.get_executions_by_id(ids):
        for props in (execution.properties, execution.custom_properties):
            if "pipeline_config" in props:
                return json.loads(props["pipeline_config"].string_value)
    return {}


# ----------------------------------------------------------------------------- data


def cleaning_report(run: RunData) -> dict:
    """The TextCleaner's cleaning_report.json.

    Raises:
      Unavailable: the TextCleaner did not run, or wrote no report.
    """
    uri = run.output("TextCleaner", "Examples")["uri"]
    return read_json(_available(os.path.join(uri, "cleaning_report.json")),
                     "the TextCleaner's cleaning report")


def anomaly_rows(run: RunData) -> list[list[str]]:
    """[split, feature (or "(dataset)"), short description, description] of each TFDV
    anomaly the ExampleValidator found, by split and feature; [] for none.

    Raises:
      Unavailable: the ExampleValidator did not run.
    """
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    uri = run.output("ExampleValidator", "ExampleAnomalies")["uri"]
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
    return rows


# ----------------------------------------------------------------------------- training


def trainer_dirs(run: RunData) -> tuple[str, str]:
    """(model_run dir with the events, Model artifact dir with training_summary.json).

    Raises:
      Unavailable: the Trainer did not run (to the end).
    """
    return (run.output("Trainer", "ModelRun")["uri"], run.output("Trainer", "Model")["uri"])


def training_summary(run: RunData) -> dict | None:
    """The Trainer's training_summary.json, or None when it wrote none.

    Raises:
      Unavailable: the Trainer did not run (to the end).
    """
    path = os.path.join(trainer_dirs(run)[1], "training_summary.json")
    return read_json(path, "the Trainer's training summary") if os.path.isfile(path) else None


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


def router_bias(scalars: dict) -> dict[str, dict[str, tuple[list[int], list[float]]]]:
    """{layer: {stat: (steps, values)}} from the `router_bias/<layer>/<stat>` scalars."""
    bias: dict[str, dict] = defaultdict(dict)
    for tag, series in scalars.items():
        if tag.startswith("router_bias/"):
            _, layer, stat = tag.split("/")
            bias[layer][stat] = series
    return dict(bias)


# ----------------------------------------------------------------------------- eval


def eval_metrics(run: RunData) -> dict:
    """The LmEvaluator's metrics.json ({"candidate", "baseline", "blessed", "message"}).

    Raises:
      Unavailable: the LmEvaluator did not run, or wrote no metrics.json.
    """
    uri = run.output("LmEvaluator", "ModelEvaluation")["uri"]
    return read_json(_available(os.path.join(uri, "metrics.json")),
                     "the LmEvaluator's metrics")


def eval_tasks(run: RunData) -> tuple[dict, dict | None]:
    """(the candidate's task metrics, the baseline's or None) from metrics.json:
    {task: metrics (evaluation/task_scoring.py)}; the first is {} when the LmEvaluator
    scored no tasks (eval.tasks empty, or a run from before tasks).

    Raises:
      Unavailable: the LmEvaluator did not run, or wrote no metrics.json.
    """
    metrics = eval_metrics(run)
    tasks = (metrics.get("candidate") or {}).get("tasks") or {}
    baseline = metrics.get("baseline")
    return tasks, (baseline.get("tasks") or {}) if baseline else None


# ----------------------------------------------------------------------------- pushed model


def pushed_dir(run: RunData) -> str:
    """The pushed SavedModel's directory.

    Raises:
      Unavailable: the Pusher did not run, or did not push (the model was not blessed).
    """
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


def decode_generated(data: bytes) -> str:
    """UTF-8 text of generated bytes. A character cut off at the end (the token budget ran
    out inside a multi-byte character: common for Chinese with a byte-level BPE) is left
    out rather than shown as U+FFFD; an invalid byte elsewhere becomes U+FFFD."""
    return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)


def generate_samples(run: RunData) -> tuple[str, list[tuple[str, str]]]:
    """Greedy continuations (`SAMPLE_NEW_TOKENS` new tokens) of `sample_prompts` by the
    pushed SavedModel's `generate` signature.

    Returns:
      (the SavedModel's directory, [(prompt, continuation)]).

    Raises:
      Unavailable: nothing pushed, or the SavedModel has no tokenizer (logits only).
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (the SavedModel's tokenizer ops)

    from savedmodel.layout import has_tokenizer

    destination = pushed_dir(run)
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
    samples = []
    for prompt, text in zip(prompts, out["text"].numpy(), strict=True):
        text = decode_generated(text)
        samples.append((prompt, text[len(prompt):] if text.startswith(prompt) else text))
    return destination, samples


def model_lineage(run: RunData) -> tuple[str, dict]:
    """(the pushed SavedModel's directory, `mlmd_report.lineage` of it).

    Raises:
      Unavailable: nothing pushed, or ML Metadata has no lineage for it.
    """
    destination = pushed_dir(run)
    try:
        return destination, mlmd_report.lineage(run.store, destination)
    except LookupError as e:
        raise Unavailable(str(e)) from e
