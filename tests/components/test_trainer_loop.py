"""The training loop on the `tiny` preset: gradient accumulation, exact resume,
NaN stop, activation recomputation, mixed precision.

Training data: synthetic transformed examples (documents made of words of a
small fixed lexicon, so there is something to learn), written with
`data.write_examples`; the input pipeline is the real one.
"""

from __future__ import annotations

import math
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from components.trainer import data, model_io, train_loop
from config import get_config
from models.deepseek import DeepSeekCausalLM

STEPS = 12


def tiny_config(**train):
    overrides = {"train.train_steps": STEPS, "train.log_every": 1, "train.checkpoint_every": 4,
                 "train.warmup_steps": 2}
    overrides.update({f"train.{k}": v for k, v in train.items()})
    return get_config("tiny", overrides)


def dataset_fn_for(config, path, take=None):
    tc = config.train

    def dataset_fn():
        ds = data.make_train_dataset(path, tc.seq_len, tc.batch_size, tc.shuffle_buffer, tc.seed)
        return ds.take(take) if take else ds

    return dataset_fn


def run(config, path, workdir, take=None, **kwargs):
    return train_loop.train(config, dataset_fn_for(config, path, take), str(workdir / "ckpt"),
                            str(workdir / "logs"), **kwargs)


@pytest.fixture(scope="module")
def reference(train_file, tmp_path_factory):
    """12 uninterrupted steps, one micro-batch, float32."""
    return run(tiny_config(), train_file, tmp_path_factory.mktemp("reference"))


def losses(result):
    return np.array([h["loss"] for h in result.history])


def test_reference_run_learns_and_checkpoints(reference):
    assert [h["step"] for h in reference.history] == list(range(1, STEPS + 1))
    assert reference.history[-1]["lm_loss"] < reference.history[0]["lm_loss"] - 0.3
    assert reference.resumed_from_step == 0 and reference.steps_run == STEPS
    assert reference.last_checkpoint.endswith(f"ckpt-{STEPS}")
    assert reference.tokens_seen == STEPS * 8 * 32
    assert reference.strategy == "OneDevice" and reference.num_replicas == 1
    assert os.listdir(os.path.dirname(reference.last_checkpoint))  # ckpt-4, -8, -12


@pytest.mark.slow
def test_grad_accumulation_equals_one_large_batch(reference, train_file, tmp_path):
    """4 micro-batches of 2 sequences == 1 batch of 8: same losses, grad norms and weights."""
    accumulated = run(tiny_config(grad_accum_steps=4), train_file, tmp_path)
    assert accumulated.per_replica_batch_size == 2 and accumulated.grad_accum_steps == 4
    # A loss is a mean of 8 x 32 = 256 per-token terms of one magnitude (~6 nats),
    # summed in 4 micro-batches instead of one: regrouping a sum of n such terms moves it
    # by ~sqrt(n) half-ulps, sqrt(256) / 2 = 8 ulps.
    assert_float32_close(losses(accumulated), losses(reference), ulps=8, err_msg="losses")
    # The grad norm carries the gradients' relative difference (64 ulps of scale, see
    # test_recomputation_gives_the_same_loss_and_gradients); a norm averages it.
    assert_float32_close([h["grad_norm"] for h in accumulated.history],
                         [h["grad_norm"] for h in reference.history], ulps=64,
                         err_msg="grad norms")
    # The weights after 12 AdamW updates: an update is lr * m / (sqrt(v) + eps), and
    # m / sqrt(v) (size <= ~1) carries the gradients' relative difference d <= 64 EPS,
    # so 12 updates at lr <= 3e-3 part a weight by <= 12 * 3e-3 * 64 EPS = 2.7e-7:
    # < 64 ulps of a tensor whose largest weight is >= 0.036 (every tensor here).
    for a, b, w in zip(accumulated.model.get_weights(), reference.model.get_weights(),
                       accumulated.model.weights, strict=True):
        assert np.max(np.abs(b)) >= 0.036 or np.array_equal(a, b), w.path
        assert_float32_close(a, b, ulps=64, err_msg=w.path)


