"""End to end: `deepseek-tfx run --num-workers 2`, killed with SIGKILL, then re-run.

The `tiny` preset on a slice of Tiny Shakespeare, 60 steps with a checkpoint
every 20, the Trainer as 2 MultiWorkerMirroredStrategy workers over loopback:

1. the command runs in a subprocess until the Trainer's first checkpoint is
   complete (its `checkpoint` state file exists), then gets `kill -9`; its
   worker processes die with it;
2. the same command again: upstream components come from the cache, the
   Trainer finds the same checkpoint directory (same inputs and config) and
   resumes from the last checkpoint; 5 steps later the command gets SIGTERM
   (a preemption): the workers checkpoint the step they reached and the command
   exits 143, "preempted";
3. the same command again resumes from that step (not from the last
   `checkpoint_every` boundary); 3 steps later worker 1 gets `kill -9`, and the
   Trainer restarts its 2 workers from the newest checkpoint within the same
   pipeline run and ends at step 60; ML Metadata records the restart and its
   reason, resumed_from_step, the strategy, replicas and throughput figures.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from components.trainer import heartbeat

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SLICE_BYTES = 60_000
# The third run kills worker 1 near step 30: the restarted group still has steps to run.
STEPS = 60


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shakespeare):
    path = tmp_path_factory.mktemp("corpus") / "shakespeare_slice.txt"
    text = shakespeare[:SLICE_BYTES]
    path.write_text(text[: text.rfind("\n\n") + 2], encoding="utf-8")
    return path


def command(corpus, out) -> list[str]:
    return [sys.executable, "-m", "cli", "run", "--data", str(corpus), "--preset", "tiny",
            "--output", str(out), "--num-workers", "2",
            "--set", f"train.train_steps={STEPS}", "--set", "train.checkpoint_every=20"]


def worker_processes(out) -> list[str]:
    """Command lines of live training workers of this output directory."""
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines()
            if "components.trainer.worker" in line and str(out) in line]


def start_until(corpus, out, log_path, worker: int, steps: int):
    """Starts the command and waits until its Trainer's worker `worker` (of this run, not
    an earlier one) is `steps` steps past the first step it reported. Returns (the process,
    that first step, the worker's last heartbeat)."""
    beats = os.path.join(out, "pipeline_root", "Trainer", "model_run", "*", f"heartbeat-{worker}")
    earlier = set(glob.glob(beats))  # earlier runs'
    with open(log_path, "w") as log:
        run = subprocess.Popen(command(corpus, out), cwd=PROJECT_ROOT, stdout=log,
                               stderr=subprocess.STDOUT)
    deadline, first = time.monotonic() + 600, None
    while True:
        assert run.poll() is None, f"run ended too soon:\n{log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"the Trainer made no {steps} steps in 10 minutes"
        live = [b for b in map(heartbeat.read, set(glob.glob(beats)) - earlier) if b and b.step]
        if live:
            first = first or live[0].step
            if live[0].step >= first + steps:
                return run, first, live[0]
        time.sleep(0.05)


def preempt_after_resume(corpus, out, log_path, checkpoint_dir) -> int:
    """Runs the command until the Trainer's chief is 5 steps past the step it resumed
    from, sends SIGTERM; returns the step the preemption checkpointed."""
    run, first, _ = start_until(corpus, out, log_path, 0, 5)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=300) == 143, log_path.read_text()[-4000:]
    text = log_path.read_text()
    saved = re.search(r"preempted \(SIGTERM to the Trainer\) at step (\d+); checkpoint", text)
    assert saved, text[-4000:]
    step = int(saved.group(1))
    assert "re-run the same command to resume from that step" in text
    assert step >= first + 5 and step % 20, step  # the step reached, not a boundary
    assert os.path.isfile(os.path.join(checkpoint_dir, f"ckpt-{step}.index"))
    assert not worker_processes(out)
    return step


