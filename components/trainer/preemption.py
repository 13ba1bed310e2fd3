"""Preemption: SIGTERM means "save at the next step boundary, then exit as preempted".

Kubernetes, Spot/preemptible VMs and batch schedulers send SIGTERM before they kill
a process. While `train_loop.train` runs, a `PreemptionWatcher` turns SIGTERM into a
request; after each optimizer step the loop asks `agreed()`, and when it is true
every worker saves a checkpoint of that step and raises `Preempted`. A worker
process then exits with `PREEMPTED_EXIT_CODE` (143 = 128 + SIGTERM), which the
launcher, the CLI and a cluster's restart policy (the Kubeflow Training Operator's
`restartPolicy: ExitCode` retries 128-255) read as "preempted, resumable": the next
run resumes from that step, not from the previous `checkpoint_every` boundary.

Agreement. Only some workers may get the signal, and at different moments; all of
them must save at the same step (saving runs collectives). With several workers
`agreed()` all-reduces each worker's request (a float32 scalar, SUM) once per step,
so every worker sees the same answer after the same step. One process (one device,
or MirroredStrategy over its local devices) reads its own request.

Why not `tf.distribute.experimental.PreemptionCheckpointHandler`: it saves outside the
loop's finite-weights check (`finite_guard.py`) with its own step counter (calls of
`run`, stored by adding a variable to our checkpoint), it is a no-op on GCE CPU
machines and probes the GCE metadata server to find out, and it exits the process
itself. The loop above keeps one step counter, one save path and one exit status on
every platform, for the price of one scalar all-reduce per step.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading

log = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # 143
# A worker whose collectives failed because a peer went away (tf.errors.UnavailableError,
# AbortedError, DeadlineExceededError, CancelledError): resumable as well.
PEER_LOST_EXIT_CODE = 75  # EX_TEMPFAIL (sysexits.h)


class Preempted(RuntimeError):
    """Training stopped on SIGTERM after saving a checkpoint.

    Attributes:
      step: the optimizer step saved (the run resumes from it), or -1 when unknown.
      checkpoint: the checkpoint's path prefix (".../ckpt-<step>"), or "".
    """

    EXIT_CODE = PREEMPTED_EXIT_CODE

    def __init__(self, message: str, step: int = -1, checkpoint: str = ""):
        super().__init__(message)
        self.step = step
        self.checkpoint = checkpoint


@contextlib.contextmanager
def sigterm_handler(handler):
    """While open, SIGTERM calls `handler(signum, frame)` instead of its previous handler,
    which is put back on exit. Handlers can only be installed from the main thread:
    elsewhere nothing is installed. Yields whether the handler was installed."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield True
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


class PreemptionWatcher:
    """Catches SIGTERM while training runs; a context manager.

    Inside the `with`, SIGTERM sets `requested` instead of killing the process
    (`sigterm_handler`; outside the main thread it keeps its previous meaning, logged).

    Args:
      strategy: the run's tf.distribute strategy; with several workers (`num_workers`
        > 1) `agreed` all-reduces the request across them.
      num_workers: worker processes in the run.
    """

    def __init__(self, strategy, num_workers: int):
        self.strategy = strategy
        self.num_workers = num_workers
        self.requested = threading.Event()
        self._handler = None
        self._reduce = None

    def __enter__(self) -> PreemptionWatcher:
        self._handler = sigterm_handler(lambda signum, frame: self.requested.set())
        if not self._handler.__enter__():
            log.info("not the main thread: SIGTERM is not watched for preemption here")
        return self

    def __exit__(self, *exc) -> None:
        self._handler.__exit__(*exc)

    def agreed(self) -> bool:
        """Whether any worker has been asked to stop. Every worker must call it after the
        same steps (it runs a collective when there are several)."""
        if self.num_workers <= 1:
            return self.requested.is_set()
        import tensorflow as tf

        if self._reduce is None:
            self._reduce = self._make_reduce()
        flag = tf.constant(1.0 if self.requested.is_set() else 0.0)
        return bool(self._reduce(flag).numpy() > 0)

    def _make_reduce(self):
        import tensorflow as tf

        strategy = self.strategy

        @tf.function(autograph=False)
        def reduce(flag):
            def replica_fn(value):
                value = tf.identity(value)  # an op on the replica's device, as collectives need
                return tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, value)

            per_replica = strategy.run(replica_fn, args=(flag,))
            return strategy.experimental_local_results(per_replica)[0]

        return reduce
