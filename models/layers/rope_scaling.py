"""YaRN RoPE scaling (Peng et al. 2023, arXiv 2309.00071), as DeepSeek-V2/V3 use it.

Pure Python (no TensorFlow), so configs validate and FLOP arithmetic runs
without TensorFlow. The formulas follow HF transformers
`modeling_rope_utils._compute_yarn_parameters` and `DeepseekV3Attention`
(identical to the official DeepSeek-V3 `inference/model.py` `precompute_freqs_cis`):

  inv_freq_extra_i = theta^(-2i/d)                      (plain RoPE, i < d/2)
  inv_freq_inter_i = inv_freq_extra_i / factor          (position interpolation)
  low, high = correction range of beta_fast, beta_slow rotations over
              original_max_position_embeddings (floored/ceiled when truncate)
  ramp_i    = clip((i - low) / (high - low), 0, 1)
  inv_freq_i = inv_freq_inter_i * ramp_i + inv_freq_extra_i * (1 - ramp_i)

  cos/sin are multiplied by attention_factor
      = mscale(factor, mscale) / mscale(factor, mscale_all_dim)   (both set)
      = mscale(factor, 1)                                           (otherwise)
  the attention softmax scale is d_qk^-0.5 * mscale(factor, mscale_all_dim)^2
      (only when mscale_all_dim is set, DeepSeek-V2 §B / HF DeepseekV3Attention)

  mscale(s, m) = 0.1 * m * ln(s) + 1   for s > 1, else 1.

`rope_scaling` dicts carry HF's keys: `type` or `rope_type` ("yarn"),
`factor`, `original_max_position_embeddings`, `beta_fast` (32), `beta_slow`
(1), `mscale` (1), `mscale_all_dim` (0), `attention_factor` (derived),
`truncate` (True).
"""

from __future__ import annotations

import math
from typing import Any

YARN_KEYS = {
    "type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast",
    "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate",
}


def normalize_rope_scaling(rope_scaling: dict | None, max_position_embeddings: int) -> dict | None:
    """Validates a `rope_scaling` dict and returns its canonical form (or None).

    The canonical form has `rope_type: "yarn"` and every key with its value or
    default. `None` and `{"rope_type": "default"}` mean plain RoPE.

    Raises:
      ValueError: unknown rope type or key, or a value out of range (named).
    """
    if rope_scaling is None:
        return None
    if not isinstance(rope_scaling, dict):
        raise ValueError(f"rope_scaling={rope_scaling!r} must be a dict or None")
    rope_type = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    if rope_type == "default" and set(rope_scaling) <= {"type", "rope_type", "rope_theta"}:
        return None
    if rope_type != "yarn":
        raise ValueError(f"rope_scaling type {rope_type!r} is not supported (only 'yarn')")
    unknown = sorted(set(rope_scaling) - YARN_KEYS - {"rope_theta"})
    if unknown:
        raise ValueError(f"rope_scaling has unknown keys {unknown}")
    out: dict[str, Any] = {
        "rope_type": "yarn",
        "factor": float(rope_scaling.get("factor", 0.0)),
        "original_max_position_embeddings": int(
            rope_scaling.get("original_max_position_embeddings") or max_position_embeddings),
        "beta_fast": float(rope_scaling.get("beta_fast") or 32.0),
        "beta_slow": float(rope_scaling.get("beta_slow") or 1.0),
        "mscale": float(rope_scaling.get("mscale") or 0.0) or None,
        "mscale_all_dim": float(rope_scaling.get("mscale_all_dim") or 0.0),
        "attention_factor": rope_scaling.get("attention_factor"),
        "truncate": bool(rope_scaling.get("truncate", True)),
    }
    if out["factor"] < 1.0:
        raise ValueError(f"rope_scaling.factor={rope_scaling.get('factor')!r} must be >= 1")
    if out["original_max_position_embeddings"] < 1:
        raise ValueError("rope_scaling.original_max_position_embeddings must be >= 1")
    if out["attention_factor"] is not None:
        out["attention_factor"] = float(out["attention_factor"])
        if out["attention_factor"] <= 0:
            raise ValueError(f"rope_scaling.attention_factor={out['attention_factor']} must be > 0")
    return out


def yarn_get_mscale(scale: float = 1.0, mscale: float = 1.0) -> float:
    """0.1 * mscale * ln(scale) + 1 for scale > 1, else 1 (HF `yarn_get_mscale`)."""
    if scale <= 1.0:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def attention_factor(rope_scaling: dict | None) -> float:
    """The factor cos and sin are multiplied by (1.0 without scaling)."""
    if rope_scaling is None:
        return 1.0
    if rope_scaling["attention_factor"] is not None:
        return rope_scaling["attention_factor"]
    factor = rope_scaling["factor"]
    mscale, mscale_all_dim = rope_scaling["mscale"], rope_scaling["mscale_all_dim"]
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_get_mscale(factor)


def softmax_scale(qk_head_dim: int, rope_scaling: dict | None) -> float:
    """MLA's softmax scale: qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2 with YaRN."""
    scale = qk_head_dim ** -0.5
    if rope_scaling is not None and rope_scaling["mscale_all_dim"]:
        m = yarn_get_mscale(rope_scaling["factor"], rope_scaling["mscale_all_dim"])
        scale *= m * m
    return scale


def inv_freq(dim: int, theta: float, rope_scaling: dict | None) -> list[float]:
    """Inverse frequencies of the dim/2 rotary pairs, plain or YaRN-scaled.

    Args:
      dim: rotary width (qk_rope_head_dim), even.
      theta: RoPE base (rope_theta).
      rope_scaling: canonical dict from `normalize_rope_scaling`, or None.

    Returns:
      dim/2 floats (radians per position).
    """
    half = dim // 2
    extrapolation = [1.0 / (theta ** (2 * i / dim)) for i in range(half)]
    if rope_scaling is None:
        return extrapolation
    factor = rope_scaling["factor"]
    original = rope_scaling["original_max_position_embeddings"]

    def correction_dim(num_rotations: float) -> float:
        return dim * math.log(original / (num_rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = correction_dim(rope_scaling["beta_fast"])
    high = correction_dim(rope_scaling["beta_slow"])
    if rope_scaling["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a division by zero (as HF)
    out = []
    for i in range(half):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0 = extrapolate, 1 = interpolate
        out.append(extrapolation[i] / factor * ramp + extrapolation[i] * (1.0 - ramp))
    return out
