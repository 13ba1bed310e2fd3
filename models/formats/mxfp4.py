"""MXFP4 weights and E8M0 scales: the routed experts of DeepSeek-V4-Flash.

DeepSeek-V4-Flash ships each routed expert projection `layers.N.ffn.experts.E.w{1,2,3}`
as MXFP4 (`config.json` `"expert_dtype": "fp4"`, read by `fp8.quantization_from_hf`):

    X.weight  I8       [out, in / 2]   two E2M1 codes a byte, the LOW nibble the even
                                       column 2j, the HIGH nibble column 2j + 1
    X.scale   F8_E8M0  [out, in / 32]  one power-of-two scale per 32 input columns
                                       of a row

    w[i, j] = e2m1(code[i, j]) * 2 ** (scale_byte[i, j // 32] - 127)

E2M1 (1 sign, 2 exponent, 1 mantissa bit, no inf/NaN): codes 0..7 are
0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8..15 their negatives. E8M0 (`float8_e8m0fnu`,
8 exponent bits, no sign, no mantissa): byte b is 2 ** (b - 127); 0xFF is NaN.

Sources: transformers 5.24 `integrations/finegrained_fp8.py` (`Fp8Dequantize._FP4_E2M1_LUT`
and `_unpack_fp4`: low nibble first; `FP8Experts` with `expert_dtype="fp4"`: int8 weight,
K halved, one scale per row and 32 columns, `sf_gran_n=1`, `sf_gran_k=32`); DeepSeek-V4
`inference/model.py` `Linear` (weight [out, in // 2] `float4_e2m1fn_x2`, scale
[out, in // 32] `float8_e8m0fnu`); OCP Microscaling Formats (MX) v1.0 §5 (E8M0, E2M1,
block 32). The safetensors dtype names are the library's (0.8: "I8", "F8_E8M0");
`safetensors_reader` reads F8_E8M0 as raw uint8 bytes (ml_dtypes 0.3 has no e8m0 type).

numpy only; no TensorFlow. Work is done a block of rows at a time, writing into the
output: dequantizing holds the output plus one row block's temporaries.
"""

from __future__ import annotations

import numpy as np

from models.formats.checkpoint_error import CheckpointError

BLOCK = 32  # input columns per E8M0 scale (transformers `sf_gran_k`, OCP MX block size)
E8M0_BIAS = 127
E8M0_NAN = 0xFF
# E2M1 code -> value (transformers `Fp8Dequantize._FP4_E2M1_LUT`).
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)
E2M1_MAX = 6.0
# Byte -> (value of its low nibble, value of its high nibble): one gather unpacks a byte.
_PAIRS = np.stack([E2M1_VALUES[np.arange(256) & 0xF],
                   E2M1_VALUES[np.arange(256) >> 4]], axis=1)  # (256, 2)
# Midpoints between the non-negative E2M1 values 0, .5, 1, 1.5, 2, 3, 4, 6 after the
# first (0.25), each with whether a value ON it rounds down (strict: the code below is even).
_THRESHOLDS = ((0.75, False), (1.25, True), (1.75, False), (2.5, True), (3.5, False),
               (5.0, True))
# Float32 bytes of output per row block; the gather's int64 indices are as large.
ROW_BLOCK_BYTES = 4 * 1024 * 1024


