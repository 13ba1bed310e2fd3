"""DeepSeek-V4 checkpoint formats: MXFP4 experts, E8M0 scales, `X.scale` names
(`models/formats/mxfp4.py`, `models/formats/fp8.py`), and the synthetic V4-Flash
checkpoint writer `benchmarks/v4_checkpoint.py`.

Expected values are worked out by hand in the comments; the layout was also checked
offline against transformers 5.24 (`DeepseekV4ForCausalLM.from_pretrained` of the
writer's tiny and small checkpoints: no missing or unexpected keys, every dequantized
weight equal to `read_dequantized`'s).
"""

import importlib.util
import json
import pathlib
import sys
import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from models.formats import fp8, mxfp4
from models.formats.checkpoint_error import CheckpointError
from models.formats.fp8 import Fp8Quantization
from models.formats.safetensors_reader import open_checkpoint, read_header, write_safetensors

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLASH = Fp8Quantization((128, 128), "ue8m0", "fp4")
BASE = Fp8Quantization((128, 128), None, "fp8")
E4M3 = ml_dtypes.float8_e4m3fn


def _writer():
    """benchmarks/v4_checkpoint.py as a module (benchmarks/ is not a package)."""
    name = "v4_checkpoint_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "v4_checkpoint.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look the module up while it loads
        spec.loader.exec_module(module)
    return sys.modules[name]


# ----------------------------------------------------------------------------- E2M1, E8M0

def test_the_16_e2m1_codes_and_the_nibble_order():
    # code: sign bit 3, exponent bits 2-1, mantissa bit 0; bias 1; exponent 0 is subnormal
    # (0.5 * m): 0 -> 0, 1 -> 0.5, 2 -> 1.0, 3 -> 1.5, 4 -> 2, 5 -> 3, 6 -> 4, 7 -> 6
    expected = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0,
                -4.0, -6.0]
    np.testing.assert_array_equal(mxfp4.E2M1_VALUES, expected)
    assert np.signbit(mxfp4.E2M1_VALUES[8])  # code 8 is -0.0
    # byte 0x21: low nibble 1 (0.5) is column 0, high nibble 2 (1.0) column 1;
    # 0x8F: low 15 (-6.0), high 8 (-0.0); 0x7A: low 10 (-1.0), high 7 (6.0)
    got = mxfp4.unpack(np.array([[0x21, 0x8F - 256, 0x7A]], np.int8))
    np.testing.assert_array_equal(got, [[0.5, 1.0, -6.0, -0.0, -1.0, 6.0]])
    every = np.arange(256, dtype=np.uint8).view(np.int8)[None]  # (1, 256)
    codes = mxfp4.e2m1_codes(mxfp4.unpack(every))  # (1, 512): back to codes
    np.testing.assert_array_equal(mxfp4.pack(codes), every)


def test_e2m1_rounding_is_to_nearest_ties_to_even_and_saturates():
    x = np.array([0.2, 0.25, 0.3, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.1, 6.0, 7.0, 1e30,
                  -0.1, -0.0, -2.6, -6.5], np.float32)
    # 0.25 ties 0 | .5 -> 0 (even code 0); .75 -> 1.0 (code 2); 1.25 -> 1.0; 1.75 -> 2.0;
    # 2.5 -> 2 (code 4); 3.5 -> 4 (code 6); 5.0 -> 4; 5.1 -> 6; above 6 -> 6 (code 7);
    # -0.1 -> -0 (code 8); -2.6 -> -3 (code 13); -6.5 -> -6 (code 15)
    np.testing.assert_array_equal(
        mxfp4.e2m1_codes(x), [0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 7, 8, 8, 13, 15])


