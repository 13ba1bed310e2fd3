"""Saving, restoring and resuming a run's state (`components/trainer/checkpointer.py`),
on a small stand-in for the model and optimizer. (A whole run resumed:
test_trainer_loop.py.)"""

from __future__ import annotations

import os

import tensorflow as tf

from components.trainer.checkpointer import MAX_TO_KEEP, Checkpointer


def state(value=0.0):
    """(model, optimizer, step, skipped_steps): anything trackable will do here."""
    model, optimizer = tf.Module(), tf.Module()
    model.w = tf.Variable([value, value])
    optimizer.m = tf.Variable(value)
    return (model, optimizer, tf.Variable(0, dtype=tf.int64),
            tf.Variable(0, dtype=tf.int64))


def test_a_fresh_run_starts_at_step_0_and_the_chief_keeps_the_last_checkpoints(tmp_path):
    directory = str(tmp_path / "ckpt")
    chief = Checkpointer(directory, chief=True)
    model, optimizer, step, skipped = state(1.0)
    assert chief.latest is None and chief.restore(model, optimizer, step, skipped) == 0
    assert chief.last_good() is None
    for n in (2, 4, 6, 8):
        step.assign(n)
        chief.save(n)
    assert chief.last_good() == chief.final() == os.path.join(directory, "ckpt-8")
    kept = sorted(f for f in os.listdir(directory) if f.endswith(".index"))
    assert len(kept) == MAX_TO_KEEP and kept[0] == "ckpt-4.index"
    chief.close()
    assert os.path.isdir(directory)  # the chief's directory stays


def test_a_resumed_run_restores_every_part_of_the_state(tmp_path):
    directory = str(tmp_path / "ckpt")
    first = Checkpointer(directory, chief=True)
    model, optimizer, step, skipped = state(1.0)
    first.restore(model, optimizer, step, skipped)
    step.assign(6)
    skipped.assign(2)
    first.save(6)
    again = Checkpointer(directory, chief=True)
    model2, optimizer2, step2, skipped2 = state(0.0)
    assert again.latest == os.path.join(directory, "ckpt-6")
    assert again.restore(model2, optimizer2, step2, skipped2) == 6
    assert int(skipped2.numpy()) == 2
    assert model2.w.numpy().tolist() == [1.0, 1.0] and float(optimizer2.m.numpy()) == 1.0


def test_other_workers_read_the_chiefs_directory_and_write_apart(tmp_path):
    directory = str(tmp_path / "ckpt")
    chief = Checkpointer(directory, chief=True)
    model, optimizer, step, skipped = state(1.0)
    chief.restore(model, optimizer, step, skipped)
    step.assign(3)
    chief.save(3)
    worker = Checkpointer(directory, chief=False)
    assert worker.restore(*state(0.0)) == 3
    worker.save(5)
    assert worker.write_dir != directory and os.path.isdir(worker.write_dir)
    assert worker.last_good() == os.path.join(directory, "ckpt-3")  # the chief's
    assert worker.final() == os.path.join(directory, "ckpt-3")
    worker.close()
    assert not os.path.exists(worker.write_dir)


def test_extra_counters_are_saved_and_an_older_checkpoint_restores_without_them(tmp_path):
    directory = str(tmp_path / "ckpt")
    old = Checkpointer(directory, chief=True)
    model, optimizer, step, skipped = state(1.0)
    old.restore(model, optimizer, step, skipped)  # a checkpoint without the counters
    old.save(2)
    counter = tf.Variable([0, 0], dtype=tf.int64)
    resumed = Checkpointer(directory, chief=True)
    assert resumed.restore(*state(0.0)[:2], step, skipped, {"source_tokens": counter}) == 0
    assert counter.numpy().tolist() == [0, 0]  # nothing to restore: it starts at 0
    counter.assign([5, 7])
    step.assign(4)
    resumed.save(4)
    again = tf.Variable([0, 0], dtype=tf.int64)
    Checkpointer(directory, chief=True).restore(*state(0.0), {"source_tokens": again})
    assert again.numpy().tolist() == [5, 7]
