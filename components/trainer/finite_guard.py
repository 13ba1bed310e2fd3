"""What the training loop does about NaN and Inf.

A step whose loss or gradients are not finite changes nothing (`train_step.py`);
the loop counts it as skipped (`FiniteGuard.skip`: a log line, the variable
checkpointed as skipped_steps) and stops after `train.max_skipped_steps` such
steps in a row. Before a log line or a checkpoint, the losses of the steps
applied since the last such check must be finite (`check_losses`), and before a
checkpoint every weight (`check_weights`): a checkpoint is written only then, so
the last one written stays the last good one. Every stop raises
FloatingPointError naming the step and that checkpoint.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from components.trainer.train_step import LOSS_TERMS


def all_finite(tensors) -> tf.Tensor:
    """A bool scalar: every element of every tensor in `tensors` is finite."""
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


class FiniteGuard:
    """Counts skipped steps and checks losses and weights (see the module docstring).

    Args:
      model: the model trained (its weights are checked).
      skipped: int64 scalar variable, the steps skipped so far in the run (checkpointed).
      max_consecutive: `train.max_skipped_steps`, the skips in a row that stop the run.
      log: called as `log(format, *args)` with the line of a skipped step.
      last_checkpoint: () -> the last good checkpoint (path prefix) or None, for
        the error messages.
    """

    def __init__(self, model, skipped: tf.Variable, max_consecutive: int, log,
                 last_checkpoint):
        self.skipped = skipped
        self.max_consecutive = max_consecutive
        self.log = log
        self.last_checkpoint = last_checkpoint
        self.consecutive = 0
        self.pending: list[tuple[int, tf.Tensor]] = []  # (step, loss) not yet checked

        @tf.function
        def weights_finite():  # integer weights (an int8 base's kernels) are always finite
            return all_finite([tf.convert_to_tensor(v) for v in model.weights
                               if v.dtype not in ("int8", "int32", "int64")])

        self._weights_finite = weights_finite

    def skip(self, step: int, out: dict) -> None:
        """Counts step `step` (1-based), whose outputs `out` (`train_step`) were not
        finite, as skipped, and logs it.

        Raises:
          FloatingPointError: it is the `max_consecutive`-th skip in a row.
        """
        self.skipped.assign_add(1)
        self.consecutive += 1
        loss = dict(zip(LOSS_TERMS, map(float, out["terms"].numpy()), strict=True))["loss"]
        self.log("step %d skipped: not finite (loss %s, grad_norm %s); nothing changed "
                 "(%d in a row, %d in all; train.max_skipped_steps=%d)", step, loss,
                 float(out["grad_norm"]), self.consecutive, int(self.skipped.numpy()),
                 self.max_consecutive)
        if self.consecutive >= self.max_consecutive:
            raise FloatingPointError(
                f"loss is {loss} and grad_norm {float(out['grad_norm'])} at step {step}:"
                f" {self.consecutive} consecutive steps were not finite (train.max_skipped_steps="
                f"{self.max_consecutive}); training stopped; last good checkpoint: "
                f"{self.last_checkpoint()}")

    def applied(self, step: int, loss: tf.Tensor) -> None:
        """Notes applied step `step` and its loss (float32 scalar, read at the next check)."""
        self.consecutive = 0
        self.pending.append((step, loss))

    def check_losses(self) -> None:
        """Reads the losses noted since the last check.

        Raises:
          FloatingPointError: one is NaN or Inf (naming the first such step).
        """
        pending, self.pending = self.pending, []
        if not pending:
            return
        values = np.array([float(v) for _, v in pending])
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            step, value = pending[bad[0]][0], values[bad[0]]
            raise FloatingPointError(
                f"loss is {value} at step {step}; training stopped; last good checkpoint: "
                f"{self.last_checkpoint()}"
            )

    def check_weights(self, step: int) -> None:
        """Checks every weight after step `step`, before it is checkpointed.

        Raises:
          FloatingPointError: a weight is NaN or Inf.
        """
        if not bool(self._weights_finite()):
            raise FloatingPointError(
                f"a weight is NaN/Inf after step {step}; training stopped (not "
                f"checkpointed); last good checkpoint: {self.last_checkpoint()}")
