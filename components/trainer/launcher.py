"""Runs a training job as an N-worker MultiWorkerMirroredStrategy cluster on this machine.

`run_workers(job, n)` picks n free loopback ports, starts n worker processes
(`python -m components.trainer.worker JOB.json`), each with its own TF_CONFIG
(`{"cluster": {"worker": ["127.0.0.1:p0", ...]}, "task": {"type": "worker",
"index": i}}`; worker 0 is the chief), waits for all of them, and on the first
failure kills the others and raises with the failing worker's log.

All n workers are child processes, the caller included none: the Trainer runs
inside the TFX process, where TensorFlow is already initialized, and
MultiWorkerMirroredStrategy can only configure collective ops at program
startup ("Collective ops must be configured at program startup"). Workers die
with their parent (each sets PR_SET_PDEATHSIG on Linux first thing, plus a
watchdog on the parent pid), so `kill -9` of the pipeline leaves no orphan
blocked in a collective.

Logs: worker i writes to `<log_dir>/worker-<i>.log`; the chief's lines are
also echoed to this process's stderr.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time

from components.trainer.job import TrainingJob

log = logging.getLogger(__name__)

WORKER_MODULE = "components.trainer.worker"


def free_ports(n: int) -> list[int]:
    """n distinct TCP ports free on 127.0.0.1 right now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                 for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def tf_config(ports: list[int], index: int) -> dict:
    return {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index}}


def _tee(stream, path: str) -> None:
    with open(path, "w") as f:
        for line in iter(stream.readline, ""):
            f.write(line)
            f.flush()
            sys.stderr.write(line)
    stream.close()


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def run_workers(job: TrainingJob, num_workers: int, job_dir: str,
                timeout_s: float | None = None) -> None:
    """Runs `job` on `num_workers` local worker processes; returns when all succeeded.

    Args:
      job: the training job (its `num_workers` is set to `num_workers`).
      num_workers: N >= 1.
      job_dir: where the job file and the worker logs go.
      timeout_s: kill everything and raise after this long (None: no limit).

    Raises:
      RuntimeError: a worker failed (its exit code and the tail of its log),
        or the timeout passed.
    """
    os.makedirs(job_dir, exist_ok=True)
    cpus = os.cpu_count() or 1
    job.num_workers = num_workers
    if not job.intra_op_threads:
        job.intra_op_threads = max(1, cpus // num_workers)
    job_path = os.path.join(job_dir, "training_job.json")
    with open(job_path, "w") as f:
        f.write(job.to_json())
    ports = free_ports(num_workers)
    log.info("starting %d workers on 127.0.0.1 ports %s (%d intra-op threads each)",
             num_workers, ports, job.intra_op_threads)

    procs, logs, threads = [], [], []
    try:
        for i in range(num_workers):
            env = {**os.environ, "TF_CONFIG": json.dumps(tf_config(ports, i)),
                   "DEEPSEEK_TFX_PARENT_PID": str(os.getpid())}
            path = os.path.join(job_dir, f"worker-{i}.log")
            logs.append(path)
            cmd = [sys.executable, "-m", WORKER_MODULE, job_path]
            if i == 0:
                p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
                t = threading.Thread(target=_tee, args=(p.stdout, path), daemon=True)
                t.start()
                threads.append(t)
            else:
                with open(path, "w") as out:
                    p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
            procs.append(p)

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i = failed[0]
                _kill(procs)
                for t in threads:
                    t.join(timeout=5)
                raise RuntimeError(
                    f"training worker {i} of {num_workers} exited with code {codes[i]}; "
                    f"log {logs[i]}:\n{_tail(logs[i])}")
            if all(c == 0 for c in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                _kill(procs)
                raise RuntimeError(f"training workers timed out after {timeout_s} s; logs: {logs}")
            time.sleep(0.2)
        for t in threads:
            t.join(timeout=5)
    except BaseException:
        _kill(procs)
        raise


def _kill(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(timeout=10)
