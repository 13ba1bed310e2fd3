"""Signals sent to worker processes when their heartbeat reaches a step (kill -9, SIGTERM),
for the tests of elastic training (`components/trainer/launcher.py`)."""

from __future__ import annotations

import os
import time

from components.trainer import heartbeat


def inject(log_dir, faults, sent: list[float]) -> None:
    """Sends each fault (worker, signal, after step) when that worker's heartbeat (a process
    not signalled before) reaches the step; appends the unix time of each to `sent`."""
    signalled: set[int] = set()
    for worker, signum, after in faults:
        while True:
            beat = heartbeat.read(str(log_dir / f"heartbeat-{worker}"))
            if beat and beat.step >= after and beat.pid not in signalled:
                os.kill(beat.pid, signum)
                signalled.add(beat.pid)
                sent.append(time.time())
                break
            time.sleep(0.01)
