"""The private Keras internals that `components.trainer.schedule.AdamW` relies on.

`schedule.AdamW` subclasses `keras.optimizers.AdamW` (keras==3.6.0, pinned in
pyproject.toml) and uses four private hooks of its TensorFlow optimizer:

  _all_reduce_sum_gradients(grads_and_vars)  overridden: the identity (the training step
                                             all-reduced the gradients already)
  _apply_weight_decay(variables)             overridden: a no-op (the decay is done in
                                             `update_step`, with the step's learning rate)
  _use_weight_decay(variable)                called: False for the variables given to the
                                             public `exclude_from_weight_decay`
  _get_variable_index(variable)              called: the variable's position in the list the
                                             optimizer was built on (the index of its m and v)

None has a public equivalent in Keras 3.6 that keeps both the numerics and the step graph
(see AdamW's docstring). A Keras that renames one would leave the override dead, silently:
every update multiplied by the number of replicas, or the weight decay applied twice. Each
test below asserts what AdamW assumes of one hook, on tiny variables (no model, no training),
and fails with the hook's name and what to do.
"""

from __future__ import annotations

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.trainer import schedule
from config import get_config

WEIGHT_DECAY, LEARNING_RATE = 0.5, 0.1


def _pin(internal: str, what: str) -> str:
    """The failure message: which internal changed, and what to do about it."""
    return (f"Keras {keras.version()}: the private `{internal}` {what}. "
            "components/trainer/schedule.py `AdamW` relies on it; the project pins keras==3.6.0 "
            "(pyproject.toml). If Keras was upgraded on purpose, read the new "
            "keras/src/optimizers/base_optimizer.py and keras/src/backend/tensorflow/optimizer.py, "
            "adapt schedule.AdamW to the new hook (or drop the override if a public route now "
            "exists), keep tests/components/test_trainer_setup.py::test_fused_adamw_matches_keras_adamw "
            "passing, then update this test.")


def _variables() -> list[keras.Variable]:
    """A kernel, an embedding (decayed) and a bias (not decayed), with distinct values."""
    return [keras.Variable(np.arange(6, dtype="float32").reshape(2, 3) / 7 - 0.3, name="kernel"),
            keras.Variable(np.linspace(-1, 1, 3, dtype="float32"), name="bias"),
            keras.Variable(np.arange(8, dtype="float32").reshape(4, 2) / 5 + 0.1, name="embeddings")]


def _train_config():
    return get_config("tiny", {"train.warmup_steps": 0, "train.weight_decay": WEIGHT_DECAY,
                               "train.learning_rate": LEARNING_RATE,
                               "train.min_learning_rate": LEARNING_RATE / 10}).train


@pytest.mark.parametrize("internal, parameters", [
    ("_all_reduce_sum_gradients", ["self", "grads_and_vars"]),
    ("_apply_weight_decay", ["self", "variables"]),
    ("_use_weight_decay", ["self", "variable"]),
    ("_get_variable_index", ["self", "variable"]),
])
def test_hook_exists_with_the_signature_adamw_assumes(internal, parameters):
    hook = getattr(keras.optimizers.AdamW, internal, None)
    assert hook is not None, _pin(internal, "no longer exists on keras.optimizers.AdamW")
    found = list(inspect.signature(hook).parameters)
    assert found == parameters, _pin(internal, f"now takes {found}, not {parameters}")


