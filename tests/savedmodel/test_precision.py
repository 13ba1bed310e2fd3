"""The one precision knob (`savedmodel/precision.py`): a bf16 checkpoint imports as a
SavedModel with bf16 variables (about half the float32 size), precision.json records
it, every reader builds the model in it, and hf-export writes back the very bytes it
was imported from, one shard at a time."""

from __future__ import annotations

import json
import os
import struct

import keras
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

import cli
from models.deepseek import hf_save
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.deepseek_presets import deepseek_preset
from models.formats.safetensors_reader import write_safetensors
from savedmodel import base_model, layout, precision
from savedmodel.hf_interop import (
    checkpoint_weight_dtype,
    hf_export,
    hf_import,
    load_model_from_savedmodel,
)

# Untied, with an MTP module: every kind of tensor (lm_head, MTP copies) is written.
CONFIG = deepseek_preset("tiny").replace(tie_word_embeddings=False, num_nextn_predict_layers=1)
SHARD_BYTES = 120_000  # several shards for the tiny model in bf16


def safetensors_bytes(path: str) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, raw bytes) of every tensor of one safetensors file, read by
    the format's definition (8-byte little-endian header length, JSON header, data)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    return {name: (meta["dtype"], meta["shape"], data[slice(*meta["data_offsets"])])
            for name, meta in header.items() if name != "__metadata__"}


def checkpoint_bytes(directory) -> dict[str, tuple[str, list[int], bytes]]:
    tensors = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            tensors.update(safetensors_bytes(os.path.join(directory, name)))
    return tensors


@pytest.fixture(scope="module")
def bf16_checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bf16_ckpt")
    keras.utils.set_random_seed(41)  # the same weights every run
    model = DeepSeekCausalLM(CONFIG, dtype="bfloat16")
    hf_save.save_hf_checkpoint(model, str(directory), max_shard_bytes=SHARD_BYTES,
                               dtype="bfloat16")
    return str(directory)


@pytest.fixture(scope="module")
def bf16_import(bf16_checkpoint, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("bf16_saved") / "saved")
    imported = hf_import(bf16_checkpoint, out, use_tokenizer=False)
    return imported


def variables_size(model_dir) -> int:
    directory = os.path.join(model_dir, "variables")
    return sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))


def test_the_knob_takes_auto_or_a_supported_dtype_and_names_a_bad_one():
    assert precision.WEIGHT_DTYPES == ("bfloat16", "float32", "int8")
    assert precision.HF_DTYPES == ("bfloat16", "float32")
    assert precision.resolve_weight_dtype("auto", "bfloat16") == "bfloat16"
    assert precision.resolve_weight_dtype("float32", "bfloat16") == "float32"
    assert precision.resolve_weight_dtype("int8", "float32") == "int8"
    assert precision.keras_policy("bfloat16") == "bfloat16"
    assert precision.keras_policy("int8") == "float32"  # then quantized
    with pytest.raises(ValueError, match="--dtype='int4'"):
        precision.resolve_weight_dtype("int4", "float32")


