"""One replica of a cluster that a platform started (Vertex AI CustomJob worker pools, a
Kubeflow TFJob): TF_CONFIG comes from the environment, not from `launcher.py`.

Each replica runs TFX's Trainer executor, and so `run_fn`, in a process where TensorFlow is
already initialized; MultiWorkerMirroredStrategy must configure its collectives at program
startup. So a replica runs the same path as `--num-workers N` locally, one worker per
machine: `run_platform_worker` starts ONE child `python -m components.trainer.worker
JOB.json` that inherits the platform's TF_CONFIG, and waits for it. The chief task then
reads the trained model back from the final checkpoint (`trained_model`) and `run_fn`
evaluates and exports it; the other replicas return after training.

The job file and the result file are local to each replica (`job_dir`, a temporary
directory by default): every replica computes the same job from the same inputs, and the
chief copies its result to `job.result_path` (which may be on `gs://`) for `run_fn`.
Checkpoints go to `job.checkpoint_dir`, storage every replica reads (under the pipeline
root on Vertex AI).

A worker that exits 143 (SIGTERM: it saved a checkpoint, `preemption.py`) raises
`Preempted`; any other failure raises `WorkerExitError` with the exit code. Either way the
replica fails and the platform's restart (or the task's retry policy) resumes from the
last checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading

from components.trainer.launcher import WORKER_MODULE, log_tail, tee_output
from components.trainer.preemption import PREEMPTED_EXIT_CODE, Preempted, sigterm_handler
from components.trainer.strategy import cluster_size

log = logging.getLogger(__name__)


class WorkerExitError(RuntimeError):
    """The replica's training worker exited with a non-zero code (`exit_code`)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def platform_cluster(environ: dict | None = None) -> dict | None:
    """TF_CONFIG from the environment when it names more than one chief/worker task,
    else None (no TF_CONFIG, or a one-task cluster: train in this process as usual).

    Raises:
      ValueError: TF_CONFIG is not JSON, or has no `task` of type chief/worker.
    """
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    if not raw:
        return None
    try:
        config = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"TF_CONFIG is not JSON ({e.msg}): {raw[:200]}") from None
    if cluster_size(config) <= 1:
        return None
    task = config.get("task", {})
    if task.get("type") not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG task {task!r}: this replica must be a 'chief' or "
                         f"'worker' task of MultiWorkerMirroredStrategy")
    return config


def is_chief(config: dict) -> bool:
    """TensorFlow's rule: the `chief` task, or worker 0 when the cluster has no chief."""
    task = config["task"]
    if task["type"] == "chief":
        return True
    return "chief" not in config["cluster"] and int(task.get("index", 0)) == 0


def run_platform_worker(job, job_dir: str | None = None) -> None:
    """Runs this replica's part of `job` in one child worker process under the platform's
    TF_CONFIG; returns when it succeeded. On the chief, the result is then at
    `job.result_path`.

    SIGTERM to this process (a preempted VM, a deleted pod) is passed on to the worker,
    which saves a checkpoint and exits; its exit code is raised here.

    Args:
      job: the `TrainingJob` (`job.py`) that `run_fn` built; not modified.
      job_dir: a local directory for the job file, the worker's log and its result
        (default: a new temporary directory).

    Raises:
      ValueError: no multi-task TF_CONFIG in the environment (`platform_cluster`).
      Preempted: the worker exited 143 (SIGTERM) after saving a checkpoint.
      WorkerExitError (a RuntimeError): the worker exited non-zero otherwise; the message
        names the exit code and holds the tail of its log.
    """
    config = platform_cluster()
    if config is None:
        raise ValueError("run_platform_worker: TF_CONFIG names no cluster of several "
                         "chief/worker tasks; train in this process instead")
    job_dir = job_dir or tempfile.mkdtemp(prefix="deepseek-tfx-worker-")
    os.makedirs(job_dir, exist_ok=True)
    task = f"{config['task']['type']}-{config['task'].get('index', 0)}"
    local = dataclasses.replace(job, num_workers=cluster_size(config),
                                result_path=os.path.join(job_dir, "train_result.json"))
    job_path = os.path.join(job_dir, "training_job.json")
    with open(job_path, "w") as f:
        f.write(local.to_json())
    log_path = os.path.join(job_dir, f"{task}.log")
    log.info("TF_CONFIG from the platform: %s of %d workers; worker log %s", task,
             local.num_workers, log_path)
    env = {**os.environ, "DEEPSEEK_TFX_PARENT_PID": str(os.getpid())}
    proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, job_path], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tee = threading.Thread(target=tee_output, args=(proc.stdout, log_path), daemon=True)
    tee.start()
    with _forward_sigterm(proc):
        try:
            code = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    tee.join(timeout=10)
    if code == PREEMPTED_EXIT_CODE:
        raise Preempted(f"training worker {task} preempted (SIGTERM; exit {code}): it saved "
                        f"a checkpoint in {job.checkpoint_dir}; log {log_path}")
    if code != 0:
        raise WorkerExitError(f"training worker {task} exited with code {code}; "
                              f"log {log_path}:\n{log_tail(log_path)}", code)
    if is_chief(config):
        if os.path.abspath(local.result_path) != os.path.abspath(job.result_path):
            import tensorflow as tf

            gfile = tf.io.gfile
            gfile.makedirs(os.path.dirname(job.result_path))
            gfile.copy(local.result_path, job.result_path, overwrite=True)


def _forward_sigterm(proc: subprocess.Popen):
    """While waiting (main thread only), SIGTERM here becomes SIGTERM to the worker."""

    def forward(signum, frame):
        log.warning("SIGTERM: passing it on to the training worker (pid %d)", proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)

    return sigterm_handler(forward)
