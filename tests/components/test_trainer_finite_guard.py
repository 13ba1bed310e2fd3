"""The loop's rules for NaN and Inf (`components/trainer/finite_guard.py`), on their own:
skipped steps counted and stopped after `max_consecutive` in a row, losses and weights
checked, errors naming the step and the last good checkpoint. (The loop with them:
test_train_step_guard.py.)"""

from __future__ import annotations

import types

import pytest
import tensorflow as tf

from components.trainer.finite_guard import FiniteGuard, all_finite

LAST = "/ckpt/ckpt-4"
NAN, INF = float("nan"), float("inf")


def guard(weights=(1.0, 2.0), max_consecutive=2):
    lines = []
    model = types.SimpleNamespace(weights=[tf.Variable(list(weights))])
    skipped = tf.Variable(0, dtype=tf.int64)
    g = FiniteGuard(model, skipped, max_consecutive, lambda *args: lines.append(args[0] % args[1:]),
                    lambda: LAST)
    return g, skipped, lines


def bad_out(loss=NAN, grad_norm=NAN):
    return {"terms": tf.constant([loss, 1.0, 1.0, 0.0, 0.0, 0.0]), "grad_norm": tf.constant(grad_norm)}


def test_skips_are_counted_and_an_applied_step_ends_a_run_of_them():
    g, skipped, lines = guard(max_consecutive=2)
    g.skip(3, bad_out())
    g.applied(3, tf.constant(1.0))  # the next batch trains: the run of skips ends
    g.skip(5, bad_out(loss=INF))
    assert int(skipped.numpy()) == 2 and g.consecutive == 1
    assert lines == [
        "step 3 skipped: not finite (loss nan, grad_norm nan); nothing changed "
        "(1 in a row, 1 in all; train.max_skipped_steps=2)",
        "step 5 skipped: not finite (loss inf, grad_norm nan); nothing changed "
        "(1 in a row, 2 in all; train.max_skipped_steps=2)"]


def test_max_consecutive_skips_stop_the_run():
    g, skipped, _ = guard(max_consecutive=2)
    g.skip(3, bad_out())
    with pytest.raises(FloatingPointError) as info:
        g.skip(3, bad_out())
    assert str(info.value) == (
        "loss is nan and grad_norm nan at step 3: 2 consecutive steps were not finite "
        "(train.max_skipped_steps=2); training stopped; last good checkpoint: " + LAST)
    assert int(skipped.numpy()) == 2


def test_the_first_non_finite_loss_since_the_last_check_stops_the_run():
    g, _, _ = guard()
    g.applied(1, tf.constant(2.0))
    g.check_losses()  # at a log line: step 1 is checked
    for step, loss in ((2, 1.0), (3, INF), (4, NAN)):
        g.applied(step, tf.constant(loss))
    with pytest.raises(FloatingPointError) as info:
        g.check_losses()
    assert str(info.value) == ("loss is inf at step 3; training stopped; last good "
                               f"checkpoint: {LAST}")


def test_weights_are_checked_before_a_checkpoint():
    guard((1.0, 2.0))[0].check_weights(4)
    with pytest.raises(FloatingPointError) as info:
        guard((1.0, NAN))[0].check_weights(5)
    assert str(info.value) == ("a weight is NaN/Inf after step 5; training stopped (not "
                               f"checkpointed); last good checkpoint: {LAST}")
    assert bool(all_finite([tf.constant([1.0]), tf.constant([[2.0]])]))
    assert not bool(all_finite([tf.constant([1.0]), tf.constant([[INF]])]))
