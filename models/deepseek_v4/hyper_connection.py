"""Manifold-constrained hyper-connections (mHC), DeepSeek-V4 §2.2 (Xie et al. 2026).

transformers 5.24 `DeepseekV4HyperConnection`. The residual is n = hc_mult streams
X (B, T, n, C). From the streams, per token:

    x      = RMSNorm_unweighted(flatten(X))                    (B, T, n*C), float32
    [p, q, r] = x fn^T                                          n, n, n*n mixes
    pre    = sigmoid(p * scale_0 + base_pre) + eps              (B, T, n)
    post   = 2 * sigmoid(q * scale_1 + base_post)               (B, T, n)
    comb   = SinkhornKnopp(softmax(r * scale_2 + base_comb, -1) + eps)   (B, T, n, n)
    collapsed = sum_j pre_j X_j                                 (B, T, C), the block input

and after the block (attention or MoE) with output y (B, T, C) the decoder block forms

    X'_k = post_k * y + sum_j comb_jk X_j        (comb^T X; `DeepseekV4DecoderLayer`)

Sinkhorn-Knopp, exactly as transformers (hc_sinkhorn_iters = t_max):

    comb /= colsum(comb) + eps
    repeat t_max - 1 times: comb /= rowsum(comb) + eps; comb /= colsum(comb) + eps

(colsum = sum over axis -2, rowsum = over axis -1), so the result is column-normalized
and close to doubly stochastic. Everything runs in float32 (transformers keeps these
modules in float32), whatever the model's dtype policy: the layer's own policy is
"float32", so its weights are float32 variables under "mixed_bfloat16" and "bfloat16"
alike, Keras casts the streams to float32 on the way in, and an enclosing layer's bf16
autocast scope does not reach it (Keras resets the scope to the layer's compute dtype).
Gradients reach `fn`, `base` and `scale` through the Sinkhorn-Knopp iterations (plain
differentiable ops, unrolled).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.ops import unweighted_rms_norm
from models.layers import initializers


def sinkhorn_knopp(comb, iters: int, eps: float):
    """Projects positive matrices toward doubly stochastic ones (module docstring).

    Args:
      comb: float32 (..., n, n), positive.
      iters: t_max >= 1 (1 = a single column normalization).
      eps: added to every row / column sum.

    Returns:
      float32 (..., n, n): columns sum to 1 (up to eps), rows approximately.
    """
    comb = comb / (tf.reduce_sum(comb, axis=-2, keepdims=True) + eps)  # columns
    for _ in range(iters - 1):
        comb = comb / (tf.reduce_sum(comb, axis=-1, keepdims=True) + eps)  # rows
        comb = comb / (tf.reduce_sum(comb, axis=-2, keepdims=True) + eps)  # columns
    return comb


# `sinkhorn_knopp` as one function for every layer: traced once per shape, dtype, iters and
# eps, and called, where unrolled it would add its ~120 small ops (~780 with their
# gradients) to the graph at every layer. In training it is compiled with XLA: the
# iterations on (B, T, n, n) become one fused kernel forward and one backward. Inference
# keeps the plain graph function, which TensorFlow Serving runs without XLA.
_sinkhorn_graph = tf.function(sinkhorn_knopp, autograph=False, reduce_retracing=True)
_sinkhorn_xla = tf.function(sinkhorn_knopp, autograph=False, reduce_retracing=True,
                            jit_compile=True)


@keras.saving.register_keras_serializable(package="deepseek_v4")
class HyperConnection(keras.layers.Layer):
    """The mHC weights of one sub-block (attention or MoE) and the collapse of the streams.

    Weights (float32; release names `hc_attn_*` / `hc_ffn_*`, transformers `attn_hc.*` /
    `ffn_hc.*`): `fn` (n*(2+n), n*C), normal(initializer_range); `base` (n*(2+n),) zeros;
    `scale` (3,) ones.

    Args:
      hc_mult: n >= 1.
      hidden_size: C.
      hc_sinkhorn_iters: t_max >= 1.
      hc_eps: eps of pre, comb and Sinkhorn-Knopp.
      rms_norm_eps: eps of the unweighted RMSNorm of the flattened streams.
      initializer_range: stddev of `fn`.

    Call args:
      streams: float tensor (B, T, n, C).
      training: Sinkhorn-Knopp compiled with XLA (module note above `HyperConnection`).

    Returns:
      (post float32 (B, T, n), comb float32 (B, T, n, n), collapsed float32 (B, T, C);
      called through Keras, bf16 streams arrive as float32).
    """

    def __init__(self, hc_mult: int, hidden_size: int, hc_sinkhorn_iters: int, hc_eps: float,
                 rms_norm_eps: float, initializer_range: float = 0.02, **kwargs):
        kwargs["dtype"] = "float32"  # transformers keeps mHC in float32
        super().__init__(**kwargs)
        self.hc_mult = hc_mult
        self.hidden_size = hidden_size
        self.hc_sinkhorn_iters = hc_sinkhorn_iters
        self.hc_eps = hc_eps
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range

    def build(self, input_shape=None):
        n = self.hc_mult
        mixes = (2 + n) * n  # pre (n) + post (n) + comb (n*n)
        self.fn = self.add_weight(name="fn", shape=(mixes, n * self.hidden_size),
                                  initializer=initializers.normal(self.initializer_range))
        self.base = self.add_weight(name="base", shape=(mixes,), initializer="zeros")
        self.scale = self.add_weight(name="scale", shape=(3,), initializer="ones")

    def call(self, streams, training=False):
        n = self.hc_mult
        batch, seq = tf.shape(streams)[0], tf.shape(streams)[1]
        flat = tf.reshape(tf.cast(streams, tf.float32),
                          [batch, seq, n * self.hidden_size])  # (B, T, n*C)
        flat = unweighted_rms_norm(flat, self.rms_norm_eps)
        mixes = tf.matmul(flat, self.fn, transpose_b=True)  # (B, T, n*(2+n))
        pre_w, post_w, comb_w = tf.split(mixes, [n, n, n * n], axis=-1)
        pre_b, post_b, comb_b = tf.split(self.base, [n, n, n * n])
        comb_w = tf.reshape(comb_w, [batch, seq, n, n])  # (B, T, n, n)
        comb_b = tf.reshape(comb_b, [n, n])  # (n, n)

        pre = tf.sigmoid(pre_w * self.scale[0] + pre_b) + self.hc_eps  # (B, T, n)
        post = 2.0 * tf.sigmoid(post_w * self.scale[1] + post_b)  # (B, T, n)
        comb = tf.nn.softmax(comb_w * self.scale[2] + comb_b, axis=-1) + self.hc_eps
        sinkhorn = _sinkhorn_xla if training else _sinkhorn_graph
        comb = sinkhorn(comb, self.hc_sinkhorn_iters, self.hc_eps)  # (B, T, n, n)

        collapsed = tf.reduce_sum(pre[..., None] * tf.cast(streams, tf.float32), axis=2)
        return post, comb, tf.cast(collapsed, streams.dtype)  # (B, T, C)

    def get_config(self):
        return {
            **super().get_config(),
            "hc_mult": self.hc_mult,
            "hidden_size": self.hidden_size,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps,
            "rms_norm_eps": self.rms_norm_eps,
            "initializer_range": self.initializer_range,
        }