def test_e8m0_bytes():
    # byte b -> 2 ** (b - 127): 127 -> 1, 128 -> 2, 126 -> 0.5, 0 -> 2**-127 (a float32
    # subnormal, still exact), 254 -> 2**127
    got = mxfp4.e8m0_to_float32(np.array([127, 128, 126, 0, 254], np.uint8))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, [1.0, 2.0, 0.5, 2.0 ** -127, 2.0 ** 127])
    np.testing.assert_array_equal(mxfp4.float32_to_e8m0(got), [127, 128, 126, 0, 254])
    with pytest.raises(CheckpointError, match=r"layers.0.ffn.experts.1.w2.scale: E8M0 scale "
                       r"byte 0xff \(NaN\) at \(1, 0\)"):
        mxfp4.e8m0_to_float32(np.array([[127], [255]], np.uint8),
                              "layers.0.ffn.experts.1.w2.scale")
    with pytest.raises(ValueError, match="3.0 is not a power of two"):
        mxfp4.float32_to_e8m0(np.array([3.0], np.float32))


# ----------------------------------------------------------------------------- MXFP4

def test_mxfp4_dequantize_by_hand():
    # one row of 64 columns = 2 blocks of 32: bytes 0x21 (0.5, 1.0) repeated, scales
    # 127 (x1) then 129 (x4): columns 0..31 alternate 0.5, 1.0; 32..63 alternate 2.0, 4.0
    packed = np.full((1, 32), 0x21, np.int8)
    got = mxfp4.dequantize(packed, np.array([[127, 129]], np.uint8))
    np.testing.assert_array_equal(got[0, :32], [0.5, 1.0] * 16)
    np.testing.assert_array_equal(got[0, 32:], [2.0, 4.0] * 16)
    # float32 scales work the same
    np.testing.assert_array_equal(
        mxfp4.dequantize(packed, np.array([[1.0, 4.0]], np.float32)), got)


@pytest.mark.parametrize("std", [1e-3, 0.02, 3.0])
def test_mxfp4_round_trip_within_the_format_resolution(std):
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((96, 160)) * std).astype(np.float32)
    packed, scales = mxfp4.quantize(w)
    assert packed.dtype == np.int8 and packed.shape == (96, 80)
    assert scales.dtype == np.uint8 and scales.shape == (96, 5)
    back = mxfp4.dequantize(packed, scales)
    scale = np.repeat(mxfp4.e8m0_to_float32(scales), 32, axis=1)  # (96, 160)
    # block amax / scale lies in (3, 6]; the E2M1 grid's gaps are 0.5 below 2, 1 up to 4,
    # 2 up to 6, so nearest rounding is off by at most half a gap
    r = np.abs(w) / scale
    half_gap = np.where(r <= 2, 0.25, np.where(r <= 4, 0.5, 1.0)) * scale
    assert np.all(np.abs(back - w) <= half_gap)
    amax = np.abs(w).reshape(96, 5, 32).max(axis=2) / mxfp4.e8m0_to_float32(scales)
    assert np.all((amax > 3) & (amax <= 6))
    # values on the grid come back exactly
    np.testing.assert_array_equal(mxfp4.dequantize(*mxfp4.quantize(back)), back)


def test_mxfp4_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="in divisible by 32"):
        mxfp4.quantize(np.zeros((4, 48), np.float32))
    with pytest.raises(CheckpointError, match=r"w1: packed MXFP4 \(4, 32\) needs scales "
                       r"\(4, 2\) .* got scales \(4, 1\)"):
        mxfp4.dequantize(np.zeros((4, 32), np.int8), np.zeros((4, 1), np.uint8), "w1")
    with pytest.raises(ValueError, match="not finite"):
        mxfp4.quantize(np.full((1, 32), np.nan, np.float32))


# ----------------------------------------------------------------------------- FP8 with E8M0

