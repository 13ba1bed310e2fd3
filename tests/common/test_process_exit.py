"""`exit_frozen` ends a process with its code and still runs what an exit must run."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

CHILD = """
import atexit, gc, sys, tempfile
from common.process_exit import exit_frozen
gc.disable()  # no automatic collection before the exit: the cycle below is still there

class Node:
    def __del__(self):  # in a cycle: only a collection would finalize it
        open(sys.argv[1] + "/collected", "w").close()

a, b = Node(), Node()
a.other, b.other = b, a
del a, b
kept = tempfile.TemporaryDirectory(dir=sys.argv[1])  # removed by its atexit finalizer
open(sys.argv[1] + "/tempdir", "w").write(kept.name)
atexit.register(lambda: open(sys.argv[1] + "/atexit", "w").write("ran"))
sys.stdout.write("unflushed line")  # no newline, no flush
gc.enable()  # as in any process: the exit's own collection would run
EXIT(7)
"""


def _child(tmp_path, exit_call: str):
    return subprocess.run([sys.executable, "-c", CHILD.replace("EXIT", exit_call), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_exit_code_atexit_handlers_temp_dirs_and_stdout_and_no_collection(tmp_path):
    result = _child(tmp_path, "exit_frozen")
    assert result.returncode == 7, result.stderr
    assert result.stdout == "unflushed line"
    assert (tmp_path / "atexit").read_text() == "ran"
    assert not pathlib.Path((tmp_path / "tempdir").read_text()).exists()
    # The frozen cycle was left to the system: what makes the exit fast.
    assert not (tmp_path / "collected").exists()


def test_a_plain_exit_collects_the_cycle(tmp_path):
    """The control: the same child ending with `sys.exit` finalizes the cycle at exit."""
    result = _child(tmp_path, "sys.exit")
    assert result.returncode == 7, result.stderr
    assert (tmp_path / "collected").exists() and (tmp_path / "atexit").exists()


def test_the_command_and_python_m_cli_end_through_it():
    assert '\ndeepseek-tfx = "cli:command"\n' in (ROOT / "pyproject.toml").read_text()
    assert "command()" in (ROOT / "cli" / "__main__.py").read_text()
    result = subprocess.run([sys.executable, "-m", "cli", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "deepseek-tfx" in result.stdout
