"""Block-quantized FP8 checkpoints (DeepSeek-V3, V3.1, R1): `quantization_config`
and dequantization.

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
No TensorFlow here: numpy and ml_dtypes only.
"""

from __future__ import annotations

import dataclasses
import logging

import ml_dtypes
import numpy as np

from models.deepseek.hf_config import CheckpointError

log = logging.getLogger(__name__)

SCALE_SUFFIX = "_scale_inv"  # X.weight -> X.weight_scale_inv
SUPPORTED_QUANT_METHODS = ("fp8",)
SUPPORTED_FMTS = ("e4m3",)
SUPPORTED_SCALE_FMTS = (None, "float", "ue8m0")
SUPPORTED_ACTIVATION_SCHEMES = ("dynamic",)
MAX_BLOCK = 1 << 16
_KNOWN_KEYS = {"quant_method", "fmt", "weight_block_size", "activation_scheme", "scale_fmt",
               "modules_to_not_convert"}


@dataclasses.dataclass(frozen=True)
class Fp8Quantization:
    """A checked `quantization_config`.

    Attributes:
      block: weight_block_size (rows, cols) of one scale.
      scale_fmt: None / "float" (any positive float32 scale) or "ue8m0" (powers of two).
    """

    block: tuple[int, int] = (128, 128)
    scale_fmt: str | None = None

    def scale_shape(self, weight_shape: tuple[int, ...]) -> tuple[int, int]:
        """[ceil(out / block rows), ceil(in / block cols)] of a 2-D weight [out, in]."""
        out, inp = weight_shape
        return (-(-out // self.block[0]), -(-inp // self.block[1]))


def quantization_from_hf(hf: dict) -> Fp8Quantization | None:
    """The FP8 quantization of a config.json dict; None when it has no `quantization_config`.

    Raises:
      CheckpointError: quantization_config is not an object, or names a
        quant_method, fmt, scale_fmt, activation_scheme or weight_block_size that is
        not supported (naming the key and value).
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
    unknown = sorted(set(q) - _KNOWN_KEYS)
    if unknown:
        log.info("config.json quantization_config keys not used: %s", unknown)
    return Fp8Quantization(block=(block[0], block[1]), scale_fmt=q.get("scale_fmt"))


def scale_name(weight_name: str) -> str:
    """`X.weight` -> `X.weight_scale_inv`."""
    return weight_name + SCALE_SUFFIX


def check_scale_header(weight_name: str, weight_shape: tuple[int, ...], scale_dtype: str,
                       scale_shape: tuple[int, ...], quant: Fp8Quantization,
                       scale_file: str) -> None:
    """Checks a `weight_scale_inv`'s header entry (safetensors dtype name, shape).

    Raises:
      CheckpointError: the weight is not 2-D, or the scale is not F32 of shape
        [ceil(out/block), ceil(in/block)] (naming the tensor, file and both shapes).
    """
    if len(weight_shape) != 2:
        raise CheckpointError(
            f"{weight_name}: an FP8 weight must be 2-D [out, in], it has shape {weight_shape}")
    name = scale_name(weight_name)
    if scale_dtype != "F32":
        raise CheckpointError(
            f"{scale_file}: tensor {name} has dtype {scale_dtype}, expected F32 (float32 scales)")
    expected = quant.scale_shape(weight_shape)
    if tuple(scale_shape) != expected:
        raise CheckpointError(
            f"{scale_file}: tensor {name} has shape {tuple(scale_shape)}, expected {expected} "
            f"(weight {tuple(weight_shape)} in {quant.block[0]}x{quant.block[1]} blocks)")


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


def dequantize(weight: np.ndarray, scale_inv: np.ndarray, quant: Fp8Quantization,
               name: str = "weight") -> np.ndarray:
    """w = fp8 * scale_inv[i // bo, j // bi], block by block, partial edge blocks included.

    Args:
      weight: float8_e4m3fn [out, in].
      scale_inv: float32 [ceil(out/bo), ceil(in/bi)] (see `check_scale_header`).
      quant: the block size (bo, bi) and scale_fmt.
      name: the weight's name, for errors.

    Returns:
      float32 [out, in] (one new array; the scale is expanded one row block at a time).

    Raises:
      CheckpointError: weight is not float8_e4m3fn, or bad scales (see
        `check_scale_values`).
    """
    if weight.dtype != np.dtype(ml_dtypes.float8_e4m3fn):
        raise CheckpointError(f"{name}: dtype {weight.dtype}, expected float8_e4m3fn")
    scale_inv = np.asarray(scale_inv, np.float32)
    check_scale_values(scale_name(name), scale_inv, quant)
    bo, bi = quant.block
    out = weight.astype(np.float32)
    cols = out.shape[1]
    for b in range(scale_inv.shape[0]):
        row_scale = np.repeat(scale_inv[b], bi)[:cols]  # [in]
        out[b * bo:(b + 1) * bo] *= row_scale
    return out


def quantize(w: np.ndarray, block: tuple[int, int] = (128, 128),
             ue8m0: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """DeepSeek-style block quantization (for tests and tools): scale = amax / 448 per
    block (448 = largest float8_e4m3fn), rounded up to a power of two with `ue8m0`.

    Returns:
      (float8_e4m3fn [out, in], float32 weight_scale_inv [ceil(out/bo), ceil(in/bi)]).
    """
    bo, bi = block
    out, inp = w.shape
    rows, cols = -(-out // bo), -(-inp // bi)
    scale = np.ones((rows, cols), np.float32)
    q = np.empty(w.shape, ml_dtypes.float8_e4m3fn)
    for r in range(rows):
        for c in range(cols):
            blk = w[r * bo:(r + 1) * bo, c * bi:(c + 1) * bi].astype(np.float32)
            amax = float(np.abs(blk).max()) if blk.size else 0.0
            s = np.float32(amax / 448.0) if amax > 0 else np.float32(1.0)
            if ue8m0:
                s = np.float32(2.0 ** np.ceil(np.log2(s)))
            scale[r, c] = s
            q[r * bo:(r + 1) * bo, c * bi:(c + 1) * bi] = (blk / s).astype(
                ml_dtypes.float8_e4m3fn)
    return q, scale
