"""The serving engine: continuous batching over a pool of decode slots, tokens streamed as
they are made.

A request enters a FIFO queue; between two decode steps the engine thread admits as many
waiting requests as there are free slots (batched `engine_prefill` calls of at most
`prefill_tokens` padded prompt tokens each, which also
chooses each one's first token), and every step (`engine_decode`) advances every running
request by one token. A request leaves its slot the step it ends (EOS, `max_tokens`, a
stop string, its grammar's end, or a cancel such as a client that disconnected), so no
request waits for another's end: iteration-level scheduling (Orca, Yu et al. OSDI 2022;
vLLM, SGLang, TGI), with JetStream's split into prefill, insert and generate.

Where the slot pool lives: in this process, as the running rows' cache. The SavedModel
holds only the two stateless steps (`savedmodel/export.py`, `models/deepseek/
engine_steps.py`); the cache is a tuple of per-layer buffers whose first axis is the
running requests, passed into each step and written there in place
(`cache_buffers.write_rows`), so a step copies nothing. A request that joins is
concatenated onto it and one that leaves is gathered out: one copy of the pool per change
of membership, none per step. So a step runs exactly the running rows (a lone request
decodes as `generate` would alone), and the pool's memory is what the running requests
use: each row holds `cache_positions(n)` positions, n the longest prompt + max_tokens
among them (the next power of two; a model's full context is never allocated unless a
request asks for it). TF Serving, which keeps no state between calls, still serves the
stateless `generate` signature.

The tokens are `generate`'s: the same rule, seeds and steps in the graph
(`engine_steps`), so greedy decoding gives the `generate` signature's tokens and a seed
reproduces sampled ones. On the host: incremental UTF-8 detokenization (whole characters
only), stop strings (text that could begin one is held back until it cannot), grammar
masks (`serving/grammar.py`'s `Constraint`, llguidance) and OpenAI's `logit_bias`.

Thread model: one engine thread runs every model call; `submit` and `cancel` may be
called from any thread, and each request's events go to its `sink` from the engine
thread (e.g. `loop.call_soon_threadsafe` into an asyncio queue).
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

log = logging.getLogger(__name__)



def cache_positions(need: int) -> int:
    """The positions of a cache that holds `need`: the next power of two, at least 64 (few
    sizes: each new one is a new shape for the kernels). A power of two past 1,024 is a
    multiple of the chunked prefill's 1,024 (`generation._prefill`'s cache size)."""
    return max(64, 1 << max(need - 1, 1).bit_length())


def prefill_groups(rows: list, budget: int) -> list[list]:
    """`rows` (requests, in order) in groups of one prefill call each: a group's padded
    prompt tokens (rows x its longest prompt) stay within `budget`, so a burst of long
    prompts (or `n` choices of one) never holds all their attention scores at once (vLLM's
    `max_num_batched_tokens`). A prompt longer than the budget is a group alone."""
    groups: list[list] = []
    for r in rows:
        group = groups[-1] if groups else None
        if group and (len(group) + 1) * max(len(x.prompt_ids) for x in (*group, r)) <= budget:
            group.append(r)
        else:
            groups.append([r])
    return groups


def _pad_like(buffer, like):
    """`buffer` (rows, ...) zero-padded at the end of each axis to `like`'s shape past rows."""
    grow = [[0, 0]] + [[0, b - a] for a, b in zip(buffer.shape[1:], like.shape[1:], strict=True)]
    return tf.pad(buffer, grow)


class EngineOverloaded(RuntimeError):
    """The waiting queue is full (an HTTP 503: retry later)."""


