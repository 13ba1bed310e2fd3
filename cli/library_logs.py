"""The libraries' loggers around a command that is not quiet (`quiet_commands.QUIET_COMMANDS`):
such a command logs on the console, and absl, Beam and TensorFlow are muted below
WARNING while it runs."""

from __future__ import annotations

import contextlib
import logging

NOISY_LOGGERS = ("absl", "apache_beam", "tensorflow")


@contextlib.contextmanager
def library_loggers_at(level: int):
    """The loggers of NOISY_LOGGERS at `level` for the duration, then as they were: a
    later command in the same process (a notebook, a test, a program calling `main`
    twice) logs as if this one had not run (a `run` after `plan` keeps Beam's INFO
    lines in its log)."""
    loggers = [logging.getLogger(name) for name in NOISY_LOGGERS]
    saved = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, before in zip(loggers, saved, strict=True):
            logger.setLevel(before)