def test_fp8_e8m0_scales_dequantize_as_their_float32_values():
    rng = np.random.default_rng(2)
    w = (rng.standard_normal((300, 140)) * 0.02).astype(np.float32)
    q, codes = fp8.quantize(w, (128, 64), e8m0=True)
    assert codes.dtype == np.uint8 and codes.shape == (3, 3)
    q32, s32 = fp8.quantize(w, (128, 64), ue8m0=True)
    np.testing.assert_array_equal(mxfp4.e8m0_to_float32(codes), s32)
    np.testing.assert_array_equal(q.view(np.uint8), q32.view(np.uint8))
    quant = Fp8Quantization((128, 64), "ue8m0")
    got = fp8.dequantize(q, codes, quant)
    np.testing.assert_array_equal(got, fp8.dequantize(q32, s32, quant))
    # e4m3 has 3 mantissa bits: relative error <= 2**-4 (normals), absolute
    # <= 2**-10 * scale (subnormals)
    s = np.repeat(np.repeat(s32, 128, 0), 64, 1)[:300, :140]
    assert np.all(np.abs(got - w) <= np.maximum(np.abs(w) * 2.0 ** -4, 2.0 ** -10 * s))
    with pytest.raises(CheckpointError, match=r"w_scale_inv: E8M0 scale byte 0xff"):
        fp8.dequantize(q, np.full((3, 3), 255, np.uint8), quant, "w")


# ----------------------------------------------------------------------------- config.json

V4_FLASH_QC = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
               "scale_fmt": "ue8m0", "weight_block_size": [128, 128]}


def test_v4_quantization_configs():
    # V4-Flash's release: expert_dtype at the top level of config.json
    assert fp8.quantization_from_hf({"quantization_config": V4_FLASH_QC,
                                     "expert_dtype": "fp4"}) == FLASH
    # as transformers' DeepseekV4Config.__post_init__ moves it: inside quantization_config
    assert fp8.quantization_from_hf(
        {"quantization_config": {**V4_FLASH_QC, "expert_dtype": "fp4"}}) == FLASH
    # V4-Flash-Base: FP8 experts, float32 scales
    base = {k: v for k, v in V4_FLASH_QC.items() if k != "scale_fmt"}
    assert fp8.quantization_from_hf({"quantization_config": base}) == BASE
    assert fp8.quantization_from_hf({"quantization_config": {**base, "scale_fmt": "float",
                                                             "expert_dtype": "fp8"}}
                                    ).expert_dtype == "fp8"


@pytest.mark.parametrize("hf,match", [
    ({"quantization_config": {**V4_FLASH_QC, "expert_dtype": "fp6"}},
     "config.json quantization_config expert_dtype='fp6' is not supported"),
    ({"quantization_config": V4_FLASH_QC, "expert_dtype": "nvfp4"},
     "config.json expert_dtype='nvfp4' is not supported"),
    ({"quantization_config": {**V4_FLASH_QC, "expert_dtype": "fp8"}, "expert_dtype": "fp4"},
     "config.json expert_dtype='fp4' disagrees with quantization_config expert_dtype='fp8'"),
    ({"quantization_config": {**V4_FLASH_QC, "moe_quant_algo": "NVFP4"}},
     "config.json quantization_config moe_quant_algo='NVFP4' is not supported"),
    ({"quantization_config": {**V4_FLASH_QC, "scale_fmt": "e8m0"}},
     "config.json quantization_config scale_fmt='e8m0' is not supported"),
])
def test_unknown_v4_quantization_keys_are_refused_in_one_line(hf, match):
    with pytest.raises(CheckpointError, match=match) as info:
        fp8.quantization_from_hf(hf)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- scale lookup, headers

def test_scale_names():
    assert fp8.find_scale_name("a.wq_a.weight", {"a.wq_a.weight", "a.wq_a.scale"}) == "a.wq_a.scale"
    assert fp8.find_scale_name("a.w.weight", {"a.w.weight_scale_inv"}) == "a.w.weight_scale_inv"
    assert fp8.find_scale_name("a.w.weight", {"a.w.weight"}) is None
    assert fp8.find_scale_name("hc_head_fn", {"hc_head_fn", "hc_head_scale"}) is None
    with pytest.raises(CheckpointError, match="s1.safetensors: tensor a.w.weight has two "
                       "scales, a.w.weight_scale_inv and a.w.scale"):
        fp8.find_scale_name("a.w.weight", {"a.w.weight_scale_inv", "a.w.scale"},
                            "s1.safetensors")
    assert fp8.is_routed_expert("layers.3.ffn.experts.17.w2.weight")
    assert fp8.is_routed_expert("mtp.0.ffn.experts.0.w1.weight")
    assert fp8.is_routed_expert("model.layers.1.mlp.experts.3.up_proj.weight")
    assert not fp8.is_routed_expert("layers.3.ffn.shared_experts.w2.weight")


