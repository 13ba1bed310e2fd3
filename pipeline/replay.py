"""Replay when continuing: `--base-model` with `data.replay_fraction` (issue 28).

A run that continues from a base model trains on its new data, and on a share
`data.replay_fraction` of the base model's own training data, so that it does not forget
what the base model knew. That old data is found through ML Metadata lineage:

  base Model  <-(output)- Trainer <-(input)- ... Transform ... TextCleaner
              <-(input)- Examples  <-(output)- TextExampleGen (input_base, input_files)

(`replay_origin`). The old data enters the new run as one more source of the mixture,
named "replay" (`config.REPLAY_SOURCE`; "replay_<name>" for each source of a base run
that was itself a mixture), read, cleaned, split, tokenized (with the base model's
tokenizer: a warm start keeps it) and evaluated like the others. Its eval split is the
base run's eval split (the split hashes the text), so the Evaluator's bits per byte on
"replay", for the base model (the baseline) and the new model, shows the forgetting.

The files must still be the ones the base model was trained on: each file's SHA-256 is
compared with the one its ExampleGen recorded (`input_files`); a changed or missing file
is refused. `create_pipeline(replay_examples_uri=...)` imports the base run's Examples
artifact (an `Importer` that reuses the artifact of that URI, so the new pipeline run's
context holds the very artifact the base model's lineage starts from), and the Trainer
records `replay_examples_id` and `replay_base_model_id` on the new Model artifact.

A base model with no lineage in this store (a Hugging Face checkpoint, a model pushed by
another pipeline root) is refused with that reason; `--replay-data PATH` names the old
data instead (`replay_data_sources`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from common.files import file_sha256
from config import REPLAY_SOURCE, SOURCE_SETTINGS, DataSource, PipelineConfig

_OUTPUT, _INPUT = 4, 3  # ml_metadata Event.OUTPUT, Event.INPUT
_SERVING_SUBDIR = "Format-Serving"


class ReplayError(ValueError):
    """The base model's training data cannot be replayed (the message says why)."""


@dataclasses.dataclass(frozen=True)
class ReplayOrigin:
    """The base model's training data, as found in ML Metadata.

    Attributes:
      base_model_id, base_model_uri: the base Model artifact.
      examples_id, examples_uri: the TextExampleGen `Examples` artifact its Trainer's
        data came from.
      sources: the base run's data as sources (its `data.sources`, or its one path as a
        source named "replay"), each with the base run's own reading and cleaning
        settings.
      input_files: the files ExampleGen read, as it recorded them ([{"path", "bytes",
        "sha256", ...}], paths relative to `input_base`).
      input_base: the directory those paths are relative to.
      task: the base run's `data.task` ("pretrain" or "sft").
    """

    base_model_id: int
    base_model_uri: str
    examples_id: int
    examples_uri: str
    sources: tuple[DataSource, ...]
    input_files: tuple[dict, ...]
    input_base: str
    task: str = "pretrain"


def open_store(metadata_path: str):
    """A read-only `ml_metadata.MetadataStore` on a SQLite file.

    Raises:
      ReplayError: there is no store at `metadata_path`.
    """
    if not os.path.exists(metadata_path):
        raise ReplayError(f"no ML Metadata at {metadata_path}: the base model has no lineage "
                          "in this run's store; name the old data with --replay-data PATH")
    from pipeline.warm_start import open_readonly_store

    return open_readonly_store(metadata_path)


def _strip(path: str) -> str:
    path = path.rstrip("/")
    return os.path.dirname(path) if os.path.basename(path) == _SERVING_SUBDIR else path


def base_model_artifact(store, base_model: str):
    """The Model artifact of `base_model`: its URI, or the destination it was pushed to
    (a PushedModel's `pushed_destination`, then the Pusher's input Model).

    Raises:
      ReplayError: no artifact of this store is, or was pushed to, `base_model`.
    """
    wanted = _strip(os.path.abspath(base_model) if "://" not in base_model else base_model)
    models = {t.id for t in store.get_artifact_types() if t.name == "Model"}
    for artifact in store.get_artifacts():
        if artifact.type_id in models and _strip(artifact.uri) == wanted:
            return artifact
    for artifact in store.get_artifacts():
        pushed = artifact.custom_properties.get("pushed_destination")
        if pushed is not None and _strip(pushed.string_value) == wanted:
            pusher = [e.execution_id for e in store.get_events_by_artifact_ids([artifact.id])
                      if e.type == _OUTPUT]
            inputs = [e.artifact_id for e in store.get_events_by_execution_ids(pusher)
                      if e.type == _INPUT]
            for candidate in store.get_artifacts_by_id(inputs):
                if candidate.type_id in models:
                    return candidate
    raise ReplayError(f"base model {base_model} has no lineage in this ML Metadata store (it "
                      "was not trained by this pipeline, e.g. a Hugging Face checkpoint): its "
                      "training data cannot be found; name the old data with --replay-data PATH")


