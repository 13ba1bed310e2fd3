"""A ResolverStrategy: the text profile statistics of the latest blessed run.

"The latest blessed run" is the pipeline run in which the newest blessed
ModelBlessing was produced; its DriftValidator `statistics` (the ExampleStatistics
artifact marked with the custom property `text_profile` = 1) are what the
DriftValidator of this run compares with. TFX records a cached component in a
run as well, so a run whose DriftValidator was cached still has its statistics.
Without `pipeline_run` contexts (InteractiveContext) nothing is resolved.

When the baseline profile was computed from the very cleaned Examples artifact
this run validates (the same data, cached), nothing is resolved either: its
drift is zero by definition, and without a baseline the DriftValidator's inputs
are those of the run that made the profile, so TFX reuses that execution and a
second identical run is cached up to the Trainer.
"""

from __future__ import annotations

import ml_metadata as mlmd
from tfx import types
from tfx.dsl.components.common import resolver

TEXT_PROFILE_PROPERTY = "text_profile"
_BLESSED = "blessed"
_PIPELINE_RUN = "pipeline_run"


class LatestBlessedRunStatisticsStrategy(resolver.ResolverStrategy):
    """Resolves `statistics` to the text profile of the latest blessed run.

    Inputs (channel keys): `statistics` (ExampleStatistics), `model_blessing`
    (ModelBlessing), `examples` (optional: this run's cleaned Examples). Outputs
    `statistics` and `model_blessing`: one artifact each, or none when no blessed
    run has a text profile yet (the first run) or when that profile was computed
    from one of the `examples` given (the same data; see the module docstring).
    `examples` is passed through.
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
                        if {a.id for a in examples} & _producer_inputs(store, newest.id):
                            return none
                        return {"statistics": [newest], "model_blessing": [blessing],
                                "examples": examples}
        return none


def _producer_inputs(store: mlmd.MetadataStore, artifact_id: int) -> set[int]:
    """Ids of the input artifacts of every execution that output `artifact_id`
    (the original one and the cached ones, which have the same inputs)."""
    producers = [e.execution_id for e in store.get_events_by_artifact_ids([artifact_id])
                 if e.type == mlmd.proto.Event.OUTPUT]
    return {e.artifact_id for e in store.get_events_by_execution_ids(producers)
            if e.type == mlmd.proto.Event.INPUT}