def packed_shape(shape: tuple[int, int]) -> tuple[int, int]:
    """[out, in / 2]: the stored I8 shape of an [out, in] weight."""
    out, inp = shape
    return (out, inp // 2)


def scale_shape(shape: tuple[int, int]) -> tuple[int, int]:
    """[out, in / 32]: the scale shape of an [out, in] weight."""
    out, inp = shape
    return (out, inp // BLOCK)


def e8m0_to_float32(codes: np.ndarray, name: str = "scale") -> np.ndarray:
    """E8M0 bytes -> float32 2 ** (b - 127) (b = 0 gives 2**-127, a float32 subnormal).

    Args:
      codes: uint8 (as `safetensors_reader` reads F8_E8M0), any shape.
      name: the tensor's name, for errors.

    Returns:
      float32 of the same shape, exact.

    Raises:
      CheckpointError: a byte is 0xFF (E8M0's NaN), naming the tensor and the index.
    """
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise CheckpointError(f"{name}: E8M0 scales must be uint8 bytes, got {codes.dtype}")
    nan = codes == E8M0_NAN
    if nan.any():
        where = tuple(int(i) for i in np.argwhere(nan)[0])
        raise CheckpointError(
            f"{name}: E8M0 scale byte 0xff (NaN) at {where}; a scale must be a number")
    return np.ldexp(np.float32(1.0), codes.astype(np.int32) - E8M0_BIAS).astype(np.float32)


def float32_to_e8m0(scales: np.ndarray, name: str = "scale") -> np.ndarray:
    """Powers of two in [2**-127, 2**127] -> their E8M0 bytes (uint8).

    Raises:
      ValueError: a value that is not such a power of two (named).
    """
    scales = np.asarray(scales, np.float32)
    mantissa, exponent = np.frexp(scales)  # scales = mantissa * 2 ** exponent, mantissa 0.5
    codes = exponent.astype(np.int32) - 1 + E8M0_BIAS
    bad = (mantissa != 0.5) | (codes < 0) | (codes > 254)
    if bad.any():
        raise ValueError(f"{name}: {float(scales[bad].flat[0])!r} is not a power of two "
                         "in [2**-127, 2**127], so has no E8M0 byte")
    return codes.astype(np.uint8)


def ceil_power_of_two_exponent(x: np.ndarray) -> np.ndarray:
    """The smallest k with 2**k >= x, for x > 0 (int32; exact, through frexp); 0 where
    x == 0 (an all-zero block keeps scale 1)."""
    mantissa, exponent = np.frexp(np.asarray(x, np.float32))  # x = m * 2**e, m in [0.5, 1)
    k = np.where(mantissa == 0.5, exponent - 1, exponent)
    return np.where(x > 0, k, 0).astype(np.int32)


def e2m1_codes(x: np.ndarray) -> np.ndarray:
    """float32 -> the nearest E2M1 code (uint8 0..15), ties to the even code, |x| above 6
    saturating to +-6, the sign kept for zeros (-0.0 and small negatives -> code 8).

    Ties to even are the IEEE rule (and ml_dtypes' `float4_e2m1fn` cast): 0.25 -> 0,
    0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2.0, 3.5 -> 4.0, 5.0 -> 4.0. So the
    magnitude code is the count of thresholds passed: > 0.25, >= 0.75, > 1.25, >= 1.75,
    > 2.5, >= 3.5, > 5 (strict where the code below is even). NaN gives code 0 / 8.
    """
    x = np.asarray(x, np.float32)
    a = np.abs(x)
    idx = (a > 0.25).astype(np.uint8)
    for threshold, strict in _THRESHOLDS:
        idx += (a > threshold) if strict else (a >= threshold)
    return idx | (np.signbit(x).astype(np.uint8) << 3)


def pack(codes: np.ndarray) -> np.ndarray:
    """E2M1 codes uint8 [..., n] (n even) -> int8 [..., n / 2], code 2j in the low nibble."""
    codes = np.asarray(codes, np.uint8)
    low, high = codes[..., 0::2], codes[..., 1::2]  # [..., n/2] each
    return (low | (high << 4)).view(np.int8)


def unpack(packed: np.ndarray) -> np.ndarray:
    """int8 (or uint8) [..., m] -> float32 [..., 2m]: low nibble, then high nibble, each
    byte (transformers `Fp8Dequantize._unpack_fp4`)."""
    packed = np.ascontiguousarray(packed).view(np.uint8)
    return _PAIRS[packed].reshape(*packed.shape[:-1], 2 * packed.shape[-1])  # (..., 2m)


def _scale_float32(scales: np.ndarray, name: str) -> np.ndarray:
    """E8M0 bytes (uint8) or float32 scales -> checked float32."""
    if scales.dtype == np.uint8:
        return e8m0_to_float32(scales, name)
    scales = np.asarray(scales, np.float32)
    bad = ~np.isfinite(scales) | (scales <= 0)
    if bad.any():
        raise CheckpointError(
            f"{name}: scale {float(scales[bad].flat[0])!r} is not a finite positive number")
    return scales


def dequantize_into(packed: np.ndarray, scales: np.ndarray, out: np.ndarray,
                    name: str = "weight") -> np.ndarray:
    """w = e2m1(code) * scale[i, j // 32], written into `out`, a row block at a time.

    Args:
      packed: int8 [rows, in / 2] (two codes a byte, low nibble first).
      scales: uint8 E8M0 bytes or float32, [rows, in / 32].
      out: float32 [rows, in], C-contiguous (written; the temporaries are one row block
        of the scales in float32).
      name: the weight's name, for errors (its scale is named `<name> scale`).

    Returns:
      `out`.

    Raises:
      CheckpointError: shapes that do not agree (naming both), an E8M0 NaN byte, a float32
        scale that is not finite and positive.
    """
    rows, half = packed.shape
    inp = 2 * half
    if packed.dtype not in (np.int8, np.uint8):
        raise CheckpointError(f"{name}: packed MXFP4 must be int8, got {packed.dtype}")
    if inp % BLOCK or scales.shape != (rows, inp // BLOCK) or out.shape != (rows, inp):
        raise CheckpointError(
            f"{name}: packed MXFP4 {tuple(packed.shape)} needs scales {(rows, inp // BLOCK)} "
            f"and output {(rows, inp)} (in divisible by {BLOCK}); got scales "
            f"{tuple(scales.shape)}, output {tuple(out.shape)}")
    if out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"{name}: out must be C-contiguous float32")
    step = max(1, ROW_BLOCK_BYTES // max(1, inp * 4))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        s = _scale_float32(scales[r0:r1], f"{name} scale")  # (h, in/32)
        block = out[r0:r1].reshape(r1 - r0, half, 2)  # (h, in/2, 2): a view of out
        np.take(_PAIRS, packed[r0:r1].view(np.uint8), axis=0, out=block, mode="clip")
        block.reshape(r1 - r0, inp // BLOCK, BLOCK)[...] *= s[:, :, None]  # (h, in/32, 32)
    return out


def dequantize(packed: np.ndarray, scales: np.ndarray, name: str = "weight") -> np.ndarray:
    """float32 [out, in] of packed MXFP4 int8 [out, in / 2] and scales [out, in / 32]
    (uint8 E8M0 bytes or float32); see `dequantize_into` for the errors."""
    out = np.empty((packed.shape[0], 2 * packed.shape[1]), np.float32)
    return dequantize_into(packed, scales, out, name)


def quantize(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """float32 [out, in] -> (packed int8 [out, in / 2], E8M0 bytes uint8 [out, in / 32]).

    Per block of 32 columns of a row: scale = 2 ** ceil(log2(amax / 6)), the smallest
    power of two putting the block within E2M1's +-6 (as DeepSeek's `ue8m0` scales round
    up, transformers `Fp8Quantize`), clamped to E8M0's [2**-127, 2**127]; then each value
    w / scale goes to its nearest E2M1 code (`e2m1_codes`). An all-zero block gets scale 1.
    For tests and for writing checkpoints in the published layout.

    Raises:
      ValueError: not 2-D, in not divisible by 32, or a value that is not finite.
    """
    w = np.asarray(w)
    if w.ndim != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"MXFP4 needs a 2-D [out, in] array with in divisible by {BLOCK}, "
                         f"got shape {w.shape}")
    out, inp = w.shape
    packed = np.empty((out, inp // 2), np.int8)
    codes_out = np.empty((out, inp // BLOCK), np.uint8)
    step = max(1, ROW_BLOCK_BYTES // max(1, inp * 4))
    for r0 in range(0, out, step):
        r1 = min(out, r0 + step)
        blk = np.asarray(w[r0:r1], np.float32).reshape(r1 - r0, inp // BLOCK, BLOCK)
        if not np.isfinite(blk).all():
            raise ValueError(f"MXFP4 quantize: rows {r0}..{r1 - 1} hold a value that is not "
                             "finite")
        amax = np.abs(blk).max(axis=2) if inp else np.zeros((r1 - r0, 0), np.float32)
        k = ceil_power_of_two_exponent(amax / np.float32(E2M1_MAX))  # (h, in/32)
        code = np.clip(k + E8M0_BIAS, 0, 254).astype(np.uint8)
        scale = np.ldexp(np.float32(1.0), code.astype(np.int32) - E8M0_BIAS).astype(np.float32)
        e2m1 = e2m1_codes(blk / scale[:, :, None]).reshape(r1 - r0, inp)  # (h, in)
        packed[r0:r1] = pack(e2m1)
        codes_out[r0:r1] = code
    return packed, codes_out
