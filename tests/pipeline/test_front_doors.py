"""The command line's other front doors (issue 24): arguments and file names in any bytes,
and `--data` covering a FIFO, a device or a socket. Every case runs `python -m cli` in a
child process with raw bytes on its command line; each is refused before TensorFlow is
imported, so each child takes about a second."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LATIN1 = "café 静夜思".encode().replace("é".encode(), b"\xe9")  # Latin-1 é in UTF-8 text


def _cli(tmp_path, *args, timeout=120) -> subprocess.CompletedProcess:
    """`python -m cli ARGS` (bytes or str), the log under tmp_path; fails the test, not
    the run, when it hangs."""
    argv = [sys.executable.encode(), b"-m", b"cli",
            *(a if isinstance(a, bytes) else str(a).encode() for a in args)]
    env = dict(os.environ, DEEPSEEK_TFX_LOG_DIR=str(tmp_path / "logs"), PYTHONUTF8="0")
    try:
        return subprocess.run(argv, cwd=PROJECT_ROOT, env=env, capture_output=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{args} did not return in {timeout} s (it hangs): {e.stderr!r}")


def _one_line_error(proc) -> str:
    err = proc.stderr.decode("utf-8")  # strict: the escapes are ASCII
    assert proc.returncode != 0 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("log: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


@pytest.mark.parametrize("args", [
    ["generate", "--model", "MODEL", "--prompt", LATIN1],
    ["chat", "--model", b"/tmp/mod\xe9l"],
    ["evaluate", "--model", "MODEL", "--data", b"caf\xe9.txt"],
    ["serve", "--model", "MODEL", "--model-name", LATIN1],
    ["hf-import", b"/tmp/\xff\xfe", "OUT"],
    ["hf-export", "MODEL", b"out-\xe9"],
    ["run", "--data", b"caf\xe9.txt", "--preset", "tiny"],
    ["validate", "--data", b"caf\xe9.txt"],
    ["report", "--output", b"runs/\xe9"],
    ["compile-kfp", "--output", "p.yaml", "--pipeline-root", b"gs://b/\xe9"],
    ["mlmd", "--output", b"runs/\xe9", "runs"],
], ids=lambda a: a[0])
def test_an_argument_that_is_not_utf8_is_refused_in_one_line(tmp_path, args):
    args = [str(tmp_path) if a == "MODEL" else str(tmp_path / "out") if a == "OUT" else a
            for a in args]
    line = _one_line_error(_cli(tmp_path, *args))
    bad = next(a for a in args if isinstance(a, bytes))
    shown = bad.decode("utf-8", "backslashreplace")  # b"caf\xe9" -> "caf\\xe9"
    assert f"'{shown}': not UTF-8 (byte 0x" in line, line


def test_a_utf8_argument_is_not_refused(tmp_path):
    """The check refuses bytes, not languages: a Chinese file name gets past it (and fails
    later: there is no such file)."""
    line = _one_line_error(_cli(tmp_path, "validate", "--data", tmp_path / "静夜思.txt"))
    assert line == f"error: --data '{tmp_path / '静夜思.txt'}': no such file or directory"


def test_the_quiet_console_writes_any_bytes_escaped(tmp_path):
    """A session whose command line, stdout and console notes hold undecodable bytes (the
    header line was `pipeline/console.py:177`'s UnicodeEncodeError)."""
    script = ("import os, sys\n"
              "import cli\n"
              "from cli import console\n"
              "console.escape_undecodable(sys.stdout, sys.stderr)\n"
              "name = os.fsdecode(b'caf\\xe9.txt')\n"
              "with console.session(sys.argv[1], header='deepseek-tfx validate --data ' + name):\n"
              "    print('data', name, '静夜思')\n"
              "    print('note', name, file=console.stderr())\n")
    log = tmp_path / "x.log"
    proc = subprocess.run([sys.executable, "-c", script, str(log)], cwd=PROJECT_ROOT,
                          capture_output=True, env=dict(os.environ, PYTHONUTF8="0"))
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    assert proc.stdout.decode("utf-8") == "data caf\\xe9.txt 静夜思\n"
    assert "note caf\\xe9.txt" in proc.stderr.decode("utf-8")
    assert "--data caf\\xe9.txt" in log.read_text(encoding="utf-8")


@pytest.fixture
def odd_files(tmp_path):
    """A data directory with one good file beside a FIFO (whose open() would wait for a
    writer forever), a Unix socket, and a file with a Latin-1 name."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "good.txt").write_text("床前明月光\n", encoding="utf-8")
    os.mkfifo(data / "pipe.txt")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(data / "sock.txt"))
    yield data
    sock.close()


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_data_directory_with_a_fifo_is_refused_by_name_not_read(tmp_path, odd_files, command):
    line = _one_line_error(_cli(tmp_path, command, "--data", odd_files,
                                "--output", tmp_path / "out", "--preset", "tiny"))
    assert "'pipe.txt' is a FIFO (named pipe)" in line and "'sock.txt' is a socket" in line
    assert "good.txt" not in line and "nothing was read" in line


def test_a_fifo_or_device_given_as_data_is_refused(tmp_path, odd_files):
    line = _one_line_error(_cli(tmp_path, "validate", "--data", odd_files / "pipe.txt",
                                "--output", tmp_path / "out"))
    assert line.endswith("pipe.txt' is a FIFO (named pipe), not a regular file or directory; "
                         "refused (nothing was read)")
    line = _one_line_error(_cli(tmp_path, "validate", "--data", "/dev/zero",
                                "--output", tmp_path / "out"))
    assert "'/dev/zero' is a character device" in line


def test_a_glob_skips_what_it_does_not_match_and_refuses_what_it_does(tmp_path, odd_files):
    from cli.data import split_data_path

    assert split_data_path(str(odd_files / "good*")) == (str(odd_files), "good*")
    with pytest.raises(SystemExit, match=r"'pipe.txt' is a FIFO"):
        split_data_path(str(odd_files / "*.txt"))


def test_a_file_name_that_is_not_utf8_inside_data_is_refused_by_name(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "good.txt").write_text("x\n")
    with open(os.path.join(os.fsencode(data), b"caf\xe9.txt"), "wb") as f:
        f.write(b"x\n")
    line = _one_line_error(_cli(tmp_path, "validate", "--data", data, "--output", tmp_path / "o"))
    assert "'caf\\xe9.txt' is a file whose name is not UTF-8" in line