@dataclasses.dataclass
class Sampling:
    """One request's decoding knobs (as the `generate` signature's, per row)."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    logit_bias: dict[int, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Delta:
    """New text of a request: whole characters, none that could begin a stop string."""
    text: str
    tokens: int  # completion tokens generated so far


@dataclasses.dataclass
class Finished:
    """A request's end. reason: "stop" (EOS, a stop string, its grammar's end), "length"
    (max_tokens), "cancelled", or "error" (then `error` says why)."""
    reason: str
    prompt_tokens: int
    completion_tokens: int
    token_ids: list[int]
    error: str | None = None


class Request:
    """A request in the engine: `submit`'s return value.

    Args:
      prompt_ids: the prompt's token ids as the model reads them (>= 1).
      max_tokens: new tokens at most (>= 1); prompt + max_tokens <= the engine's max_len.
      sampling: its `Sampling`.
      sink: called (from the engine thread) with each `Delta`, then one `Finished`.
      stop: stop strings; the text ends before the first one that appears.
      constraint: a grammar `Constraint` (`serving/grammar.py`), or None.
      stop_at_eos: EOS ends the request (False: EOS is a token like any other).
    """

    def __init__(self, prompt_ids: Sequence[int], max_tokens: int, sampling: Sampling,
                 sink: Callable[[Delta | Finished], None], stop: Sequence[str] = (),
                 constraint=None, stop_at_eos: bool = True):
        self.prompt_ids = list(prompt_ids)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.sink = sink
        self.stop = [s for s in stop if s]
        self.constraint = constraint
        self.stop_at_eos = stop_at_eos
        self.tokens: list[int] = []  # generated, EOS excluded
        self.cancelled = False
        self.submitted = time.monotonic()
        self.admitted: float | None = None
        self.last_token_at: float | None = None
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = ""  # decoded text not yet sent: it could begin a stop string

    def cancel(self) -> None:
        """Ends the request at the engine's next step (its slot is freed then)."""
        self.cancelled = True

    # -- text ------------------------------------------------------------------------
    def _text(self, piece: bytes) -> tuple[str, bool]:
        """(text that can be sent now, whether a stop string ended the request)."""
        text = self._held + self._utf8.decode(piece)
        cut = min((i for i in (text.find(s) for s in self.stop) if i >= 0), default=-1)
        if cut >= 0:  # what follows the stop string is never sent
            self._held = ""
            self._utf8.reset()
            return text[:cut], True
        keep = max((k for s in self.stop for k in range(1, min(len(s), len(text) + 1))
                    if text.endswith(s[:k])), default=0)  # a suffix that may begin a stop
        self._held = text[len(text) - keep:] if keep else ""
        return text[:len(text) - keep], False

    def _flush(self) -> str:
        text, self._held = self._held + self._utf8.decode(b"", final=True), ""
        return text


