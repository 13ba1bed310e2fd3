"""Saving and restoring a run's training state in its checkpoint directory.

The directory itself (one per training data and config, so that a re-run
resumes) is chosen by `checkpoint_location.py`. A checkpoint holds the model, the
optimizer (slots, step, loss scale), the global step and the count of skipped
steps (`tf.train.Checkpoint` keys model, optimizer, step, skipped_steps), and the
loop's other state (`extra`: the tokens and sequences per mixture source, and the
history's records as JSON, `MetricWindow.resume`), as
`ckpt-<step>`; the last `MAX_TO_KEEP` are kept. A checkpoint written before an
`extra` key existed restores without it (that counter keeps its initial value).

Every worker restores from the chief's directory; only the chief writes there.
The other workers write to a temporary directory of their own, removed at the
end, as TensorFlow's multi-worker guide prescribes (saving may run collectives,
so every worker must save).
"""

from __future__ import annotations

import shutil
import tempfile

import keras
import tensorflow as tf

MAX_TO_KEEP = 3


class Checkpointer:
    """Restores and saves one run's training state.

    Args:
      checkpoint_dir: the run's checkpoint directory (the chief's).
      chief: whether this worker is the chief (the one that writes there).

    Attributes:
      latest: the checkpoint found in `checkpoint_dir` when the run started (its
        path prefix, e.g. ".../ckpt-8"), which `restore` resumes from; None for a
        fresh run.
    """

    def __init__(self, checkpoint_dir: str, chief: bool):
        self.checkpoint_dir = checkpoint_dir
        self.chief = chief
        self.latest = tf.train.latest_checkpoint(checkpoint_dir)
        self.write_dir = self.manager = None  # set by `restore`

    def restore(self, model: keras.Model, optimizer: keras.optimizers.Optimizer,
                step: tf.Variable, skipped_steps: tf.Variable,
                extra: dict[str, tf.Variable] | None = None) -> int:
        """Tracks the training state for `save`, and restores it from `latest` if any.

        Args:
          model, optimizer: the model trained and its optimizer.
          step: int64 scalar, the optimizer steps done (the global step).
          skipped_steps: int64 scalar, the steps skipped as not finite.
          extra: {key: variable} saved too, and restored where `latest` has the key.

        Returns:
          The step restored (`step`'s value: 0 for a fresh run).

        Raises:
          AssertionError: a tracked object has no value in the checkpoint (another
            architecture, trainable selection or optimizer).
        """
        extra = extra or {}
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step,
                                         skipped_steps=skipped_steps, **extra)
        self.write_dir = (self.checkpoint_dir if self.chief
                          else tempfile.mkdtemp(prefix="ckpt-worker-"))
        self.manager = tf.train.CheckpointManager(checkpoint, self.write_dir,
                                                  max_to_keep=MAX_TO_KEEP)
        if self.latest:
            saved = {name.split("/")[0] for name, _ in tf.train.list_variables(self.latest)}
            if not set(extra) <= saved:  # written before those counters existed
                checkpoint = tf.train.Checkpoint(
                    model=model, optimizer=optimizer, step=step, skipped_steps=skipped_steps,
                    **{k: v for k, v in extra.items() if k in saved})
            checkpoint.restore(self.latest).assert_existing_objects_matched()
        return int(step.numpy())

    def last_good(self) -> str | None:
        """The newest checkpoint of this run's directory known here (the chief's last
        save; on other workers, `latest`): the one to resume from after a failure."""
        return self.manager.latest_checkpoint if self.chief else self.latest

    def save(self, step: int) -> None:
        """Writes `ckpt-<step>`, the state after optimizer step `step` (every worker
        must call it; see the module docstring)."""
        self.manager.save(checkpoint_number=step)

    def final(self) -> str | None:
        """The newest checkpoint in `checkpoint_dir` now (read from the directory)."""
        return tf.train.latest_checkpoint(self.checkpoint_dir)

    def close(self) -> None:
        """Removes a non-chief worker's temporary directory."""
        if not self.chief:
            shutil.rmtree(self.write_dir, ignore_errors=True)
