"""common/memory.py: TensorFlow's tensors go back to the OS once freed.

Each case runs in a fresh interpreter: the allocator is chosen at TensorFlow's first
allocation, so it cannot be switched inside this (pytest) process.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from common import memory

ROOT = pathlib.Path(__file__).resolve().parents[2]

# Allocates and frees a 256 MB tensor; prints how much of it stayed resident (MB).
_PROBE = """
from common import memory
memory.use_system_allocator()
import tensorflow as tf

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

tf.zeros([4])  # the runtime's own first allocations
before = rss_mb()
t = tf.fill([64 * 1024 * 1024], 1.0)  # 256 MB, every page written
del t
memory.release_free_memory()
print(round(rss_mb() - before))
"""


def _retained_mb(env_value):
    env = {k: v for k, v in os.environ.items() if k != memory.SYSTEM_ALLOCATOR_ENV}
    if env_value is not None:
        env[memory.SYSTEM_ALLOCATOR_ENV] = env_value
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_freed_tensor_is_returned_to_the_os():
    """`use_system_allocator()` before TensorFlow loads: the 256 MB come back."""
    assert _retained_mb(None) < 32


def test_the_environment_wins(monkeypatch):
    monkeypatch.setenv(memory.SYSTEM_ALLOCATOR_ENV, "0")
    assert memory.use_system_allocator() is ("tensorflow" not in sys.modules)
    assert os.environ[memory.SYSTEM_ALLOCATOR_ENV] == "0"
