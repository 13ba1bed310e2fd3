"""The Trainer as a Vertex AI CustomJob (`components/trainer/vertex.py`), without a cloud:
TFX's submission is replaced by a fake that plays the chief replica. These tests also
fail loudly if TFX renames what the module overrides or calls (`_GetExecutorClass`,
`_GetFnArgs`, `runner.start_cloud_training`, `udf_utils.get_fn`)."""

from __future__ import annotations

import json

import pytest
from tfx.components.trainer import executor as tfx_trainer_executor
from tfx.extensions.google_cloud_ai_platform import runner
from tfx.extensions.google_cloud_ai_platform.trainer import executor as tfx_vertex_executor
from tfx.types import standard_artifacts
from tfx.utils import import_utils

from components.trainer import cluster_worker, vertex
from components.trainer.executor import Executor

IMAGE = "registry.example/deepseek-tfx:test"


def test_tfx_still_has_what_vertex_py_overrides_and_calls():
    # If one of these fails, TFX changed its Vertex AI Trainer extension: see vertex.py.
    assert "_GetExecutorClass" in vars(tfx_vertex_executor.GenericExecutor)
    assert "_GetFnArgs" in vars(tfx_trainer_executor.GenericExecutor)
    assert callable(runner.start_cloud_training)
    assert issubclass(vertex.ReplicaExecutor, Executor)
    assert vertex.VertexExecutor()._GetExecutorClass() is vertex.ReplicaExecutor


def _artifacts(tmp_path):
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    run = standard_artifacts.ModelRun()
    run.uri = str(tmp_path / "model_run")
    return {"model": [model], "model_run": [run]}


def test_vertex_executor_submits_replicas_of_our_executor_then_records_figures(tmp_path,
                                                                             monkeypatch):
    submitted = {}

    def fake_start_cloud_training(input_dict, output_dict, exec_properties,
                                  executor_class_path, job_args, job_id, job_labels,
                                  enable_vertex, vertex_region):
        submitted.update(executor_class_path=executor_class_path, job_args=job_args,
                         enable_vertex=enable_vertex, vertex_region=vertex_region)
        # The chief replica writes training_summary.json beside the serving model.
        uri = output_dict["model"][0].uri
        (tmp_path / "model").mkdir()
        with open(f"{uri}/training_summary.json", "w") as f:
            json.dump({"train_steps": 30, "num_workers": 4, "final_train_loss": 3.5,
                       "strategy": "MultiWorkerMirroredStrategy"}, f)

    monkeypatch.setattr(runner, "start_cloud_training", fake_start_cloud_training)
    outputs = _artifacts(tmp_path)
    custom = {**vertex.custom_config(4, IMAGE, "my-project", "europe-west4"),
              "pipeline_config": "{}", "num_workers": 4, "teacher_model": "gs://b/teacher"}
    vertex.VertexExecutor().Do({}, outputs, {"custom_config": json.dumps(custom),
                                             "run_fn": "components.trainer.run_fn.run_fn"})

    path = submitted["executor_class_path"]
    assert path == "components.trainer.vertex.ReplicaExecutor"
    assert import_utils.import_class_by_path(path) is vertex.ReplicaExecutor
    assert submitted["enable_vertex"] is True and submitted["vertex_region"] == "europe-west4"
    pools = submitted["job_args"]["job_spec"]["worker_pool_specs"]
    assert [p["replica_count"] for p in pools] == [1, 3]
    model = outputs["model"][0]
    assert model.get_int_custom_property("train_steps") == 30
    assert model.get_int_custom_property("num_workers") == 4
    assert model.get_string_custom_property("strategy") == "MultiWorkerMirroredStrategy"
    assert model.get_string_custom_property("teacher_model_uri") == "gs://b/teacher"


def _as_replica(monkeypatch, kind: str, index: int):
    cluster = {"chief": ["chief:2222"], "worker": ["w0:2222", "w1:2222"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster,
                                                "task": {"type": kind, "index": index}}))


def test_a_replica_other_than_the_chief_only_calls_run_fn(tmp_path, monkeypatch):
    _as_replica(monkeypatch, "worker", 0)  # with a chief task, worker 0 is not the chief
    calls = []
    monkeypatch.setattr(vertex.ReplicaExecutor, "_GetFnArgs",
                        lambda self, i, o, e: ("fn_args", o["model"][0].uri))
    monkeypatch.setattr(vertex.udf_utils, "get_fn", lambda props, name: calls.append)
    outputs = _artifacts(tmp_path)
    # No serving model, no training_summary.json: still a success for this replica.
    vertex.ReplicaExecutor().Do({}, outputs, {"run_fn": "components.trainer.run_fn.run_fn"})
    assert calls == [("fn_args", outputs["model"][0].uri)]


def test_a_preempted_worker_makes_the_replica_exit_143(tmp_path, monkeypatch):
    from components.trainer.preemption import Preempted

    _as_replica(monkeypatch, "worker", 1)
    monkeypatch.setattr(vertex.ReplicaExecutor, "_GetFnArgs", lambda self, i, o, e: None)

    def preempted(fn_args):
        raise Preempted("training worker worker-1 preempted (SIGTERM; exit 143)")

    monkeypatch.setattr(vertex.udf_utils, "get_fn", lambda props, name: preempted)
    with pytest.raises(SystemExit) as exit_info:
        vertex.ReplicaExecutor().Do({}, _artifacts(tmp_path), {"run_fn": "x.run_fn"})
    assert exit_info.value.code == 143

    def failed(fn_args):
        raise cluster_worker.WorkerExitError("training worker worker-1 exited with code 1", 1)

    monkeypatch.setattr(vertex.udf_utils, "get_fn", lambda props, name: failed)
    with pytest.raises(cluster_worker.WorkerExitError, match="code 1"):
        vertex.ReplicaExecutor().Do({}, _artifacts(tmp_path), {"run_fn": "x.run_fn"})
