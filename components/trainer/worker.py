"""Entry point of one training worker process (started by `launcher.py`).

  TF_CONFIG=... python -m components.trainer.worker TRAINING_JOB.json

Runs `job.run` under the TF_CONFIG it was given. Exit status:

  0    trained to `train.train_steps`
  143  preempted (`preemption.PREEMPTED_EXIT_CODE`): SIGTERM, checkpoint saved first
  75   a peer went away (`preemption.PEER_LOST_EXIT_CODE`): the collectives failed
       with UnavailableError, AbortedError, DeadlineExceededError or CancelledError
  1    any other error (traceback on stderr): not worth a restart

Exits at once if its parent dies (when started by the local launcher).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit if it already has."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the watchdog thread below still applies
    if os.getppid() != parent_pid:
        os._exit(3)
    threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _watch_parent(parent_pid: int) -> None:
    while True:
        if os.getppid() != parent_pid:
            os._exit(3)
        time.sleep(1.0)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} TRAINING_JOB.json", file=sys.stderr)
        return 2
    _die_with_parent(int(os.environ.get("DEEPSEEK_TFX_PARENT_PID", os.getppid())))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "apache_beam", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from components.trainer import job as job_lib

    # No heartbeat here: a process's first beat is the step its loop starts from (0, or
    # the step it resumed from), which the launcher's start-up allowance keys on.
    with open(argv[1]) as f:
        job = job_lib.TrainingJob.from_json(f.read())
    return run_job(job)


def run_job(job) -> int:
    """Runs `job` (`job.run`) and returns the worker's exit status (module docstring)."""
    import tensorflow as tf

    from components.trainer import job as job_lib
    from components.trainer.preemption import PEER_LOST_EXIT_CODE, PREEMPTED_EXIT_CODE, Preempted

    try:
        job_lib.run(job)
    except Preempted as e:
        logging.getLogger(__name__).warning("%s", e)
        return PREEMPTED_EXIT_CODE
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.DeadlineExceededError, tf.errors.CancelledError) as e:
        logging.getLogger(__name__).error("a peer went away: %s: %s", type(e).__name__,
                                          str(e).splitlines()[0] if str(e) else "")
        return PEER_LOST_EXIT_CODE
    return 0


if __name__ == "__main__":
    from common.process_exit import exit_frozen

    exit_frozen(main(sys.argv))  # without collecting the traced graphs: seconds sooner
