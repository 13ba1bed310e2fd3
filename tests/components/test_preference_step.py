"""DPO in the training step (`train_step.make_train_step` with `DPOObjective`): the step's
loss is `preference.dpo_loss` of the model and its frozen reference, response tokens
only; a reference that gives NaN skips the step (the NaN guard of every task) and
changes no weight."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.trainer import model_io, preference, preference_objectives, train_step, trainable
from components.trainer.data import IGNORE_LABEL
from components.trainer.schedule import make_optimizer
from config import get_config

T = 10


def _models():
    config = get_config("tiny", {"data.task": "dpo", "train.seq_len": T})
    keras.utils.set_random_seed(0)
    model = model_io.build_model(config)
    reference = model_io.build_model(config)
    reference.set_weights(model.get_weights())
    return config, model, reference


def _batch(vocab: int, pairs: int = 4):
    """(1 micro-batch, pairs, 2, T): a 3-token prompt, then responses of 2..5 tokens."""
    rng = np.random.default_rng(0)
    ids = rng.integers(3, vocab, (1, pairs, 2, T)).astype(np.int32)
    labels = np.full_like(ids, IGNORE_LABEL)
    for p in range(pairs):
        for r, length in enumerate((2 + p % 3, 5 - p % 3)):
            labels[0, p, r, 2:2 + length] = rng.integers(3, vocab, length)
    return {"input_ids": tf.constant(ids), "labels": tf.constant(labels)}


def _step(config, model, reference):
    variables = trainable.without_mtp(model, trainable.prepare(model, config.train)).variables
    optimizer = make_optimizer(config.train, variables)
    objective = preference_objectives.DPOObjective(model, reference, beta=0.1)
    return train_step.make_train_step(model, optimizer, variables, tf.distribute.get_strategy(),
                                      micro_batches=1, grad_clip_norm=1.0, objective=objective)


@pytest.mark.slow
def test_the_dpo_step_loss_is_dpo_loss_of_policy_and_reference():
    config, model, reference = _models()
    batch = _batch(config.model.vocab_size)
    ids = tf.reshape(batch["input_ids"], [-1, T])
    labels = tf.reshape(batch["labels"], [-1, T])
    policy = tf.reshape(preference.sequence_logps(model(ids), labels), [-1, 2])
    expected, _ = preference.dpo_loss(policy[:, 0], policy[:, 1], policy[:, 0], policy[:, 1],
                                      0.1)
    out = _step(config, model, reference).step_on(batch)
    terms = dict(zip(train_step.LOSS_TERMS, out["terms"].numpy(), strict=True))
    assert terms["lm_loss"] == pytest.approx(float(expected), abs=1e-6)
    assert terms["lm_loss"] == pytest.approx(np.log(2.0), abs=1e-6)  # policy == reference
    figures = dict(zip(preference_objectives.DPO_FIGURES, out["figures"].numpy(), strict=True))
    assert figures["reward_accuracy"] == 0.0 and abs(figures["reward_margin"]) < 1e-6
    assert not bool(out["skipped"])


@pytest.mark.slow
def test_a_nan_reference_skips_the_step_and_changes_nothing():
    config, model, reference = _models()
    kernel = reference.trainable_variables[0]
    kernel.assign(tf.fill(kernel.shape, float("nan")))
    before = [v.numpy().copy() for v in model.trainable_variables]
    out = _step(config, model, reference).step_on(_batch(config.model.vocab_size))
    assert bool(out["skipped"])
    for old, v in zip(before, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(old, v.numpy())
