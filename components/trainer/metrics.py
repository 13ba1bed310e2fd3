"""The figures a training run reports: per logging window, and over the whole run.

A logging window is the optimizer steps applied since the last log line (the
first window of a run is its first step alone: it includes tracing). At its end
`MetricWindow.close` gives the window's record (one entry of the run's history):

    loss terms, grad_norm   the window's last step's (not averaged over the window)
    learning_rate           the schedule's rate for that step (`schedule(step - 1)`)
    tokens_per_second       steps x tokens_per_step / the window's wall-clock seconds
    mfu                     tokens_per_second x flops_per_token / peak_flops
                            (PaLM appendix B, `models.deepseek.flops.mfu`)
    moe_dropped_fraction    sum of the dropped (token, expert) pairs / sum of the routed
                            pairs over the window's steps and MoE layers
    skipped_steps           steps skipped (not finite) so far in the run

and the expert load of the window: the tokens routed to each expert of each MoE
layer, summed over its steps (float32 [M, E]; the load before any capacity drop).
Skipped steps (`train_step.py`) never enter a window.

`SourceCounts` keeps the run's tokens trained and sequences drawn per mixture source
(issue 28), summed on the global batch (`train_step`'s all-reduced `source_tokens`,
`source_sequences`): the same on 1 or N workers, and kept through a resume (checkpointed).

`RunClock` times the run for its overall and steady-state tokens/s (the latter
without the first step and without checkpoint writing).
"""

from __future__ import annotations

import contextlib
import json
import time

import numpy as np
import tensorflow as tf

from components.trainer.train_step import LOSS_TERMS
from models.deepseek import flops

NAN = float("nan")