def test_apply_calls_the_hooks_once_per_step_in_order(monkeypatch):
    """One `apply`: decay hook (all variables), all-reduce hook (all pairs), update_step each."""
    calls = []

    class Recording(schedule.AdamW):
        def _apply_weight_decay(self, variables):
            calls.append(("_apply_weight_decay", list(variables)))
            return super()._apply_weight_decay(variables)

        def _all_reduce_sum_gradients(self, grads_and_vars):
            grads_and_vars = list(grads_and_vars)
            calls.append(("_all_reduce_sum_gradients", [v for _, v in grads_and_vars]))
            reduced = super()._all_reduce_sum_gradients(grads_and_vars)
            assert [(id(g), id(v)) for g, v in reduced] == [(id(g), id(v)) for g, v in grads_and_vars]
            return reduced

        def update_step(self, gradient, variable, learning_rate):
            calls.append(("update_step", variable, float(learning_rate), int(self.iterations.numpy())))
            return super().update_step(gradient, variable, learning_rate)

    monkeypatch.setattr(schedule, "AdamW", Recording)
    variables = _variables()
    optimizer = schedule.make_optimizer(_train_config(), variables)
    calls.clear()
    optimizer.apply([tf.ones_like(v) for v in variables], variables)

    names = [c[0] for c in calls]
    assert names.count("_apply_weight_decay") == 1, _pin(
        "_apply_weight_decay", f"is called {names.count('_apply_weight_decay')} times per apply, not "
        "once (AdamW's no-op override would no longer stop Keras' own decay, or decay is elsewhere)")
    assert names.count("_all_reduce_sum_gradients") == 1, _pin(
        "_all_reduce_sum_gradients", f"is called {names.count('_all_reduce_sum_gradients')} times per "
        "apply, not once (Keras may now all-reduce elsewhere: updates multiplied by the replica count)")
    assert names == ["_apply_weight_decay", "_all_reduce_sum_gradients"] + ["update_step"] * 3, _pin(
        "_apply_weight_decay / _all_reduce_sum_gradients", f"are called in a new order: {names}")
    assert calls[0][1] == variables, _pin(
        "_apply_weight_decay", "no longer receives the trainable variables of the step")
    update_vars = [c[1] for c in calls[2:]]
    assert all(u is v.value for u, v in zip(update_vars, variables, strict=True)), _pin(
        "_backend_update_step", "no longer hands update_step each variable's tf.Variable, in build order")
    assert calls[1][1] == update_vars, _pin(
        "_all_reduce_sum_gradients", "no longer receives the (gradient, tf.Variable) pairs of the step")
    # The decay in update_step uses update_step's learning rate: it is the one Keras' own
    # `_apply_weight_decay` would use (the schedule at `iterations`, read before the step counts).
    for _, _, learning_rate, iterations in calls[2:]:
        assert iterations == 0 and learning_rate == np.float32(LEARNING_RATE), _pin(
            "update_step's learning_rate", f"is {learning_rate} at iterations={iterations}, not the "
            f"schedule's lr(0) = {LEARNING_RATE} before the step counts")
    assert int(optimizer.iterations.numpy()) == 1


def test_weight_decay_is_applied_exactly_once_per_step():
    """With zero gradients Adam moves nothing, so a step is the decay alone: w - w * wd * lr."""
    variables = _variables()
    optimizer = schedule.make_optimizer(_train_config(), variables)
    before = [v.numpy() for v in variables]
    optimizer.apply([tf.zeros_like(v) for v in variables], variables)
    for v, w in zip(variables, before, strict=True):
        expected = w - w * np.float32(WEIGHT_DECAY) * np.float32(LEARNING_RATE) if v.ndim >= 2 else w
        np.testing.assert_array_equal(v.numpy(), expected, err_msg=_pin(
            "_apply_weight_decay", f"did not leave {v.path} decayed exactly once (Keras' own decay "
            "ran besides AdamW's, or neither did)"))


def test_use_weight_decay_follows_exclude_from_weight_decay():
    variables = _variables()
    optimizer = schedule.make_optimizer(_train_config(), variables)
    for v in variables:
        for key in (v, v.value):  # update_step receives the tf.Variable
            assert optimizer._use_weight_decay(key) == (v.ndim >= 2), _pin(
                "_use_weight_decay", f"answers {optimizer._use_weight_decay(key)} for {v.path} "
                f"({type(key).__name__}); exclude_from_weight_decay excluded exactly the rank < 2 ones")


def test_get_variable_index_is_the_build_position_of_m_and_v():
    variables = _variables()
    optimizer = schedule.make_optimizer(_train_config(), variables)
    for i, v in enumerate(variables):
        for key in (v, v.value):
            assert optimizer._get_variable_index(key) == i, _pin(
                "_get_variable_index", f"gives {optimizer._get_variable_index(key)} for {v.path} "
                f"({type(key).__name__}), not its position {i} in the build list")
        for slots in (optimizer.momentums, optimizer.velocities):
            assert slots[i].shape == v.shape and slots[i].path.startswith(f"adamw/{v.name}_")


def test_slots_have_the_layout_of_keras_adamw():
    """Same variables, names and order as keras.optimizers.AdamW: checkpoints stay compatible."""
    variables = _variables()
    tc = _train_config()
    ours = schedule.make_optimizer(tc, variables)
    keras_adamw = keras.optimizers.AdamW(learning_rate=schedule.make_learning_rate_schedule(tc))
    keras_adamw.build(variables)
    assert [(v.path, v.shape, v.dtype) for v in ours.variables] == \
        [(v.path, v.shape, v.dtype) for v in keras_adamw.variables], (
        "schedule.AdamW.build no longer creates the slot variables of keras.optimizers.Adam.build "
        f"(keras {keras.version()}; the project pins keras==3.6.0): optimizer checkpoints written "
        "by earlier runs would not restore. Adapt schedule.AdamW.build to the new Adam.build.")
