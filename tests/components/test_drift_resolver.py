"""The drift baseline resolver on a hand-built ML Metadata store (no pipeline run).

Runs are built as TFX records them: a `pipeline_run` context holding the
DriftValidator execution (input events `examples`, `baseline_statistics`; output
events `statistics`, `anomalies`) and the evaluator execution that outputs the
ModelBlessing.
"""

from __future__ import annotations

import ml_metadata as mlmd
import pytest
from ml_metadata.proto import metadata_store_pb2 as pb


class _Store:
    def __init__(self):
        config = pb.ConnectionConfig()
        config.fake_database.SetInParent()
        self.store = mlmd.MetadataStore(config)
        self.types = {name: self.store.put_artifact_type(pb.ArtifactType(name=name))
                      for name in ("Examples", "ExampleStatistics", "ExampleAnomalies",
                                   "ModelBlessing")}
        self.run_type = self.store.put_context_type(pb.ContextType(name="pipeline_run"))
        self.exec_type = self.store.put_execution_type(pb.ExecutionType(name="component"))
        self.runs = 0

    def artifact(self, type_name, **custom):
        a = pb.Artifact(type_id=self.types[type_name], uri=f"/{type_name}/{self.runs}")
        for key, value in custom.items():
            a.custom_properties[key].int_value = value
        (a.id,) = self.store.put_artifacts([a])
        return a

    def execution(self, context, inputs, outputs):
        events = []
        for kind, artifacts in ((pb.Event.INPUT, inputs), (pb.Event.OUTPUT, outputs)):
            for key, artifact in artifacts.items():
                path = pb.Event.Path(steps=[pb.Event.Path.Step(key=key),
                                            pb.Event.Path.Step(index=0)])
                events.append((artifact, pb.Event(type=kind, path=path)))
        self.store.put_execution(pb.Execution(type_id=self.exec_type), events, [context])

    def blessed_run(self, examples, baseline=None, drift_detected=0):
        """A run whose DriftValidator read `examples` (and `baseline`), then blessed.
        Returns its text profile statistics."""
        self.runs += 1
        context = pb.Context(type_id=self.run_type, name=f"run-{self.runs}")
        (context.id,) = self.store.put_contexts([context])
        statistics = self.artifact("ExampleStatistics", text_profile=1)
        anomalies = self.artifact("ExampleAnomalies", drift_detected=drift_detected)
        inputs = {"examples": examples, **({"baseline_statistics": baseline} if baseline else {})}
        self.execution(context, inputs, {"statistics": statistics, "anomalies": anomalies})
        blessing = self.artifact("ModelBlessing", blessed=1)
        self.execution(context, {}, {"blessing": blessing})
        return statistics

    def resolve(self, examples):
        from tfx.types import standard_artifacts

        from components.drift_validator.resolver import LatestBlessedRunStatisticsStrategy

        def wrap(cls, type_name):
            out = []
            for a in self.store.get_artifacts_by_type(type_name):
                artifact = cls()
                artifact.set_mlmd_artifact(a)
                out.append(artifact)
            return out

        current = [a for a in wrap(standard_artifacts.Examples, "Examples") if a.id == examples.id]
        result = LatestBlessedRunStatisticsStrategy().resolve_artifacts(self.store, {
            "statistics": wrap(standard_artifacts.ExampleStatistics, "ExampleStatistics"),
            "model_blessing": wrap(standard_artifacts.ModelBlessing, "ModelBlessing"),
            "examples": current,
        })
        assert [a.id for a in result["examples"]] == [examples.id]
        return [a.id for a in result["statistics"]]


@pytest.fixture
def store():
    return _Store()


def test_no_blessed_run_no_baseline(store):
    assert store.resolve(store.artifact("Examples")) == []


def test_new_data_is_compared_with_the_latest_blessed_profile(store):
    first, second = store.artifact("Examples"), store.artifact("Examples")
    profile_1 = store.blessed_run(first)
    assert store.resolve(second) == [profile_1.id]
    profile_2 = store.blessed_run(second, baseline=profile_1)
    assert store.resolve(store.artifact("Examples")) == [profile_2.id]


def test_same_data_gets_the_baseline_its_profile_was_checked_against(store):
    # So the DriftValidator's inputs equal that execution's, and TFX's cache hits.
    first, second = store.artifact("Examples"), store.artifact("Examples")
    profile_1 = store.blessed_run(first)
    assert store.resolve(first) == []
    store.blessed_run(second, baseline=profile_1)
    assert store.resolve(second) == [profile_1.id]


def test_same_data_after_accepted_drift_has_no_baseline(store):
    first, second = store.artifact("Examples"), store.artifact("Examples")
    profile_1 = store.blessed_run(first)
    store.blessed_run(second, baseline=profile_1, drift_detected=1)
    assert store.resolve(second) == []
