"""The KV compressor of DeepSeek-V4's CSA and HCA layers (paper §2.3.1 / §2.3.2).

transformers 5.24 `DeepseekV4HCACompressor` (overlap=False) and the compressor half of
`DeepseekV4CSACompressor` (overlap=True); the lightning indexer uses one too, at
`index_head_dim`. Per token t the layer projects

    C_t = h_t W_KV,   Z_t = h_t W_Z           (coff * D each, coff = 2 with overlap, else 1)

and pools each window w of m = compress_rate consecutive tokens (window w covers
positions w*m .. w*m + m - 1 of the sequence, counted from position 0) into one entry:

    HCA (no overlap):  e_w = sum_{j<m} softmax_j(Z_{w,j} + B_j) * C_{w,j}
    CSA (overlap):     the D channels are two series, Ca = [..., :D] and Cb = [..., D:];
                       e_w pools 2m slots, window w-1's Ca then window w's Cb:
                       e_w = sum_{j<2m} softmax_j([Za_{w-1} | Zb_w] + [Ba | Bb]) * [Ca_{w-1} | Cb_w]
                       (window 0's Ca slots are zero with gate -inf: weight 0, unless a
                       carried state gives the previous call's last window)

with the learned position bias B = `position_bias` (m, coff*D) (release name `ape`),
softmax over the slots in float32. Then e = RMSNorm(e) (`kv_norm`) and RoPE (the
"compress" rope) on its trailing rope dims at position w*m + first_window_position (the
window's first token). An entry is usable by a query at position p iff (w + 1) * m <= p + 1
(`ops.visible_compressed_count`).

The window math is in `pool_windows`, which takes the carried state a KV cache needs
(`first_window_position`, the previous window's Ca slice); `call` is the stateless
prefill (windows from position 0, an incomplete last window dropped). The KV cache
(`models.deepseek_v4.kv_cache.update_compressed`) keeps `kv_proj` / `gate_proj` of every
position and re-pools, through `compress`, the windows its new tokens touch.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.ops import apply_rope_3d, rope_cos_sin, rope_inv_freq
from models.layers import initializers
from models.layers.rms_norm import RMSNorm


def pool_windows(kv, gate, position_bias, compress_rate: int, overlap: bool,
                 prior_kv=None, prior_gate=None):
    """Gated softmax pooling of complete windows (module docstring), before norm and RoPE.

    Args:
      kv: float (B, W*m, coff*D) projected tokens C of W complete windows, the first
        token at a window boundary.
      gate: float (B, W*m, coff*D) projected gates Z (same tokens).
      position_bias: float32 (m, coff*D), B.
      compress_rate: m.
      overlap: CSA's two-series layout (coff = 2).
      prior_kv, prior_gate: with overlap, the Ca slices [..., :D] of the window before
        these W windows, kv (B, m, D) and gate + bias (B, m, D), float32; None = no such
        window (its slots get weight 0).

    Returns:
      (B, W, D), the dtype of `kv`.
    """
    batch = tf.shape(kv)[0]
    width = kv.shape[-1]  # coff * D
    n_windows = tf.shape(kv)[1] // compress_rate
    kv = tf.reshape(kv, [batch, n_windows, compress_rate, width])  # (B, W, m, coff*D)
    gate = tf.reshape(tf.cast(gate, tf.float32),
                      [batch, n_windows, compress_rate, width])  # (B, W, m, coff*D)
    gate += tf.cast(position_bias, tf.float32)  # (B, W, m, coff*D)
    if overlap:
        dim = width // 2
        ca_kv, cb_kv = kv[..., :dim], kv[..., dim:]  # (B, W, m, D) each
        ca_gate, cb_gate = gate[..., :dim], gate[..., dim:]
        if prior_kv is None:
            first_kv = tf.zeros([batch, 1, compress_rate, dim], kv.dtype)  # (B, 1, m, D)
            first_gate = tf.fill([batch, 1, compress_rate, dim], float("-inf"))
        else:
            first_kv = tf.cast(prior_kv, kv.dtype)[:, None]  # (B, 1, m, D)
            first_gate = tf.cast(prior_gate, tf.float32)[:, None]
        # Window w's first m slots: window w-1's Ca (window -1: the prior or nothing).
        prev_kv = tf.concat([first_kv, ca_kv], axis=1)[:, :n_windows]  # (B, W, m, D)
        prev_gate = tf.concat([first_gate, ca_gate], axis=1)[:, :n_windows]
        kv = tf.concat([prev_kv, cb_kv], axis=2)  # (B, W, 2m, D)
        gate = tf.concat([prev_gate, cb_gate], axis=2)  # (B, W, 2m, D)
    weights = tf.nn.softmax(gate, axis=2)  # over the window's slots, float32
    return tf.reduce_sum(kv * tf.cast(weights, kv.dtype), axis=2)  # (B, W, D)


@keras.saving.register_keras_serializable(package="deepseek_v4")
class KVCompressor(keras.layers.Layer):
    """Compresses every window of `compress_rate` tokens into one KV entry (module docstring).

    Sublayers and weights (release names in brackets): `kv_proj` Dense C -> coff*D
    [`wkv`], `gate_proj` Dense C -> coff*D [`wgate`], `position_bias` float32
    (m, coff*D), zeros [`ape`], `kv_norm` RMSNorm(D) float32 [`norm`].

    Args:
      hidden_size: C.
      head_dim: D, the width of an entry (config.head_dim, or index_head_dim for the
        indexer's compressor).
      compress_rate: m.
      overlap: CSA's overlapping two-series windows (coff = 2); False for HCA.
      rope_dim: trailing rotary dims (config.qk_rope_head_dim).
      rope_theta: config.compress_rope_theta.
      rope_scaling: config.rope_scaling (YaRN) or None.
      rms_norm_eps: eps of `kv_norm`.
      initializer_range: stddev of the projections.

    Call args:
      hidden_states: float tensor (B, T, C), positions 0 .. T-1.

    Returns:
      (B, T // m, D) compressed entries in the compute dtype, entry w at position w*m.
    """

    def __init__(self, hidden_size: int, head_dim: int, compress_rate: int, overlap: bool,
                 rope_dim: int, rope_theta: float, rope_scaling: dict | None,
                 rms_norm_eps: float, initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.head_dim = head_dim
        self.compress_rate = compress_rate
        self.overlap = overlap
        self.rope_dim = rope_dim
        self.rope_theta = rope_theta
        self.rope_scaling = rope_scaling
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range
        self.inv_freq = rope_inv_freq(rope_dim, rope_theta, rope_scaling)  # (rope_dim/2,)
        width = (2 if overlap else 1) * head_dim

        def dense(name):
            return keras.layers.Dense(
                width, use_bias=False, name=name, dtype=self.dtype_policy,
                kernel_initializer=initializers.normal(initializer_range))

        self.kv_proj = dense("kv_proj")
        self.gate_proj = dense("gate_proj")
        self.kv_norm = RMSNorm(rms_norm_eps, name="kv_norm", dtype="float32")

    def build(self, input_shape=None):
        width = (2 if self.overlap else 1) * self.head_dim
        self.kv_proj.build((None, None, self.hidden_size))
        self.gate_proj.build((None, None, self.hidden_size))
        self.position_bias = self.add_weight(name="position_bias",
                                             shape=(self.compress_rate, width),
                                             initializer="zeros", dtype="float32")
        self.kv_norm.build((None, None, self.head_dim))

    def call(self, hidden_states):
        seq = tf.shape(hidden_states)[1]
        usable = (seq // self.compress_rate) * self.compress_rate  # complete windows only
        x = hidden_states[:, :usable]  # (B, W*m, C)
        return self.compress(self.kv_proj(x), self.gate_proj(x), first_window_position=0)

    def compress(self, kv, gate, first_window_position=0, prior_kv=None, prior_gate=None):
        """Entries of complete windows from projected tokens (the cache-friendly entry point).

        Args:
          kv, gate: (B, W*m, coff*D) outputs of `kv_proj` / `gate_proj`.
          first_window_position: int or int32 scalar (every row), or int32 (B,) (one per
            row, a KV cache's rows at their own positions): the position of the first
            token, a multiple of m.
          prior_kv, prior_gate: carried overlap state, see `pool_windows`.

        Returns:
          (B, W, D): normalized, rotated at positions w*m + first_window_position.
        """
        pooled = pool_windows(kv, gate, self.position_bias, self.compress_rate, self.overlap,
                              prior_kv, prior_gate)  # (B, W, D)
        entries = tf.cast(self.kv_norm(pooled), pooled.dtype)  # (B, W, D)
        n_windows = tf.shape(entries)[1]
        positions = tf.range(n_windows) * self.compress_rate  # (W,)
        first = tf.convert_to_tensor(first_window_position, tf.int32)
        if first.shape.rank == 1:  # per row
            positions = first[:, None] + positions[None, :]  # (B, W)
        else:
            positions = positions + first  # (W,)
        cos, sin = rope_cos_sin(positions, self.inv_freq)  # (W | B,W, rope_dim/2)
        return apply_rope_3d(entries, cos, sin)  # (B, W, D)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "head_dim": self.head_dim,
            "compress_rate": self.compress_rate,
            "overlap": self.overlap,
            "rope_dim": self.rope_dim,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "rms_norm_eps": self.rms_norm_eps,
            "initializer_range": self.initializer_range,
        }