def _headers(tmp_path, tensors: dict) -> dict:
    """{name: TensorInfo} of `tensors` written as one safetensors file s.safetensors."""
    write_safetensors(str(tmp_path / "s.safetensors"), tensors)
    return read_header(str(tmp_path / "s.safetensors"))[0]


def _u8(shape, v=127):
    return np.full(shape, v, np.uint8)  # written as F8_E8M0


EXPERT = "layers.0.ffn.experts.1.w1.weight"
WQ = "layers.0.attn.wq_a.weight"


def test_headers_of_the_v4_flash_layout_pass(tmp_path):
    t = _headers(tmp_path, {
        EXPERT: np.zeros((256, 128), np.int8), EXPERT[:-6] + "scale": _u8((256, 8)),
        WQ: np.zeros((300, 200), E4M3), WQ[:-6] + "scale": _u8((3, 2)),
        "layers.0.attn.compressor.wkv.weight": np.zeros((64, 200), ml_dtypes.bfloat16),
        "layers.0.ffn.gate.tid2eid": np.zeros((10, 2), np.int64)})
    assert {n: i.dtype for n, i in t.items() if "scale" in n} == {
        EXPERT[:-6] + "scale": "F8_E8M0", WQ[:-6] + "scale": "F8_E8M0"}
    assert t[EXPERT].dtype == "I8" and t["layers.0.ffn.gate.tid2eid"].dtype == "I64"
    assert fp8.check_weight(t, EXPERT, (256, 256), FLASH, True) == EXPERT[:-6] + "scale"
    assert fp8.check_weight(t, WQ, (300, 200), FLASH, False) == WQ[:-6] + "scale"
    assert fp8.check_weight(t, "layers.0.attn.compressor.wkv.weight", (64, 200), FLASH,
                            False) is None


