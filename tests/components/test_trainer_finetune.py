"""Fine-tuning in the training step: response-only losses, frozen weights, LoRA,
distillation (the `tiny` preset, synthetic data, a few steps each)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from components.trainer import model_io, train_loop, trainable
from config import get_config
from models.layers import losses

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def tiny(**train):
    overrides = {"train.train_steps": 3, "train.log_every": 1, "train.checkpoint_every": 3,
                 "train.warmup_steps": 1}
    overrides.update({f"train.{k}": v for k, v in train.items()})
    return get_config("tiny", overrides)


def sft_batches(config, prompt_lengths, response_lengths, seed=0, prompt_label=-100):
    """A dataset_fn of global batches: row i has a prompt of prompt_lengths[i] tokens
    (labels `prompt_label`), then response_lengths[i] targets, then padding (-100)."""
    tc = config.train
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.model.vocab_size, (tc.batch_size, tc.seq_len)).astype(np.int32)
    labels = np.full_like(ids, -100)
    real = rng.integers(3, config.model.vocab_size, ids.shape).astype(np.int32)
    for i, (p, r) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        labels[i, :p] = prompt_label if prompt_label != "real" else real[i, :p]
        labels[i, p:p + r] = real[i, p:p + r]

    def dataset_fn():
        return tf.data.Dataset.from_tensors({"input_ids": ids, "labels": labels}).repeat()

    return dataset_fn


def initial_weights(config) -> dict:
    """The weights a run of `config` starts from (`train_loop.setup` seeds, then builds)."""
    keras.utils.set_random_seed(config.train.seed)
    return {trainable.weight_path(v): v.numpy() for v in model_io.build_model(config).weights}


def train_weights(config, dataset_fn, workdir, **kwargs):
    result = train_loop.train(config, dataset_fn, str(workdir / "ckpt"), None, **kwargs)
    return result, {trainable.weight_path(v): v.numpy() for v in result.model.weights}


# ---------------------------------------------------------------------------- losses


def test_distillation_loss_by_hand_on_a_two_token_vocabulary():
    student = tf.constant([[[1.0, -1.0], [0.5, 0.0]]])  # (1, 2, 2)
    teacher = tf.constant([[[0.0, 2.0], [3.0, 1.0]]])
    labels = tf.constant([[1, -100]])  # the second position has no target
    tau, alpha = 2.0, 0.25

    def softmax(z):
        e = np.exp(np.asarray(z) / tau)
        return e / e.sum()

    p, q = softmax([0.0, 2.0]), softmax([1.0, -1.0])
    kl = float(np.sum(p * np.log(p / q)))  # position 0 only
    ce = -math.log(math.exp(-1.0) / (math.exp(1.0) + math.exp(-1.0)))
    assert float(losses.distillation_kl_sum(student, teacher, labels, tau)) == pytest.approx(
        tau * tau * kl, rel=1e-6)
    out = losses.causal_lm_loss({"logits": student, "mtp_logits": [],
                                 "balance_loss": tf.constant(0.0),
                                 "expert_load": tf.zeros([0, 2])}, labels, 0.3,
                                teacher_logits=teacher, distill_alpha=alpha,
                                distill_temperature=tau)
    assert float(out["lm_loss"]) == pytest.approx(ce, rel=1e-6)
    assert float(out["distill_loss"]) == pytest.approx(tau * tau * kl, rel=1e-6)
    assert float(out["loss"]) == pytest.approx(alpha * ce + (1 - alpha) * tau * tau * kl, rel=1e-6)


def test_global_token_count_divides_the_summed_loss():
    logits = tf.random.stateless_normal([2, 4, 5], seed=[1, 2])
    labels = tf.constant([[1, 2, -100, -100], [3, 4, 0, 1]])
    outputs = {"logits": logits, "mtp_logits": [], "balance_loss": tf.constant(0.0),
               "expert_load": tf.zeros([0, 5])}
    local = losses.causal_lm_loss(outputs, labels, 0.3)
    total, count = losses.token_cross_entropy_sum(logits, labels)
    assert float(count) == 6.0
    assert float(local["lm_loss"]) == pytest.approx(float(total) / 6.0, rel=1e-6)
    half = losses.causal_lm_loss(outputs, labels, 0.3, targets=tf.constant([12.0]))
    assert float(half["lm_loss"]) == pytest.approx(float(total) / 12.0, rel=1e-6)


# ---------------------------------------------------------------------------- SFT


@pytest.mark.slow
def test_prompt_labels_change_nothing_in_the_update(tmp_path):
    config = tiny()
    prompts, responses = [5, 9, 2, 14, 7, 20, 3, 11], [12, 3, 20, 6, 9, 4, 17, 1]
    _, masked = train_weights(config, sft_batches(config, prompts, responses), tmp_path / "a")
    _, other = train_weights(config, sft_batches(config, prompts, responses, prompt_label=-7),
                             tmp_path / "b")
    _, real = train_weights(config, sft_batches(config, prompts, responses, prompt_label="real"),
                            tmp_path / "c")
    for path, value in masked.items():
        np.testing.assert_array_equal(other[path], value, err_msg=path)
    # Control: had the prompt tokens been targets, the update would differ.
    assert any(not np.array_equal(real[p], v) for p, v in masked.items())


MIRRORED_SFT_SCRIPT = textwrap.dedent("""
    import json, sys
    import keras
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    sys.path[:0] = ["tests", "tests/components"]
    from test_trainer_finetune import sft_batches, tiny
    from components.trainer import data, model_io, strategy, train_loop, trainable
    from components.trainer.schedule import AdamW
    from components.trainer.train_step import make_train_step

    class SGD(keras.optimizers.SGD):
        # Applies the step's already all-reduced gradients, as the trainer's AdamW does.
        _all_reduce_sum_gradients = AdamW._all_reduce_sum_gradients

    prompts, responses = [2, 20, 4, 25, 1, 30, 6, 3], [28, 2, 25, 1, 30, 1, 20, 27]
    out = {}
    for name, micro, s in (("one", 1, strategy.make_strategy("one_device")),
                           ("two", 2, strategy.make_strategy("mirrored", ["/cpu:0", "/cpu:1"]))):
        config = tiny(grad_accum_steps=micro)
        keras.utils.set_random_seed(0)
        with s.scope():
            model = model_io.build_model(config)
            variables = model.trainable_variables
            sgd = SGD(learning_rate=1.0)  # update = -gradient
            sgd.build(variables)
        before = [v.numpy() for v in variables]
        step = make_train_step(model, sgd, variables, s, micro_batches=micro, grad_clip_norm=1e9)
        batches = data.distribute_global_batches(s, sft_batches(config, prompts, responses), micro)
        result = step(iter(batches))
        terms, norm = result["terms"], result["grad_norm"]
        out[name] = {"loss": float(terms[0]), "grad_norm": float(norm),
                     "replicas": s.num_replicas_in_sync,
                     "gradients": {trainable.weight_path(v): (b - v.numpy()).tolist()
                                   for v, b in zip(variables, before)}}
    print("RESULT " + json.dumps(out))
    from common.process_exit import exit_frozen
    exit_frozen(0)  # as the real worker ends: without collecting the traced graphs
