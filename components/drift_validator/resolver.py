"""A ResolverStrategy: the text profile statistics of the latest blessed run.

"The latest blessed run" is the pipeline run in which the newest blessed
ModelBlessing was produced; its DriftValidator `statistics` (the ExampleStatistics
artifact marked with the custom property `text_profile` = 1) are what the
DriftValidator of this run compares with. TFX records a cached component in a
run as well, so a run whose DriftValidator was cached still has its statistics.
Without `pipeline_run` contexts (InteractiveContext) nothing is resolved.

When that profile was computed from the very cleaned Examples artifact this
run validates (the same data, cached), the data has been checked already, by the
DriftValidator execution that made the profile: the baseline resolved is that
execution's own baseline (none on a first run), so this run's DriftValidator has
the same inputs, TFX reuses the execution, and an identical re-run is cached up
to the Trainer. If that execution found drift (accepted, since its run was
blessed), nothing is resolved instead: comparing the same data with the same old
baseline would only find it again, and the accepted data is now the baseline.
"""

from __future__ import annotations

import ml_metadata as mlmd
from tfx import types
from tfx.dsl.components.common import resolver

TEXT_PROFILE_PROPERTY = "text_profile"
DRIFT_DETECTED_PROPERTY = "drift_detected"
_BLESSED = "blessed"
_PIPELINE_RUN = "pipeline_run"


class LatestBlessedRunStatisticsStrategy(resolver.ResolverStrategy):
    """Resolves `statistics` to the text profile of the latest blessed run.

    Inputs (channel keys): `statistics` (ExampleStatistics), `model_blessing`
    (ModelBlessing), `examples` (optional: this run's cleaned Examples). Outputs
    `statistics` and `model_blessing`: one artifact each, or none when no blessed
    run has a text profile yet (the first run). When the profile was computed
    from one of the `examples` given, `statistics` is that computation's own
    baseline (see the module docstring). `examples` is passed through.
    """

    def resolve_artifacts(self, store: mlmd.MetadataStore,
                          input_dict: dict[str, list[types.Artifact]]):
        statistics = {a.id: a for a in input_dict.get("statistics", [])
                      if a.has_custom_property(TEXT_PROFILE_PROPERTY)
                      and a.get_int_custom_property(TEXT_PROFILE_PROPERTY) == 1}
        blessings = sorted(
            (b for b in input_dict.get("model_blessing", [])
             if b.has_custom_property(_BLESSED) and b.get_int_custom_property(_BLESSED) == 1),
            key=lambda b: b.id, reverse=True)
        examples = list(input_dict.get("examples", []))
        none = {"statistics": [], "model_blessing": [], "examples": examples}
        try:
            run_type = store.get_context_type(_PIPELINE_RUN)
        except mlmd.errors.NotFoundError:
            # No orchestrated pipeline run recorded yet (e.g. InteractiveContext,
            # which records component runs one by one): nothing to compare with.
            return none
        for blessing in blessings:
            events = store.get_events_by_artifact_ids([blessing.id])
            executions = [e.execution_id for e in events
                          if e.type == mlmd.proto.Event.OUTPUT]
            for execution_id in executions:
                for context in store.get_contexts_by_execution(execution_id):
                    if context.type_id != run_type.id:
                        continue
                    in_run = [statistics[a.id] for a in store.get_artifacts_by_context(context.id)
                              if a.id in statistics]
                    if in_run:
                        newest = max(in_run, key=lambda a: a.id)
                        baseline = [newest]
                        same_data = _same_data_check(store, newest.id, {a.id for a in examples})
                        if same_data is not None:
                            baseline = [statistics[i] for i in same_data if i in statistics]
                        return {"statistics": baseline, "model_blessing": [blessing],
                                "examples": examples}
        return none


def _same_data_check(store: mlmd.MetadataStore, profile_id: int,
                     examples_ids: set[int]) -> list[int] | None:
    """If a DriftValidator execution that output the profile `profile_id` read
    one of `examples_ids`: the ids of its baseline statistics (empty when it had
    none or found drift). Otherwise None.

    The original execution and the cached ones have the same inputs; any will do.
    """
    producers = sorted(e.execution_id for e in store.get_events_by_artifact_ids([profile_id])
                       if e.type == mlmd.proto.Event.OUTPUT)
    for execution_id in producers:
        events = store.get_events_by_execution_ids([execution_id])
        inputs = {e.artifact_id: _key(e) for e in events if e.type == mlmd.proto.Event.INPUT}
        if not examples_ids & {i for i, key in inputs.items() if key == "examples"}:
            continue
        outputs = store.get_artifacts_by_id(
            [e.artifact_id for e in events if e.type == mlmd.proto.Event.OUTPUT])
        drifted = any(a.custom_properties[DRIFT_DETECTED_PROPERTY].int_value == 1
                      for a in outputs if DRIFT_DETECTED_PROPERTY in a.custom_properties)
        if drifted:
            return []
        return [i for i, key in inputs.items() if key == "baseline_statistics"]
    return None


def _key(event) -> str:
    """The input/output key of an MLMD event (its first path step)."""
    steps = event.path.steps
    return steps[0].key if steps and steps[0].HasField("key") else ""
