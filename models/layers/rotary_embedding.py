"""Rotary position embedding (RoPE, Su et al. 2021, arXiv 2104.09864).

DeepSeek's MLA applies RoPE only to a decoupled slice of each query and key
(DeepSeek-V2 arXiv 2405.04434 §2.1.3). The tables follow HF transformers
`DeepseekV3RotaryEmbedding`: inv_freq_i = theta^(-2i/d) and cos/sin are laid
out as cat(freqs, freqs), so rotation is the "rotate_half" form:

    x_rot = x * cos + rotate_half(x) * sin,   rotate_half([a, b]) = [-b, a]

With `interleave=True` (HF `rope_interleave`, the layout of the official
weights) the input's rope dims are (even, odd) pairs: they are first
de-interleaved to [evens, odds] and then rotated, so the output is written
de-interleaved. Attention logits equal those of the official complex-number
(interleaved) form because q and k are permuted alike.

With `rope_scaling` (YaRN, see `rope_scaling.py`) the inverse frequencies
are blended between extrapolation and interpolation, and cos/sin are
multiplied by the YaRN attention factor, as HF does.
"""

import tensorflow as tf

from models.layers import rope_scaling as yarn


def rope_cos_sin(positions, dim: int, theta: float = 10000.0, rope_scaling: dict | None = None):
    """cos/sin tables for the given positions.

    Args:
      positions: int tensor (T,) of absolute positions (offset + arange(T) for
        cached decoding).
      dim: rotary width (qk_rope_head_dim), even.
      theta: RoPE base (rope_theta).
      rope_scaling: canonical YaRN dict (`DeepSeekConfig.rope_scaling`) or None.

    Returns:
      (cos, sin), float32 tensors (T, dim), each cat(freqs, freqs) along the
      last axis, times the YaRN attention factor (1 without scaling).
    """
    if rope_scaling is None:
        inv_freq = 1.0 / (theta ** (tf.range(0, dim, 2, dtype=tf.float32) / dim))  # (dim/2,)
    else:
        inv_freq = tf.constant(yarn.inv_freq(dim, theta, rope_scaling), tf.float32)  # (dim/2,)
    freqs = tf.cast(positions, tf.float32)[:, None] * inv_freq[None, :]  # (T, dim/2)
    emb = tf.concat([freqs, freqs], axis=-1)  # (T, dim)
    factor = yarn.attention_factor(rope_scaling)
    if factor == 1.0:
        return tf.cos(emb), tf.sin(emb)
    return tf.cos(emb) * factor, tf.sin(emb) * factor


def rotate_half(x):
    """[a, b] -> [-b, a] on the last axis (halves)."""
    x1, x2 = tf.split(x, 2, axis=-1)
    return tf.concat([-x2, x1], axis=-1)


def deinterleave(x):
    """(..., d) laid out as pairs (x0, x1), (x2, x3), ... -> [x0, x2, ..., x1, x3, ...]."""
    d = x.shape[-1]
    pairs = tf.reshape(x, tf.concat([tf.shape(x)[:-1], [d // 2, 2]], axis=0))  # (..., d/2, 2)
    rank = len(x.shape)
    perm = list(range(rank - 1)) + [rank, rank - 1]
    return tf.reshape(tf.transpose(pairs, perm), tf.shape(x))  # (..., 2, d/2) -> (..., d)


def apply_rotary_pos_emb(x, cos, sin, interleave: bool = False):
    """Rotates the last axis of x by its position.

    Args:
      x: float tensor (B, T, H, d): queries or keys (use H = 1 for the shared k_pe).
      cos, sin: float32 tensors (T, d) from `rope_cos_sin`.
      interleave: HF `rope_interleave` (see module docstring).

    Returns:
      A tensor (B, T, H, d) of the dtype of x; de-interleaved when `interleave`.
    """
    if interleave:
        x = deinterleave(x)
    cos = tf.cast(cos, x.dtype)[None, :, None, :]  # (1, T, 1, d)
    sin = tf.cast(sin, x.dtype)[None, :, None, :]  # (1, T, 1, d)
    return x * cos + rotate_half(x) * sin
