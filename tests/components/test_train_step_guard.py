"""The training step's NaN/Inf guard (`components/trainer/train_step.py`).

A batch that makes the loss and the gradients non-finite is injected through the
data: the model's `forward_train` is wrapped so that the logits of a batch holding
one token id (POISON) are multiplied by +Inf, which makes that batch's loss and
gradients Inf/NaN while the weights stay finite; other batches train normally. The step on such a batch must
change nothing: weights (router biases included), optimizer slots and step (so
the learning-rate schedule), and the step counter; it is reported as skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import data, train_loop, trainable
from components.trainer.train_step import make_train_step
from config import get_config

POISON = 7  # the token id whose embedding is +Inf


def tiny(**train):
    return get_config("tiny", {f"train.{k}": v for k, v in train.items()})


def batches(config, poisoned_steps):
    """Global batches of random ids without POISON, except at `poisoned_steps`."""
    tc, vocab = config.train, config.model.vocab_size

    def dataset_fn():
        def make(i):
            shape = [tc.batch_size, tc.seq_len]
            ids = tf.random.stateless_uniform(shape, [i, 0], POISON + 1, vocab, tf.int32)
            poisoned = tf.reduce_any(tf.equal(i, tf.constant(poisoned_steps or [-1], tf.int64)))
            ids = tf.where(poisoned, tf.tensor_scatter_nd_update(ids, [[0, 3]], [POISON]), ids)
            return {"input_ids": ids, "labels": tf.roll(ids, -1, axis=1)}
        return tf.data.Dataset.range(1000).map(make)
    return dataset_fn


def snapshot(state):
    model, optimizer = state.model, state.optimizer
    return {
        "weights": {trainable.weight_path(v): v.numpy().copy() for v in model.weights},
        "optimizer": [v.numpy().copy() for v in optimizer.variables],
        "iterations": int(optimizer.iterations.numpy()),
        "step": int(state.step.numpy()),
    }


def assert_same(before, after):
    assert after["step"] == before["step"]
    assert after["iterations"] == before["iterations"]  # the schedule did not move
    for name, value in before["weights"].items():  # bit for bit, Inf included
        np.testing.assert_array_equal(after["weights"][name], value, err_msg=name)
    assert len(after["optimizer"]) == len(before["optimizer"])
    for a, b in zip(after["optimizer"], before["optimizer"], strict=True):
        np.testing.assert_array_equal(a, b)


def make_step(config, state, jit_compile=False, loss_scaling=False):
    tc = config.train
    strategy = tf.distribute.get_strategy()
    step = make_train_step(
        state.model, state.optimizer, state.selection.variables, strategy,
        micro_batches=tc.grad_accum_steps, grad_clip_norm=tc.grad_clip_norm,
        loss_scaling=loss_scaling, moe_mask=state.selection.moe_mask, step_counter=state.step,
        jit_compile=jit_compile,
        moe_capacity_factor=tc.moe_capacity_factor if jit_compile else None)
    dist = data.distribute_global_batches(strategy, batches(config, [1]), tc.grad_accum_steps)
    return step, iter(dist)


def poison(model):
    """Wraps `model.forward_train`: Inf logits for a batch holding POISON."""
    forward_train = model.forward_train

    def poisoned(input_ids, **kwargs):
        out = dict(forward_train(input_ids, **kwargs))
        hit = tf.reduce_any(tf.equal(input_ids, POISON))
        out["logits"] = out["logits"] * tf.where(hit, float("inf"), 1.0)
        return out

    model.forward_train = poisoned


@pytest.mark.parametrize("micro", [1, 2])
@pytest.mark.slow
def test_a_non_finite_step_changes_nothing_and_is_counted(micro):
    config = tiny(grad_accum_steps=micro)
    state = train_loop.setup(config, tf.distribute.get_strategy(), "float32", warm_start=False)
    poison(state.model)
    step, it = make_step(config, state)

    good = step(it)  # batch 0: no POISON
    assert not bool(good["skipped"]) and int(state.step.numpy()) == 1
    before = snapshot(state)
    bias_before = [m.gate.e_score_correction_bias.numpy().copy() for m in state.model.moe_layers]
    bad = step(it)  # batch 1: one POISON token
    assert bool(bad["skipped"])
    assert not np.isfinite(float(bad["grad_norm"])) or not np.all(np.isfinite(bad["terms"]))
    assert_same(before, snapshot(state))
    for moe, bias in zip(state.model.moe_layers, bias_before, strict=True):
        np.testing.assert_array_equal(moe.gate.e_score_correction_bias.numpy(), bias)
    again = step(it)  # batch 2: trains again
    assert not bool(again["skipped"]) and int(state.step.numpy()) == 2
    assert int(state.optimizer.iterations.numpy()) == before["iterations"] + 1


@pytest.mark.slow
def test_the_loop_counts_skips_and_stops_after_max_skipped_steps(tmp_path, monkeypatch):
    config = tiny(train_steps=6, max_skipped_steps=3, checkpoint_every=2, log_every=1)
    setup = train_loop.setup

    def poisoned_setup(*args, **kwargs):
        state = setup(*args, **kwargs)
        poison(state.model)
        return state

    monkeypatch.setattr(train_loop, "setup", poisoned_setup)
    # Batches 2 and 3 hold POISON: the 3rd and 4th steps are skipped, 6 are applied.
    result = train_loop.train(config, batches(config, [2, 3]), str(tmp_path / "ckpt"), None)
    assert result.skipped_steps == 2 and result.steps_run == 6
    assert result.history[-1]["skipped_steps"] == 2
    stopping = tiny(train_steps=6, max_skipped_steps=2, checkpoint_every=2)
    with pytest.raises(FloatingPointError, match=r"2 consecutive steps were not finite "
                                                 r"\(train.max_skipped_steps=2\)"):
        train_loop.train(stopping, batches(config, [2, 3]), str(tmp_path / "ckpt2"), None)
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt2")).endswith("ckpt-2")


@pytest.mark.slow
def test_mixed_float16_overflow_skip_follows_the_same_rule():
    """Under mixed_float16 the LossScaleOptimizer skips the step and halves its scale;
    the router biases and the step counter follow: nothing else changes."""
    config = tiny()
    state = train_loop.setup(config, tf.distribute.get_strategy(), "mixed_float16",
                             warm_start=False)
    poison(state.model)
    step, it = make_step(config, state, loss_scaling=True)
    step(it)
    scale = float(state.optimizer.dynamic_scale.numpy())
    before = snapshot(state)
    bad = step(it)
    assert bool(bad["skipped"])
    after = snapshot(state)
    assert float(state.optimizer.dynamic_scale.numpy()) == scale / 2
    # Everything but the loss scale's own state (its scale and growth counter) is unchanged.
    before["optimizer"] = [v for v in before["optimizer"] if v.shape != ()]
    after["optimizer"] = [v for v in after["optimizer"] if v.shape != ()]
    assert_same(before, after)
