"""`deepseek-tfx mlmd`: what ML Metadata knows about the runs in an output directory.

  runs(store)                 every pipeline run: each component's state and duration
  artifacts(store)            every artifact: type, URI, properties (eval metrics,
                              training figures, cleaning counts, ...)
  lineage(store, model_dir)   from a pushed model back through Pusher, Evaluator,
                              Trainer, Transform, cleaning and ExampleGen to the input
                              files and their fingerprints

Reads the SQLite store read-only; imports ml-metadata only (not TFX).
"""

from __future__ import annotations

import json
import os
from typing import Any

from ml_metadata.proto import metadata_store_pb2

from reporting.run_summary import open_store, property_value

_STATES = {v: k for k, v in metadata_store_pb2.Execution.State.items()}


def _properties(node) -> dict[str, Any]:
    out = {k: property_value(v) for k, v in node.properties.items()}
    out.update({k: property_value(v) for k, v in node.custom_properties.items()})
    return {k: v for k, v in out.items() if k not in ("tfx_version", "is_external")}


class _Index:
    """Type names and component names, looked up once."""

    def __init__(self, store):
        self.store = store
        self.artifact_types = {t.id: t.name for t in store.get_artifact_types()}
        self.execution_types = {t.id: t.name for t in store.get_execution_types()}
        node_type = store.get_context_type("node").id
        self.component = {}
        for context in store.get_contexts_by_type("node"):
            assert context.type_id == node_type
            for execution in store.get_executions_by_context(context.id):
                self.component[execution.id] = context.name.split(".", 1)[-1]

    def artifact(self, a) -> dict[str, Any]:
        return {"id": a.id, "type": self.artifact_types[a.type_id], "uri": a.uri,
                "properties": _properties(a)}

    def execution(self, e) -> dict[str, Any]:
        return {
            "id": e.id,
            "component": self.component.get(e.id, self.execution_types.get(e.type_id, "?")),
            "state": _STATES.get(e.last_known_state, "?"),
            "duration_s": round((e.last_update_time_since_epoch
                                 - e.create_time_since_epoch) / 1000, 1),
        }


def runs(store) -> list[dict[str, Any]]:
    """Pipeline runs, oldest first, each with its component executions."""
    index = _Index(store)
    out = []
    for run in sorted(store.get_contexts_by_type("pipeline_run"),
                      key=lambda c: c.create_time_since_epoch):
        executions = sorted(store.get_executions_by_context(run.id), key=lambda e: e.id)
        out.append({"run": run.name, "executions": [index.execution(e) for e in executions]})
    return out


def artifacts(store) -> list[dict[str, Any]]:
    """Every artifact with its properties, oldest first."""
    index = _Index(store)
    return [index.artifact(a) for a in sorted(store.get_artifacts(), key=lambda a: a.id)]


def find_pushed_model(store, model_dir: str):
    """The PushedModel (or Model) artifact for a serving dir, version dir or model URI.

    Raises:
      LookupError: nothing in this store was pushed to or written at `model_dir`.
    """
    model_dir = os.path.abspath(model_dir).rstrip("/")
    candidates = []
    for a in store.get_artifacts():
        destination = a.custom_properties.get("pushed_destination")
        if destination is not None:
            dest = destination.string_value.rstrip("/")
            if dest == model_dir or os.path.dirname(dest) == model_dir:
                candidates.append((int(a.custom_properties["pushed_version"].string_value), a))
        elif a.uri.rstrip("/") == model_dir:
            candidates.append((0, a))
    if not candidates:
        raise LookupError(f"no pushed model or artifact at {model_dir} in this ML Metadata store")
    return max(candidates, key=lambda c: (c[0], c[1].id))[1]


