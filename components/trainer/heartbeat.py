"""Heartbeats: how the launcher tells a slow worker from a hung one.

A worker started by `launcher.py` gets `HEARTBEAT_ENV` = a file path. It writes
"<step> <unix time> <pid>" there before its first step (the step it starts or resumes
from) and after every optimizer step (at most
once a second, and always for a new step), by writing a temporary file and
renaming it, so a reader never sees half a line. The launcher reads the files
(`read`) and calls a worker hung when its last beat is older than
`train.heartbeat_timeout_s`: a worker stopped by SIGSTOP, blocked in a collective
whose peer is gone, or stuck in I/O. Without the variable (one in-process worker)
`beat` does nothing.
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

HEARTBEAT_ENV = "DEEPSEEK_TFX_HEARTBEAT_FILE"


class Heartbeat:
    """Writes this worker's heartbeat file (see the module docstring).

    Args:
      path: the file, or "" for none (then `beat` does nothing).
    """

    def __init__(self, path: str):
        self.path = path
        self._last = (-1, 0.0)

    @classmethod
    def from_env(cls) -> Heartbeat:
        return cls(os.environ.get(HEARTBEAT_ENV, ""))

    def beat(self, step: int) -> None:
        """Records that `step` optimizer steps are done (0: started, none yet)."""
        if not self.path:
            return
        now = time.time()
        if step == self._last[0] and now - self._last[1] < 1.0:
            return
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as f:
            f.write(f"{step} {now:.3f} {os.getpid()}\n")
        os.replace(tmp, self.path)
        self._last = (step, now)


class Beat(NamedTuple):
    step: int  # optimizer steps done
    time: float  # unix time
    pid: int  # the worker's process id


def read(path: str) -> Beat | None:
    """The last beat in `path`, or None when there is none yet."""
    try:
        with open(path) as f:
            step, when, pid = f.read().split()
        return Beat(int(step), float(when), int(pid))
    except (OSError, ValueError):
        return None