@pytest.mark.parametrize("tensors,args,match", [
    # MXFP4: packed [out, in/2] and scales [out, in/32]; each error names file, tensor, shapes
    ({EXPERT: np.zeros((256, 128), np.int8), EXPERT[:-6] + "scale": _u8((256, 4))},
     (EXPERT, (256, 256), FLASH, True),
     r"s.safetensors: tensor layers.0.ffn.experts.1.w1.scale has shape \(256, 4\), expected "
     r"\(256, 8\) \(weight \(256, 256\) in 1x32 blocks\)"),
    ({EXPERT: np.zeros((256, 256), np.int8), EXPERT[:-6] + "scale": _u8((256, 8))},
     (EXPERT, (256, 256), FLASH, True),
     r"s.safetensors: tensor layers.0.ffn.experts.1.w1.weight has shape \(256, 256\), "
     r"expected \(256, 128\) \(packed MXFP4"),
    ({EXPERT: np.zeros((256, 128), np.int8)}, (EXPERT, (256, 256), FLASH, True),
     r"MXFP4 tensor layers.0.ffn.experts.1.w1.weight has no scale "
     r"layers.0.ffn.experts.1.w1.weight_scale_inv or layers.0.ffn.experts.1.w1.scale"),
    ({EXPERT: np.zeros((256, 128), np.int8), EXPERT[:-6] + "scale": _u8((256, 8))},
     (EXPERT, (256, 256), BASE, True), r"is I8 \(packed MXFP4\), but config.json "
     r"expert_dtype is 'fp8', not 'fp4'"),
    ({EXPERT: np.zeros((256, 128), np.int8), EXPERT[:-6] + "scale": _u8((256, 8))},
     (EXPERT, (256, 256), FLASH, False), r"which only routed experts are"),
    ({EXPERT: np.zeros((256, 128), np.int8), EXPERT[:-6] + "scale": _u8((256, 8))},
     (EXPERT, (256, 256), None, True), r"is I8 \(packed MXFP4\), but config.json has no "
     "quantization_config"),
    ({EXPERT: np.zeros((256, 256), E4M3), EXPERT[:-6] + "scale": _u8((2, 2))},
     (EXPERT, (256, 256), FLASH, True), r"is F8_E4M3, but config.json expert_dtype is 'fp4'"),
    ({EXPERT: np.zeros((256, 128), np.int8),
      EXPERT[:-6] + "scale": np.ones((256, 8), np.float16)}, (EXPERT, (256, 256), FLASH, True),
     r"tensor layers.0.ffn.experts.1.w1.scale has dtype F16, expected F8_E8M0 or F32"),
    # FP8: [ceil(out/128), ceil(in/128)] scales, one name or the other, not both
    ({WQ: np.zeros((300, 200), E4M3), WQ[:-6] + "scale": _u8((2, 2))},
     (WQ, (300, 200), FLASH, False), r"s.safetensors: tensor layers.0.attn.wq_a.scale has "
     r"shape \(2, 2\), expected \(3, 2\) \(weight \(300, 200\) in 128x128 blocks\)"),
    ({WQ: np.zeros((300, 200), E4M3), WQ[:-6] + "scale": _u8((3, 2)),
      WQ + "_scale_inv": np.ones((3, 2), np.float32)}, (WQ, (300, 200), FLASH, False),
     "has two scales, layers.0.attn.wq_a.weight_scale_inv and layers.0.attn.wq_a.scale"),
    ({WQ: np.zeros((300, 200), E4M3)}, (WQ, (300, 200), BASE, False),
     "FP8 tensor layers.0.attn.wq_a.weight has no scale layers.0.attn.wq_a.weight_scale_inv "
     "or layers.0.attn.wq_a.scale"),
    ({WQ: np.zeros((300, 200), E4M3), WQ[:-6] + "scale": _u8((3, 2))},
     (WQ, (300, 201), FLASH, False), r"has shape \(300, 200\), expected \(300, 201\)"),
    ({WQ: np.zeros((300, 200), ml_dtypes.bfloat16), WQ[:-6] + "scale": _u8((3, 2))},
     (WQ, (300, 200), FLASH, False), "is BF16 but has a scale layers.0.attn.wq_a.scale"),
    ({WQ: np.zeros((300, 200), np.int64)}, (WQ, (300, 200), FLASH, False),
     "has dtype I64, expected F8_E4M3, I8"),
])
def test_bad_v4_headers_are_refused_in_one_line(tmp_path, tensors, args, match):
    t = _headers(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=match) as info:
        fp8.check_weight(t, *args)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- read_dequantized

@pytest.fixture(scope="module")
def flash(tmp_path_factory):
    """The writer's tiny V4-Flash checkpoint, in 4 shards."""
    d = tmp_path_factory.mktemp("v4") / "flash"
    _writer().write_checkpoint(str(d), "tiny", "flash", seed=3, max_shard_bytes=200_000)
    return d