class MetricWindow:
    """Sums a logging window's step outputs and gives its record (see the module docstring).

    Args:
      schedule: the learning-rate schedule (step -> rate; its step counts from 0).
      tokens_per_step: tokens of one global batch (batch size x sequence length).
      flops_per_token: training FLOPs per token (`flops.flops_per_token`).
      peak_flops: peak FLOP/s of all the hardware taking part; 0: MFU is NaN.

    Attributes:
      history: the records of the closed windows, in order.
    """

    def __init__(self, schedule, tokens_per_step: int, flops_per_token: int, peak_flops: float,
                 figure_names: tuple[str, ...] = ()):
        self.schedule = schedule
        self.figure_names = tuple(figure_names)
        self.tokens_per_step = tokens_per_step
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.history: list[dict] = []  # the records of the closed windows, in order
        self.stored = None  # the checkpointed copy of `history` (`resume`)
        self.routed_pairs = 0.0  # over the closed windows of the run
        self.dropped_pairs = 0.0
        self.last_terms = None
        self._reset()
        self.restart()

    def _reset(self) -> None:
        self.steps = 0
        self.load = self.dropped = None  # float32 [M, E] and [M] tensors, summed
        self.figures = None  # float32 [F], summed
        self.grad_norm = None

    def restart(self) -> None:
        """Starts the window's clock now (its tokens/s counts the time from here)."""
        self.start = time.perf_counter()

    def add(self, out: dict) -> None:
        """Adds an applied step's outputs (`train_step`): "terms" float32
        [len(LOSS_TERMS)], "grad_norm" float32 scalar, "expert_load" float32 [M, E]
        (tokens routed per expert), "moe_dropped" float32 [M] (pairs the capacity
        dropped; 0 without XLA). Sums stay on the device."""
        self.steps += 1
        load, dropped = out["expert_load"], out["moe_dropped"]
        self.load = load if self.load is None else self.load + load
        self.dropped = dropped if self.dropped is None else self.dropped + dropped
        self.last_terms, self.grad_norm = out["terms"], out["grad_norm"]
        if self.figure_names:
            figures = out["figures"]
            self.figures = figures if self.figures is None else self.figures + figures

    def close(self, step: int, skipped_steps: int, timed: bool) -> tuple[dict, np.ndarray]:
        """Ends the window at optimizer step `step`, adding its record to `history` (call
        `restart` when the next window starts).

        Args:
          step: the optimizer step the window ends with (1-based).
          skipped_steps: steps skipped so far in the run.
          timed: False for a window whose time includes tracing (the run's first
            step): its tokens/s and MFU are NaN.

        Returns:
          (record, load): the record (floats; keys "step", LOSS_TERMS,
          "grad_norm", "learning_rate", "tokens_per_second", "mfu",
          "moe_dropped_fraction", "skipped_steps"; with `figure_names`, "figures":
          {name: the mean over the window's steps} — DPO's reward accuracy, GRPO's
          reward and KL, ...) and the window's expert load, float32 numpy [M, E].
        """
        now = time.perf_counter()
        load = self.load.numpy()  # routed pairs = the load before dropping
        routed, dropped = float(load.sum()), float(self.dropped.numpy().sum())
        timed_steps = self.steps if timed else 0
        tps = timed_steps * self.tokens_per_step / (now - self.start) if timed_steps else NAN
        record = {"step": step,
                  **dict(zip(LOSS_TERMS, map(float, self.last_terms.numpy()), strict=True)),
                  "grad_norm": float(self.grad_norm),
                  "learning_rate": float(self.schedule(step - 1)),
                  "tokens_per_second": tps,
                  "mfu": (flops.mfu(tps, self.flops_per_token, self.peak_flops)
                          if self.peak_flops and timed_steps else NAN),
                  "moe_dropped_fraction": dropped / routed if routed else 0.0,
                  "skipped_steps": skipped_steps}
        if self.figure_names:
            means = self.figures.numpy() / self.steps
            record["figures"] = {n: float(v) for n, v in zip(self.figure_names, means,
                                                             strict=True)}
        self.history.append(record)
        self.routed_pairs += routed
        self.dropped_pairs += dropped
        self._reset()
        return record, load

    @property
    def run_dropped_fraction(self) -> float:
        """Dropped / routed (token, expert) pairs over the run's closed windows (0 if none)."""
        return self.dropped_pairs / self.routed_pairs if self.routed_pairs else 0.0

    def resume(self, stored: tf.Variable) -> None:
        """Starts `history` with the records `stored` holds and keeps it for `store`.

        Args:
          stored: a tf.string scalar variable saved in the run's checkpoints: the JSON
            list of the records up to the checkpoint's step ("[]" for a fresh run). So a
            run restarted after preemption, a lost worker or a kill reports the whole
            run's history, not only its last attempt's.
        """
        self.stored = stored
        self.history = json.loads(stored.numpy().decode("utf-8") or "[]")

    def store(self) -> None:
        """Writes `history` into the `resume` variable (before a checkpoint is saved)."""
        if self.stored is not None:
            self.stored.assign(json.dumps(self.history))

    @property
    def final_loss(self) -> float:
        """The loss of the last step added; without one (a run resumed at its last
        step), the last record's; NaN when there is none."""
        if self.last_terms is not None:
            return float(self.last_terms[0])
        return float(self.history[-1]["loss"]) if self.history else NAN


