"""Runs a training job as an N-worker MultiWorkerMirroredStrategy cluster on this machine,
and keeps it running through lost, hung and preempted workers.

`run_workers(job, n, job_dir)` picks n free loopback ports, starts n worker processes
(`python -m components.trainer.worker JOB.json`), each with its own TF_CONFIG
(`{"cluster": {"worker": ["127.0.0.1:p0", ...]}, "task": {"type": "worker",
"index": i}}`; worker 0 is the chief), and waits for all of them.

Elastic restarts (`train.max_restarts`, `train.min_workers`, `train.heartbeat_timeout_s`):

  a worker dies (killed by a signal: kill -9, the OOM killer, a lost node), hangs (no
  heartbeat, `heartbeat.py`, for heartbeat_timeout_s: SIGSTOP, a collective whose
  peer is gone), is preempted (exit 143) or loses its peer (exit 75)
      -> the launcher stops the whole group and starts it again, on fresh ports, from
         the newest checkpoint, up to max_restarts times within this call;
  a worker fails with any other error (exit 1: a bad input, a non-finite loss)
      -> no restart: RuntimeError with the worker's log tail (a restart would fail
         the same way).

A worker that was killed or hung is a lost slot. With `min_workers` below the group's
size the restart continues on the slots left (never fewer than min_workers), keeping
the global batch: `train.grad_accum_steps` grows so that micro-batches x replicas x
per-replica batch is still `train.batch_size` (`shrunk_layout`), and the resumed run
skips exactly the batches already drawn (`data.distribute_global_batches`). With
min_workers = 0 (the default: the group's size) a lost slot is replaced.

Preemption (`preemption.py`): SIGTERM to this process (the Trainer) is passed on to
every worker; they save a checkpoint at the same step boundary and exit 143; this
call then raises `Preempted`. Workers still running `train.preemption_grace_s` later
are killed.

All n workers are child processes, the caller included none: the Trainer runs inside
the TFX process, where TensorFlow is already initialized, and
MultiWorkerMirroredStrategy can only configure collective ops at program startup
("Collective ops must be configured at program startup"). Workers die with their
parent (each sets PR_SET_PDEATHSIG on Linux first thing, plus a watchdog on the parent
pid), so `kill -9` of the pipeline leaves no orphan blocked in a collective.

Logs: worker i writes to `<job_dir>/worker-<i>.log` (`worker-<i>.restart-<r>.log` after
restart r); the chief's lines are also echoed to this process's stderr.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from components.trainer import heartbeat
from components.trainer.job import TrainingJob
from components.trainer.preemption import (
    PEER_LOST_EXIT_CODE,
    PREEMPTED_EXIT_CODE,
    Preempted,
    sigterm_handler,
)
from config import PipelineConfig

log = logging.getLogger(__name__)

WORKER_MODULE = "components.trainer.worker"
# x heartbeat_timeout_s before a worker process's first step: its start-up, the cluster's
# rendezvous, restoring a checkpoint and tracing the step (a restarted worker's first
# beat is the step it resumes from, so "first" is per process, not step 0).
STARTUP_ALLOWANCE = 5


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


@dataclasses.dataclass
class Restart:
    """One restart of the worker group (`run_workers`' return value lists them).

    Attributes:
      restart: 1 for the first restart, 2 for the second, ...
      cause: "lost" (killed by a signal), "hung" (no heartbeat), "preempted" (exit 143)
        or "peer_lost" (exit 75).
      reason: one line naming the worker, e.g. "worker 1 of 2 killed by SIGKILL at step 31".
      workers_before, workers_after: the group's size before and after.
      grad_accum_steps: micro-batches per step after the restart.
      resumed_from_step: the checkpoint's step the new group resumes from (0: none).
      at: when the failure was found (unix time, seconds).
    """

    restart: int
    cause: str
    reason: str
    workers_before: int
    workers_after: int
    grad_accum_steps: int
    resumed_from_step: int
    at: float


@dataclasses.dataclass
class _Failure:
    cause: str  # "lost" | "hung" | "preempted" | "peer_lost" | "error" | "timeout"
    worker: int
    code: int | None
    reason: str
    lost: set[int]  # slots lost (killed by a signal or hung)
    at: float = dataclasses.field(default_factory=time.time)  # when it was found


def shrunk_layout(batch_size: int, grad_accum_steps: int, workers: int, available: int,
                  min_workers: int) -> tuple[int, int]:
    """(workers, grad_accum_steps) for a restart on at most `available` workers.

    The most workers in [min_workers, available] on which `batch_size` still splits
    into micro-batches no larger than today's (`batch_size / (grad_accum_steps x
    workers)`, one replica per worker), with the fewest micro-batches that do.

    Raises:
      ValueError: no worker count from min_workers to available splits the batch.
    """
    per_replica = batch_size // (grad_accum_steps * workers)
    for n in range(available, max(min_workers, 1) - 1, -1):
        for k in range(1, batch_size // n + 1):
            if batch_size % (k * n) == 0 and batch_size // (k * n) <= per_replica:
                return n, k
    raise ValueError(f"train.batch_size={batch_size} does not split over {min_workers} to "
                     f"{available} workers with micro-batches of at most {per_replica}")


def run_workers(job: TrainingJob, num_workers: int, job_dir: str,
                timeout_s: float | None = None) -> list[Restart]:
    """Runs `job` on `num_workers` local worker processes, restarting them as the module
    docstring says; returns when the job is done.

    Args:
      job: the training job (its `num_workers`, `intra_op_threads` and the config's
        `train.grad_accum_steps` are set for each group started).
      num_workers: N >= 1.
      job_dir: where the job file, the heartbeats and the worker logs go.
      timeout_s: kill everything and raise after this long in all (None: no limit).

    Returns:
      The restarts, in order ([] when the first group finished).

    Raises:
      RuntimeError: a worker failed with an error (its exit code and log tail), the
        restarts ran out (each restart's reason), or the timeout passed.
      Preempted: this process got SIGTERM; the workers saved a checkpoint first.
    """
    os.makedirs(job_dir, exist_ok=True)
    config = PipelineConfig.from_json(job.pipeline_config)
    tc = config.train
    min_workers = tc.min_workers or num_workers
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    restarts: list[Restart] = []
    workers, accum = num_workers, tc.grad_accum_steps
    with _SigtermToWorkers() as sigterm:
        while True:
            _set_layout(job, config, workers, accum)
            failure = _run_group(job, workers, job_dir, len(restarts), tc, deadline, sigterm)
            if failure is None:
                return restarts
            step = _checkpoint_step(job.checkpoint_dir)
            if sigterm.received.is_set():
                path = _checkpoint_path(job.checkpoint_dir, step)
                raise Preempted(f"preempted (SIGTERM to the Trainer) at step {step}; "
                                f"checkpoint {path} ({failure.reason})", step, path)
            if failure.cause in ("error", "timeout"):
                raise RuntimeError(failure.reason)
            if len(restarts) >= tc.max_restarts:
                history = "; ".join(r.reason for r in restarts)
                raise RuntimeError(f"{failure.reason}; no restart left (train.max_restarts="
                                   f"{tc.max_restarts}{'; before: ' + history if history else ''})")
            before = workers
            if min_workers < workers and failure.lost:
                workers, accum = shrunk_layout(tc.batch_size, accum, workers,
                                               workers - len(failure.lost), min_workers)
            restart = Restart(len(restarts) + 1, failure.cause, failure.reason, before,
                              workers, accum, step, round(failure.at, 3))
            restarts.append(restart)
            log.warning("restart %d of at most %d: %s; resuming from step %d on %d worker(s) "
                        "(%d micro-batch(es) per step)", restart.restart, tc.max_restarts,
                        failure.reason, step, workers, accum)


def _set_layout(job: TrainingJob, config: PipelineConfig, workers: int, accum: int) -> None:
    """Points `job` at a group of `workers` with `accum` micro-batches per step."""
    train = dataclasses.replace(config.train, grad_accum_steps=accum)
    job.pipeline_config = dataclasses.replace(config, train=train).to_json()
    job.num_workers = workers
    job.intra_op_threads = max(1, (os.cpu_count() or 1) // workers)


def _run_group(job: TrainingJob, n: int, job_dir: str, restart: int, tc, deadline,
               sigterm: _SigtermToWorkers) -> _Failure | None:
    """Starts n workers and watches them until all succeed (None) or the group fails."""
    suffix = f".restart-{restart}" if restart else ""
    job_path = os.path.join(job_dir, "training_job.json")
    with open(job_path, "w") as f:
        f.write(job.to_json())
    ports = free_ports(n)
    log.info("starting %d workers on 127.0.0.1 ports %s (%d intra-op threads each)",
             n, ports, job.intra_op_threads)
    beats = [os.path.join(job_dir, f"heartbeat-{i}") for i in range(n)]
    for path in beats:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
    group = _Group(n)
    try:
        for i in range(n):
            env = {**os.environ, "TF_CONFIG": json.dumps(tf_config(ports, i)),
                   "DEEPSEEK_TFX_PARENT_PID": str(os.getpid()),
                   heartbeat.HEARTBEAT_ENV: beats[i]}
            group.start(i, [sys.executable, "-m", WORKER_MODULE, job_path], env,
                        os.path.join(job_dir, f"worker-{i}{suffix}.log"))
        sigterm.group = group
        return _watch(group, beats, tc, deadline, sigterm)
    finally:
        sigterm.group = None
        group.kill()


def _watch(group: _Group, beats: list[str], tc, deadline, sigterm) -> _Failure | None:
    n, started = group.n, time.time()
    first_beat: list[int | None] = [None] * n  # each process's first beat: where it starts
    while True:
        codes = group.poll()
        if all(c == 0 for c in codes):
            group.join_logs()
            return None
        if sigterm.received.is_set():
            if sigterm.forwarded_to is not group:  # it came before the group started
                group.signal(signal.SIGTERM)
            return _wait_for_preempted(group, tc.preemption_grace_s, "SIGTERM to the Trainer")
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            preempted = [i for i in failed if codes[i] in (PREEMPTED_EXIT_CODE, -signal.SIGTERM)]
            if preempted:
                return _wait_for_preempted(group, tc.preemption_grace_s,
                                           f"worker(s) {preempted} of {n} preempted (SIGTERM)")
            return _classify(group, codes, beats)
        now = time.time()
        stale = []
        for i in range(n):
            beat = heartbeat.read(beats[i])
            step, last = (beat.step, beat.time) if beat else (0, started)
            if beat and first_beat[i] is None:
                first_beat[i] = beat.step
            starting = beat is None or beat.step == first_beat[i]  # no step done yet
            allowance = tc.heartbeat_timeout_s * (STARTUP_ALLOWANCE if starting else 1)
            if codes[i] is None and now - last > allowance:
                stale.append(i)
        if stale:
            # The others wait for the hung one in a collective: name the one behind.
            i = _hung_worker(group, beats, stale)
            beat = heartbeat.read(beats[i])
            step, last = (beat.step, beat.time) if beat else (0, started)
            return _Failure("hung", i, None, f"worker {i} of {n} hung{_stopped_note(group, i)}: "
                            f"no heartbeat for {now - last:.0f} s after step {step} "
                            f"(train.heartbeat_timeout_s={tc.heartbeat_timeout_s:g})", {i})
        if deadline is not None and time.monotonic() > deadline:
            return _Failure("timeout", 0, None, f"training workers timed out; logs: "
                            f"{group.logs}", set())
        time.sleep(0.2)


def _classify(group: _Group, codes: list[int | None], beats: list[str]) -> _Failure:
    """The failure of a group where some worker exited non-zero (not 143)."""
    n = group.n
    killed = [i for i, c in enumerate(codes) if c is not None and c < 0]
    if killed:
        i = killed[0]
        beat = heartbeat.read(beats[i])
        step = beat.step if beat else 0
        return _Failure("lost", i, codes[i], f"worker {i} of {n} killed by "
                        f"{signal.Signals(-codes[i]).name} after step {step}", set(killed))
    i = next(i for i, c in enumerate(codes) if c not in (None, 0))
    if codes[i] == PEER_LOST_EXIT_CODE:
        # A peer went away: whoever else exits within a moment says which; else a live
        # one that is stopped or behind (TensorFlow's coordination service aborts the
        # collectives when a task misses its own heartbeats).
        time.sleep(2.0)
        codes = group.poll()
        if any(c is not None and c < 0 for c in codes):
            return _classify(group, codes, beats)
        live = [j for j, c in enumerate(codes) if c is None]
        if live:
            j = _hung_worker(group, beats, live)
            beat = heartbeat.read(beats[j])
            return _Failure("hung", j, None, f"worker {j} of {n} hung{_stopped_note(group, j)} "
                            f"after step {beat.step if beat else 0} (worker {i} lost it: exit "
                            f"{PEER_LOST_EXIT_CODE})", {j})
        return _Failure("peer_lost", i, codes[i],
                        f"worker {i} of {n} lost its peer (exit {PEER_LOST_EXIT_CODE})", set())
    return _Failure("error", i, codes[i], f"training worker {i} of {n} exited with code "
                    f"{codes[i]}; log {group.logs[i]}:\n{log_tail(group.logs[i])}", set())


def _hung_worker(group: _Group, beats: list[str], candidates: list[int]) -> int:
    """Of `candidates`, the stopped one (SIGSTOP), else the one with the fewest steps and
    the oldest heartbeat."""
    stopped = [i for i in candidates if _process_state(group.procs[i].pid) == "T"]
    if stopped:
        return stopped[0]

    def behind(i):
        beat = heartbeat.read(beats[i])
        return (beat.step, beat.time) if beat else (-1, 0.0)

    return min(candidates, key=behind)


def _process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ("T": stopped), or "" where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _stopped_note(group: _Group, i: int) -> str:
    return " (stopped: SIGSTOP)" if _process_state(group.procs[i].pid) == "T" else ""


def _wait_for_preempted(group: _Group, grace_s: float, why: str) -> _Failure:
    """Waits up to grace_s for every worker to save and exit (143), then kills the rest."""
    end = time.monotonic() + grace_s
    while time.monotonic() < end and any(c is None for c in group.poll()):
        time.sleep(0.2)
    codes = group.poll()
    late = [i for i, c in enumerate(codes) if c is None]
    if late:
        log.warning("workers %s still running %.0f s after SIGTERM: killed", late, grace_s)
    worker = next((i for i, c in enumerate(codes) if c == PREEMPTED_EXIT_CODE), 0)
    return _Failure("preempted", worker, PREEMPTED_EXIT_CODE,
                    f"{why}; exit codes {codes}", set())


def _checkpoint_step(checkpoint_dir: str) -> int:
    """The step of the newest checkpoint in checkpoint_dir (0: none)."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(checkpoint_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def _checkpoint_path(checkpoint_dir: str, step: int) -> str:
    return f"{checkpoint_dir.rstrip('/')}/ckpt-{step}" if step else ""


class _Group:
    """The worker processes of one group; worker 0's output is echoed to stderr."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[subprocess.Popen] = []
        self.logs: list[str] = []
        self.threads: list[threading.Thread] = []

    def start(self, i: int, cmd: list[str], env: dict, log_path: str) -> None:
        self.logs.append(log_path)
        if i == 0:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
            t = threading.Thread(target=tee_output, args=(p.stdout, log_path), daemon=True)
            t.start()
            self.threads.append(t)
        else:
            with open(log_path, "w") as out:
                p = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)

    def poll(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def signal(self, signum: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signum)

    def join_logs(self) -> None:
        for t in self.threads:
            t.join(timeout=5)

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
        for p in self.procs:
            with contextlib.suppress(Exception):
                p.wait(timeout=10)
        self.join_logs()


class _SigtermToWorkers:
    """While open (main thread only), SIGTERM to this process is recorded and passed on
    to the running group's workers (`preemption.sigterm_handler`)."""

    def __init__(self):
        self.received = threading.Event()
        self.group: _Group | None = None
        self.forwarded_to: _Group | None = None
        self._handler = sigterm_handler(self._on_sigterm)

    def __enter__(self) -> _SigtermToWorkers:
        self._handler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._handler.__exit__(*exc)

    def _on_sigterm(self, signum, frame) -> None:
        del frame
        self.received.set()
        group = self.group
        if group is not None and self.forwarded_to is not group:
            self.forwarded_to = group
            group.signal(signum)


def tee_output(stream, path: str) -> None:
    """Copies a worker's output lines to `path` and to this process's stderr."""
    with open(path, "w") as f:
        for line in iter(stream.readline, ""):
            f.write(line)
            f.flush()
            sys.stderr.write(line)
    stream.close()


def log_tail(path: str, lines: int = 40) -> str:
    """The last `lines` lines of a worker's log, or "(no log)"."""
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"
