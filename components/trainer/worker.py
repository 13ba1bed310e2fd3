"""Entry point of one training worker process (started by `launcher.py`).

  TF_CONFIG=... python -m components.trainer.worker TRAINING_JOB.json

Runs `job.run` under the TF_CONFIG it was given, exits 0 on success and 1 with
the traceback on stderr otherwise. Exits at once if its parent dies.
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

    with open(argv[1]) as f:
        job = job_lib.TrainingJob.from_json(f.read())
    job_lib.run(job)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
