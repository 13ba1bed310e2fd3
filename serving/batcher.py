"""Request batching for `deepseek-tfx serve` (TF Serving's `--enable_batching`).

`Batcher` queues validated requests by batching key, runs the requests of one key
as one call once `max_batch_size` rows wait or the oldest has waited
`batch_timeout_micros`, and hands each request its rows of the outputs. A failed
batch runs again request by request, so only the request at fault gets the error.
The knobs and their names are TF Serving's (`config.ServeConfig`);
`serving/server.py` decides the keys and validates before anything is queued.
Metrics see the batcher through two hooks that need no metrics library here:
`on_batch(rows)` at every model call and `queued_rows()` (`serving/metrics.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import numpy as np

from config import ServeConfig

log = logging.getLogger(__name__)


class Unavailable(RuntimeError):
    """The batch queue is full or the server is stopping; becomes HTTP 503."""



@dataclasses.dataclass
class _Task:
    """One request's inputs (numpy, per-row inputs with `rows` rows) and its answer."""

    key: tuple
    inputs: dict[str, np.ndarray]
    rows: int
    enqueued: float  # time.monotonic() seconds
    future: Future = dataclasses.field(default_factory=Future)


class Batcher:
    """Runs queued requests that share a batching key as one call (TF Serving's batching).

    Args:
      call: `call(signature_name, inputs) -> outputs`, dicts of numpy arrays. Inputs
        with a row axis (ndim >= 1) arrive concatenated along axis 0 over the batch;
        scalars (ndim 0) are equal within a batch (they belong to the key) and are
        passed once. Outputs whose leading dimension is the batch's total rows are
        split back per request; others go whole to every request.
      config: max_batch_size (rows per call), batch_timeout_micros (the longest the
        oldest request waits for batch-mates, microseconds), max_enqueued_batches,
        num_batch_threads.
      on_batch: called as `on_batch(rows)` at the start of every model call, with the
        call's rows (int, 1..max_batch_size; a failed batch's calls included, and the
        calls of its requests run again one by one), e.g. a batch size histogram. It
        runs on a batch thread; what it raises is logged and does not fail the call.
        Also a public attribute, so it can be set after construction.
    """

    def __init__(self, call: Callable[[str, dict], dict], config: ServeConfig,
                 on_batch: Callable[[int], None] | None = None):
        self._call = call
        self.on_batch = on_batch
        self.config = config
        self._timeout_s = config.batch_timeout_micros / 1e6
        self._max_queued_rows = config.max_enqueued_batches * config.max_batch_size
        self._queues: dict[tuple, list[_Task]] = {}
        self._queued_rows = 0
        self._running: dict[tuple, int] = {}  # key -> calls in flight
        self._cond = threading.Condition()
        self._closed = False
        self._stats = {"requests": 0, "calls": 0, "rows": 0, "max_rows": 0,
                       "retried_batches": 0, "refused": 0}
        self._threads = [threading.Thread(target=self._loop, name=f"batch-{i}", daemon=True)
                         for i in range(config.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: tuple, inputs: dict[str, np.ndarray], rows: int) -> Future:
        """Queues one request; its Future gets the request's outputs or the error.

        `key[0]` is the signature name; requests with equal keys may share a call.

        Raises:
          Unavailable: the queue holds max_enqueued_batches * max_batch_size rows
            already, or the batcher is closed.
        """
        task = _Task(key, inputs, rows, time.monotonic())
        with self._cond:
            if self._closed:
                raise Unavailable("the server is stopping")
            if self._queued_rows + rows > self._max_queued_rows:
                self._stats["refused"] += 1
                raise Unavailable(
                    f"the batch queue is full ({self._queued_rows} rows waiting; "
                    f"max_enqueued_batches={self.config.max_enqueued_batches} x "
                    f"max_batch_size={self.config.max_batch_size}); retry later")
            self._queues.setdefault(key, []).append(task)
            self._queued_rows += rows
            self._stats["requests"] += 1
            self._cond.notify()
        return task.future

    def queued_rows(self) -> int:
        """Rows (prompts) queued and not yet in a model call, over all keys: the queue
        depth. Submits are refused (Unavailable) beyond max_enqueued_batches *
        max_batch_size."""
        with self._cond:
            return self._queued_rows

    def stats(self) -> dict:
        """Counts so far: requests, calls (model calls), rows, max_rows (largest batch),
        retried_batches (failed batches run again request by request), refused (503)."""
        with self._cond:
            return dict(self._stats)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stops the batch threads; queued requests get Unavailable."""
        with self._cond:
            self._closed = True
            pending = [t for queue in self._queues.values() for t in queue]
            self._queues.clear()
            self._queued_rows = 0
            self._cond.notify_all()
        for task in pending:
            task.future.set_exception(Unavailable("the server is stopping"))
        for thread in self._threads:
            thread.join(timeout_s)

    def _next_batch(self) -> list[_Task] | None:
        """Blocks until a batch is due; None once closed.

        Keys are tried oldest request first. A batch is due when it is full, or when
        its oldest request has waited batch_timeout_micros and no call of its key is
        running (then it gathers requests until that call ends: on a CPU two calls of
        one signature side by side mostly split the cores, one larger call does more).
        """
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                next_due = None
                for key, queue in sorted(self._queues.items(), key=lambda kv: kv[1][0].enqueued):
                    due = queue[0].enqueued + self._timeout_s
                    if sum(t.rows for t in queue) < self.config.max_batch_size and (
                            now < due or self._running.get(key)):
                        if not self._running.get(key):  # else: woken when that call ends
                            next_due = due if next_due is None else min(next_due, due)
                        continue
                    batch, rows = [], 0
                    while queue and (not batch or rows + queue[0].rows
                                     <= self.config.max_batch_size):
                        rows += queue[0].rows
                        batch.append(queue.pop(0))
                    if not queue:
                        del self._queues[key]
                    self._queued_rows -= rows
                    self._running[key] = self._running.get(key, 0) + 1
                    return batch
                self._cond.wait(None if next_due is None else next_due - now)
            return None

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            try:
                self._run(batch)
            finally:
                with self._cond:
                    key = batch[0].key
                    self._running[key] -= 1
                    if not self._running[key]:
                        del self._running[key]
                    self._cond.notify_all()

    def _counted_call(self, name: str, inputs: dict, rows: int) -> dict:
        with self._cond:
            self._stats["calls"] += 1
            self._stats["rows"] += rows
            self._stats["max_rows"] = max(self._stats["max_rows"], rows)
        if (on_batch := self.on_batch) is not None:
            try:
                on_batch(rows)
            except Exception:  # noqa: BLE001 (a metrics hook never fails a request)
                log.exception("the batcher's on_batch hook failed")
        return self._call(name, inputs)

    def _run(self, batch: list[_Task]) -> None:
        name = batch[0].key[0]
        if len(batch) == 1:
            task = batch[0]
            try:
                task.future.set_result(self._counted_call(name, task.inputs, task.rows))
            except Exception as e:  # noqa: BLE001 (the request's answer)
                task.future.set_exception(e)
            return
        inputs = {k: np.concatenate([t.inputs[k] for t in batch]) if v.ndim else v
                  for k, v in batch[0].inputs.items()}
        total = sum(t.rows for t in batch)
        try:
            outputs = self._counted_call(name, inputs, total)
        except Exception as e:  # noqa: BLE001
            # Only the request at fault should fail: run each alone.
            log.info("a batch of %d %s requests failed (%s); running each alone",
                     len(batch), name, str(e).splitlines()[0] if str(e) else type(e).__name__)
            with self._cond:
                self._stats["retried_batches"] += 1
            for task in batch:
                self._run([task])
            return
        start = 0
        for task in batch:
            end = start + task.rows
            task.future.set_result({k: v[start:end] if v.ndim and v.shape[0] == total else v
                                    for k, v in outputs.items()})
            start = end