""")


@pytest.mark.slow
def test_uneven_responses_on_two_replicas_and_two_micro_batches_equal_one_batch():
    """2 replicas x 2 micro-batches of 2 sequences whose response lengths differ
    (1 to 30 targets) give the gradient of one batch of 8: the loss is the mean
    over the response tokens of the whole global batch, not a mean of means.

    The gradient is compared (an SGD step of rate 1), not AdamW's update: AdamW
    divides each element by its own magnitude, which turns rounding at the scale of
    a tensor into large relative changes of its smallest elements."""
    result = subprocess.run([sys.executable, "-c", MIRRORED_SFT_SCRIPT], capture_output=True,
                            text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out["two"]["replicas"] == 2
    # The loss: sums over <= 256 terms regrouped 4 ways (8 ulps, as in test_trainer_loop).
    assert_float32_close(out["two"]["loss"], out["one"]["loss"], ulps=8, err_msg="loss")
    # Gradients, as one vector: a weight's gradient sums up to 256 token terms, here in
    # 4 groups of 64 computed with other matmul shapes (b = 2 rows instead of 8), so each
    # of the ~10 chained reductions of 2 blocks forward and backward moves by
    # ~sqrt(256) = 16 ulps: 160, rounded up to 256 ulps of the largest gradient element.
    # (Per tensor the scale can be far smaller than the terms that cancelled into it,
    # e.g. the MTP block's.) A mean of per-micro-batch means would be off by percents.
    paths = sorted(out["one"]["gradients"])
    flat = {name: np.concatenate([np.ravel(out[name]["gradients"][p]) for p in paths])
            for name in ("one", "two")}
    assert_float32_close(flat["two"], flat["one"], ulps=256, err_msg="gradient")
    # The micro-batches' target counts are uneven: (28+2, 25+1, 30+1, 20+27).


# ---------------------------------------------------------------------------- frozen, LoRA


@pytest.fixture(scope="module")
def pretrain_batches():
    config = tiny()
    return sft_batches(config, [0] * 8, [32] * 8, seed=3)


@pytest.mark.parametrize("rule", ["top:1", r"self_attn/(q_b_proj|o_proj)"])
@pytest.mark.slow
def test_frozen_weights_are_bit_identical_and_get_no_slots(rule, pretrain_batches, tmp_path):
    config = tiny(trainable=rule)
    start = initial_weights(config)
    result, after = train_weights(config, pretrain_batches, tmp_path)
    trained = {trainable.weight_path(v) for v in trainable.prepare(
        model_io.build_model(config), config.train).variables}
    assert 0 < len(trained) < len(start)
    for path, value in start.items():
        router_of_trained = (path.endswith("gate/e_score_correction_bias")
                             and path.replace("e_score_correction_bias", "weight") in trained)
        if path in trained or router_of_trained:
            continue
        np.testing.assert_array_equal(after[path], value, err_msg=f"frozen {path} changed")
    assert any(not np.array_equal(after[p], start[p]) for p in trained)
    assert result.trainable_params < result.total_params
    if rule == "top:1":
        assert all(not p.startswith("layers.0/") for p in trained)
        assert "norm/weight" in trained and "embed_tokens/embeddings" in trained


@pytest.mark.slow
def test_lora_trains_adapters_only_and_the_merged_copy_has_the_same_logits(
        pretrain_batches, tmp_path):
    config = tiny(lora_rank=4, learning_rate=1e-2)
    start = initial_weights(config)
    result, after = train_weights(config, pretrain_batches, tmp_path)
    adapters = [p for p in after if p.endswith(("lora_kernel_a", "lora_kernel_b"))]
    assert adapters and result.trainable_params == sum(after[p].size for p in adapters)
    for path, value in start.items():
        np.testing.assert_array_equal(after[path], value, err_msg=f"base weight {path} changed")
    merged = model_io.copy_to_float32_model(config, result.model)
    assert not any(trainable.weight_path(v).endswith("lora_kernel_a") for v in merged.weights)
    ids = tf.constant(np.arange(3, 35, dtype=np.int32)[None])
    lora_logits = result.model(ids).numpy()
    assert not np.allclose(lora_logits, model_io.build_model(config)(ids).numpy())
    # x (W + A B) as one kernel vs the same sum formed in the layer: the same ops.
    assert_float32_close(merged(ids).numpy(), lora_logits, ulps=4)


def test_a_rule_that_picks_nothing_is_refused():
    config = tiny(trainable="no_such_weight")
    with pytest.raises(ValueError, match="picks no weight"):
        trainable.prepare(model_io.build_model(config), config.train)


# ---------------------------------------------------------------------------- warm start


@pytest.mark.slow
def test_warm_start_from_a_hugging_face_checkpoint_has_its_logits_before_any_step():
    """`train_loop.setup` with a HF checkpoint as base: the model to be trained gives the
    logits transformers computed for the checkpoint (the fixture's expected_logits.npy)."""
    import dataclasses

    from models.deepseek.hf_checkpoint import read_config_json

    fixture = os.path.join(ROOT, "tests", "fixtures", "hf_deepseek_v3", "no_q_lora")
    model_config = read_config_json(fixture)
    config = dataclasses.replace(
        get_config("tiny", {"train.seq_len": 8, "tokenizer.path": fixture}), model=model_config)
    state = train_loop.setup(config, tf.distribute.get_strategy(), "float32", warm_start=True,
                             base_model=fixture)
    ids = np.load(os.path.join(fixture, "input_ids.npy"))
    expected = np.load(os.path.join(fixture, "expected_logits.npy"))
    logits = state.model(tf.constant(ids, tf.int32)).numpy()
    assert np.max(np.abs(logits - expected)) <= 1e-5
    cold = train_loop.setup(config, tf.distribute.get_strategy(), "float32", warm_start=False,
                            base_model=fixture)
    assert np.max(np.abs(cold.model(tf.constant(ids, tf.int32)).numpy() - expected)) > 1e-2