class SourceCounts:
    """Tokens trained and sequences drawn per source since the run's first step.

    Tokens count the targets of applied steps; sequences count every sequence drawn
    (a skipped step's batch was drawn too), for `mixture.epochs_drawn`. Per-step sums
    stay on the device until `sync` (called at logging and checkpointing).

    Args:
      names: the sources, in index order (`mixture.source_names`).
      tokens, sequences: int64 [S] variables, checkpointed with the run (their values:
        the counts restored; `store` writes the counts back before a checkpoint).
    """

    def __init__(self, names: list[str], tokens: tf.Variable, sequences: tf.Variable):
        self.names = list(names)
        self.tokens_var, self.sequences_var = tokens, sequences
        self.tokens = tokens.numpy().astype(np.int64)  # (S,)
        self.sequences = sequences.numpy().astype(np.int64)  # (S,)
        self._tokens = self._sequences = None  # device sums since the last `sync`

    def add(self, out: dict, applied: bool) -> None:
        """Adds a step's `source_tokens` (if `applied`) and `source_sequences`, float32 [S]."""
        self._sequences = (out["source_sequences"] if self._sequences is None
                           else self._sequences + out["source_sequences"])
        if applied:
            self._tokens = (out["source_tokens"] if self._tokens is None
                            else self._tokens + out["source_tokens"])

    def sync(self) -> None:
        """Moves the device sums to the host counts."""
        if self._tokens is not None:
            self.tokens += np.rint(self._tokens.numpy()).astype(np.int64)
        if self._sequences is not None:
            self.sequences += np.rint(self._sequences.numpy()).astype(np.int64)
        self._tokens = self._sequences = None

    def store(self) -> None:
        """`sync`, then the counts into the checkpointed variables."""
        self.sync()
        self.tokens_var.assign(self.tokens)
        self.sequences_var.assign(self.sequences)

    def token_counts(self) -> dict[str, int]:
        """{name: tokens trained} (after `sync`)."""
        return {n: int(t) for n, t in zip(self.names, self.tokens, strict=True)}

    def sequence_counts(self) -> dict[str, int]:
        """{name: sequences drawn} (after `sync`)."""
        return {n: int(t) for n, t in zip(self.names, self.sequences, strict=True)}

    def shares(self) -> dict[str, float]:
        """{name: share of the tokens trained} (0.0 each before any)."""
        total = int(self.tokens.sum())
        return {n: (int(t) / total if total else 0.0)
                for n, t in zip(self.names, self.tokens, strict=True)}


class RunClock:
    """The wall-clock time of a run (from its construction to `stop`), in seconds.

    Attributes:
      first_step_done: when the first step had finished (`time.perf_counter`), or None.
      saving_s: seconds spent writing checkpoints (`saving`).
    """

    def __init__(self):
        self.start = time.perf_counter()
        self.end = None
        self.first_step_done = None
        self.saving_s = 0.0

    def step_done(self, terms: tf.Tensor) -> bool:
        """After an applied step; True for the run's first, whose end it waits for
        (reading `terms`, the step's loss terms) and notes: its time includes tracing."""
        if self.first_step_done is not None:
            return False
        terms.numpy()
        self.first_step_done = time.perf_counter()
        return True

    @contextlib.contextmanager
    def saving(self):
        """A context whose time is checkpoint writing (left out of the steady state)."""
        start = time.perf_counter()
        yield
        self.saving_s += time.perf_counter() - start

    def stop(self) -> None:
        """Ends the run's time."""
        self.end = time.perf_counter()

    def figures(self, steps_run: int, tokens_per_step: int, flops_per_token: int,
                peak_flops: float) -> dict:
        """The run's throughput, after `stop`.

        Returns:
          {"train_wall_s": seconds, "tokens_per_second": steps_run x tokens_per_step /
          wall (0 when no step ran), "steady_tokens_per_second": the same over the
          steps after the first, without checkpoint writing (= tokens_per_second
          with one step or none), "mfu", "steady_mfu": of those (0 when peak_flops
          is 0)}.
        """
        wall = self.end - self.start
        tps = steps_run * tokens_per_step / wall if steps_run else 0.0
        steady_steps = steps_run - 1
        steady_wall = (self.end - self.first_step_done - self.saving_s
                       if self.first_step_done else 0.0)
        steady_tps = steady_steps * tokens_per_step / steady_wall if steady_steps > 0 else tps
        return {
            "train_wall_s": wall,
            "tokens_per_second": tps,
            "steady_tokens_per_second": steady_tps,
            "mfu": flops.mfu(tps, flops_per_token, peak_flops) if peak_flops else 0.0,
            "steady_mfu": flops.mfu(steady_tps, flops_per_token, peak_flops) if peak_flops else 0.0,
        }
