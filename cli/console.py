"""The console of a CLI command: the project's own lines on the terminal, the libraries' in a log.

`session(log_path)` sends everything the libraries write to stderr into a log file:
Python logging (absl, TFX, Beam, TensorFlow), `warnings`, and what C++ code and
child processes write to file descriptor 2 (TensorFlow's and XLA's messages,
including those at `import tensorflow`, Beam and Trainer workers). It does so
by pointing fd 2 at the file (`os.dup2`) before the command imports
TensorFlow, so it must be entered before the heavy imports. The project's own
lines stay on the console: stdout (fd 1) is left alone, and `stderr()` is the
console's stderr while a session runs (for notes and error lines).

With `verbose=True`, fd 2 is a pipe that a thread copies to the log and to the
console (a tee). Everything is restored on exit, so a process may run several
sessions one after the other (tests call `cli.main` many times).

Arguments and file names may hold any bytes (Python keeps those that are not UTF-8
as lone surrogates, `surrogateescape`): the log's header and every stream of the
session write them as `\\xNN` (`common.files.shown`, `ESCAPE_ERRORS`), never fail on them.

An exception escaping the session is logged with its traceback; its messages
(`failure_message`) and the log's path are printed on the console, and it is
raised again (`reported` tells it was). A `SystemExit` is left to Python, which
prints its message to the console's stderr once the session is over.
"""

from __future__ import annotations

import codecs
import contextlib
import logging
import os
import sys
import threading
import time
import warnings
from typing import TextIO

from common.files import ESCAPE_ERRORS, shown

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_REPORTED = "_deepseek_tfx_reported"


def failure_message(error: BaseException) -> str:
    """The messages of an exception and its causes (orchestrators wrap the real one)."""
    messages, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error).strip()
        if text and text not in messages:
            messages.append(text)
        error = error.__cause__ or error.__context__
    return "\n".join(messages) or "unknown error (see the log)"


def reported(error: BaseException) -> bool:
    """Whether a session already printed this exception's messages on the console."""
    return bool(getattr(error, _REPORTED, False))


_consoles: list[TextIO] = []  # the console's stderr of each open session, innermost last


def stderr() -> TextIO:
    """The console's stderr: inside a session not fd 2 (the log), else `sys.stderr`."""
    return _consoles[-1] if _consoles else sys.stderr


def _fileno(stream) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None


def _flush(*streams) -> None:
    for stream in streams:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.flush()


