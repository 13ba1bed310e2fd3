"""Distributed training follows the one-device run, step for step.

- MultiWorkerMirroredStrategy: 2 worker processes on loopback (the launcher
  behind `deepseek-tfx run --num-workers 2`) against 1 worker, 50 steps of the
  `tiny` preset with the same global batch of 8: the loss curves agree within
  LOSS_TOLERANCE at every step.
- MirroredStrategy over two logical CPU devices in one process (the path of
  several local GPUs): same losses as one device.

Both see exactly the same global batches (each input pipeline keeps its
replicas' rows of the same stream), and the loss is the per-token mean over the
global batch, so only the order of floating-point sums differs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from components.trainer import job as job_lib
from components.trainer import launcher
from config import get_config

# Slow: each test starts worker processes (TensorFlow import, a cluster over loopback).
pytestmark = pytest.mark.slow

STEPS = 50
# Max |loss_2 workers - loss_1 worker| over the first 50 steps (losses ~4-8 nats).
# Measured on a 2-core CPU: ~2e-5 (summation order only); the bound leaves room
# for routing near-ties flipping an expert choice on other CPUs.
LOSS_TOLERANCE = 1e-3


def run_cluster(num_workers: int, train_file: str, workdir) -> dict:
    config = get_config("tiny", {"train.train_steps": STEPS, "train.log_every": 1,
                                 "train.checkpoint_every": 25})
    job = job_lib.TrainingJob(
        pipeline_config=config.to_json(), train_files=[train_file],
        checkpoint_dir=str(workdir / "ckpt"), log_dir=str(workdir / "logs"),
        result_path=str(workdir / "result.json"),
        peak_flops_per_device=1e11, peak_flops_source="fixed for the test")
    launcher.run_workers(job, num_workers, job_dir=str(workdir / "logs"), timeout_s=900)
    with open(job.result_path) as f:
        return json.load(f)


def test_two_workers_follow_one_worker(train_file, tmp_path):
    one = run_cluster(1, train_file, tmp_path / "one")
    two = run_cluster(2, train_file, tmp_path / "two")
    assert (one["strategy"], one["num_replicas"], one["num_workers"]) == ("OneDevice", 1, 1)
    assert (two["strategy"], two["num_replicas"], two["num_workers"]) == (
        "MultiWorkerMirroredStrategy", 2, 2)
    assert one["per_replica_batch_size"] == 8 and two["per_replica_batch_size"] == 4
    assert one["global_batch_size"] == two["global_batch_size"] == 8
    loss_1 = np.array([h["loss"] for h in one["history"]])
    loss_2 = np.array([h["loss"] for h in two["history"]])
    assert len(loss_1) == len(loss_2) == STEPS
    diff = np.abs(loss_2 - loss_1)
    print(f"max |loss_2w - loss_1w| over {STEPS} steps: {diff.max():.2e} "
          f"(tolerance {LOSS_TOLERANCE:.0e}); first step {diff[0]:.2e}")
    assert diff.max() < LOSS_TOLERANCE, diff
    assert loss_1[-5:].mean() < loss_1[:5].mean() - 0.5  # it trains
    np.testing.assert_allclose([h["grad_norm"] for h in two["history"]],
                               [h["grad_norm"] for h in one["history"]], rtol=1e-2)
    # Only the chief wrote checkpoints and TensorBoard events.
    assert two["last_checkpoint"].endswith(f"ckpt-{STEPS}")
    assert any(f.startswith("events.out") for f in os.listdir(tmp_path / "two" / "logs"))
    assert os.path.isfile(tmp_path / "two" / "logs" / "worker-1.log")


def test_worker_failure_is_reported_and_stops_the_cluster(train_file, tmp_path):
    job = job_lib.TrainingJob(
        pipeline_config=get_config("tiny").to_json(), train_files=[str(tmp_path / "missing*.gz")],
        checkpoint_dir=str(tmp_path / "ckpt"), log_dir=str(tmp_path / "logs"),
        result_path=str(tmp_path / "result.json"), peak_flops_per_device=1e11)
    with pytest.raises(RuntimeError, match=r"training worker \d of 2 exited with code"):
        launcher.run_workers(job, 2, job_dir=str(tmp_path / "logs"), timeout_s=300)


MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys, tempfile
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from components.trainer import data, strategy, train_loop
    from config import get_config
    config = get_config("tiny", {"train.train_steps": 8, "train.log_every": 1,
                                 "train.checkpoint_every": 8, "train.grad_accum_steps": 2})
    tc = config.train
    def dataset_fn():
        return data.make_train_dataset(sys.argv[1], tc.seq_len, tc.batch_size,
                                       tc.shuffle_buffer, tc.seed)
    out = {}
    for name, s in (("one", strategy.make_strategy("one_device")),
                    ("mirrored", strategy.make_strategy("mirrored", ["/cpu:0", "/cpu:1"]))):
        d = tempfile.mkdtemp()
        r = train_loop.train(config, dataset_fn, d + "/ckpt", None, strategy=s)
        out[name] = {"losses": [h["loss"] for h in r.history], "strategy": r.strategy,
                     "replicas": r.num_replicas, "per_replica": r.per_replica_batch_size}
    print("RESULT " + json.dumps(out))
""")