def _examplegen_output(store, model) -> tuple:
    """(ExampleGen execution, its Examples artifact) upstream of `model`."""
    frontier, seen = [model.id], set()
    while frontier:
        producers = sorted({e.execution_id for e in store.get_events_by_artifact_ids(frontier)
                            if e.type == _OUTPUT} - seen)
        frontier = []
        for execution in store.get_executions_by_id(producers):
            seen.add(execution.id)
            events = store.get_events_by_execution_ids([execution.id])
            if "input_base" in execution.custom_properties:
                outputs = [e.artifact_id for e in events if e.type == _OUTPUT]
                return execution, store.get_artifacts_by_id(outputs)[0]
            frontier += [e.artifact_id for e in events if e.type == _INPUT]
    raise ReplayError(f"base model {model.uri}: no TextExampleGen upstream of it in ML "
                      "Metadata; name the old data with --replay-data PATH")


def _pattern(execution) -> str:
    """The split pattern of an ExampleGen execution's `input_config` (one split)."""
    value = execution.custom_properties.get("input_config")
    splits = json.loads(value.string_value).get("splits", []) if value is not None else []
    if len(splits) != 1 or "pattern" not in splits[0]:
        raise ReplayError(f"ExampleGen execution {execution.id}: cannot read its input "
                          "pattern; name the old data with --replay-data PATH")
    return splits[0]["pattern"]


def replay_origin(store, base_model: str) -> ReplayOrigin:
    """The base model's training data, found through ML Metadata lineage.

    Args:
      store: the run's `ml_metadata.MetadataStore`.
      base_model: the base model's directory (a Model artifact's URI, its
        `Format-Serving`, or a pushed version directory).

    Raises:
      ReplayError: no lineage (see `base_model_artifact`), or the base model carries
        no pipeline config.
    """
    from savedmodel import base_model as base_model_lib
    from savedmodel.layout import read_pipeline_config

    model = base_model_artifact(store, base_model)
    execution, examples = _examplegen_output(store, model)
    base_config = read_pipeline_config(base_model_lib.model_dir(model.uri))
    if base_config is None:
        raise ReplayError(f"base model {model.uri} carries no pipeline config; name the old "
                          "data with --replay-data PATH")
    input_base = execution.custom_properties["input_base"].string_value
    recorded = examples.custom_properties.get("input_files")
    files = tuple(json.loads(recorded.string_value)) if recorded is not None and \
        recorded.string_value else ()
    data = base_config.data
    if data.sources:
        sources = tuple(dataclasses.replace(
            s, **{k: getattr(data.for_source(s.name), k) for k in SOURCE_SETTINGS})
            for s in data.sources)
    else:
        sources = (DataSource(REPLAY_SOURCE, os.path.join(input_base, _pattern(execution)),
                              **{k: getattr(data, k) for k in SOURCE_SETTINGS}),)
    return ReplayOrigin(model.id, model.uri, examples.id, examples.uri, sources, files,
                        input_base, data.task)


def check_unchanged(origin: ReplayOrigin) -> None:
    """Every file the base model's ExampleGen read still has the bytes it had then.

    Raises:
      ReplayError: a file is gone or its SHA-256 differs (naming it).
    """
    import tensorflow as tf

    for entry in origin.input_files:
        if entry.get("refused"):
            continue
        path = os.path.join(entry.get("input_base", origin.input_base), entry["path"])
        if not tf.io.gfile.exists(path):
            raise ReplayError(f"replay: {path}, which the base model was trained on, is gone; "
                              "name the old data with --replay-data PATH")
        digest = file_sha256(path)
        if digest != entry["sha256"]:
            raise ReplayError(f"replay: {path} changed since the base model was trained on it "
                              f"(SHA-256 {digest[:12]}..., recorded "
                              f"{entry['sha256'][:12]}...); name the old data with "
                              "--replay-data PATH")


def replay_data_sources(path: str) -> tuple[DataSource, ...]:
    """`--replay-data PATH` as the one replayed source (this run's reading settings)."""
    return (DataSource(REPLAY_SOURCE, path),)


def with_replay(config: PipelineConfig, old: tuple[DataSource, ...], data_path: str
                ) -> PipelineConfig:
    """`config` whose mixture draws `data.replay_fraction` of its tokens from `old`.

    The run's own data keeps its sources (a run without sources becomes the one source
    "default" at `data_path`); the old sources join them as "replay" (one old source) or
    "replay_<name>", with weights that make their normalized total `replay_fraction`,
    shared among them as the base run weighted them. An old source's settings are kept
    where they differ from this run's (`SOURCE_SETTINGS`).

    Raises:
      ReplayError: `data.replay_fraction` is 0, or a name clash with this run's sources.
    """
    fraction = config.data.replay_fraction
    if not fraction > 0:
        raise ReplayError("replay needs data.replay_fraction > 0 (e.g. --set "
                          "data.replay_fraction=0.2)")
    own = config.data.sources or (DataSource("default", data_path),)
    total = math.fsum(s.weight for s in own)
    old_total = math.fsum(s.weight for s in old)
    replay_weight = fraction / (1.0 - fraction) * total
    names = {s.name for s in own}
    replayed = []
    for s in old:
        name = REPLAY_SOURCE if len(old) == 1 else f"{REPLAY_SOURCE}_{s.name}"
        if name in names:
            raise ReplayError(f"replay: this run already has a source named {name!r}; "
                              "rename it")
        settings = {k: v for k, v in s.settings().items() if v != getattr(config.data, k)}
        replayed.append(DataSource(name, s.path, replay_weight * s.weight / old_total,
                                   **settings))
    data = dataclasses.replace(config.data, sources=(*own, *replayed))
    return dataclasses.replace(config, data=data)