def _tee(read_fd: int, log_fd: int, console: TextIO) -> None:
    """Copies the pipe to the log and to the console until every writer has closed it."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    try:
        while chunk := os.read(read_fd, 65536):
            os.write(log_fd, chunk)
            with contextlib.suppress(OSError, ValueError):  # a closed console: the log only
                console.write(decoder.decode(chunk))
                console.flush()
    finally:
        os.close(read_fd)
        os.close(log_fd)


def _open_log(path: str, header: str) -> int:
    """The log file `path` opened for appending (its directory created), `header` (if
    any) written as its first line, time-stamped.

    Raises:
      SystemExit: the log file cannot be written.
    """
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as e:
        raise SystemExit(f"error: cannot write the log file {path} ({e}); pass --log-dir DIR") from e
    if header:
        os.write(log_fd, f"{time.strftime('%Y-%m-%d %H:%M:%S')} {shown(header)}\n".encode())
    return log_fd


def _console_stream(saved_stderr, saved_fd2: int | None) -> tuple[TextIO, bool]:
    """(the console's stderr, whether the session opened it and closes it).

    The console's stderr: a new stream on the saved fd 2 when sys.stderr writes to
    fd 2; otherwise sys.stderr itself (e.g. pytest's capture, which is not fd 2).
    """
    own_console = saved_stderr is None or _fileno(saved_stderr) == 2
    if not own_console:
        console = saved_stderr
    elif saved_fd2 is not None:
        console = open(os.dup(saved_fd2), "w", buffering=1, errors=ESCAPE_ERRORS,
                       encoding=getattr(saved_stderr, "encoding", None) or "utf-8")
    else:
        console = open(os.devnull, "w")
    return console, own_console


def _point_fd2_at_log(log_fd: int, console: TextIO, verbose: bool) -> threading.Thread | None:
    """Points fd 2 at the log; with `verbose`, at a pipe that a started thread copies to
    the log and to `console` (`_tee`), which is returned (else None)."""
    tee = None
    if verbose:
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, 2)
        os.close(write_fd)
        tee = threading.Thread(target=_tee, args=(read_fd, os.dup(log_fd), console),
                               name="console-tee", daemon=True)
        tee.start()
    else:
        os.dup2(log_fd, 2)
    return tee


def _log_to_stderr(root: logging.Logger, saved_handlers: list, saved_stderr) -> logging.Handler:
    """Makes the root logger log at INFO to `sys.stderr` (fd 2, the log) with
    `LOG_FORMAT`; returns the new handler.

    Handlers that write to the console go (they would print on it, or write twice
    to the log); others stay (a FileHandler, pytest's caplog).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    root.handlers = [handler] + [h for h in saved_handlers if not _to_console(h, saved_stderr)]
    root.setLevel(logging.INFO)
    return handler


def _restore_fd2(saved_fd2: int | None, tee: threading.Thread | None) -> None:
    """Points fd 2 back at what it was before the session (closes it if there was none),
    then waits for the tee, if any, to copy the last lines (at most 5 s)."""
    if saved_fd2 is not None:
        os.dup2(saved_fd2, 2)
        os.close(saved_fd2)
    else:
        os.close(2)
    if tee is not None:  # the pipe ends when fd 2 was its last writer; children may hold it
        tee.join(timeout=5)


@contextlib.contextmanager
def session(path: str, *, verbose: bool = False, announce: bool = True,
            header: str = ""):
    """Sends the libraries' stderr, logs and warnings to the log file `path` (see above).

    Args:
      path: the log file (appended to; its directory is created).
      verbose: also show all of it on the console.
      announce: print `log: <path>` on the console's stderr at the start and at the
        end; otherwise only when the block fails.
      header: a first line for the log (e.g. the command line).

    Yields the console's stderr.
    """
    log_fd = _open_log(path, header)
    _flush(sys.stdout, sys.stderr)
    try:
        saved_fd2 = os.dup(2)
    except OSError:  # no fd 2 at all
        saved_fd2 = None
    saved_stderr = sys.stderr
    console, own_console = _console_stream(saved_stderr, saved_fd2)
    tee = _point_fd2_at_log(log_fd, console, verbose)
    # Python's writers to "stderr" follow fd 2 (never closed: a library may keep it).
    sys.stderr = open(2, "w", buffering=1, closefd=False, errors=ESCAPE_ERRORS,
                      encoding="utf-8")
    root = logging.getLogger()
    saved_root = (root.handlers[:], root.level)
    handler = _log_to_stderr(root, saved_root[0], saved_stderr)
    warnings_context = warnings.catch_warnings()  # restores filters and showwarning
    warnings_context.__enter__()
    warnings.showwarning = _log_warning
    _consoles.append(console)
    if announce:
        print(f"log: {path}", file=console, flush=True)
    failed = True
    try:
        yield console
        failed = False
    except SystemExit as e:
        failed = e.code not in (None, 0)
        raise
    except Exception as e:
        logging.getLogger("deepseek-tfx").error("failed", exc_info=True)
        print(f"error: {failure_message(e)}", file=console, flush=True)
        with contextlib.suppress(AttributeError, TypeError):
            setattr(e, _REPORTED, True)
        raise
    finally:
        _flush(sys.stdout, sys.stderr, handler)
        _consoles.pop()
        warnings_context.__exit__(None, None, None)
        root.handlers, root.level = saved_root
        handler.close()
        sys.stderr = saved_stderr
        _restore_fd2(saved_fd2, tee)
        if announce or failed:  # after the tee has copied the last library line
            print(f"log: {path}", file=console, flush=True)
        os.close(log_fd)
        if own_console and (tee is None or not tee.is_alive()):
            console.close()


def escape_undecodable(*streams) -> None:
    """Makes text streams (sys.stdout, sys.stderr) write characters they cannot encode,
    such as the undecodable bytes of a file name, as `\\xNN` instead of raising."""
    for stream in streams:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            stream.reconfigure(errors=ESCAPE_ERRORS)


def _to_console(handler: logging.Handler, stderr_stream) -> bool:
    if isinstance(handler, logging.FileHandler) or not isinstance(handler, logging.StreamHandler):
        return False
    stream = handler.stream
    return (stream in (stderr_stream, sys.__stderr__, sys.stdout, sys.__stdout__)
            or _fileno(stream) in (1, 2))


def _log_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """`warnings.showwarning` during a session: to the `py.warnings` logger (the log)."""
    text = warnings.formatwarning(message, category, filename, lineno, line)
    logging.getLogger("py.warnings").warning("%s", text.rstrip())