def test_writer_layout_passes_the_header_checks_and_reads_back_exactly(flash):
    w = _writer()
    cfg = json.loads((flash / "config.json").read_text())
    quant = fp8.quantization_from_hf(cfg)
    assert quant == FLASH
    ckpt = open_checkpoint(str(flash))
    assert len(ckpt.files) == 4
    specs = {s.name: s for s in w.tensor_specs(cfg)}
    named = set()
    for name, spec in specs.items():
        named.add(name)
        if spec.role == "tid2eid":
            assert ckpt.tensors[name].dtype == "I64"
            ids = ckpt.read(name)  # top_k distinct experts a token
            assert ids.shape == (256, 2) and all(len(set(r)) == 2 for r in ids.tolist())
            continue
        scale = fp8.check_weight(ckpt.tensors, name, spec.shape, quant,
                                 fp8.is_routed_expert(name))
        if scale:
            named.add(scale)
        got = fp8.read_dequantized(ckpt, name, quant)
        values = w.tensor_values(spec, cfg, seed=3)
        if spec.role == "expert":  # MXFP4 of the drawn values, exactly
            assert ckpt.tensors[name].dtype == "I8" and ckpt.tensors[scale].dtype == "F8_E8M0"
            np.testing.assert_array_equal(got, mxfp4.dequantize(*mxfp4.quantize(values)))
        elif spec.role == "linear":  # FP8 with E8M0 128x128 scales
            assert ckpt.tensors[scale].dtype == "F8_E8M0" and scale.endswith(".scale")
            q, s = fp8.quantize(values, e8m0=True)
            np.testing.assert_array_equal(got, fp8.dequantize(q, s, quant))
        else:
            assert scale is None
            np.testing.assert_array_equal(got, values.astype(ckpt.read(name).dtype))
    assert named == set(ckpt.tensors)  # every tensor is a weight or its one scale
    expert = "layers.1.ffn.experts.2.w2.weight"
    bf16 = fp8.read_dequantized(ckpt, expert, quant, ml_dtypes.bfloat16)
    np.testing.assert_array_equal(
        bf16, fp8.read_dequantized(ckpt, expert, quant).astype(ml_dtypes.bfloat16))


def test_writer_config_has_the_v4_fields(flash):
    cfg = json.loads((flash / "config.json").read_text())
    fields = ("vocab_size hidden_size moe_intermediate_size num_hidden_layers "
              "num_attention_heads head_dim q_lora_rank qk_rope_head_dim n_routed_experts "
              "n_shared_experts num_experts_per_tok scoring_func norm_topk_prob "
              "routed_scaling_factor rope_theta compress_rope_theta max_position_embeddings "
              "layer_types compress_rates hc_mult hc_sinkhorn_iters hc_eps mlp_layer_types "
              "swiglu_limit sliding_window o_groups o_lora_rank index_n_heads index_head_dim "
              "index_topk num_nextn_predict_layers rms_norm_eps tie_word_embeddings "
              "initializer_range attention_dropout").split()
    assert not [f for f in fields if f not in cfg]
    assert cfg["quantization_config"] == V4_FLASH_QC and cfg["expert_dtype"] == "fp4"
    assert cfg["model_type"] == "deepseek_v4"


def test_base_layout_has_fp8_experts_with_float32_scales(tmp_path):
    w = _writer()
    w.write_checkpoint(str(tmp_path), "tiny", "base", seed=4)
    cfg = json.loads((tmp_path / "config.json").read_text())
    quant = fp8.quantization_from_hf(cfg)
    assert quant == BASE
    ckpt = open_checkpoint(str(tmp_path))
    name = "layers.2.ffn.experts.3.w3.weight"
    assert ckpt.tensors[name].dtype == "F8_E4M3"
    assert ckpt.tensors["layers.2.ffn.experts.3.w3.scale"].dtype == "F32"
    assert fp8.check_weight(ckpt.tensors, name, (32, 64), quant, True)
    spec = next(s for s in w.tensor_specs(cfg) if s.name == name)
    q, s = fp8.quantize(w.tensor_values(spec, cfg, seed=4))
    np.testing.assert_array_equal(fp8.read_dequantized(ckpt, name, quant),
                                  fp8.dequantize(q, s, quant))


