"""The loop over the optimizer steps of a run that `train_loop.train` started.

    while step < train.train_steps:
        before each step: heartbeat; on SIGTERM (any worker): checkpoint this step,
                          raise Preempted                      `save_and_stop`
        out = train_step(batches)
        the data ended (train.on_source_exhausted="stop"): checkpoint, end  `data_ended`
        not finite: skip (nothing changed), count it
        add out to the logging window; progress bar          `after_step`
        every log_every steps (and after the first): check the losses; log line;
            TensorBoard                                       `log_window`
        every checkpoint_every steps (and at the end): check losses and weights;
            checkpoint                                        `before_saving`

Its lines go to the logger it is given (`train_loop`'s).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import tensorflow as tf

from components.trainer import metrics
from components.trainer.checkpointer import Checkpointer
from components.trainer.finite_guard import FiniteGuard
from components.trainer.heartbeat import Heartbeat
from components.trainer.preemption import Preempted, PreemptionWatcher
from components.trainer.progress import Progress, progress_enabled
from components.trainer.run_records import TrainingState
from components.trainer.summaries import TrainSummaries
from config import PipelineConfig


@dataclasses.dataclass
class StepLoop:
    """The loop of a started run and what it keeps between steps.

    Attributes:
      config: the pipeline config.
      state: the model, optimizer and counters (`train_loop.setup`).
      checkpoints: the run's `Checkpointer`.
      train_step: the step: `train_step(batches) -> outputs` (`train_step.py`).
      batches: the iterator of the distributed global batches, at the first not drawn.
      sources: the tokens and sequences per source (`metrics.SourceCounts`).
      window: the logging window (`metrics.MetricWindow`), resumed.
      tensorboard: the TensorBoard writer (`TrainSummaries`).
      clock: the run's wall clock (`metrics.RunClock`).
      logger: where the loop's lines go.
      step: the optimizer steps done.
      stopped_early: why the run ended before `train.train_steps` ("": it did not).
      saved: the last step checkpointed (-1: none yet).
      progress, guard: the progress bar and the `FiniteGuard` (while `loop` runs).
    """

    config: PipelineConfig
    state: TrainingState
    checkpoints: Checkpointer
    train_step: Any
    batches: Any
    sources: metrics.SourceCounts
    window: metrics.MetricWindow
    tensorboard: TrainSummaries
    clock: metrics.RunClock
    logger: logging.Logger
    step: int
    stopped_early: str = ""
    saved: int = -1
    progress: Progress | None = None
    guard: FiniteGuard | None = None

    def loop(self, strategy: tf.distribute.Strategy, num_workers: int) -> None:
        """Steps until `train.train_steps` are done or the data ends (`data_ended`); before
        each step a heartbeat and, once every worker (of `num_workers`) agrees on a
        SIGTERM, `save_and_stop`.

        Raises:
          FloatingPointError, Preempted, tf.errors.OutOfRangeError: as `train_loop.train`.
        """
        tc, checkpoints = self.config.train, self.checkpoints
        heartbeat = Heartbeat.from_env()
        with Progress(tc.train_steps, self.step, self.window.tokens_per_step, logger=self.logger,
                      enabled=checkpoints.chief and progress_enabled()) as progress, \
                PreemptionWatcher(strategy, num_workers) as preemption:
            self.progress = progress
            self.guard = FiniteGuard(self.state.model, self.state.skipped, tc.max_skipped_steps,
                                     progress.log, checkpoints.last_good)
            self.saved = self.step if checkpoints.latest else -1
            while self.step < tc.train_steps:
                heartbeat.beat(self.step)
                if preemption.agreed():  # every worker, after the same steps
                    with progress.suspended():
                        self.save_and_stop()
                try:
                    out = self.train_step(self.batches)
                except (tf.errors.OutOfRangeError, StopIteration):
                    if tc.on_source_exhausted != "stop":
                        raise
                    self.data_ended()
                    break
                self.after_step(out)

    def data_ended(self) -> None:
        """With `train.on_source_exhausted="stop"`: notes and logs where the data ended,
        and checkpoints the last full global batch (unless it is saved already).

        Raises:
          FloatingPointError: a loss or a weight is not finite (nothing is saved).
        """
        tc, step = self.config.train, self.step
        self.stopped_early = f"the data ended at step {step}"
        self.progress.log("train.on_source_exhausted=stop: %s of %d; training ends there",
                          self.stopped_early, tc.train_steps)
        if self.saved != step:  # the last full global batch: checkpoint it
            self.guard.check_losses()
            self.before_saving(step)
            self.checkpoints.save(step)

    def after_step(self, out: dict) -> None:
        """Counts a step's outputs `out` (`train_step`): a skipped one (not finite), or an
        applied one, then its log line and checkpoint when they are due.

        Raises:
          FloatingPointError: too many steps in a row were skipped, or a loss or a weight
            is not finite at a log line or checkpoint.
        """
        tc = self.config.train
        applied = not bool(out["skipped"])
        self.sources.add(out, applied)
        if not applied:
            self.guard.skip(self.step + 1, out)
            return
        self.step += 1
        step = self.step
        self.guard.applied(step, out["terms"][0])
        self.progress.step(step, out["terms"][0])
        self.window.add(out)
        first = self.clock.step_done(out["terms"])
        is_log = first or step % tc.log_every == 0 or step == tc.train_steps
        is_ckpt = step % tc.checkpoint_every == 0 or step == tc.train_steps
        if is_log or is_ckpt:
            self.guard.check_losses()
        if is_log:
            self.log_window(first)
        if is_ckpt:
            self.before_saving(step)
            with self.clock.saving(), self.progress.suspended():  # TensorFlow logs while it saves
                self.checkpoints.save(step)
            self.saved = step
        if is_log:
            self.window.restart()  # after the log line and any saving: tokens/s of steps only

    def log_window(self, first: bool) -> None:
        """Closes the logging window at this step: its log line (untimed after the `first`
        step, whose time includes tracing) and TensorBoard."""
        record, load = self.window.close(self.step, int(self.state.skipped.numpy()),
                                         timed=not first)
        self.sources.sync()
        record["source_tokens"], record["token_share"] = (self.sources.token_counts(),
                                                          self.sources.shares())
        self.progress.log_window(record, self.config.train.train_steps, timed=not first)
        self.tensorboard.write(record, load)

    def before_saving(self, step: int) -> None:
        """What every checkpoint write of step `step` needs first: finite weights (or
        FloatingPointError), and the source counts and the history in their checkpointed
        variables."""
        self.guard.check_weights(step)
        self.sources.store()
        self.window.store()

    def save_and_stop(self) -> None:
        """On preemption: checkpoints this step (unless it is saved already) and raises
        `Preempted` (the history keeps the records closed so far: the open window's steps
        have none).

        Raises:
          Preempted: always, naming the step and its checkpoint.
          FloatingPointError: a weight is not finite (nothing is saved).
        """
        step, checkpoints = self.step, self.checkpoints
        if self.saved != step:
            self.before_saving(step)
            checkpoints.save(step)
        path = f"{checkpoints.checkpoint_dir.rstrip('/')}/ckpt-{step}"
        checkpoints.close()
        self.logger.warning("preempted (SIGTERM): checkpoint %s written at step %d; the next "
                            "run resumes from it", path, step)
        raise Preempted(f"preempted (SIGTERM) at step {step}; checkpoint {path}", step, path)
