"""RMSNorm (Zhang & Sennrich 2019), as `DeepseekV3RMSNorm` in HF transformers."""

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="deepseek")
class RMSNorm(keras.layers.Layer):
    """y = weight * x / sqrt(mean(x^2) + eps), statistics in float32.

    Args:
      epsilon: added to the mean square.

    Call args:
      x: float tensor (..., dim).

    Returns:
      A tensor of the shape and dtype of `x`. The learned scale is the weight
      `weight` (dim,), initialized to ones (HF name `...norm.weight`).

    Reference: HF transformers `modeling_deepseek_v3.py` (DeepseekV3RMSNorm).
    """

    def __init__(self, epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.weight = self.add_weight(name="weight", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        x32 = tf.cast(x, tf.float32)
        variance = tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True)  # (..., 1)
        normed = tf.cast(x32 * tf.math.rsqrt(variance + self.epsilon), x.dtype)
        return tf.cast(self.weight, x.dtype) * normed

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}
