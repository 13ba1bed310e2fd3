"""Block-quantized FP8 checkpoints (DeepSeek-V3/R1 `quantization_config`, V3.1 `ue8m0`).

The fixture tests/fixtures/hf_deepseek_v3_fp8/ (made offline by its
`make_fixture.py` with transformers + torch) is a DeepSeek-V3 checkpoint whose
linear weights are float8_e4m3fn with float32 `weight_scale_inv` per 128x128
block, widths not multiples of 128 (hidden 160, intermediate 288), an MTP layer,
3 shards with scales in other shards than their weights; `expected_logits.npy`
are transformers' logits on the dequantized weights.
"""

import json
import logging

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from checkpoint_edits import FP8, copy_fixture, dequantized, edit_config, rewrite_tensors

from models.deepseek import hf_checkpoint
from models.formats import fp8
from models.formats.checkpoint_error import CheckpointError
from models.formats.safetensors_reader import open_checkpoint, write_safetensors

TOLERANCE = 1e-4


def _logits(model, d=FP8):
    return model(tf.constant(np.load(d / "input_ids.npy"), tf.int32)).numpy().astype(np.float32)


def test_fp8_checkpoint_as_base_model_and_import(tmp_path):
    # `--base-model PATH` / `--teacher PATH` read it through savedmodel.base_model; hf-import
    # keeps it in bf16 by default (FP8 dequantizes to bf16), float32 when asked.
    from savedmodel import base_model
    from savedmodel.hf_interop import hf_import, load_model_from_savedmodel

    assert base_model.kind(str(FP8)) == base_model.HF
    assert base_model.weight_dtype(str(FP8)) == "bfloat16"
    model = base_model.load_model(str(FP8), dtype="float32")
    expected = np.load(FP8 / "expected_logits.npy")
    assert float(np.abs(_logits(model) - expected).max()) <= TOLERANCE
    imported = hf_import(str(FP8), str(tmp_path / "bf16"), use_tokenizer=False)
    assert imported.weight_dtype == "bfloat16"
    bf16 = load_model_from_savedmodel(imported.path)
    assert bf16.embed_tokens.embeddings.dtype == "bfloat16"
    # bf16 weights and compute: bf16's own tolerance (8 bits of mantissa)
    assert float(np.abs(_logits(bf16) - expected).max()) <= 0.05 * float(np.abs(expected).max())


def test_fixture_is_what_it_claims():
    cfg = json.loads((FP8 / "config.json").read_text())
    assert cfg["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3",
                                          "quant_method": "fp8", "weight_block_size": [128, 128]}
    assert cfg["hidden_size"] % 128 and cfg["hidden_size"] > 128
    ckpt = open_checkpoint(str(FP8))
    assert len(ckpt.files) == 3
    fp8_weights = [n for n, i in ckpt.tensors.items() if i.dtype == "F8_E4M3"]
    assert "model.layers.2.eh_proj.weight" in fp8_weights  # the MTP module is FP8 too
    elsewhere = [n for n in fp8_weights
                 if ckpt.tensors[n + "_scale_inv"].file != ckpt.tensors[n].file]
    assert len(elsewhere) >= 10
    multi_block = [n for n in fp8_weights if ckpt.tensors[n + "_scale_inv"].shape[0] > 1
                   and ckpt.tensors[n].shape[0] % 128]
    assert multi_block  # more than one block, the last one partial
    assert ckpt.tensors["model.embed_tokens.weight"].dtype == "BF16"


def test_fp8_logits_match_transformers(caplog):
    with caplog.at_level(logging.WARNING):
        model = hf_checkpoint.load_hf_checkpoint(str(FP8), dtype="float32")
    expected = np.load(FP8 / "expected_logits.npy")
    logits = _logits(model)
    assert logits.shape == expected.shape
    max_diff = float(np.abs(logits - expected).max())
    assert max_diff <= TOLERANCE, f"max |logits - transformers| = {max_diff:.2e}"
    assert "differs" not in caplog.text  # the MTP embed/head copies equal the main ones
    assert model.mtp_layers and model.embed_tokens.embeddings.dtype == "float32"


def test_fp8_loads_into_bfloat16_variables_and_reports_its_precision():
    assert hf_checkpoint.stored_precision(str(FP8)) == "bfloat16"
    model = hf_checkpoint.load_hf_checkpoint(str(FP8), dtype="bfloat16")
    router = {id(m.gate.weight) for m in model.moe_layers} | {
        id(m.gate.e_score_correction_bias) for m in model.moe_layers}
    assert {v.dtype for v in model.weights if id(v) not in router} == {"bfloat16"}
    reference = dequantized(FP8)["model.layers.0.mlp.down_proj.weight"]
    kernel = model.decoder_layers[0].mlp.down_proj.kernel.numpy()
    np.testing.assert_array_equal(kernel.T, reference.astype(ml_dtypes.bfloat16))
    expected = np.load(FP8 / "expected_logits.npy")
    assert float(np.abs(_logits(model) - expected).max()) < 0.5