def test_killed_run_resumes_from_its_last_checkpoint(corpus, tmp_path):
    out = tmp_path / "run"
    log_path = tmp_path / "first.log"
    with open(log_path, "w") as log:
        first = subprocess.Popen(command(corpus, out), cwd=PROJECT_ROOT, stdout=log,
                                 stderr=subprocess.STDOUT)
    state = os.path.join(out, "pipeline_root", "Trainer", "checkpoints", "*", "checkpoint")
    deadline = time.monotonic() + 600
    while not glob.glob(state):
        assert first.poll() is None, f"run ended before its first checkpoint:\n{log_path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint after 10 minutes"
        time.sleep(0.05)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    (checkpoint_dir,) = [os.path.dirname(p) for p in glob.glob(state)]
    killed_at = [p for p in os.listdir(checkpoint_dir) if p.endswith(".index")]
    assert killed_at and f"ckpt-{STEPS}.index" not in killed_at, killed_at
    for _ in range(50):  # the workers die with their parent (PR_SET_PDEATHSIG)
        if not worker_processes(out):
            break
        time.sleep(0.2)
    assert not worker_processes(out), worker_processes(out)

    preempted_at = preempt_after_resume(corpus, out, tmp_path / "second.log", checkpoint_dir)

    # The third run resumes from the preemption's step; kill -9 of its worker 1 makes the
    # Trainer restart its group from the newest checkpoint within the same pipeline run.
    third_log = tmp_path / "third.log"
    third, _, victim = start_until(corpus, out, third_log, 1, 3)
    os.kill(victim.pid, signal.SIGKILL)
    assert third.wait(timeout=900) == 0, third_log.read_text()[-4000:]
    (log_file,) = set(re.findall(r"^log: (\S+)$", third_log.read_text(), re.M))
    text = open(log_file).read()  # the command's log: the Trainer's and workers' lines
    assert f"resumed from {checkpoint_dir}/ckpt-{preempted_at} (step {preempted_at})" in text
    assert "restart 1 of at most 2: worker 1 of 2 killed by SIGKILL" in text

    from reporting.run_summary import latest_run

    runs = {r.component: r for r in latest_run(str(out / "metadata.db"))}
    assert runs["Transform"].state == "CACHED"
    assert runs["Trainer"].state == "COMPLETE"
    model = runs["Trainer"].outputs["Model"]
    assert model["restarts"] == 1 and "worker 1 of 2 killed by SIGKILL" in model["restart_reasons"]
    assert model["resumed_from_step"] >= preempted_at  # the restarted group's start
    assert model["train_steps"] == STEPS
    assert model["steps_run"] == STEPS - model["resumed_from_step"]
    assert model["tokens_seen"] == STEPS * 8 * 32
    assert model["strategy"] == "MultiWorkerMirroredStrategy"
    assert model["num_replicas"] == 2 and model["num_workers"] == 2
    assert model["per_replica_batch_size"] == 4 and model["global_batch_size"] == 8
    assert model["precision"] == "float32"
    assert model["tokens_per_second"] > 0 and 0 < model["mfu"] < 1
    assert model["train_wall_s"] > 0 and model["checkpoint_dir"] == checkpoint_dir
    summary = json.load(open(os.path.join(model["uri"], "training_summary.json")))
    assert summary["resumed_from_step"] == model["resumed_from_step"]
    (restart,) = summary["restart_log"]
    assert restart["cause"] == "lost" and restart["resumed_from_step"] == model["resumed_from_step"]
    # The whole run's history across its three attempts and the restart: the checkpoints
    # bring back the records before them (tiny logs every 5 steps, and each attempt's
    # first step).
    steps = [h["step"] for h in summary["history"]]
    assert steps == sorted(set(steps)) and steps[0] == 1 and steps[-1] == STEPS, steps
    assert set(range(5, STEPS + 1, 5)) <= set(steps), steps
    assert os.path.isfile(os.path.join(checkpoint_dir, f"ckpt-{STEPS}.index"))
    assert runs["Pusher"].outputs["PushedModel"]["pushed"] == 1
    assert not worker_processes(out)
