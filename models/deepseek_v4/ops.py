"""Functions shared by the DeepSeek-V4 layers: V4's RoPE, the unweighted RMSNorm, causal masks.

RoPE (transformers 5.24 `modular_deepseek_v4.py`, `apply_rotary_pos_emb` and
`DeepseekV4RotaryEmbedding`): only the trailing `rope_dim` channels of each head rotate
(layout [nope | rope]), as interleaved pairs (x_2i, x_2i+1) with one angle per pair:

    theta_i(p) = p * inv_freq_i,   i < rope_dim / 2
    y_2i   = x_2i * cos - x_2i+1 * sin
    y_2i+1 = x_2i+1 * cos + x_2i * sin          (glm's interleaved `rotate_half`)

in float32, cast back to the input dtype. inv_freq is plain RoPE, theta^(-2i/d), for
the "main" rope (sliding-window layers) and YaRN (`models.layers.rope_scaling.inv_freq`)
for the "compress" rope of CSA/HCA layers; V4 never scales cos/sin by YaRN's mscale
(transformers sets `attention_factor` 1.0). Rotating by -theta (`inverse=True`) undoes it:
V4 applies it to the attention output's rope slice at the query position.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from models.layers import rope_scaling as yarn


def rope_inv_freq(dim: int, theta: float, rope_scaling: dict | None) -> np.ndarray:
    """float32 (dim/2,) inverse frequencies (radians per position).

    Plain: 1 / theta^(arange(0, dim, 2) / dim) computed in float32 as transformers'
    `compute_default_rope_parameters`; YaRN: `rope_scaling.inv_freq` (HF
    `_compute_yarn_parameters`; V4's cos/sin are not multiplied by an attention factor).

    Raises:
      ValueError: `rope_scaling` has an attention_factor other than 1 (V4 never scales).
    """
    if rope_scaling is None:
        exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
        return (np.float32(1.0) / np.power(np.float32(theta), exponent)).astype(np.float32)
    if yarn.attention_factor(rope_scaling) != 1.0:
        raise ValueError(f"rope_scaling.attention_factor={yarn.attention_factor(rope_scaling)}: "
                         "DeepSeek-V4's compress rope is not scaled (must be 1.0)")
    return np.asarray(yarn.inv_freq(dim, theta, rope_scaling), np.float32)


def rope_cos_sin(positions, inv_freq: np.ndarray):
    """cos/sin of every (position, pair).

    Args:
      positions: int tensor (..., T) of absolute positions.
      inv_freq: float32 (dim/2,) from `rope_inv_freq`.

    Returns:
      (cos, sin), float32 tensors (..., T, dim/2): one angle per interleaved pair.
    """
    freqs = tf.cast(positions, tf.float32)[..., None] * tf.constant(inv_freq)  # (..., T, dim/2)
    return tf.cos(freqs), tf.sin(freqs)


def apply_rope(x, cos, sin, inverse: bool = False):
    """Rotates the trailing 2 * cos.shape[-1] channels of x as interleaved pairs.

    Args:
      x: float tensor (B, T, H, D) (H = 1 for the shared KV head); or (B, N, D) with
        cos/sin (B or 1, N, dim/2) for compressed entries, see `apply_rope_3d`.
      cos, sin: float32 (T, dim/2) or (B, T, dim/2) from `rope_cos_sin`.
      inverse: rotate by -theta (sin negated).

    Returns:
      A tensor of the shape and dtype of x; the leading D - dim channels unchanged.
    """
    if len(cos.shape) == 2:
        cos, sin = cos[None], sin[None]  # (1, T, dim/2)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # (B|1, T, 1, dim/2) head-broadcast
    if inverse:
        sin = -sin
    dim = 2 * cos.shape[-1]
    nope, rope = x[..., :-dim], tf.cast(x[..., -dim:], tf.float32)  # (B,T,H,D-dim), (B,T,H,dim)
    pairs = tf.reshape(rope, tf.concat([tf.shape(rope)[:-1], [dim // 2, 2]], 0))  # (B,T,H,d/2,2)
    even, odd = pairs[..., 0], pairs[..., 1]  # (B, T, H, dim/2) each
    rotated = tf.stack([even * cos + (-odd) * sin, odd * cos + even * sin], axis=-1)  # (..,d/2,2)
    rotated = tf.reshape(rotated, tf.shape(rope))  # (B, T, H, dim)
    return tf.concat([nope, tf.cast(rotated, x.dtype)], axis=-1)  # (B, T, H, D)


def apply_rope_3d(x, cos, sin):
    """`apply_rope` on compressed entries x (B, N, D) with cos/sin (N, dim/2) or (B, N, dim/2)."""
    return apply_rope(x[:, :, None, :], cos, sin)[:, :, 0, :]  # (B, N, 1, D) -> (B, N, D)


def unweighted_rms_norm(x, eps: float):
    """x / sqrt(mean(x^2) + eps) over the last axis, the statistic in float32, no weight.

    transformers `DeepseekV4UnweightedRMSNorm` (q per head, mHC inputs). Shape and dtype of x.
    """
    variance = tf.reduce_mean(tf.square(tf.cast(x, tf.float32)), axis=-1, keepdims=True)
    return x * tf.cast(tf.math.rsqrt(variance + eps), x.dtype)


def sliding_window_mask(query_positions, key_positions, sliding_window: int):
    """bool (..., Tq, Tk): key k visible to query q iff q - sliding_window < k <= q.

    A query sees `sliding_window` keys, itself included (transformers
    `masking_utils.sliding_window_causal_mask_function`: kv_idx > q_idx - sliding_window
    and kv_idx <= q_idx).

    Args:
      query_positions: int tensor (..., Tq); key_positions: int tensor (..., Tk).
    """
    q = query_positions[..., :, None]  # (..., Tq, 1)
    k = key_positions[..., None, :]  # (..., 1, Tk)
    return (k <= q) & (k > q - sliding_window)


def visible_compressed_count(query_positions, compress_rate: int):
    """int (..., T): compressed entries w with w < (p + 1) // compress_rate are complete at
    position p (a window's entry is usable once its last token is in the past or present;
    transformers' `causal_threshold`)."""
    return (query_positions + 1) // compress_rate
