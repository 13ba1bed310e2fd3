"""The launcher's heartbeat watch (`launcher._watch`) on stand-in worker processes that
beat as a resumed worker does: no TensorFlow, a few seconds."""

from __future__ import annotations

import sys
import threading
import types

from components.trainer import heartbeat, launcher

RESUMED_WORKER = """
import sys, time
from components.trainer.heartbeat import Heartbeat
beat = Heartbeat(sys.argv[1])
beat.beat(25)      # the loop's first beat: the step it resumed from
time.sleep(2.5)    # restoring and tracing the first step: longer than the timeout
for step in range(26, 31):
    beat.beat(step)
    time.sleep(0.1)
"""


def _watch(tmp_path, script, timeout_s):
    beat_file = str(tmp_path / "heartbeat-0")
    group = launcher._Group(1)
    group.start(0, [sys.executable, "-c", script, beat_file], None,
                str(tmp_path / "worker-0.log"))
    tc = types.SimpleNamespace(heartbeat_timeout_s=timeout_s, preemption_grace_s=1.0)
    sigterm = types.SimpleNamespace(received=threading.Event(), forwarded_to=None)
    try:
        return launcher._watch(group, [beat_file], tc, None, sigterm)
    finally:
        group.kill()


def test_a_resumed_worker_has_the_start_up_allowance_until_its_first_step(tmp_path):
    """Its first beat is the step it resumed from (25), not step 0: until step 26 it gets
    STARTUP_ALLOWANCE x heartbeat_timeout_s (5 x 1 s), so 2.5 s of tracing is no hang."""
    assert heartbeat.HEARTBEAT_ENV  # the workers' variable; here the path is argv[1]
    assert _watch(tmp_path, RESUMED_WORKER, 1.0) is None


def test_a_worker_that_stops_beating_after_a_step_is_hung(tmp_path):
    stalls = RESUMED_WORKER.replace("time.sleep(0.1)", "time.sleep(0.1 if step < 27 else 60)")
    failure = _watch(tmp_path, stalls, 1.0)
    assert failure.cause == "hung" and "after step 27" in failure.reason, failure
