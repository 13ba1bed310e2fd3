"""The quiet console: libraries' stderr, logs and warnings go to the log file, the
project's lines stay on the console, and everything is restored afterwards."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import cli
from cli import console, library_logs, quiet_commands

PROJECT_ROOT = Path(__file__).resolve().parents[2]

# Writes from C (fd 2), a child process, Python's sys.stderr, `warnings` and absl's
# logger; then the project's lines: one on stdout, one on the console's stderr.
SCRIPT = textwrap.dedent("""
    import logging, os, subprocess, sys, warnings
    from cli import console

    with console.session(sys.argv[1], verbose=sys.argv[2] == "1", header="HEADER"):
        os.write(2, b"C-LEVEL WRITE\\n")
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('CHILD WRITE\\\\n')"])
        print("PYTHON STDERR", file=sys.stderr)
        warnings.warn("A WARNING", FutureWarning)
        logging.getLogger("absl").warning("ABSL LOG")
        print("PROJECT LINE", flush=True)
        print("PROJECT NOTE", file=console.stderr())
    os.write(2, b"FD2 AFTER\\n")
    if len(sys.argv) > 3:
        with console.session(sys.argv[1] + ".2", announce=False):
            raise SystemExit("error: " + sys.argv[3])
""")
LIBRARY_LINES = ("C-LEVEL WRITE", "CHILD WRITE", "PYTHON STDERR", "FutureWarning: A WARNING",
                 "WARNING absl: ABSL LOG")


def _script(tmp_path, *args):
    log = tmp_path / "logs" / "x.log"
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(log), *args], cwd=PROJECT_ROOT,
                          capture_output=True, text=True, timeout=120)
    return proc, log


def test_library_output_goes_to_the_log_not_the_console(tmp_path):
    proc, log = _script(tmp_path, "0")
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    assert text.splitlines()[0].endswith(" HEADER")
    for line in LIBRARY_LINES:
        assert line in text and line not in proc.stdout + proc.stderr
    assert proc.stdout == "PROJECT LINE\n"
    # The log's path at the start and at the end; fd 2 is the console again after.
    assert proc.stderr == f"log: {log}\nPROJECT NOTE\nlog: {log}\nFD2 AFTER\n"
    assert "PROJECT" not in text


def test_verbose_tees_to_the_console_and_the_log(tmp_path):
    proc, log = _script(tmp_path, "1")
    assert proc.returncode == 0, proc.stderr
    text = log.read_text()
    for line in LIBRARY_LINES:
        assert line in text and line in proc.stderr
    assert proc.stdout == "PROJECT LINE\n"
    assert proc.stderr.endswith(f"log: {log}\nFD2 AFTER\n")


def test_a_system_exit_message_reaches_the_console(tmp_path):
    proc, log = _script(tmp_path, "0", "bad value")
    assert proc.returncode == 1
    assert proc.stderr.endswith(f"log: {log}.2\nerror: bad value\n")


def test_the_cli_refuses_a_bad_setting_in_one_line_before_opening_a_log(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--preset", "tiny",
                           "--data", str(PROJECT_ROOT / "README.md"), "--output", str(tmp_path),
                           "--set", "train.train_steps=-3"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == "error: train.train_steps=-3 must be > 0\n"
    assert not (tmp_path / "logs").exists()


def _state():
    root = logging.getLogger()
    return (os.fstat(2).st_ino, sys.stderr, root.handlers[:], root.level,
            warnings.filters[:], warnings.showwarning)


def test_in_process_sessions_restore_everything(tmp_path, capsys):
    before = _state()
    for i in range(2):
        log = tmp_path / f"{i}.log"
        with console.session(str(log), verbose=i == 1) as err:
            assert err is before[1] and console.stderr() is err  # pytest's capture
            warnings.simplefilter("ignore", UserWarning)
            logging.getLogger("absl").warning("ABSL %d", i)
            warnings.warn(f"WARNED {i}", FutureWarning, stacklevel=1)
        assert _state() == before
        text = log.read_text()
        assert f"ABSL {i}" in text and f"WARNED {i}" in text
    captured = capsys.readouterr()
    assert "ABSL 0" not in captured.err and "WARNED 0" not in captured.err
    assert "ABSL 1" in captured.err and "WARNED 1" in captured.err  # --verbose
    assert console.stderr() is sys.stderr


def test_a_command_that_is_not_quiet_leaves_the_library_loggers_as_they_were(capsys):
    """`plan` (not quiet) mutes absl, Beam and TensorFlow below WARNING while it runs;
    afterwards a later `run` in this process must still log Beam's INFO lines (the
    runners e2e test reads them from its log)."""
    loggers = [logging.getLogger(name) for name in library_logs.NOISY_LOGGERS]
    before = [logger.level for logger in loggers]
    assert cli.main(["plan"]) == 0
    assert [logger.level for logger in loggers] == before
    with library_logs.library_loggers_at(logging.ERROR):
        assert all(logger.level == logging.ERROR for logger in loggers)
    assert [logger.level for logger in loggers] == before


def test_an_error_is_reported_with_its_causes_and_logged(tmp_path, capsys):
    log = tmp_path / "e.log"
    with pytest.raises(RuntimeError) as info:
        with console.session(str(log), announce=False):
            try:
                raise ValueError("the real cause")
            except ValueError as e:
                raise RuntimeError("component failed") from e
    assert console.reported(info.value)
    assert capsys.readouterr().err == (f"error: component failed\nthe real cause\nlog: {log}\n")
    assert "Traceback" in log.read_text()


def test_entry_turns_a_reported_error_into_exit_code_1(monkeypatch):
    reported = RuntimeError("shown")
    setattr(reported, console._REPORTED, True)

    def fail(error):
        def main():
            raise error
        return main

    monkeypatch.setattr(cli, "main", fail(reported))
    assert cli.entry() == 1
    monkeypatch.setattr(cli, "main", fail(KeyError("not shown")))
    with pytest.raises(KeyError):
        cli.entry()


def test_every_quiet_command_has_verbose_and_log_dir():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for command in quiet_commands.QUIET_COMMANDS:
        options = {o for a in sub.choices[command]._actions for o in a.option_strings}
        assert {"--verbose", "-v", "--log-dir"} <= options, command
    assert "--verbose" not in {o for a in sub.choices["mlmd"]._actions for o in a.option_strings}


def test_log_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv(quiet_commands.LOG_DIR_ENV, str(tmp_path / "env"))
    assert quiet_commands.default_log_dir() == str(tmp_path / "env")
    monkeypatch.delenv(quiet_commands.LOG_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert quiet_commands.default_log_dir() == str(tmp_path / "deepseek-tfx" / "logs")
    parser = cli.build_parser()
    args = parser.parse_args(["run", "--output", str(tmp_path / "out")])
    assert cli.log_dir(args) == str(tmp_path / "out" / "logs")
    args = parser.parse_args(["generate", "--model", "m", "--prompt", "p"])
    assert cli.log_dir(args) == quiet_commands.default_log_dir()
    args = parser.parse_args(["generate", "--model", "m", "--prompt", "p", "--log-dir", "here"])
    assert cli.log_dir(args) == "here"
    path = quiet_commands.log_path("generate", str(tmp_path), when=0)
    assert Path(path).name.startswith("generate-19700101-") or Path(path).name.startswith(
        "generate-1969")  # local time
    Path(path).write_text("")
    assert quiet_commands.log_path("generate", str(tmp_path), when=0) == path[:-4] + "-2.log"
