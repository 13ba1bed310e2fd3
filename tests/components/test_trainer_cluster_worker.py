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
from components.trainer.strategy import cluster_size

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tf_config(cluster: dict, kind: str, index: int) -> dict:
    return {"cluster": cluster, "task": {"type": kind, "index": index}}


def test_platform_cluster_reads_tf_config_from_the_environment():
    vertex = {"chief": ["cmle-training-workerpool0-0:2222"],
              "worker": ["cmle-training-workerpool1-0:2222", "cmle-training-workerpool1-1:2222"]}
    chief = tf_config(vertex, "chief", 0)
    assert cluster_worker.platform_cluster({"TF_CONFIG": json.dumps(chief)}) == chief
    assert cluster_worker.is_chief(chief) and cluster_size(chief) == 3
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


# A stand-in for `components.trainer.worker`: the chief writes its result; SIGTERM makes
# it exit 143 (preempted), as the real worker does.
FAKE_WORKER = textwrap.dedent("""
    import json, os, signal, sys, time
    signal.signal(signal.SIGTERM, lambda *a: (print("checkpoint saved, preempted"), sys.exit(143)))
    with open(sys.argv[1]) as f:
        job = json.load(f)
    print("worker sees", os.environ["TF_CONFIG"], job["num_workers"], flush=True)
    if os.environ.get("FAKE_WORKER_WAIT"):
        time.sleep(60)
    with open(job["result_path"], "w") as f:
        json.dump({"num_workers": job["num_workers"]}, f)
""")


def fake_worker(tmp_path, monkeypatch, kind: str, index: int):
    from components.trainer import job as job_lib

    (tmp_path / "fake_worker.py").write_text(FAKE_WORKER)
    monkeypatch.setattr(cluster_worker, "WORKER_MODULE", "fake_worker")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    cluster = {"chief": ["c:1"], "worker": ["w:1", "w:2"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config(cluster, kind, index)))
    return job_lib.TrainingJob(pipeline_config="{}", train_files=[], checkpoint_dir="",
                               log_dir="", result_path=str(tmp_path / "run" / "result.json"))


def test_the_chief_copies_its_local_result_to_the_job_s_result_path(tmp_path, monkeypatch):
    job = fake_worker(tmp_path, monkeypatch, "chief", 0)
    cluster_worker.run_platform_worker(job, str(tmp_path / "local"))
    # The worker wrote to the replica's local job dir; the chief copied it.
    assert json.loads((tmp_path / "local" / "train_result.json").read_text()) == {
        "num_workers": 3}
    assert json.loads((tmp_path / "run" / "result.json").read_text()) == {"num_workers": 3}
    assert "worker sees" in (tmp_path / "local" / "chief-0.log").read_text()
    assert job.result_path == str(tmp_path / "run" / "result.json")  # not modified

    (tmp_path / "other").mkdir()
    other = fake_worker(tmp_path / "other", monkeypatch, "worker", 1)
    cluster_worker.run_platform_worker(other, str(tmp_path / "other" / "local"))
    assert not (tmp_path / "other" / "run").exists()  # only the chief's result goes there


def test_sigterm_reaches_the_worker_and_its_143_is_raised_as_preempted(tmp_path, monkeypatch):
    import signal
    import threading

    job = fake_worker(tmp_path, monkeypatch, "worker", 1)
    monkeypatch.setenv("FAKE_WORKER_WAIT", "1")
    log = tmp_path / "local" / "worker-1.log"

    def preempt():  # once the worker runs, SIGTERM to this process (the replica)
        for _ in range(300):
            if log.exists() and "worker sees" in log.read_text():
                break
            threading.Event().wait(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    threading.Thread(target=preempt, daemon=True).start()
    from components.trainer.preemption import Preempted

    with pytest.raises(Preempted, match=r"worker-1 preempted \(SIGTERM; exit 143\)") as e:
        cluster_worker.run_platform_worker(job, str(tmp_path / "local"))
    assert e.value.EXIT_CODE == 143
    assert "checkpoint saved, preempted" in (tmp_path / "local" / "worker-1.log").read_text()
    assert signal.getsignal(signal.SIGTERM) is before  # the forwarding handler is gone


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
    from common.process_exit import exit_frozen
    exit_frozen(0)  # as the real worker ends: without collecting the traced graphs
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
