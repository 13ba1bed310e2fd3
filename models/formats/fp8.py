"""Block-quantized checkpoints: DeepSeek-V3 / V3.1 / V3.2 / R1 FP8 and DeepSeek-V4's FP8 +
MXFP4 (`quantization_config`, scale lookup, header checks, dequantization, quantizers).

DeepSeek publishes V3/V3.1/R1 with `config.json`

    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                            "weight_block_size": [128, 128],
                            "activation_scheme": "dynamic"}

(V3.1 adds `"scale_fmt": "ue8m0"`: every scale is a power of two). Each quantized
linear weight `X.weight` is float8_e4m3fn [out, in], with a float32
`X.weight_scale_inv` [ceil(out/128), ceil(in/128)], one per 128x128 block, which
MULTIPLIES the FP8 values (the name is DeepSeek's: the inverse of the
quantization scale):

    w[i, j] = fp8[i, j] * weight_scale_inv[i // 128, j // 128]

Edge blocks are partial. Reference: DeepSeek-V3 `inference/kernel.py`
`weight_dequant_kernel` and `inference/fp8_cast_bf16.py`; transformers
`integrations/finegrained_fp8.py` (`scale_fmt` "float" / "ue8m0").

DeepSeek-V4 (transformers 5.24 `utils/quantization_config.py` `FineGrainedFP8Config`:
`scale_fmt` "float" | "ue8m0", `expert_dtype` "fp8" | "fp4"; vLLM's `DeepseekV4FP8Config`):

  * V4-Flash: `quantization_config = {"quant_method": "fp8", "fmt": "e4m3",
    "weight_block_size": [128, 128], "activation_scheme": "dynamic", "scale_fmt": "ue8m0"}`
    and `"expert_dtype": "fp4"` at the top level of config.json (transformers'
    `DeepseekV4Config.__post_init__` moves it into `quantization_config`; either place is
    read here). Linear weights are F8_E4M3 [out, in] with per-128x128-block scales stored
    as `X.scale` (not `X.weight_scale_inv`; transformers
    `quantizers/quantizer_finegrained_fp8.py` renames `<module>.scale` to
    `<module>.weight_scale_inv`, "e.g. DeepSeek-V4-Flash") of dtype F8_E8M0 (`float8_e8m0fnu`,
    byte b = 2 ** (b - 127)). The routed experts `layers.N.ffn.experts.E.w{1,2,3}` are
    MXFP4: I8 [out, in / 2] with F8_E8M0 `X.scale` [out, in / 32] (`mxfp4.py`). The
    compressor / indexer `wkv`, `wgate` and the indexer `weights_proj` ship BF16 without a
    scale (transformers `DeepseekV4PreTrainedModel._keep_in_fp32_modules`).
  * V4-Flash-Base: FP8 everywhere, experts included, with float32 block scales
    (`scale_fmt` "float" or absent, no `expert_dtype` or "fp8").
  * The scale of `X.weight` is `X.weight_scale_inv` or `X.scale` (`find_scale_name`);
    a weight with both is refused, a quantized weight with neither too.

`read_dequantized` is the one entry point for a loader: any weight, quantized or not, to
float32 (or bfloat16), a block of rows at a time. No TensorFlow here: numpy and ml_dtypes.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from models.formats import mxfp4
from models.formats.checkpoint_error import CheckpointError

log = logging.getLogger(__name__)

SCALE_SUFFIX = "_scale_inv"  # X.weight -> X.weight_scale_inv
V4_SCALE_SUFFIX = ".scale"  # X.weight -> X.scale (DeepSeek-V4's release)
SUPPORTED_QUANT_METHODS = ("fp8",)
SUPPORTED_FMTS = ("e4m3",)
SUPPORTED_SCALE_FMTS = (None, "float", "ue8m0")
SUPPORTED_ACTIVATION_SCHEMES = ("dynamic",)
SUPPORTED_EXPERT_DTYPES = ("fp8", "fp4")
SUPPORTED_MOE_QUANT_ALGOS = (None, "MXFP4")
MAX_BLOCK = 1 << 16
_KNOWN_KEYS = {"quant_method", "fmt", "weight_block_size", "activation_scheme", "scale_fmt",
               "modules_to_not_convert", "expert_dtype", "moe_quant_algo"}
# Safetensors dtypes of a scale tensor: float32 (V3, V4-Flash-Base) or E8M0 bytes (V4-Flash).
SCALE_DTYPES = ("F32", "F8_E8M0")
FLOAT_DTYPES = ("BF16", "F16", "F32")
# A routed expert's projection, release names (`layers.N.ffn.experts.E.w1.weight`, MTP
# `mtp.D.ffn.experts.E.w2.weight`) or V3's (`model.layers.N.mlp.experts.E.up_proj.weight`).
ROUTED_EXPERT = re.compile(r"(^|\.)experts\.\d+\.[A-Za-z0-9_]+\.weight$")


@dataclasses.dataclass(frozen=True)
class Fp8Quantization:
    """A checked `quantization_config`.

    Attributes:
      block: weight_block_size (rows, cols) of one scale of an FP8 weight.
      scale_fmt: None / "float" (any positive float32 scale) or "ue8m0" (powers of two).
      expert_dtype: "fp8" (routed experts FP8 like the rest) or "fp4" (routed experts
        packed MXFP4 with one scale per 32 input columns, `mxfp4.py`; DeepSeek-V4-Flash).
    """

    block: tuple[int, int] = (128, 128)
    scale_fmt: str | None = None
    expert_dtype: str = "fp8"

    def scale_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, int]:
        """[ceil(out / block rows), ceil(in / block cols)] of a 2-D weight [out, in]."""
        out, inp = weight_shape
        return (-(-out // self.block[0]), -(-inp // self.block[1]))


def quantization_from_hf(hf: dict) -> Fp8Quantization | None:
    """The FP8 quantization of a config.json dict; None when it has no `quantization_config`.

    `expert_dtype` is read from `quantization_config`, else from the top level of
    config.json (where DeepSeek-V4-Flash's release has it; transformers 5.24
    `DeepseekV4Config.__post_init__` moves it into `quantization_config`), else "fp8".

    Raises:
      CheckpointError: quantization_config is not an object, or names a
        quant_method, fmt, scale_fmt, activation_scheme, weight_block_size,
        expert_dtype or moe_quant_algo that is not supported (naming the key and
        value); or config.json's top-level expert_dtype disagrees with
        quantization_config's.
    """
    q = hf.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise CheckpointError(f"config.json quantization_config={q!r} is not an object")

    def refuse(key, supported):
        raise CheckpointError(
            f"config.json quantization_config {key}={q.get(key)!r} is not supported "
            f"(supported: {', '.join(repr(s) for s in supported)})")

    if q.get("quant_method") not in SUPPORTED_QUANT_METHODS:
        refuse("quant_method", SUPPORTED_QUANT_METHODS)
    if q.get("fmt", "e4m3") not in SUPPORTED_FMTS:
        refuse("fmt", SUPPORTED_FMTS)
    if q.get("scale_fmt") not in SUPPORTED_SCALE_FMTS:
        refuse("scale_fmt", SUPPORTED_SCALE_FMTS)
    if q.get("activation_scheme", "dynamic") not in SUPPORTED_ACTIVATION_SCHEMES:
        refuse("activation_scheme", SUPPORTED_ACTIVATION_SCHEMES)
    block = q.get("weight_block_size", [128, 128])
    if (not isinstance(block, list) or len(block) != 2 or not all(
            isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= MAX_BLOCK
            for b in block)):
        raise CheckpointError(
            f"config.json quantization_config weight_block_size={block!r} is not supported "
            f"(two ints in [1, {MAX_BLOCK}], e.g. [128, 128])")
    if q.get("moe_quant_algo") not in SUPPORTED_MOE_QUANT_ALGOS:
        refuse("moe_quant_algo", SUPPORTED_MOE_QUANT_ALGOS)
    top = hf.get("expert_dtype")  # DeepSeek-V4-Flash's release puts it here
    if "expert_dtype" in q:
        expert_dtype = q["expert_dtype"]
        if expert_dtype not in SUPPORTED_EXPERT_DTYPES:
            refuse("expert_dtype", SUPPORTED_EXPERT_DTYPES)
        if top is not None and top != expert_dtype:
            raise CheckpointError(
                f"config.json expert_dtype={top!r} disagrees with quantization_config "
                f"expert_dtype={expert_dtype!r}")
    elif top is not None:
        expert_dtype = top
        if expert_dtype not in SUPPORTED_EXPERT_DTYPES:
            raise CheckpointError(
                f"config.json expert_dtype={top!r} is not supported "
                f"(supported: {', '.join(repr(s) for s in SUPPORTED_EXPERT_DTYPES)})")
    else:
        expert_dtype = "fp8"
    unknown = sorted(set(q) - _KNOWN_KEYS)
    if unknown:
        log.info("config.json quantization_config keys not used: %s", unknown)
    return Fp8Quantization(block=(block[0], block[1]), scale_fmt=q.get("scale_fmt"),
                           expert_dtype=expert_dtype)


def scale_name(weight_name: str) -> str:
    """`X.weight` -> `X.weight_scale_inv` (V3's name; `find_scale_name` knows V4's too)."""
    return weight_name + SCALE_SUFFIX


def scale_names(weight_name: str) -> tuple[str, ...]:
    """The names the scale of `weight_name` may have: `X.weight_scale_inv` (V3,
    transformers) and, for `X.weight`, `X.scale` (DeepSeek-V4's release)."""
    if weight_name.endswith(".weight"):
        return (weight_name + SCALE_SUFFIX, weight_name[:-len(".weight")] + V4_SCALE_SUFFIX)
    return (weight_name + SCALE_SUFFIX,)


def find_scale_name(weight_name: str, names, file: str = "") -> str | None:
    """The scale tensor of `weight_name` among `names` (any container of tensor names):
    `X.weight_scale_inv` or `X.scale`; None when neither is there.

    Raises:
      CheckpointError: both are there (naming the weight, both scales and `file`).
    """
    found = [n for n in scale_names(weight_name) if n in names]
    if len(found) > 1:
        where = f"{file}: " if file else ""
        raise CheckpointError(
            f"{where}tensor {weight_name} has two scales, {found[0]} and {found[1]}; "
            "a weight has one")
    return found[0] if found else None


def is_routed_expert(name: str) -> bool:
    """Whether `name` is a routed expert's projection weight (`...experts.E.w1.weight`,
    `...experts.E.up_proj.weight`): the tensors `expert_dtype` governs."""
    return ROUTED_EXPERT.search(name) is not None


def check_scale_header(weight_name: str, weight_shape: tuple[int, ...], scale_dtype: str,
                       scale_shape: tuple[int, ...], quant: Fp8Quantization,
                       scale_file: str, scale: str | None = None) -> None:
    """Checks the header entry (safetensors dtype name, shape) of an FP8 weight's scale.

    Args:
      scale: the scale's name (default `X.weight_scale_inv`; V4's is `X.scale`).

    Raises:
      CheckpointError: the weight is not 2-D, or the scale is not F32 / F8_E8M0 of shape
        [ceil(out/block), ceil(in/block)] (naming the tensor, file and both shapes).
    """
    if len(weight_shape) != 2:
        raise CheckpointError(
            f"{weight_name}: an FP8 weight must be 2-D [out, in], it has shape {weight_shape}")
    name = scale or scale_name(weight_name)
    if scale_dtype not in SCALE_DTYPES:
        raise CheckpointError(
            f"{scale_file}: tensor {name} has dtype {scale_dtype}, expected F32 (float32 "
            "scales) or F8_E8M0")
    expected = quant.scale_shape(weight_shape)
    if tuple(scale_shape) != expected:
        raise CheckpointError(
            f"{scale_file}: tensor {name} has shape {tuple(scale_shape)}, expected {expected} "
            f"(weight {tuple(weight_shape)} in {quant.block[0]}x{quant.block[1]} blocks)")


def check_weight(tensors: Mapping, name: str, expected_shape: tuple[int, ...],
                 quant: Fp8Quantization | None, routed_expert: bool | None = None
                 ) -> str | None:
    """Checks one model weight's header entry, and its scale's, against the shape the
    config wants; returns the scale's name (None for an unquantized weight).

    Accepted: BF16 / F16 / F32 of `expected_shape` with no scale; F8_E4M3 [out, in]
    with an F32 or F8_E8M0 scale [ceil(out/b0), ceil(in/b1)]; and, when quant's
    expert_dtype is "fp4", I8 [out, in/2] (packed MXFP4, in divisible by 32) with an
    F32 or F8_E8M0 scale [out, in/32]. The scale is `X.weight_scale_inv` or `X.scale`.

    Args:
      tensors: {name: safetensors_reader.TensorInfo} of the checkpoint
        (`Checkpoint.tensors`).
      name: the weight, e.g. "layers.0.ffn.experts.3.w1.weight".
      expected_shape: its logical shape from the config ([out, in] for a linear weight,
        unpacked: [out, in], not the stored [out, in/2] of MXFP4).
      quant: `quantization_from_hf(config.json)`, or None.
      routed_expert: True for a routed expert's projection (with expert_dtype "fp4" it must
        be I8), False for any other weight (it must not be I8), None not to check the
        role (`read_dequantized`).

    Returns:
      The scale tensor's name, or None.

    Raises:
      CheckpointError: one line naming the file and tensor: absent; a wrong shape (both
        shapes given); a dtype other than the above; FP8 / I8 without quantization_config;
        I8 when expert_dtype is not "fp4" or for a weight that is not a routed expert; a
        routed expert that is not I8 under expert_dtype "fp4"; a quantized weight with no
        scale, a float weight with one, a weight with two; a scale of another dtype or
        shape.
    """
    info = tensors.get(name)
    if info is None:
        raise CheckpointError(f"no tensor {name} in the checkpoint")
    expected = tuple(expected_shape)
    where = f"{info.file}: tensor {name}"
    scale = find_scale_name(name, tensors, info.file)
    fp4_expert = bool(routed_expert) and quant is not None and quant.expert_dtype == "fp4"
    if info.dtype in FLOAT_DTYPES:
        _check_float_weight(name, info, expected, scale, fp4_expert)
        return None
    if info.dtype not in ("F8_E4M3", "I8"):
        raise CheckpointError(
            f"{where} has dtype {info.dtype}, expected F8_E4M3, I8 (packed MXFP4), BF16, "
            "F16 or F32")
    if quant is None:
        kind = "float8_e4m3fn" if info.dtype == "F8_E4M3" else "I8 (packed MXFP4)"
        raise CheckpointError(f"{where} is {kind}, but config.json has no quantization_config")
    if len(expected) != 2:
        raise CheckpointError(
            f"{where} is {info.dtype}, but a quantized weight must be 2-D [out, in]; the "
            f"expected shape is {expected}")
    if info.dtype == "F8_E4M3":
        return _check_fp8_weight(tensors, name, info, expected, scale, quant, fp4_expert)
    return _check_mxfp4_weight(tensors, name, info, expected, scale, quant, routed_expert)


def _check_float_weight(name: str, info, expected: tuple[int, ...], scale: str | None,
                        fp4_expert: bool) -> None:
    """`check_weight` of a BF16 / F16 / F32 weight (`info`, its TensorInfo): of the
    expected shape, with no scale, and not a routed expert under expert_dtype "fp4".

    Raises:
      CheckpointError: one line naming the file and tensor (both shapes for a wrong one).
    """
    where = f"{info.file}: tensor {name}"
    if info.shape != expected:
        raise CheckpointError(f"{where} has shape {info.shape}, expected {expected}")
    if scale is not None:
        raise CheckpointError(f"{where} is {info.dtype} but has a scale {scale}")
    if fp4_expert:
        raise CheckpointError(
            f"{where} is {info.dtype}, but config.json expert_dtype is 'fp4' (routed "
            "experts are packed MXFP4, I8)")


def _check_fp8_weight(tensors: Mapping, name: str, info, expected: tuple[int, int],
                      scale: str | None, quant: Fp8Quantization, fp4_expert: bool) -> str:
    """`check_weight` of an F8_E4M3 weight (`info`, its TensorInfo in `tensors`): [out, in]
    = `expected`, not a routed expert under expert_dtype "fp4", with a scale of
    `check_scale_header`'s dtype and shape; returns the scale's name.

    Raises:
      CheckpointError: one line naming the file and tensor (both shapes for a wrong one).
    """
    where = f"{info.file}: tensor {name}"
    if fp4_expert:
        raise CheckpointError(
            f"{where} is F8_E4M3, but config.json expert_dtype is 'fp4' (routed experts "
            "are packed MXFP4, I8)")
    if info.shape != expected:
        raise CheckpointError(f"{where} has shape {info.shape}, expected {expected}")
    if scale is None:
        raise CheckpointError(
            f"{info.file}: FP8 tensor {name} has no scale "
            f"{' or '.join(scale_names(name))} in the checkpoint")
    s = tensors[scale]
    check_scale_header(name, info.shape, s.dtype, s.shape, quant, s.file, scale)
    return scale


def _check_mxfp4_weight(tensors: Mapping, name: str, info, expected: tuple[int, int],
                        scale: str | None, quant: Fp8Quantization,
                        routed_expert: bool | None) -> str:
    """`check_weight` of an I8 weight (`info`, its TensorInfo in `tensors`): packed MXFP4
    (`mxfp4.py`) of a routed expert under expert_dtype "fp4", stored [out, in/2] for
    `expected` [out, in] (in divisible by `mxfp4.BLOCK`), with an F8_E8M0 or F32 scale
    [out, in/32]; returns the scale's name.

    Raises:
      CheckpointError: one line naming the file and tensor (both shapes for a wrong one).
    """
    where = f"{info.file}: tensor {name}"
    if quant.expert_dtype != "fp4":
        raise CheckpointError(
            f"{where} is I8 (packed MXFP4), but config.json expert_dtype is "
            f"{quant.expert_dtype!r}, not 'fp4'")
    if routed_expert is False:
        raise CheckpointError(f"{where} is I8 (packed MXFP4), which only routed experts are")
    if expected[1] % mxfp4.BLOCK:
        raise CheckpointError(
            f"{where} is I8 (packed MXFP4), which needs in divisible by {mxfp4.BLOCK}; the "
            f"expected shape is {expected}")
    packed = mxfp4.packed_shape(expected)
    if info.shape != packed:
        raise CheckpointError(
            f"{where} has shape {info.shape}, expected {packed} (packed MXFP4 of "
            f"[out, in] = {expected}, two values a byte)")
    if scale is None:
        raise CheckpointError(
            f"{info.file}: MXFP4 tensor {name} has no scale "
            f"{' or '.join(scale_names(name))} in the checkpoint")
    s = tensors[scale]
    if s.dtype not in SCALE_DTYPES:
        raise CheckpointError(
            f"{s.file}: tensor {scale} has dtype {s.dtype}, expected F8_E8M0 or F32")
    if s.shape != mxfp4.scale_shape(expected):
        raise CheckpointError(
            f"{s.file}: tensor {scale} has shape {s.shape}, expected "
            f"{mxfp4.scale_shape(expected)} (weight {expected} in 1x{mxfp4.BLOCK} blocks)")
    return scale


def check_scale_values(name: str, scale_inv: np.ndarray, quant: Fp8Quantization) -> None:
    """Scales must be finite and positive; with scale_fmt "ue8m0", powers of two.

    Raises:
      CheckpointError: naming the tensor and the first bad value.
    """
    bad = ~np.isfinite(scale_inv) | (scale_inv <= 0)
    if bad.any():
        raise CheckpointError(
            f"{name}: scale {scale_inv[bad].flat[0]!r} is not a finite positive number")
    if quant.scale_fmt == "ue8m0":
        mantissa, _ = np.frexp(scale_inv)
        bad = mantissa != 0.5
        if bad.any():
            raise CheckpointError(
                f"{name}: scale {float(scale_inv[bad].flat[0])!r} is not a power of two, but "
                "config.json quantization_config scale_fmt is 'ue8m0'")


def scale_float32(name: str, scale: np.ndarray, quant: Fp8Quantization) -> np.ndarray:
    """A scale tensor as checked float32: F8_E8M0 bytes (uint8) decoded, 2 ** (b - 127);
    float32 checked by `check_scale_values`.

    Raises:
      CheckpointError: an E8M0 byte 0xFF (NaN), or a bad float32 value (naming `name`).
    """
    if scale.dtype == np.uint8:
        return mxfp4.e8m0_to_float32(scale, name)
    scale = np.asarray(scale, np.float32)
    check_scale_values(name, scale, quant)
    return scale


def _dequantize_rows(weight: np.ndarray, scale: np.ndarray, block: tuple[int, int],
                     out: np.ndarray) -> None:
    """out = fp8 * scale[i // bo, j // bi] for a block of rows starting on a block-row
    boundary: weight float8_e4m3fn [h, in], scale float32 [ceil(h/bo), ceil(in/bi)],
    out float32 [h, in] (written in place; the temporary is one row of the scale)."""
    bo, bi = block
    cols = out.shape[1]
    np.copyto(out, weight, casting="unsafe")  # e4m3 -> float32, exact
    for b in range(scale.shape[0]):
        row_scale = np.repeat(scale[b], bi)[:cols]  # [in]
        out[b * bo:(b + 1) * bo] *= row_scale


def dequantize(weight: np.ndarray, scale_inv: np.ndarray, quant: Fp8Quantization,
               name: str = "weight") -> np.ndarray:
    """w = fp8 * scale_inv[i // bo, j // bi], block by block, partial edge blocks included.

    Args:
      weight: float8_e4m3fn [out, in].
      scale_inv: float32, or uint8 E8M0 bytes (F8_E8M0, V4), [ceil(out/bo), ceil(in/bi)]
        (see `check_scale_header`).
      quant: the block size (bo, bi) and scale_fmt.
      name: the weight's name, for errors.

    Returns:
      float32 [out, in] (one new array; the scale is expanded one row block at a time).

    Raises:
      CheckpointError: weight is not float8_e4m3fn, or bad scales (see
        `check_scale_values`; an E8M0 byte 0xFF).
    """
    if weight.dtype != np.dtype(ml_dtypes.float8_e4m3fn):
        raise CheckpointError(f"{name}: dtype {weight.dtype}, expected float8_e4m3fn")
    scale = scale_float32(scale_name(name), np.asarray(scale_inv), quant)
    out = np.empty(weight.shape, np.float32)
    _dequantize_rows(weight, scale, quant.block, out)
    return out


def quantize(w: np.ndarray, block: tuple[int, int] = (128, 128), ue8m0: bool = False,
             e8m0: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-style block quantization (for tests and tools): scale = amax / 448 per
    block (448 = largest float8_e4m3fn), rounded up to a power of two with `ue8m0`
    (transformers `Fp8Quantize`: ceil(log2)); an all-zero block gets scale 1.

    Args:
      w: float [out, in].
      block: (bo, bi).
      ue8m0: power-of-two scales (V3.1).
      e8m0: power-of-two scales returned as E8M0 bytes (uint8, DeepSeek-V4's F8_E8M0
        `X.scale`); implies ue8m0.

    Returns:
      (float8_e4m3fn [out, in], scales [ceil(out/bo), ceil(in/bi)]: float32, or uint8
      E8M0 bytes with `e8m0`).

    Raises:
      ValueError: w is not 2-D or holds a value that is not finite.
    """
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"FP8 block quantization needs a 2-D [out, in] array, got {w.shape}")
    bo, bi = block
    out, inp = w.shape
    rows, cols = -(-out // bo), -(-inp // bi)
    scale = np.ones((rows, cols), np.float32)
    q = np.empty(w.shape, ml_dtypes.float8_e4m3fn)
    for r in range(rows):
        blk = np.asarray(w[r * bo:(r + 1) * bo], np.float32)  # (h, in)
        if not np.isfinite(blk).all():
            raise ValueError(f"FP8 quantize: rows {r * bo}..{r * bo + blk.shape[0] - 1} hold "
                             "a value that is not finite")
        if inp == 0:
            continue
        a = np.abs(blk)
        if cols * bi != inp:
            a = np.pad(a, ((0, 0), (0, cols * bi - inp)))  # (h, cols * bi)
        amax = a.reshape(blk.shape[0], cols, bi).max(axis=(0, 2))  # (cols,)
        s = np.where(amax > 0, (amax.astype(np.float64) / 448.0).astype(np.float32),
                     np.float32(1.0))
        if ue8m0 or e8m0:
            k = mxfp4.ceil_power_of_two_exponent(s)
            s = np.ldexp(np.float32(1.0), np.clip(k, -mxfp4.E8M0_BIAS, 127)).astype(np.float32)
        scale[r] = s
        q[r * bo:(r + 1) * bo] = (blk / np.repeat(s, bi)[:inp]).astype(ml_dtypes.float8_e4m3fn)
    if e8m0:
        return q, mxfp4.float32_to_e8m0(scale, "scale")
    return q, scale


# Float32 bytes of output dequantized per step of `read_dequantized`.
ROW_BLOCK_BYTES = 8 * 1024 * 1024
OUTPUT_DTYPES = (np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16))


def read_dequantized(files, name: str, quantization: Fp8Quantization | None,
                     dtype=np.float32) -> np.ndarray:
    """One weight of a checkpoint as a float array: FP8 (V3 / V4) and MXFP4 (V4-Flash
    experts) dequantized, BF16 / F16 / F32 converted; read a block of rows at a time.

    Contract (the call a DeepSeek-V4 loader makes for every weight it assigns):
      * `X` stored BF16 / F16 / F32, any shape, no scale -> that shape in `dtype`.
      * `X` stored F8_E4M3 [out, in] with scale `X.weight_scale_inv` or `X.scale`
        (F32 or F8_E8M0 [ceil(out/b0), ceil(in/b1)], `quantization.block`)
        -> [out, in], w = fp8 * scale[i // b0, j // b1].
      * `X` stored I8 [out, in/2] (packed MXFP4, `quantization.expert_dtype == "fp4"`)
        with scale F8_E8M0 or F32 [out, in/32] -> [out, in],
        w = e2m1(nibble) * scale[i, j // 32], low nibble = even column (`mxfp4.py`).
    The role of the weight (routed expert or not) is not checked here: call
    `check_weight(files.tensors, name, shape, quantization, routed_expert)` when checking
    the checkpoint's headers against the config.

    Memory: the output array plus one block of rows: its stored bytes (at most
    `ROW_BLOCK_BYTES` / 4), the gather indices of `mxfp4.dequantize_into` (at most
    `mxfp4.ROW_BLOCK_BYTES`) and, for a bfloat16 / float16 output, the block in float32
    (`ROW_BLOCK_BYTES`); plus the scale, read whole and held in float32 (1/16384 of an FP8
    weight's elements, 1/32 of an MXFP4 weight's). Never a second copy of the output:
    measured (tracemalloc) on a [2048, 4096] expert, 33.5 MB of float32 output, peak
    +6.3 MB for MXFP4 and +4.2 MB for FP8 (+19 MB with a bfloat16 output of 16.8 MB).

    Args:
      files: a `safetensors_reader.Checkpoint` (headers checked, lazy reads); the scale
        may be in another shard than its weight.
      name: the weight's tensor name, e.g. "layers.3.ffn.experts.7.w2.weight".
      quantization: `quantization_from_hf(config.json)`, or None for an unquantized
        checkpoint.
      dtype: the output dtype, float32 (default), ml_dtypes.bfloat16 or float16
        (dequantized in float32 a row block at a time, then rounded).

    Returns:
      A new C-contiguous array of `dtype`.

    Raises:
      CheckpointError: no such tensor; another stored dtype (I64, a lone F8_E8M0, ...);
        a quantized weight without quantization_config, without a scale, or with a scale
        of the wrong dtype or shape; a float weight with a scale; a weight with two
        scales; I8 when expert_dtype is not "fp4"; an E8M0 scale byte 0xFF (NaN), a
        float32 scale that is not finite and positive, or not a power of two under
        scale_fmt "ue8m0" (each one line naming the file or tensor, and both shapes for a
        wrong shape); a file shorter than its header said.
      ValueError: `dtype` is not one of the three.
    """
    dtype = np.dtype(dtype)
    if dtype not in OUTPUT_DTYPES:
        raise ValueError(f"read_dequantized: dtype {dtype} is not float32, bfloat16 or float16")
    info = files.info(name)
    if info.dtype in FLOAT_DTYPES:
        check_weight(files.tensors, name, info.shape, quantization)  # no scale
        return _read_float(files, name, info.shape, dtype)
    return _read_quantized(files, name, info, quantization, dtype)


def _read_float(files, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """`read_dequantized` of a checked BF16 / F16 / F32 weight of `shape`: a new array of
    `dtype` and `shape`, converted a block of rows at a time (`_row_step`)."""
    out = np.empty(shape, dtype)
    if len(shape) == 0 or 0 in shape:
        out[...] = files.read(name)
        return out
    step = _row_step(shape, 1)
    for r0 in range(0, shape[0], step):
        r1 = min(r0 + step, shape[0])
        out[r0:r1] = files.read(name, (r0, r1))  # converted in the assignment
    return out


def _read_quantized(files, name: str, info, quantization: Fp8Quantization | None,
                    dtype: np.dtype) -> np.ndarray:
    """`read_dequantized` of an F8_E4M3 or I8 (packed MXFP4) weight (`info`, its
    TensorInfo), checked with its scale by `check_weight`: [out, in] of `dtype`,
    dequantized in float32 a block of rows at a time (whole scale blocks for FP8).

    Raises:
      CheckpointError: see `check_weight` and `scale_float32`; a file shorter than its
        header said.
    """
    if info.dtype == "I8" and len(info.shape) == 2:
        shape = (info.shape[0], 2 * info.shape[1])
    else:
        shape = info.shape
    scale = check_weight(files.tensors, name, shape, quantization)
    scales = scale_float32(scale, files.read(scale), quantization)
    out = np.empty(shape, dtype)
    rows_per_scale = quantization.block[0] if info.dtype == "F8_E4M3" else 1
    step = _row_step(shape, rows_per_scale)
    for r0 in range(0, shape[0], step):
        r1 = min(r0 + step, shape[0])
        target = out[r0:r1] if dtype == np.float32 else np.empty((r1 - r0, shape[1]),
                                                                 np.float32)
        stored = files.read(name, (r0, r1))  # (h, in) fp8 or (h, in/2) int8
        if info.dtype == "F8_E4M3":
            b0 = r0 // rows_per_scale
            _dequantize_rows(stored, scales[b0:-(-r1 // rows_per_scale)], quantization.block,
                             target)
        else:
            mxfp4.dequantize_into(stored, scales[r0:r1], target, name)
        if dtype != np.float32:
            out[r0:r1] = target  # rounded to dtype
    return out


def _row_step(shape: tuple[int, ...], multiple: int) -> int:
    """Rows per step: about ROW_BLOCK_BYTES of float32, a multiple of `multiple`."""
    row_bytes = 4 * max(1, int(np.prod(shape[1:], dtype=np.int64)))
    rows = max(1, ROW_BLOCK_BYTES // row_bytes)
    return max(multiple, rows // multiple * multiple)