def test_read_dequantized_works_a_row_block_at_a_time(tmp_path, monkeypatch):
    rng = np.random.default_rng(5)
    expert = (rng.standard_normal((512, 2048)) * 0.02).astype(np.float32)  # 4 MB float32
    linear = (rng.standard_normal((300, 700)) * 0.02).astype(np.float32)
    p, s = mxfp4.quantize(expert)
    q, qs = fp8.quantize(linear, e8m0=True)
    # the scales in another shard than the weights, V3's `_scale_inv` name for one of them
    write_safetensors(str(tmp_path / "a.safetensors"), {"e.w1.weight": p, "l.weight": q})
    write_safetensors(str(tmp_path / "b.safetensors"), {"e.w1.scale": s,
                                                        "l.weight_scale_inv": qs})
    ckpt = open_checkpoint(str(tmp_path))
    monkeypatch.setattr(fp8, "ROW_BLOCK_BYTES", 256 * 1024)  # 32 rows of the expert, 128 of l
    monkeypatch.setattr(mxfp4, "ROW_BLOCK_BYTES", 64 * 1024)
    tracemalloc.start()
    got = fp8.read_dequantized(ckpt, "e.w1.weight", FLASH)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    np.testing.assert_array_equal(got, mxfp4.dequantize(p, s))
    # the output (4 MB), the whole scale in float32 (128 kB) and one block of rows
    assert peak < got.nbytes + 1_000_000, peak
    np.testing.assert_array_equal(fp8.read_dequantized(ckpt, "l.weight", FLASH),
                                  fp8.dequantize(q, qs, FLASH))


@pytest.mark.parametrize("edit,match", [
    (lambda t: t.update({"e.w1.scale": np.where(np.arange(8) == 5, 255, 127).astype(
        np.uint8)[None].repeat(4, 0)}),
     r"e.w1.scale: E8M0 scale byte 0xff \(NaN\) at \(0, 5\)"),
    (lambda t: t.update({"l.scale": np.array([[np.inf]], np.float32)}),
     "l.scale: scale inf is not a finite positive number"),
    (lambda t: t.update({"l.scale": np.array([[-1.0]], np.float32)}),
     "l.scale: scale -1.0 is not a finite positive number"),
    (lambda t: t.update({"l.scale": np.array([[0.75]], np.float32)}),
     "l.scale: scale 0.75 is not a power of two, but config.json quantization_config "
     "scale_fmt is 'ue8m0'"),
])
def test_bad_scale_values_are_refused_by_name(tmp_path, edit, match):
    t = {"e.w1.weight": np.zeros((4, 128), np.int8), "e.w1.scale": _u8((4, 8)),
         "l.weight": np.zeros((2, 3), E4M3), "l.scale": np.ones((1, 1), np.float32)}
    edit(t)
    write_safetensors(str(tmp_path / "model.safetensors"), t)
    ckpt = open_checkpoint(str(tmp_path))
    with pytest.raises(CheckpointError, match=match):
        for name in ("e.w1.weight", "l.weight"):
            fp8.read_dequantized(ckpt, name, FLASH)


NAMES_TXT = ROOT / "tests" / "fixtures" / "hf_deepseek_v4" / "tiny" / "names.txt"


def test_writer_names_are_transformers_save_names_in_release_spelling():
    """names.txt lists what transformers 5.24 `save_pretrained` wrote for the tiny V4
    fixture; its `conversion_mapping.py` "deepseek_v4" maps the release's names and these
    to the same parameters. Release spelling (the published V4-Flash headers):
    `embed.weight`, `norm.weight`, `hc_head_{fn,base,scale}`, no `model.` prefix, and
    `attn.kv_norm.weight` where transformers writes `attn.norm.weight`."""
    import re

    def release(name):
        name = {"model.embed_tokens.weight": "embed.weight",
                "model.norm.weight": "norm.weight"}.get(name, name)
        name = re.sub(r"^model\.hc_head\.hc_", "hc_head_", name)
        name = re.sub(r"^model\.", "", name)
        return re.sub(r"\.attn\.norm\.weight$", ".attn.kv_norm.weight", name)

    saved = {}
    for line in NAMES_TXT.read_text().splitlines():
        name, shape, _ = line.split()
        saved[release(name)] = tuple(json.loads(shape))
    cfg = json.loads((NAMES_TXT.parent / "config.json").read_text())
    # transformers builds no MTP module, so saves none
    written = {s.name: s.shape for s in _writer().tensor_specs(
        {**cfg, "num_nextn_predict_layers": 0})}
    assert written == saved
