"""What a training run shows on the terminal: the progress bar and the log lines.

Log lines (chief): one after the first step and every `train.log_every` steps,
always (`Progress.log_window`), and one per skipped step; they go to the logger
the loop passes in (the run's log file and console).

Progress bar (chief, in a terminal): tqdm with step/total, loss and tokens/s,
refreshed at most every `PROGRESS_INTERVAL_S`. `progress_enabled` says whether
to draw it: not when neither stderr nor stdout is a terminal (a log file, a
notebook), nor when `CI` is set; `DEEPSEEK_TFX_PROGRESS=1`/`0` forces it
on/off. It draws on stderr, or on stdout when only stdout is a terminal
(`progress_stream`: the CLI sends stderr to its log file and keeps stdout on
the console). It reads the loss (a device-to-host copy) at most that often, so
the steps between refreshes run as without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

import tensorflow as tf
from tqdm import tqdm

PROGRESS_ENV = "DEEPSEEK_TFX_PROGRESS"
PROGRESS_INTERVAL_S = 1.0


def progress_stream():
    """The stream the progress bar draws on: stderr when it is a terminal, else stdout
    when that is one (the CLI keeps stdout on the terminal and sends stderr to its
    log file), else stderr."""
    for stream in (sys.stderr, sys.stdout):
        try:
            if stream is not None and stream.isatty():
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return sys.stderr


def progress_enabled(stream=None) -> bool:
    """Whether to draw a progress bar on `stream` (default `progress_stream()`).

    `DEEPSEEK_TFX_PROGRESS=1` or `0` decides; otherwise only on a terminal and
    when `CI` is unset or empty (CI logs get the periodic log lines only).

    Raises:
      ValueError: `DEEPSEEK_TFX_PROGRESS` is set to something else.
    """
    forced = os.environ.get(PROGRESS_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{PROGRESS_ENV}={forced!r}: expected 1 (progress bar) or 0 (none)")
        return forced == "1"
    if os.environ.get("CI", "").strip():
        return False
    stream = progress_stream() if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """The progress bar and log lines of a training run (the bar a no-op when disabled).

    A context manager: the bar is closed on leaving it (`close`), exception or not.

    Args:
      total: the run's optimizer steps (`train.train_steps`).
      initial: the steps already done (a resumed run's step).
      tokens_per_step: tokens of one global batch (batch size x sequence length),
        for the bar's tokens/s.
      enabled: whether to draw the bar (`progress_enabled`; the chief only).
      logger: where the log lines go.
      stream: the bar's stream (default `progress_stream()`).
    """

    def __init__(self, total: int, initial: int, tokens_per_step: int, enabled: bool,
                 logger: logging.Logger, stream=None):
        self.tokens_per_step = tokens_per_step
        self.logger = logger
        self.stream = progress_stream() if stream is None else stream
        self.bar = tqdm(total=total, initial=initial, unit="step", desc="train",
                        file=self.stream, dynamic_ncols=True, mininterval=PROGRESS_INTERVAL_S,
                        disable=not enabled)
        self.last_time, self.last_step = time.perf_counter(), initial

    def step(self, step: int, loss: tf.Tensor) -> None:
        """After optimizer step `step`; reads `loss` (a float32 scalar) only when the
        postfix is refreshed."""
        if self.bar.disable:
            return
        now = time.perf_counter()
        if now - self.last_time >= PROGRESS_INTERVAL_S or step == self.bar.total:
            tps = (step - self.last_step) * self.tokens_per_step / (now - self.last_time)
            self.bar.set_postfix_str(f"loss {float(loss):.4f}, {tps:,.0f} tok/s", refresh=False)
            self.last_time, self.last_step = now, step
        self.bar.update(1)

    def log(self, *args) -> None:
        """`logger.info(*args)`, with the bar cleared while the line is written."""
        with self.suspended():
            self.logger.info(*args)

    def log_window(self, record: dict, total_steps: int, timed: bool) -> None:
        """The log line of a logging window's `record` (`metrics.MetricWindow.record`).

        `timed` is False for the window of the first step (it includes tracing:
        no tokens/s or MFU). The distillation and indexer losses, the dropped MoE fraction and
        the skipped steps appear only when not 0; the token share of each source
        (the record's "token_share") only with 2+ sources; DPO's and GRPO's figures
        (the record's "figures") when there are any.
        """
        speed = (f"  {record['tokens_per_second']:.0f} tok/s  MFU {100 * record['mfu']:.1f}%"
                 if timed else "  (first step: tracing)")
        distill = "".join(f"  {name} {record[name]:.4f}" for name in
                          ("distill_loss", "indexer_loss") if record.get(name))
        dropped = (f"  MoE dropped {100 * record['moe_dropped_fraction']:.2f}%"
                   if record["moe_dropped_fraction"] else "")
        skipped = f"  skipped {record['skipped_steps']}" if record["skipped_steps"] else ""
        shares = record.get("token_share", {})
        sources = ("  tokens " + " ".join(f"{n} {100 * v:.1f}%" for n, v in shares.items())
                   if len(shares) > 1 else "")
        figures = "".join(f"  {n} {v:.4f}" for n, v in record.get("figures", {}).items())
        self.log("step %5d/%d  loss %.4f  lm_loss %.4f%s%s  lr %.2e  grad_norm %.3f%s%s%s%s",
                 record["step"], total_steps, record["loss"], record["lm_loss"], distill,
                 figures, record["learning_rate"], record["grad_norm"], speed, dropped, skipped,
                 sources)

    def suspended(self):
        """A context in which the bar is cleared (for other writers to the terminal)."""
        if self.bar.disable:
            return contextlib.nullcontext()
        return tqdm.external_write_mode(file=self.stream)

    def close(self) -> None:
        """Closes the bar (leaves it drawn at its last state)."""
        self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