@pytest.mark.slow
def test_resume_after_a_crash_continues_the_same_run(reference, train_file, tmp_path):
    """A run that dies after step 8 (its data runs out), then resumed, equals an uninterrupted one."""
    config = tiny_config()
    with pytest.raises((tf.errors.OutOfRangeError, StopIteration)):
        run(config, train_file, tmp_path, take=9)  # 9 batches: checkpoint at 8, dies in step 10
    assert tf.train.latest_checkpoint(str(tmp_path / "ckpt")).endswith("ckpt-8")
    resumed = run(config, train_file, tmp_path)
    assert resumed.resumed_from_step == 8 and resumed.steps_run == STEPS - 8
    assert resumed.train_steps == STEPS and resumed.last_checkpoint.endswith(f"ckpt-{STEPS}")
    # Same data position (batches 9-12), optimizer state and router biases: same losses.
    # The history is the whole run's: steps 1-8 came back with the checkpoint.
    assert [h["step"] for h in resumed.history] == list(range(1, STEPS + 1))
    np.testing.assert_allclose(losses(resumed), losses(reference), rtol=1e-6)
    for a, b in zip(resumed.model.get_weights(), reference.model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    # A finished run re-run trains nothing and ends at the same step.
    again = run(config, train_file, tmp_path)
    assert again.resumed_from_step == STEPS and again.steps_run == 0


@pytest.mark.slow
def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(train_file, tmp_path):
    # lr 1e25 from step 2 on: the weights blow up, turn Inf/NaN, and so does the loss.
    # Whichever is seen first (a NaN loss, or a NaN weight before saving) stops the run.
    config = tiny_config(learning_rate=1e25, min_learning_rate=1e25, warmup_steps=1,
                         checkpoint_every=1)
    with pytest.raises(FloatingPointError, match=r"step (\d+)\b.*training stopped") as info:
        run(config, train_file, tmp_path)
    bad_step = int(re.search(r"step (\d+)\b.*training stopped", str(info.value)).group(1))
    assert bad_step > 1
    latest = tf.train.latest_checkpoint(str(tmp_path / "ckpt"))
    assert latest.endswith(f"ckpt-{bad_step - 1}"), (latest, str(info.value))
    assert str(info.value).endswith(latest)
    reader = tf.train.load_checkpoint(latest)
    for name in reader.get_variable_to_shape_map():
        value = reader.get_tensor(name)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            assert np.all(np.isfinite(value)), name


@pytest.mark.slow
def test_recomputation_gives_the_same_loss_and_gradients():
    config = get_config("tiny")
    keras.utils.set_random_seed(0)
    model = DeepSeekCausalLM(config.model)
    ids = tf.random.stateless_uniform([2, 16], [1, 2], 0, 512, tf.int32)
    labels = tf.random.stateless_uniform([2, 16], [3, 4], 0, 512, tf.int32)

    @tf.function
    def grads(recompute):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(ids, labels, recompute_blocks=recompute)["loss"]
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, plain = grads(False)
    loss_rc, recomputed = grads(True)
    assert float(loss) == float(loss_rc)
    assert all(g is not None for g in recomputed)  # MTP included
    # Recomputation reorders the backward pass's float32 sums: each gradient element
    # sums over the 2 x 16 = 32 tokens (sqrt(32) ~ 6 ulps of its scale per reduction),
    # through ~10 chained reductions (2 blocks, MTP, the tied head): 64 ulps.
    for a, b, v in zip(plain, recomputed, model.trainable_variables, strict=True):
        assert_float32_close(tf.convert_to_tensor(a), tf.convert_to_tensor(b), ulps=64,
                             err_msg=v.path)


def test_mixed_bfloat16_keeps_router_norm_statistics_and_loss_in_float32():
    config = get_config("tiny")
    model = DeepSeekCausalLM(config.model, dtype="mixed_bfloat16")
    assert all(v.dtype == "float32" for v in model.weights)
    assert model.decoder_layers[0].self_attn.compute_dtype == "bfloat16"
    assert model.moe_layers[0].gate.compute_dtype == "float32"  # router
    ids = tf.random.stateless_uniform([2, 16], [1, 2], 0, 512, tf.int32)
    out = model.forward_train(ids)
    assert out["logits"].dtype == tf.float32 and out["balance_loss"].dtype == tf.float32
    loss = model.compute_loss(ids, ids)
    assert all(loss[k].dtype == tf.float32 for k in ("loss", "lm_loss", "mtp_loss"))
    hidden = model.embed_tokens(ids)
    assert hidden.dtype == tf.bfloat16
    assert model.norm(hidden).dtype == tf.bfloat16  # statistics in float32 inside, see rms_norm.py
    topk, weights, scores = model.moe_layers[0].gate(tf.reshape(hidden, [-1, 64]))
    assert weights.dtype == tf.float32 and scores.dtype == tf.float32


@pytest.mark.slow
def test_mixed_float16_trains_with_dynamic_loss_scaling(train_file, tmp_path):
    config = tiny_config(train_steps=3, checkpoint_every=3, recompute_activations=True)
    result = run(config, train_file, tmp_path, precision="mixed_float16")
    assert result.precision == "mixed_float16"
    assert all(math.isfinite(h["loss"]) for h in result.history)
    # The loss scale is saved with the optimizer: the checkpoint holds it.
    names = tf.train.list_variables(result.last_checkpoint)
    assert any("dynamic_scale" in name for name, _ in names)
    float32_copy = model_io.copy_to_float32_model(config, result.model)
    assert float32_copy.compute_dtype == "float32"
    for a, b in zip(float32_copy.get_weights(), result.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_expert_load_is_logged_per_moe_layer_and_logging_window(reference):
    from reporting.report_data import read_events

    log_dir = os.path.join(os.path.dirname(reference.checkpoint_dir), "logs")
    _, tensors = read_events(log_dir)
    loads = {tag: series for tag, series in tensors.items() if tag.endswith("/expert_load")}
    # tiny: 2 decoder layers, the first dense -> MoE in layer 1 and in the MTP module's block
    assert len(loads) == 2
    for steps, vectors in loads.values():
        assert steps == list(range(1, STEPS + 1))  # log_every=1: one window per step
        assert all(v.shape == (8,) and v.dtype == np.float32 for v in vectors)  # 8 experts
    # a decoder MoE layer routes every token of the batch to top-2 experts:
    # 8 sequences x 32 tokens x 2 = 512 (token, expert) pairs per step
    decoder = next(series for tag, series in loads.items() if "mtp" not in tag)
    assert [float(v.sum()) for v in decoder[1]] == [512.0] * STEPS
