"""The final collapse of the mHC streams, DeepSeek-V4 §2.2 (transformers `DeepseekV4HyperHead`).

    x   = RMSNorm_unweighted(flatten(X))           (B, T, n*C), float32
    pre = sigmoid((x hc_fn^T) * hc_scale + hc_base) + hc_eps      (B, T, n)
    out = sum_j pre_j X_j                          (B, T, C)

It runs before the model's final RMSNorm.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.ops import unweighted_rms_norm
from models.layers import initializers


@keras.saving.register_keras_serializable(package="deepseek_v4")
class HyperHead(keras.layers.Layer):
    """Collapses the n = hc_mult residual streams into one.

    Weights (float32; release names `hc_head_fn` / `hc_head_base` / `hc_head_scale`,
    transformers `model.hc_head.hc_fn` / `hc_base` / `hc_scale`): `hc_fn` (n, n*C),
    normal(initializer_range); `hc_base` (n,) zeros; `hc_scale` (1,) ones.

    Args:
      hc_mult: n.
      hidden_size: C.
      hc_eps: added to the sigmoid weights.
      rms_norm_eps: eps of the unweighted RMSNorm.
      initializer_range: stddev of `hc_fn`.

    Call args:
      streams: float tensor (B, T, n, C).

    Returns:
      (B, T, C) in the dtype of `streams`.
    """

    def __init__(self, hc_mult: int, hidden_size: int, hc_eps: float, rms_norm_eps: float,
                 initializer_range: float = 0.02, **kwargs):
        kwargs["dtype"] = "float32"  # transformers keeps hc_head in float32
        super().__init__(**kwargs)
        self.hc_mult = hc_mult
        self.hidden_size = hidden_size
        self.hc_eps = hc_eps
        self.rms_norm_eps = rms_norm_eps
        self.initializer_range = initializer_range

    def build(self, input_shape=None):
        n = self.hc_mult
        self.hc_fn = self.add_weight(name="hc_fn", shape=(n, n * self.hidden_size),
                                     initializer=initializers.normal(self.initializer_range))
        self.hc_base = self.add_weight(name="hc_base", shape=(n,), initializer="zeros")
        self.hc_scale = self.add_weight(name="hc_scale", shape=(1,), initializer="ones")

    def call(self, streams):
        n = self.hc_mult
        batch, seq = tf.shape(streams)[0], tf.shape(streams)[1]
        x = tf.cast(streams, tf.float32)
        flat = tf.reshape(x, [batch, seq, n * self.hidden_size])  # (B, T, n*C)
        flat = unweighted_rms_norm(flat, self.rms_norm_eps)
        mixes = tf.matmul(flat, self.hc_fn, transpose_b=True)  # (B, T, n)
        pre = tf.sigmoid(mixes * self.hc_scale + self.hc_base) + self.hc_eps  # (B, T, n)
        return tf.cast(tf.reduce_sum(pre[..., None] * x, axis=2), streams.dtype)  # (B, T, C)

    def get_config(self):
        return {
            **super().get_config(),
            "hc_mult": self.hc_mult,
            "hidden_size": self.hidden_size,
            "hc_eps": self.hc_eps,
            "rms_norm_eps": self.rms_norm_eps,
            "initializer_range": self.initializer_range,
        }
