"""Reads a finished run back from ML Metadata: what ran, how long, what came out."""

from __future__ import annotations

import dataclasses

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

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


def _custom_properties(artifact) -> dict:
    out = {}
    for key, value in artifact.custom_properties.items():
        kind = value.WhichOneof("value")
        if kind in ("int_value", "double_value", "string_value", "bool_value"):
            out[key] = getattr(value, kind)
    return out


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
