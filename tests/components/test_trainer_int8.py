"""LoRA on an int8 base (QLoRA-style): the base's int8 kernels and scales stay bit for bit,
float32 adapters train and lower the held-out loss below the quantized starting point,
and the export merges them into re-quantized int8 kernels. Full fine-tuning of an int8
base is refused; `train.export_dtype` converts the exported model."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import model_io, train_loop, trainable
from config import get_config
from models.deepseek import hf_save
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.formats import quantization as Q
from savedmodel import base_model
from savedmodel.hf_interop import hf_import

PERIOD = 23  # the training text: a fixed random sequence of 23 tokens, repeated


def tiny(**train):
    overrides = {"train.train_steps": 30, "train.log_every": 10, "train.checkpoint_every": 30,
                 "train.warmup_steps": 2, "train.learning_rate": 1e-2, "train.lora_rank": 4}
    overrides.update({f"train.{k}": v for k, v in train.items()})
    return get_config("tiny", overrides)


def windows(config, offset):
    """(batch_size, seq_len + 1) windows of the periodic text, starting at `offset`,
    `offset` + 5, ..."""
    tc = config.train
    cycle = np.random.default_rng(7).permutation(np.arange(3, config.model.vocab_size))[:PERIOD]
    text = np.tile(cycle, 64)
    rows = [text[offset + 5 * b: offset + 5 * b + tc.seq_len + 1] for b in range(tc.batch_size)]
    return np.stack(rows).astype(np.int32)


def batches(config):
    w = windows(config, 0)

    def dataset_fn():  # nanoGPT packing: input_ids = w[:-1], labels = w[1:]
        return tf.data.Dataset.from_tensors({"input_ids": w[:, :-1], "labels": w[:, 1:]}).repeat()

    return dataset_fn


def held_out_loss(model, config) -> float:
    """Mean next-token cross-entropy (nats/token) on windows at offsets never trained on
    (the same text, so a model that learned it does better)."""
    ids = tf.constant(windows(config, 3))
    logits = model(ids[:, :-1])
    loss = tf.keras.losses.sparse_categorical_crossentropy(ids[:, 1:], logits, from_logits=True)
    return float(tf.reduce_mean(loss))


@pytest.fixture(scope="module")
def int8_base(tmp_path_factory):
    """An int8 SavedModel (hf-import --dtype int8 of a float32 checkpoint of the tiny
    preset's model) and its int8 kernels and scales by weight path."""
    checkpoint = str(tmp_path_factory.mktemp("float_ckpt"))
    hf_save.save_hf_checkpoint(DeepSeekCausalLM(tiny().model), checkpoint)
    saved = str(tmp_path_factory.mktemp("int8_base") / "saved")
    assert hf_import(checkpoint, saved, use_tokenizer=False, dtype="int8").weight_dtype == "int8"
    model = base_model.load_model(saved)
    stored = {trainable.weight_path(v): v.numpy() for v in model.weights
              if v.dtype == "int8" or v.path.endswith("kernel_scale")}
    return saved, stored, held_out_loss(model, tiny())


@pytest.mark.slow
def test_lora_on_an_int8_base_keeps_it_bit_identical_and_learns(int8_base, tmp_path):
    saved, stored, loss_before = int8_base
    config = tiny()
    result = train_loop.train(config, batches(config), str(tmp_path / "ckpt"), None,
                              base_model=saved)
    model = result.model
    assert math.isfinite(result.final_loss)
    assert result.frozen_weights_dtype.startswith("int8 ")
    assert result.trainable_weights_dtype == "float32"
    weights = {trainable.weight_path(v): v for v in model.weights}
    assert len(stored) == 2 * len(Q.quantized_layers(model))  # kernel + kernel_scale each
    for path, value in stored.items():  # the int8 base, bit for bit
        assert weights[path].dtype == value.dtype
        np.testing.assert_array_equal(weights[path].numpy(), value, err_msg=path)
    loss_after = held_out_loss(model, config)
    # 30 steps of rank-4 adapters on a 23-token cycle: the held-out loss (and with it bits
    # per byte, a fixed multiple of it on one text) falls below the int8 base's (measured:
    # 6.2 -> 5.1 nats/token, as from the float base); half a nat is far beyond the
    # rounding differences of a seeded run.
    assert loss_after < loss_before - 0.5, (loss_before, loss_after)

    exported = model_io.copy_for_export(config, model)  # re-quantized int8, adapters merged
    assert model_io.export_weight_dtype(exported) == "int8"
    assert not any(v.path.endswith("lora_kernel_a") for v in exported.weights)
    layer = exported.decoder_layers[0].self_attn.o_proj
    assert Q.kernel_variable(layer).dtype == "int8"
    # One more rounding of every weight (to 1/254 of its column's absmax): the export
    # keeps what the adapters learned.
    assert held_out_loss(exported, config) < loss_before - 0.5


def test_full_fine_tuning_of_an_int8_base_is_refused(int8_base, tmp_path):
    saved, _, _ = int8_base
    config = tiny(lora_rank=0)
    with pytest.raises(ValueError, match="int8 and train.lora_rank=0"):
        train_loop.train(config, batches(config), str(tmp_path / "ckpt"), None,
                         base_model=saved)


def test_export_dtype_converts_the_exported_model():
    config = tiny(lora_rank=0)
    model = DeepSeekCausalLM(config.model)
    ids = tf.constant(windows(config, 0)[:, :-1])
    reference = model(ids).numpy()
    as_bf16 = model_io.to_export_dtype(tiny(lora_rank=0, export_dtype="bfloat16"), model)
    assert as_bf16.dtype_policy.name == "bfloat16" and as_bf16 is not model
    assert model_io.to_export_dtype(config, model) is model  # auto
    as_int8 = model_io.to_export_dtype(tiny(lora_rank=0, export_dtype="int8"), model)
    assert as_int8 is model and model_io.export_weight_dtype(model) == "int8"
    assert np.abs(model(ids).numpy() - reference).max() <= 0.05 * np.abs(reference).max()
    with pytest.raises(ValueError, match="train.export_dtype='float32': the trained model is int8"):
        model_io.to_export_dtype(tiny(lora_rank=0, export_dtype="float32"), model)
    with pytest.raises(ValueError, match="train.export_dtype='int4' must be one of"):
        tiny(export_dtype="int4")
