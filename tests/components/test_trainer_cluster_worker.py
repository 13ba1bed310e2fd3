"""A replica of a platform's cluster (Vertex AI worker pools, a TFJob) trains like a local
`--num-workers` worker: TF_CONFIG from its environment, one child worker process, the
chief alone evaluates and exports (`components/trainer/cluster_worker.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from components.trainer import cluster_worker, launcher

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tf_config(cluster: dict, kind: str, index: int) -> dict:
    return {"cluster": cluster, "task": {"type": kind, "index": index}}


def test_platform_cluster_reads_tf_config_from_the_environment():
    vertex = {"chief": ["cmle-training-workerpool0-0:2222"],
              "worker": ["cmle-training-workerpool1-0:2222", "cmle-training-workerpool1-1:2222"]}
    chief = tf_config(vertex, "chief", 0)
    assert cluster_worker.platform_cluster({"TF_CONFIG": json.dumps(chief)}) == chief
    assert cluster_worker.is_chief(chief) and cluster_worker.num_tasks(chief) == 3
    # With a chief task, worker 0 is not the chief.
    assert not cluster_worker.is_chief(tf_config(vertex, "worker", 0))
    loopback = {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}
    assert cluster_worker.is_chief(tf_config(loopback, "worker", 0))
    assert not cluster_worker.is_chief(tf_config(loopback, "worker", 1))
    # No TF_CONFIG, or one task: train in this process.
    assert cluster_worker.platform_cluster({}) is None
    one = tf_config({"chief": ["a:1"]}, "chief", 0)
    assert cluster_worker.platform_cluster({"TF_CONFIG": json.dumps(one)}) is None
    with pytest.raises(ValueError, match="TF_CONFIG is not JSON"):
        cluster_worker.platform_cluster({"TF_CONFIG": "{chief"})
    with pytest.raises(ValueError, match="must be a 'chief' or 'worker' task"):
        cluster_worker.platform_cluster({"TF_CONFIG": json.dumps(tf_config(vertex, "ps", 0))})


def test_run_platform_worker_needs_a_cluster(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG names no cluster"):
        cluster_worker.run_platform_worker(object())


# One replica as Vertex AI runs it: TF_CONFIG in the environment, then the Trainer's
# `run_fn.train_model` (the hook that sends a platform replica to `cluster_worker`).
REPLICA = textwrap.dedent("""
    import json, sys
    from components.trainer import job as job_lib, run_fn
    from config import PipelineConfig

    with open(sys.argv[1]) as f:
        job = job_lib.TrainingJob.from_json(f.read())
    model = run_fn.train_model(job, PipelineConfig.from_json(job.pipeline_config))
    with open(sys.argv[2], "w") as f:
        json.dump({"model": None if model is None else int(model.count_params())}, f)
""")
STEPS = 20
LOSS_TOLERANCE = 1e-3  # as tests/components/test_trainer_distributed.py


def tiny_job(train_file: str, workdir):
    from components.trainer import job as job_lib
    from config import get_config

    config = get_config("tiny", {"train.train_steps": STEPS, "train.log_every": 1,
                                 "train.checkpoint_every": 10})
    return job_lib.TrainingJob(
        pipeline_config=config.to_json(), train_files=[train_file],
        checkpoint_dir=str(workdir / "ckpt"), log_dir=str(workdir / "logs"),
        result_path=str(workdir / "result" / "train_result.json"), intra_op_threads=1,
        peak_flops_per_device=1e11, peak_flops_source="fixed for the test")


@pytest.mark.slow
def test_replicas_with_tf_config_from_the_environment_train_as_local_workers(train_file,
                                                                              tmp_path):
    # Two replicas of a 2-worker cluster on loopback, each started the way a platform
    # starts one: its own TF_CONFIG in the environment, nothing else.
    job = tiny_job(train_file, tmp_path / "platform")
    job_file = tmp_path / "job.json"
    job_file.write_text(job.to_json())
    ports = launcher.free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    replicas = []
    for i in range(2):
        env = {**os.environ, "TF_CONFIG": json.dumps(tf_config(cluster, "worker", i)),
               "PYTHONPATH": ROOT}
        out = tmp_path / f"replica-{i}.json"
        log = open(tmp_path / f"replica-{i}.log", "w")
        replicas.append((subprocess.Popen([sys.executable, "-c", REPLICA, str(job_file),
                                           str(out)], env=env, cwd=ROOT, stdout=log,
                                          stderr=subprocess.STDOUT), out, log))
    for proc, _, log in replicas:
        code = proc.wait(timeout=900)
        log.close()
        assert code == 0, (tmp_path / f"replica-{replicas.index((proc, _, log))}.log").read_text()
    chief, other = (json.loads(out.read_text()) for _, out, _ in replicas)
    assert chief["model"] and chief["model"] > 0  # the chief evaluates and exports
    assert other["model"] is None  # the other replica only trains
    platform = json.loads((tmp_path / "platform" / "result" / "train_result.json").read_text())

    # The same job on 2 local worker processes (`--num-workers 2`).
    local_job = tiny_job(train_file, tmp_path / "local")
    launcher.run_workers(local_job, 2, job_dir=str(tmp_path / "local" / "logs"), timeout_s=900)
    local = json.loads(open(local_job.result_path).read())

    assert (platform["strategy"], platform["num_workers"], platform["num_replicas"]) == (
        "MultiWorkerMirroredStrategy", 2, 2)
    assert platform["global_batch_size"] == local["global_batch_size"] == 8
    loss_p = np.array([h["loss"] for h in platform["history"]])
    loss_l = np.array([h["loss"] for h in local["history"]])
    assert len(loss_p) == len(loss_l) == STEPS
    assert np.abs(loss_p - loss_l).max() < LOSS_TOLERANCE, (loss_p, loss_l)
    assert platform["last_checkpoint"].startswith(str(tmp_path / "platform" / "ckpt"))
    assert platform["last_checkpoint"].endswith(f"ckpt-{STEPS}")