def test_dequantize_matches_a_naive_loop_with_partial_blocks():
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (300, 140)).astype(np.float32)
    quant = fp8.Fp8Quantization((128, 64))
    q, scale = fp8.quantize(w, quant.block)
    assert scale.shape == (3, 3) == quant.scale_shape(w.shape)
    got = fp8.dequantize(q, scale, quant)
    naive = np.empty_like(w)
    for i in range(300):
        for j in range(140):
            naive[i, j] = float(q[i, j]) * scale[i // 128, j // 64]
    np.testing.assert_array_equal(got, naive)
    assert np.abs(got - w).max() < 0.07 * np.abs(w).max()  # e4m3: 3 mantissa bits


@pytest.mark.parametrize("key,value", [
    ("quant_method", "bitsandbytes"), ("fmt", "e5m2"), ("scale_fmt", "e8m0fnu"),
    ("activation_scheme", "static"), ("weight_block_size", [128]),
    ("weight_block_size", [0, 128]),
])
def test_unsupported_quantization_configs_are_refused_by_name(key, value):
    q = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
         "activation_scheme": "dynamic", key: value}
    with pytest.raises(CheckpointError, match=f"quantization_config {key}="):
        fp8.quantization_from_hf({"quantization_config": q})
    assert fp8.quantization_from_hf({}) is None
    assert fp8.quantization_from_hf({"quantization_config": {
        "quant_method": "fp8", "scale_fmt": "ue8m0"}}).scale_fmt == "ue8m0"


def _ue8m0_pair(tmp_path):
    """An FP8 checkpoint with power-of-two scales (V3.1's scale_fmt "ue8m0") and a
    float32 checkpoint of exactly its dequantized values."""
    ue8m0 = copy_fixture(FP8, tmp_path / "ue8m0")
    values = dequantized(FP8)

    def requantize(tensors):
        out = dict(tensors)
        for name, v in values.items():
            if name + "_scale_inv" in tensors:
                out[name], out[name + "_scale_inv"] = fp8.quantize(v, ue8m0=True)
        return out

    rewrite_tensors(ue8m0, requantize)
    cfg = edit_config(ue8m0)
    edit_config(ue8m0, quantization_config={**cfg["quantization_config"], "scale_fmt": "ue8m0"})
    ref = copy_fixture(FP8, tmp_path / "float32")
    for f in ref.glob("*.safetensors"):
        f.unlink()
    (ref / "model.safetensors.index.json").unlink()
    write_safetensors(str(ref / "model.safetensors"), dequantized(ue8m0))
    edit_config(ref, drop=("quantization_config",))
    return ue8m0, ref


def test_ue8m0_power_of_two_scales_load_as_their_dequantized_values(tmp_path):
    ue8m0, ref = _ue8m0_pair(tmp_path)
    scales = open_checkpoint(str(ue8m0)).read("model.layers.1.self_attn.kv_b_proj.weight_scale_inv")
    assert np.all(np.frexp(scales)[0] == 0.5)
    assert hf_checkpoint.stored_precision(str(ref)) == "float32"
    a = _logits(hf_checkpoint.load_hf_checkpoint(str(ue8m0)))
    b = _logits(hf_checkpoint.load_hf_checkpoint(str(ref)))
    np.testing.assert_array_equal(a, b)

    # ue8m0 promised but a scale is not a power of two: refused, naming the scale.
    name = "model.layers.1.self_attn.o_proj.weight_scale_inv"
    rewrite_tensors(ue8m0, lambda t: {**t, name: t[name] * np.float32(1.5)})
    with pytest.raises(CheckpointError, match=f"{name}: scale .* not a power of two"):
        hf_checkpoint.load_hf_checkpoint(str(ue8m0))


def test_mtp_copies_that_differ_are_warned_about_not_loaded(tmp_path, caplog):
    d = copy_fixture(FP8, tmp_path / "ckpt")
    name = "model.layers.2.shared_head.head.weight"
    rewrite_tensors(d, lambda t: {**t, name: (t[name].astype(np.float32) + 1).astype(
        ml_dtypes.bfloat16)})
    with caplog.at_level(logging.WARNING):
        model = hf_checkpoint.load_hf_checkpoint(str(d))
    assert f"{name} differs" in caplog.text
    np.testing.assert_allclose(_logits(model), np.load(FP8 / "expected_logits.npy"),
                               atol=TOLERANCE)
