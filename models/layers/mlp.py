"""SwiGLU MLP (Shazeer 2020), the dense FFN and the expert of DeepSeek-V3."""

import keras

from models.layers import initializers
from models.layers.routed_experts import swiglu


@keras.saving.register_keras_serializable(package="deepseek")
class SwiGLU(keras.layers.Layer):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), all projections without bias.

    Used as the dense MLP of the first `first_k_dense_replace` blocks, as each
    routed expert and as the (fused) shared expert. Names match HF
    `DeepseekV3MLP` (`gate_proj`, `up_proj`, `down_proj`); kernels are stored
    (in, out), i.e. transposed with respect to HF's (out, in) `weight`.

    Args:
      hidden_size: input and output width C.
      intermediate_size: inner width F.
      initializer_range: stddev of the normal kernel initializer.
      swiglu_limit: None, or L > 0 to clamp the pre-activations as DeepSeek-V4's
        shared expert does (`routed_experts.swiglu`).

    Call args:
      x: float tensor (..., C).

    Returns:
      A tensor (..., C) of the dtype of `x`.
    """

    def __init__(self, hidden_size: int, intermediate_size: int,
                 initializer_range: float = 0.02, swiglu_limit: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.initializer_range = initializer_range
        self.swiglu_limit = swiglu_limit

        def dense(units, name):
            return keras.layers.Dense(
                units, use_bias=False, name=name, dtype=self.dtype_policy,
                kernel_initializer=initializers.normal(initializer_range))

        self.gate_proj = dense(intermediate_size, "gate_proj")
        self.up_proj = dense(intermediate_size, "up_proj")
        self.down_proj = dense(hidden_size, "down_proj")

    def build(self, input_shape=None):
        self.gate_proj.build((None, self.hidden_size))
        self.up_proj.build((None, self.hidden_size))
        self.down_proj.build((None, self.intermediate_size))

    def call(self, x):
        h = swiglu(self.gate_proj(x), self.up_proj(x), self.swiglu_limit)  # (..., F)
        return self.down_proj(h)  # (..., C)

    def get_config(self):
        return {
            **super().get_config(),
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "initializer_range": self.initializer_range,
            "swiglu_limit": self.swiglu_limit,
        }
