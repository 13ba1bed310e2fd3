"""The launcher's heartbeat watch (`launcher._watch`) on a stand-in worker process that
never beats: no TensorFlow, a few seconds."""

from __future__ import annotations

import sys
import threading
import time
import types

from components.trainer import launcher


def test_a_restarted_worker_is_judged_by_its_own_beats_not_the_previous_ones(tmp_path):
    """After a restart the heartbeat file still holds the previous process's last beat.
    The new process gets the start-up allowance until its own first beat; the old beat
    (step 30, long ago) neither ends that allowance nor makes it hung at once."""
    beat_file = str(tmp_path / "worker-0.beat")
    with open(beat_file, "w") as f:
        f.write(f"30 {time.time() - 100:.3f} 1\n")  # pid 1: not this group's process
    group = launcher._Group(1)
    group.start(0, [sys.executable, "-c", "import time; time.sleep(60)"], {},
                str(tmp_path / "worker-0.log"))
    tc = types.SimpleNamespace(heartbeat_timeout_s=0.4, preemption_grace_s=1.0)
    sigterm = types.SimpleNamespace(received=threading.Event(), forwarded_to=None)
    start = time.time()
    try:
        failure = launcher._watch(group, [beat_file], tc, None, sigterm)
    finally:
        group.kill()
    waited = failure.at - start
    assert failure.cause == "hung" and "after step 0" in failure.reason, failure
    # STARTUP_ALLOWANCE x heartbeat_timeout_s = 2 s, plus polling.
    assert launcher.STARTUP_ALLOWANCE * 0.4 <= waited < 10, waited