def lineage(store, model_dir: str) -> dict[str, Any]:
    """The chain of executions and artifacts that produced a pushed model.

    Returns:
      {"model": artifact, "steps": [{"execution", "inputs": [artifact], "outputs":
      [artifact]}, ...] (from the Pusher back to ExampleGen), "input_files": [...]}.

    Raises:
      LookupError: see `find_pushed_model`.
    """
    index = _Index(store)
    start = find_pushed_model(store, model_dir)
    steps, seen_executions, frontier = [], set(), [start.id]
    input_files: list[dict[str, Any]] = []
    while frontier:
        events = store.get_events_by_artifact_ids(frontier)
        producers = sorted({e.execution_id for e in events
                            if e.type == metadata_store_pb2.Event.OUTPUT} - seen_executions,
                           reverse=True)
        frontier = []
        for execution in store.get_executions_by_id(producers):
            seen_executions.add(execution.id)
            exec_events = store.get_events_by_execution_ids([execution.id])
            ids = {kind: [e.artifact_id for e in exec_events if e.type == kind]
                   for kind in (metadata_store_pb2.Event.INPUT, metadata_store_pb2.Event.OUTPUT)}
            inputs = store.get_artifacts_by_id(ids[metadata_store_pb2.Event.INPUT])
            outputs = store.get_artifacts_by_id(ids[metadata_store_pb2.Event.OUTPUT])
            step = {"execution": index.execution(execution),
                    "inputs": [index.artifact(a) for a in inputs],
                    "outputs": [index.artifact(a) for a in outputs]}
            props = _properties(execution)
            if "input_base" in props:  # ExampleGen: where the data came from
                step["execution"]["input_base"] = props["input_base"]
                step["execution"]["input_fingerprint"] = props.get("input_fingerprint")
                for out in step["outputs"]:
                    input_files += out["properties"].get("input_files", [])
            steps.append(step)
            frontier += [a.id for a in inputs]
    return {"model": index.artifact(start), "steps": steps, "input_files": input_files}


# ----------------------------------------------------------------------------- text


def format_runs(data: list[dict[str, Any]]) -> str:
    lines = []
    for run in data:
        lines.append(f"run {run['run']}")
        for e in run["executions"]:
            lines.append(f"  {e['component']:<32} {e['state'].lower():<10} {e['duration_s']:>8.1f} s")
    return "\n".join(lines)


def format_artifacts(data: list[dict[str, Any]]) -> str:
    lines = []
    for a in data:
        lines.append(f"{a['id']:>4} {a['type']:<18} {a['uri']}")
        for k, v in sorted(a["properties"].items()):
            if isinstance(v, (dict, list)):
                v = json.dumps(v)[:120]
            lines.append(f"       {k} = {v}")
    return "\n".join(lines)


def format_lineage(data: dict[str, Any]) -> str:
    model = data["model"]
    lines = [f"{model['type']} {model['uri']}"
             + (f" -> {model['properties'].get('pushed_destination')}"
                if "pushed_destination" in model["properties"] else "")]
    for step in data["steps"]:
        e = step["execution"]
        lines.append(f"  <- {e['component']} (execution {e['id']}, {e['state'].lower()})")
        for a in step["inputs"]:
            lines.append(f"       input  {a['type']:<18} {a['uri']}")
        if "input_base" in e:
            lines.append(f"       read   {e['input_base']}  ({e.get('input_fingerprint')})")
    for f in data["input_files"]:
        lines.append(f"  input file {f['path']}  {int(f.get('bytes', 0))} bytes  "
                     f"sha256 {f.get('sha256')}")
    return "\n".join(lines)


def report(metadata_path: str, what: str, model_dir: str | None = None,
           as_json: bool = False) -> str:
    """The text (or JSON) of `deepseek-tfx mlmd`.

    Raises:
      FileNotFoundError: no metadata.db at metadata_path.
      LookupError: `lineage` of a model the store does not know.
    """
    if not os.path.isfile(metadata_path):
        raise FileNotFoundError(f"{metadata_path}: no ML Metadata store")
    store = open_store(metadata_path)
    if what == "runs":
        data, fmt = runs(store), format_runs
    elif what == "artifacts":
        data, fmt = artifacts(store), format_artifacts
    elif what == "lineage":
        data, fmt = lineage(store, model_dir or ""), format_lineage
    else:
        raise ValueError(f"what={what!r} must be runs, artifacts or lineage")
    return json.dumps(data, indent=2, default=str) if as_json else fmt(data)
