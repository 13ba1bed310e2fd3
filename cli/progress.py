"""Progress lines of a pipeline run: one when a component starts, one when it is done,
cached or failed, read from the orchestrators' own absl log messages."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import time


class ComponentProgress(logging.Handler):
    """Prints one line when a component starts and one when it is done, cached or
    failed, with its elapsed time and the time since the run began.

    It reads the orchestrators' own log messages (TFX logs through absl):
    LocalDagRunner's "Component X is running/finished", BeamDagRunner's "node X is
    running/finished", and the launcher's "A cached execution N is used", which
    comes from the thread that runs that component.
    """

    _START = re.compile(r"^(?:Component|node) (\S+) is running\.$")
    _END = re.compile(r"^(?:Component|node) (\S+) is finished\.$")
    _CACHED = re.compile(r"^A cached execution \d+ is used\.$")

    def __init__(self, stream=None):
        super().__init__(level=logging.INFO)
        self.stream = stream
        self.t0 = time.perf_counter()
        self._lock = threading.Lock()
        self._running: dict[str, tuple[float, int]] = {}  # component -> (start, thread id)
        self._cached: set[str] = set()
        self.finished: dict[str, str] = {}  # component -> "done" | "cached"

    def _print(self, component: str, what: str, seconds: float | None = None) -> None:
        took = f" ({seconds:.1f} s)" if seconds is not None else ""
        print(f"[{time.perf_counter() - self.t0:7.1f} s] {component:<34} {what}{took}",
              file=self.stream or sys.stdout, flush=True)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 (a log call with bad arguments is not ours to fail)
            return
        with self._lock:
            if m := self._START.match(message):
                self._running[m.group(1)] = (time.perf_counter(), threading.get_ident())
                self._print(m.group(1), "running")
            elif self._CACHED.match(message):
                for component, (_, thread) in self._running.items():
                    if thread == threading.get_ident():
                        self._cached.add(component)
            elif m := self._END.match(message):
                component = m.group(1)
                start, _ = self._running.pop(component, (time.perf_counter(), 0))
                status = "cached" if component in self._cached else "done"
                self.finished[component] = status
                self._print(component, status, time.perf_counter() - start)

    def report_failure(self) -> None:
        """Marks the components still running as failed (call when the run raised)."""
        with self._lock:
            for component, (start, _) in self._running.items():
                self._print(component, "FAILED", time.perf_counter() - start)
            self._running.clear()


@contextlib.contextmanager
def show_progress(stream=None):
    """Shows `ComponentProgress` while the block runs; absl (TFX) warnings and errors
    are still logged as before. Yields the handler."""
    from absl import logging as absl_logging

    absl_logger = logging.getLogger("absl")
    saved = (absl_logger.level, absl_logger.propagate)
    saved_verbosity = absl_logging.get_verbosity()
    progress = ComponentProgress(stream)
    # Through absl's verbosity, not only the logger's level: TensorFlow code does
    # `v = get_verbosity(); set_verbosity(FATAL); ...; set_verbosity(v)`, which
    # resets the logger's level from absl's verbosity.
    absl_logging.set_verbosity(absl_logging.INFO)
    if saved[0] > logging.INFO:
        # TFX's INFO chatter feeds the progress lines only; WARNING and above go
        # wherever absl's records went before.
        absl_logger.propagate = False
        warnings = _ForwardHandler(logging.getLogger(), max(saved[0], logging.WARNING))
        absl_logger.addHandler(warnings)
    else:
        warnings = None
    absl_logger.addHandler(progress)
    try:
        yield progress
    except BaseException:
        progress.report_failure()
        raise
    finally:
        absl_logger.removeHandler(progress)
        if warnings is not None:
            absl_logger.removeHandler(warnings)
        absl_logging.set_verbosity(saved_verbosity)
        absl_logger.setLevel(saved[0])
        absl_logger.propagate = saved[1]


class _ForwardHandler(logging.Handler):
    """Hands records at or above `level` to another logger's handlers."""

    def __init__(self, target: logging.Logger, level: int):
        super().__init__(level=level)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.handle(record)