def test_mirrored_over_two_local_devices_follows_one_device(train_file):
    result = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT, train_file],
                            capture_output=True, text=True, timeout=900,
                            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out["mirrored"]["strategy"] == "MirroredStrategy"
    assert out["mirrored"]["replicas"] == 2 and out["mirrored"]["per_replica"] == 2  # 8/(2x2)
    np.testing.assert_allclose(out["mirrored"]["losses"], out["one"]["losses"], atol=1e-4)


def test_sft_with_uneven_responses_on_two_workers_and_two_micro_batches(tmp_path):
    """SFT records whose response lengths differ from 1 to 30 tokens: 2 worker processes x
    2 micro-batches take the first step of 1 worker with 1 batch (same loss and gradient
    norm: the loss is a sum over the global batch's response tokens over their count)."""
    from numerics import assert_float32_close

    from components.trainer import data

    rng = np.random.default_rng(5)
    records = []
    for i in range(64):
        prompt, response = 1 + (7 * i) % 20, 1 + (11 * i) % 30
        ids = rng.integers(3, 512, prompt + response).tolist() + [1]
        records.append((ids[:32] if len(ids) > 33 else ids, prompt, response))
    path = str(tmp_path / "sft-00000-of-00001.gz")
    data.write_sft_examples(path, records)
    out = {}
    for workers, micro in ((1, 1), (2, 2)):
        config = get_config("tiny", {"train.train_steps": 1, "train.log_every": 1,
                                     "train.grad_accum_steps": micro, "data.task": "sft"})
        workdir = tmp_path / f"w{workers}"
        job = job_lib.TrainingJob(
            pipeline_config=config.to_json(), train_files=[path],
            checkpoint_dir=str(workdir / "ckpt"), log_dir=str(workdir / "logs"),
            result_path=str(workdir / "result.json"), peak_flops_per_device=1e11)
        launcher.run_workers(job, workers, job_dir=str(workdir / "logs"), timeout_s=900)
        with open(job.result_path) as f:
            out[workers] = json.load(f)
    assert out[2]["num_workers"] == 2 and out[2]["grad_accum_steps"] == 2
    first = {w: out[w]["history"][0] for w in out}
    # As test_trainer_finetune's replica test: 8 ulps for the loss, the gradient's 256.
    assert_float32_close(first[2]["loss"], first[1]["loss"], ulps=8, err_msg="loss")
    assert_float32_close(first[2]["grad_norm"], first[1]["grad_norm"], ulps=256,
                         err_msg="grad norm")
