"""Fine-tuning a bf16 base model: with LoRA the frozen base stays bf16 and the adapters
and their optimizer states are float32; full fine-tuning up-casts the base once, as it
loads, to float32 master weights; the run records each part's precision."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import model_io, precision, train_loop, trainable
from config import get_config
from models.deepseek import hf_save
from models.deepseek.causal_lm import DeepSeekCausalLM


def tiny(**train):
    overrides = {"train.train_steps": 2, "train.log_every": 1, "train.checkpoint_every": 2,
                 "train.warmup_steps": 1, "train.learning_rate": 1e-2}
    overrides.update({f"train.{k}": v for k, v in train.items()})
    return get_config("tiny", overrides)


def batches(config, seed=0):
    tc = config.train
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, config.model.vocab_size, (tc.batch_size, tc.seq_len)).astype(np.int32)

    def dataset_fn():
        return tf.data.Dataset.from_tensors({"input_ids": ids, "labels": ids}).repeat()

    return dataset_fn


@pytest.fixture(scope="module")
def bf16_base(tmp_path_factory):
    """A bf16 HF checkpoint of the tiny preset's model, and its weights as stored (bf16;
    the router float32 holding bf16 values) by path."""
    directory = str(tmp_path_factory.mktemp("bf16_base"))
    model = DeepSeekCausalLM(tiny().model, dtype="bfloat16")
    hf_save.save_hf_checkpoint(model, directory, dtype="bfloat16")
    stored = {}
    for v in model.weights:
        value = tf.convert_to_tensor(v)
        stored[trainable.weight_path(v)] = tf.cast(tf.cast(value, tf.bfloat16), v.dtype).numpy()
    return directory, stored


@pytest.mark.slow
def test_lora_on_a_bf16_base_keeps_the_base_bf16_and_trains_float32_adapters(bf16_base,
                                                                              tmp_path):
    base_dir, base_weights = bf16_base
    config = tiny(lora_rank=4)
    result = train_loop.train(config, batches(config), str(tmp_path / "ckpt"), None,
                              base_model=base_dir)
    model = result.model
    assert result.precision == "bfloat16" and math.isfinite(result.final_loss)
    weights = {trainable.weight_path(v): v for v in model.weights}
    adapters = [p for p in weights if p.endswith(("lora_kernel_a", "lora_kernel_b"))]
    assert adapters and {weights[p].dtype for p in adapters} == {"float32"}
    kernels = [p for p in weights if p.endswith("o_proj/kernel")]
    assert kernels and {weights[p].dtype for p in kernels} == {"bfloat16"}
    for path, value in base_weights.items():  # the frozen base, bit for bit
        np.testing.assert_array_equal(weights[path].numpy(), value, err_msg=path)
    assert any(np.any(weights[p].numpy() != 0) for p in adapters if p.endswith("_b"))
    assert result.frozen_weights_dtype.startswith("bfloat16 ")  # + the float32 router
    assert result.trainable_weights_dtype == "float32"
    assert result.optimizer_states_dtype == "float32"
    assert result.compute_dtype == "bfloat16"

    exported = model_io.copy_for_export(config, model)  # bf16, adapters merged, no f32 copy
    assert model_io.export_weight_dtype(model) == "bfloat16"
    assert exported.dtype_policy.name == "bfloat16"
    assert not any(v.path.endswith("lora_kernel_a") for v in exported.weights)
    ids = tf.constant(np.arange(3, 35, dtype=np.int32)[None])
    np.testing.assert_allclose(exported(ids).numpy(), model(ids).numpy(), atol=5e-2)


def test_lora_adapters_and_their_optimizer_slots_are_float32(bf16_base):
    base_dir, _ = bf16_base
    config = tiny(lora_rank=4)
    state = train_loop.setup(config, tf.distribute.get_strategy(), "bfloat16", warm_start=True,
                             base_model=base_dir)
    assert {v.dtype for v in state.selection.variables} == {"float32"}
    slots = [v for v in state.optimizer.variables if len(v.shape) > 0]
    assert slots and {v.dtype for v in slots} == {"float32"}
    layer = state.selection.lora_layers[0]
    assert layer.compute_dtype == "bfloat16"  # the adapted layer still computes in bf16


@pytest.mark.slow
def test_full_fine_tuning_of_a_bf16_base_trains_float32_master_weights(bf16_base, tmp_path):
    base_dir, base_weights = bf16_base
    config = tiny()
    state = train_loop.setup(config, tf.distribute.get_strategy(), "float32", warm_start=True,
                             base_model=base_dir)
    assert {v.dtype for v in state.model.weights} == {"float32"}
    for v in state.model.weights:  # up-cast exactly, once, as the base loaded
        path = trainable.weight_path(v)
        np.testing.assert_array_equal(
            v.numpy(), tf.cast(base_weights[path], tf.float32).numpy(), err_msg=path)
    result = train_loop.train(config, batches(config), str(tmp_path / "ckpt"), None,
                              base_model=base_dir)
    assert result.precision == "float32" and math.isfinite(result.final_loss)
    assert result.trainable_weights_dtype == "float32"
    assert result.optimizer_states_dtype == "float32" and result.compute_dtype == "float32"
    assert model_io.export_weight_dtype(result.model) == "float32"


def test_explicit_float32_precision_up_casts_a_lora_base(bf16_base):
    config = tiny(lora_rank=4, precision="float32")
    assert precision.model_policy("float32", "", "bfloat16", config.train)[0] == "float32"
    assert precision.model_policy("float32", "", "bfloat16", tiny(lora_rank=4).train)[0] == (
        "bfloat16")
    assert precision.model_policy("mixed_bfloat16", "", "float32",
                                  tiny(lora_rank=4).train)[0] == "mixed_bfloat16"


def test_dtype_breakdown_by_share_of_elements():
    a = tf.Variable(tf.zeros([3, 4], tf.bfloat16))
    b = tf.Variable(tf.zeros([4], tf.float32))
    assert precision.dtype_breakdown([a]) == "bfloat16"
    assert precision.dtype_breakdown([a, b]) == "bfloat16 75.0%, float32 25.0%"
    assert precision.dtype_breakdown([]) == "none"


PARTS = {"frozen_weights_dtype": "bfloat16 99.9%, float32 0.1%",
         "trainable_weights_dtype": "float32", "optimizer_states_dtype": "float32",
         "compute_dtype": "bfloat16", "exported_weights_dtype": "bfloat16"}


def test_the_run_summary_prints_each_parts_precision(monkeypatch, capsys):
    from reporting import run_summary

    model = {"train_steps": 2, "precision": "bfloat16", **PARTS}
    runs = [run_summary.ComponentRun("Trainer", "COMPLETE", 1.0, {"Model": model})]
    monkeypatch.setattr(run_summary, "latest_run", lambda path: runs)
    run_summary.print_summary("unused.sqlite", 1.0)
    out = capsys.readouterr().out
    assert ("precision: frozen weights bfloat16 99.9%, float32 0.1%, trained weights float32, "
            "optimizer states float32, compute bfloat16, exported bfloat16") in out


@pytest.mark.slow  # imports tfx
def test_the_model_artifact_records_each_parts_precision():
    from components.trainer.executor import record_summary

    class Artifact:
        def __init__(self):
            self.properties = {}

        def set_string_custom_property(self, key, value):
            self.properties[key] = value

        set_int_custom_property = set_float_custom_property = set_string_custom_property
        set_bool_custom_property = set_string_custom_property

    artifact = Artifact()
    record_summary(artifact, {**PARTS, "precision": "bfloat16"})
    assert artifact.properties == {**PARTS, "precision": "bfloat16"}