class Engine:
    """Continuous batching over a loaded SavedModel's `engine_prefill` / `engine_decode`.

    Args:
      module: the loaded SavedModel (`tf.saved_model.load`) with the engine's two
        functions (`savedmodel/export.py`; `has_engine` says whether it has them).
      surfaces: the bytes of each token id (`ByteLevelBpe.surfaces()`: special tokens
        b""); ids past it decode to nothing.
      eos_id: the end-of-sequence id.
      max_len: the most positions (prompt + max_tokens) of a request. The running rows
        share one cache of `cache_positions(longest need)` positions, grown (zero-padded)
        when a longer request joins and reset when none runs.
      slots: decode slots (requests running at once).
      max_waiting: requests queued beyond the slots; more get `EngineOverloaded`.
      vocab_size: the model's vocabulary (the bitmask's width, ceil(V/32) words).
      observer: optional hooks (`metrics.EngineObserver`): `queued(seconds)`,
        `first_token(seconds)`, `next_token(seconds)`, `finished(seconds)`.
      steps_per_call: decoding steps per `engine_decode` call (vLLM's multi-step
        scheduling): a call costs ~2 ms on a CPU whatever it computes, so 4 steps a call
        bring a lone request's per-token time near `generate`'s in-graph loop. A request
        that arrives meanwhile waits up to that many steps; a step with a grammar row,
        or a row with fewer tokens left, takes fewer.
      prefill_tokens: padded prompt tokens per prefill call (`prefill_groups`).
    """

    def __init__(self, module, surfaces: Sequence[bytes], eos_id: int, max_len: int,
                 slots: int = 8, max_waiting: int = 64, vocab_size: int | None = None,
                 observer=None, steps_per_call: int = 4, prefill_tokens: int = 4096):
        if slots < 1 or max_len < 2 or steps_per_call < 1:
            raise ValueError(f"slots={slots} and steps_per_call={steps_per_call} must be >= 1 "
                             f"and max_len={max_len} >= 2")
        self.steps_per_call = steps_per_call
        self.prefill_tokens = prefill_tokens
        self._prefill_fn, self._decode_fn = module.engine_prefill, module.engine_decode
        self.surfaces, self.eos_id = list(surfaces), eos_id
        self.max_len = max_len
        self.slots, self.max_waiting = slots, max_waiting
        self.mask_words = -(-(vocab_size or len(self.surfaces)) // 32)
        self.observer = observer
        self.cache_len = 0  # positions of the running rows' cache (0: no rows)
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._cache = None  # the running rows' cache (first axis: self._running)
        self._cond = threading.Condition()
        self._closed = False
        self.steps = 0  # decoding steps (tokens per running row)
        self.calls = 0  # engine_decode calls
        self._thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self._thread.start()

    @staticmethod
    def has_engine(module) -> bool:
        """Whether a loaded SavedModel carries the engine's functions, multi-step
        `engine_decode` included (exports before them serve through the batcher only)."""
        if not (hasattr(module, "engine_prefill") and hasattr(module, "engine_decode")):
            return False
        functions = module.engine_decode.concrete_functions
        return bool(functions) and any(
            getattr(spec, "name", None) == "num_steps"
            for spec in tf.nest.flatten(functions[0].structured_input_signature))

    # -- the public side -----------------------------------------------------------------
    def submit(self, request: Request) -> Request:
        """Queues `request`; returns it.

        Raises:
          ValueError: an empty prompt, max_tokens < 1, or prompt + max_tokens > max_len.
          EngineOverloaded: `max_waiting` requests already wait.
          RuntimeError: the engine is closed.
        """
        if not request.prompt_ids or request.max_tokens < 1:
            raise ValueError("a request needs a prompt of >= 1 token and max_tokens >= 1")
        if len(request.prompt_ids) + request.max_tokens > self.max_len:
            raise ValueError(f"prompt ({len(request.prompt_ids)} tokens) + max_tokens "
                             f"({request.max_tokens}) exceeds the engine's {self.max_len} "
                             "positions per slot")
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            if len(self._waiting) >= self.max_waiting:
                raise EngineOverloaded(f"{len(self._waiting)} requests are waiting for a "
                                       f"decode slot (the limit); retry later")
            self._waiting.append(request)
            self._cond.notify()
        return request

    def run(self, request: Request, timeout_s: float = 600.0) -> Finished:
        """Submits `request` and waits for its end (warm-up, scripts); its sink still gets
        every event. Raises as `submit`, and TimeoutError."""
        done: list[Finished] = []
        event = threading.Event()
        sink = request.sink

        def collect(e) -> None:
            sink(e)
            if isinstance(e, Finished):
                done.append(e)
                event.set()

        request.sink = collect
        self.submit(request)
        if not event.wait(timeout_s):
            request.cancel()
            raise TimeoutError(f"the engine did not finish a request in {timeout_s} s")
        return done[0]

    def stats(self) -> dict:
        """running, waiting, slots, steps (decoding steps), calls (of engine_decode);
        cache_len and cache_bytes: the running rows' cache, its positions per row and its
        bytes."""
        with self._cond:
            cache = self._cache
            return {"running": len(self._running), "waiting": len(self._waiting),
                    "slots": self.slots, "steps": self.steps, "calls": self.calls,
                    "cache_len": self.cache_len,
                    "cache_bytes": 0 if cache is None else sum(
                        int(np.prod(t.shape)) * t.dtype.size for t in tf.nest.flatten(cache))}

    def close(self, timeout_s: float = 10.0) -> None:
        """Stops the engine thread; unfinished requests end as "cancelled"."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)

    # -- the engine thread ---------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._waiting and not self._running:
                    self._cond.wait()
                if self._closed:
                    break
                gone = [r for r in self._waiting if r.cancelled]  # e.g. clients that left
                self._waiting = deque(r for r in self._waiting if not r.cancelled)
                free = self.slots - len(self._running)
                admitted = [self._waiting.popleft()
                            for _ in range(min(free, len(self._waiting)))]
            for r in gone:
                self._finish(r, "cancelled")
            self._drop_cancelled()
            admitted = [r for r in admitted if not self._end_if_cancelled(r)]
            for group in prefill_groups(admitted, self.prefill_tokens):
                self._step(functools.partial(self._prefill, group), group, decode=False)
            if self._running:
                self._step(self._decode, list(self._running), decode=True)
        for r in [*self._waiting, *self._running]:
            self._finish(r, "cancelled")

    def _step(self, run: Callable[[], None], rows: list[Request], decode: bool) -> None:
        """`run()`; a failure ends `rows` with the error, not the engine (a failed decode
        also drops the running rows' cache, which it may have written; a failed prefill
        leaves it as it was)."""
        try:
            run()
        except Exception as e:  # noqa: BLE001 (the engine keeps serving)
            log.exception("engine step failed")
            for r in rows:
                self._finish(r, "error", error=f"{type(e).__name__}: {e}")
            if decode:
                with self._cond:
                    self._running = []
                self._cache, self.cache_len = None, 0

    def _knobs(self, rows: list[Request]) -> dict:
        """The per-row sampling inputs and constraints of the engine's functions."""
        b = len(rows)
        any_constrained = any(r.constraint is not None for r in rows)
        bitmask = np.full([b, self.mask_words if any_constrained else 0], -1, np.int32)
        for i, r in enumerate(rows):  # -1: every token allowed
            if r.constraint is not None:
                r.constraint.fill_mask(bitmask[i])
        width = max((len(r.sampling.logit_bias) for r in rows), default=0)
        bias_ids = np.full([b, width], -1, np.int32)
        bias_values = np.zeros([b, width], np.float32)
        for i, r in enumerate(rows):
            for k, (token, value) in enumerate(r.sampling.logit_bias.items()):
                bias_ids[i, k], bias_values[i, k] = token, value
        return {"temperature": np.array([r.sampling.temperature for r in rows], np.float32),
                "top_k": np.array([r.sampling.top_k for r in rows], np.int32),
                "top_p": np.array([r.sampling.top_p for r in rows], np.float32),
                "seed": np.array([r.sampling.seed for r in rows], np.int32),
                "bitmask": bitmask, "bias_ids": bias_ids, "bias_values": bias_values}

    def _prefill(self, rows: list[Request]) -> None:
        """Admits `rows`: their prompts into a new cache, their first tokens chosen."""
        now = time.monotonic()
        for r in rows:
            r.admitted = now
            if self.observer is not None:
                self.observer.queued(now - r.submitted)
        lengths = np.array([len(r.prompt_ids) for r in rows], np.int32)
        ids = np.zeros([len(rows), lengths.max()], np.int32)
        for i, r in enumerate(rows):
            ids[i, :lengths[i]] = r.prompt_ids
        need = max(len(r.prompt_ids) + r.max_tokens for r in rows)
        cache_len = max(self.cache_len, cache_positions(need))
        out = self._prefill_fn(input_ids=ids, prompt_lengths=lengths,
                               cache_len=np.int32(cache_len), **self._knobs(rows))
        if self._cache is not None and cache_len > self.cache_len:  # the pool grows
            self._cache = tf.nest.map_structure(_pad_like, self._cache, out["cache"])
        self.cache_len = cache_len
        kept = self._take_tokens(rows, out["token"].numpy())
        cache = out["cache"]
        if len(kept) < len(rows):
            cache = tf.nest.map_structure(lambda t: tf.gather(t, np.array(kept, np.int32)),
                                          cache)
        with self._cond:
            self._running.extend(rows[i] for i in kept)
        self._cache = cache if self._cache is None else tf.nest.map_structure(
            lambda a, b: tf.concat([a, b], axis=0), self._cache, cache)

    def _decode(self) -> None:
        """One step of every running request."""
        rows = self._running
        tokens = np.array([r.tokens[-1] if r.tokens else self.eos_id for r in rows], np.int32)
        positions = np.array([len(r.prompt_ids) + len(r.tokens) - 1 for r in rows], np.int32)
        steps = np.array([len(r.tokens) for r in rows], np.int32)
        left = min(r.max_tokens - len(r.tokens) for r in rows)  # >= 1: no row overruns
        k = 1 if any(r.constraint is not None for r in rows) else min(self.steps_per_call, left)
        out = self._decode_fn(tokens=tokens, positions=positions, cache=self._cache,
                              steps=steps, num_steps=np.int32(k), **self._knobs(rows))
        self._cache = out["cache"]
        self.steps += k
        self.calls += 1
        kept = self._take_tokens(rows, out["token"].numpy())
        if len(kept) < len(rows):
            self._keep(kept)

    def _keep(self, kept: list[int]) -> None:
        """Keeps only the running rows `kept` (indices), in the pool and the list."""
        with self._cond:
            self._running = [self._running[i] for i in kept]
        self._cache = (None if not kept else tf.nest.map_structure(
            lambda t: tf.gather(t, np.array(kept, np.int32)), self._cache))
        if not kept:
            self.cache_len = 0

    def _drop_cancelled(self) -> None:
        kept = [i for i, r in enumerate(self._running) if not self._end_if_cancelled(r)]
        if len(kept) < len(self._running):
            self._keep(kept)

    def _end_if_cancelled(self, r: Request) -> bool:
        if r.cancelled:
            self._finish(r, "cancelled")
        return r.cancelled

    def _take_tokens(self, rows: list[Request], tokens: np.ndarray) -> list[int]:
        """Hands each row its new tokens ((B,) or (B, k)), up to its end; returns the
        indices of the rows that go on."""
        now = time.monotonic()
        tokens = tokens.reshape(len(rows), -1)
        kept = []
        for i, (r, row) in enumerate(zip(rows, tokens.tolist(), strict=True)):
            if self.observer is not None:  # a call's k tokens share its time
                if r.last_token_at is None:
                    self.observer.first_token(now - r.submitted)
                else:
                    for _ in row:
                        self.observer.next_token((now - r.last_token_at) / len(row))
            r.last_token_at = now
            reason = None
            for token in row:
                try:
                    reason = self._advance(r, int(token))
                except Exception as e:  # noqa: BLE001 (e.g. a grammar refusing a token)
                    log.warning("engine: a request ended with an error: %s", e)
                    reason = "error"
                    self._finish(r, "error", error=f"{type(e).__name__}: {e}")
                    break
                if reason is not None:
                    self._finish(r, reason)
                    break
            if reason is None:
                kept.append(i)
        return kept

    def _advance(self, r: Request, token: int) -> str | None:
        """Appends `token` to `r`, sends its text; the reason `r` ends, or None."""
        if r.cancelled:
            return "cancelled"
        if token == self.eos_id and r.stop_at_eos:
            return "stop"
        if r.constraint is not None:
            r.constraint.advance(token)
        r.tokens.append(token)
        piece = self.surfaces[token] if 0 <= token < len(self.surfaces) else b""
        text, stopped = r._text(piece)
        if text:
            r.sink(Delta(text, len(r.tokens)))
        if stopped or (r.constraint is not None and r.constraint.done()):
            return "stop"
        return "length" if len(r.tokens) >= r.max_tokens else None

    def _finish(self, r: Request, reason: str, error: str | None = None) -> None:
        if reason in ("stop", "length"):  # held-back text is sent (nothing after a stop string)
            rest = r._flush()
            if rest:
                r.sink(Delta(rest, len(r.tokens)))
        if self.observer is not None and reason != "error":
            self.observer.finished(time.monotonic() - r.submitted)
        r.sink(Finished(reason, len(r.prompt_ids), len(r.tokens), list(r.tokens), error))
