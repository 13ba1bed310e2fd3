"""A DeepSeek-V4-style run (`tiny_v4`) on loopback workers, on Tang and Song poems (UTF-8
bytes as token ids): two workers follow one worker step for step, and a worker killed with
SIGKILL mid-run is restarted from the last checkpoint and ends with the uninterrupted
run's loss, by the same rules as the V3 runs (tests/components/test_trainer_distributed.py:
LOSS_TOLERANCE between layouts, RESTART_ULPS after a restart). The hash tables are built
from the same token counts on every worker and restored with the checkpoint, so the
restarted worker routes as before.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
from fault_injection import run_cluster_job
from numerics import assert_float32_close

from config import get_config

pytestmark = pytest.mark.slow  # worker processes: TensorFlow imports, a loopback cluster

STEPS = 12
CHECKPOINT_EVERY = 6
KILL_AFTER = 9  # between the checkpoints at steps 6 and 12: the restart resumes from 6
LOSS_TOLERANCE = 1e-3  # as test_trainer_distributed.py (measured there: ~2e-5)
RESTART_ULPS = 4  # as test_trainer_distributed.py


@pytest.fixture(scope="module")
def poem_file(chinese_poems, tmp_path_factory):
    from components.trainer import data

    path = str(tmp_path_factory.mktemp("poems") / "train-00000-of-00001.gz")
    data.write_examples(path, [[b + 3 for b in poem.encode("utf-8")]
                               for poem in chinese_poems[:300]])
    return path


def run_cluster(num_workers: int, train_file: str, workdir, faults=()) -> dict:
    config = get_config("tiny_v4", {"train.train_steps": STEPS, "train.log_every": 1,
                                    "train.checkpoint_every": CHECKPOINT_EVERY})
    return run_cluster_job(config, num_workers, train_file, workdir, faults)


def test_two_workers_follow_one_and_a_killed_worker_resumes_to_the_same_loss(poem_file,
                                                                             tmp_path):
    one = run_cluster(1, poem_file, tmp_path / "one")
    two = run_cluster(2, poem_file, tmp_path / "two")
    killed = run_cluster(2, poem_file, tmp_path / "killed",
                         faults=((1, signal.SIGKILL, KILL_AFTER),))
    assert (two["num_workers"], two["global_batch_size"]) == (2, one["global_batch_size"])
    loss_1 = np.array([h["loss"] for h in one["history"]])
    loss_2 = np.array([h["loss"] for h in two["history"]])
    assert len(loss_1) == len(loss_2) == STEPS
    diff = np.abs(loss_2 - loss_1)
    print(f"tiny_v4: max |loss_2w - loss_1w| over {STEPS} steps {diff.max():.2e}; final "
          f"losses 1w {loss_1[-1]:.6f} 2w {loss_2[-1]:.6f} killed {killed['final_loss']:.6f}; "
          f"1w mean loss of the first 3 steps {loss_1[:3].mean():.4f}, last 3 "
          f"{loss_1[-3:].mean():.4f}")
    assert diff.max() < LOSS_TOLERANCE, diff
    assert loss_1[-3:].mean() < loss_1[:3].mean()  # it trains
    assert one["tid2eid"]["tokens_counted"] == two["tid2eid"]["tokens_counted"] > 0
    (lost,) = killed["restarts"]
    assert lost["cause"] == "lost" and lost["resumed_from_step"] == CHECKPOINT_EVERY, lost
    # The history is the whole run's: steps 1-6 came back with the checkpoint.
    assert [h["step"] for h in killed["history"]] == list(range(1, STEPS + 1))
    assert_float32_close(killed["final_loss"], two["final_loss"], ulps=RESTART_ULPS,
                         err_msg="final loss after kill -9 and resume")