@pytest.mark.parametrize("stored, expected", [
    (ml_dtypes.float8_e4m3fn, "bfloat16"),  # FP8 dequantizes to bf16
    (ml_dtypes.bfloat16, "bfloat16"),
    (np.float32, "float32"),
    (np.float16, "float32"),  # the supported dtype that holds it exactly
])
def test_a_checkpoints_precision_is_read_from_its_headers(tmp_path, stored, expected):
    # config.json's torch_dtype says otherwise: the stored tensors decide.
    (tmp_path / "config.json").write_text(json.dumps({"torch_dtype": "float16"}))
    weight = np.ones((4, 8), np.float32).astype(stored)
    write_safetensors(str(tmp_path / "model.safetensors"),
                      {"model.layers.0.self_attn.o_proj.weight": weight,
                       "model.norm.weight": np.ones(8, np.float32)})
    assert checkpoint_weight_dtype(str(tmp_path)) == expected


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_bf16_import_keeps_bf16_variables_at_half_the_size(bf16_checkpoint, bf16_import,
                                                           tmp_path):
    assert bf16_import.weight_dtype == "bfloat16"
    assert layout.read_weight_dtype(bf16_import.path) == "bfloat16"
    dtypes = tf.train.load_checkpoint(
        os.path.join(bf16_import.path, "variables", "variables")).get_variable_to_dtype_map()
    weights = {k: v for k, v in dtypes.items() if k.endswith("VARIABLE_VALUE")}
    router = {k for k in weights if "/gate/" in k}  # the router is float32 by design
    assert weights and router
    assert {v for k, v in weights.items() if k not in router} == {tf.bfloat16}
    assert {weights[k] for k in router} == {tf.float32}

    f32 = hf_import(bf16_checkpoint, str(tmp_path / "f32"), use_tokenizer=False, dtype="float32")
    assert f32.weight_dtype == "float32" and layout.read_weight_dtype(f32.path) == "float32"
    ratio = variables_size(bf16_import.path) / variables_size(f32.path)
    assert 0.45 < ratio < 0.6, ratio

    model = load_model_from_savedmodel(bf16_import.path)  # the SavedModel's own dtype
    assert model.embed_tokens.embeddings.dtype == "bfloat16"
    assert base_model.load_model(bf16_import.path).lm_head.kernel.dtype == "bfloat16"
    assert base_model.load_model(bf16_checkpoint).lm_head.kernel.dtype == "bfloat16"
    assert base_model.weight_dtype(bf16_checkpoint) == "bfloat16"
    ids = tf.constant([[1, 2, 3, 4]], tf.int32)
    logits = tf.saved_model.load(bf16_import.path).signatures["logits"](input_ids=ids)["logits"]
    assert logits.dtype == tf.float32
    # The graph and eager bf16 matmuls may round differently (oneDNN), and bf16 keeps 8
    # significant bits: a few bf16 ulps of the logits' scale per layer (measured up to 9
    # ulps, 0.018 on logits of 0.25), as test_mla_absorbed_decode.py allows in bf16.
    expected = model(ids).numpy()
    assert np.abs(logits.numpy() - expected).max() <= 0.05 * np.abs(expected).max()


def test_bf16_import_then_export_writes_the_same_bytes(bf16_checkpoint, bf16_import, tmp_path):
    files = hf_export(bf16_import.path, str(tmp_path / "hf"), max_shard_bytes=SHARD_BYTES)
    assert len(files) > 2  # sharded
    assert sorted(os.listdir(tmp_path / "hf")) == sorted(os.listdir(bf16_checkpoint))
    index = hf_save.SAFE_WEIGHTS_INDEX_NAME
    assert (json.loads((tmp_path / "hf" / index).read_text())
            == json.loads(open(os.path.join(bf16_checkpoint, index)).read()))
    before, after = checkpoint_bytes(bf16_checkpoint), checkpoint_bytes(tmp_path / "hf")
    assert sorted(before) == sorted(after)
    for name, (dtype, shape, data) in before.items():
        # DeepSeek stores the router bias in float32, whatever the weights' dtype.
        assert dtype == ("F32" if name.endswith("e_score_correction_bias") else "BF16"), name
        assert after[name] == (dtype, shape, data), f"{name} differs after import + export"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"


def test_bf16_savedmodel_exports_as_float32_when_asked(bf16_checkpoint, bf16_import, tmp_path):
    hf_export(bf16_import.path, str(tmp_path / "hf"), dtype="float32")
    after = checkpoint_bytes(tmp_path / "hf")
    name = "model.embed_tokens.weight"
    dtype, shape, data = after[name]
    assert dtype == "F32"
    source = checkpoint_bytes(bf16_checkpoint)[name][2]
    bf16 = np.frombuffer(source, np.uint16).astype(np.uint32) << 16  # bf16 -> f32 bits
    np.testing.assert_array_equal(np.frombuffer(data, np.uint32), bf16)


def test_a_bf16_savedmodel_loads_up_cast_into_one_float32_model(bf16_import):
    bf16 = load_model_from_savedmodel(bf16_import.path)
    f32 = load_model_from_savedmodel(bf16_import.path, dtype="float32")  # restore_cast
    assert {v.dtype for v in f32.weights} == {"float32"}
    for a, b in zip(bf16.weights, f32.weights, strict=True):
        assert a.path.split("/", 1)[1] == b.path.split("/", 1)[1]
        np.testing.assert_array_equal(tf.cast(a, tf.float32).numpy(), b.numpy(), err_msg=a.path)


def test_shards_are_planned_from_shapes_and_written_one_at_a_time(tmp_path, monkeypatch):
    model = DeepSeekCausalLM(CONFIG)
    plan = hf_save.plan_shards(model, SHARD_BYTES, 2)
    written = []
    real_write = hf_save.write_safetensors_streaming

    def write(path, entries, metadata=None):
        written.append(sorted(name for name, *_ in entries))
        made = []

        def one_at_a_time(make, name):
            def wrapped():
                made.append(name)  # made only when the writer reaches it
                return make()
            return wrapped
        real_write(path, [(n, shape, dtype, one_at_a_time(make, n))
                          for n, shape, dtype, make in entries], metadata)
        assert made == [name for name, *_ in entries]

    monkeypatch.setattr(hf_save, "write_safetensors_streaming", write)
    hf_save.save_hf_checkpoint(model, str(tmp_path), max_shard_bytes=SHARD_BYTES,
                               dtype="bfloat16")
    assert written == [sorted(names) for names in plan] and len(plan) > 2
    assert sorted(n for names in plan for n in names) == sorted(hf_save.model_tensors(model))


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_cli_import_dtype_and_export_default(bf16_checkpoint, tmp_path, capsys):
    assert cli.main(["hf-import", bf16_checkpoint, str(tmp_path / "a")]) == 0
    assert "weights: bfloat16" in capsys.readouterr().out
    assert cli.main(["hf-import", bf16_checkpoint, str(tmp_path / "b"), "--dtype",
                     "float32"]) == 0
    assert "weights: float32" in capsys.readouterr().out
    assert layout.read_weight_dtype(str(tmp_path / "b")) == "float32"
    assert cli.main(["hf-export", str(tmp_path / "b"), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["torch_dtype"] == "float32"
    with pytest.raises(SystemExit):
        cli.main(["hf-import", bf16_checkpoint, str(tmp_path / "c"), "--dtype", "int4"])
    with pytest.raises(SystemExit):  # a HF checkpoint is written in bf16 or float32 only
        cli.main(["hf-export", str(tmp_path / "b"), str(tmp_path / "hf8"), "--dtype", "int8"])


def test_a_savedmodel_without_precision_json_is_float32_and_a_bad_one_is_named(tmp_path):
    assert layout.read_weight_dtype(str(tmp_path)) == "float32"
    (tmp_path / layout.ASSETS_EXTRA_DIR).mkdir()
    (tmp_path / layout.ASSETS_EXTRA_DIR / layout.PRECISION_ASSET).write_text(
        '{"weight_dtype": "float8"}')
    with pytest.raises(ValueError, match="precision.json: weight_dtype='float8'"):
        layout.read_weight_dtype(str(tmp_path))


@pytest.mark.parametrize("fixture", ["v2_lite", "v2"])
@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_bf16_deepseek_v2_checkpoint_round_trips_bit_identical(fixture, tmp_path):
    # transformers' DeepseekV2ForCausalLM fixtures (tests/fixtures/hf_deepseek_v2), in bf16.
    from models.deepseek.hf_checkpoint import load_hf_checkpoint

    source = os.path.join(os.path.dirname(__file__), "..", "fixtures", "hf_deepseek_v2", fixture)
    checkpoint = tmp_path / "bf16"
    hf_save.save_hf_checkpoint(load_hf_checkpoint(source, dtype="bfloat16"), str(checkpoint),
                               dtype="bfloat16")
    imported = hf_import(str(checkpoint), str(tmp_path / "saved"), use_tokenizer=False)
    assert imported.weight_dtype == "bfloat16"
    hf_export(imported.path, str(tmp_path / "hf"))
    before, after = checkpoint_bytes(checkpoint), checkpoint_bytes(tmp_path / "hf")
    assert sorted(before) == sorted(after) and before
    for name, stored in before.items():
        assert after[name] == stored, f"{name} differs after import + export"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == "deepseek_v2" and config["torch_dtype"] == "bfloat16"
