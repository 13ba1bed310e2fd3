"""The routed experts of a DeepSeekMoE layer: E SwiGLU MLPs held as stacked kernels.

    y_e = down_proj_e(silu(gate_proj_e(x_e)) * up_proj_e(x_e))      for every expert e

over a buffer x of shape (E, S, C) (row e: the tokens routed to expert e, padded),
as three batched matmuls whatever E is, so the layer's graph, its build and the
SavedModel that holds it do not grow with the number of experts (MaxText,
torchtitan and transformers 5 hold experts stacked the same way). The kernels are
(E, C, F), (E, C, F) and (E, F, C) (`ExpertProjection`); Hugging Face checkpoints
keep one [out, in] tensor per expert, `mlp.experts.e.{gate,up,down}_proj.weight`,
mapped to slices by `hf_names.py`.

`experts[e]` is a view of expert e (`ExpertView`): its SwiGLU on (..., C) tokens and
its (in, out) kernels, for references and tests; it holds no weights of its own.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.layers.expert_projection import ExpertProjection

PROJECTIONS = ("gate_proj", "up_proj", "down_proj")


@keras.saving.register_keras_serializable(package="deepseek")
class RoutedExperts(keras.layers.Layer):
    """E SwiGLU experts of width F on C, stacked (module docstring).

    Args:
      num_experts: E.
      hidden_size: C.
      intermediate_size: F (config.moe_intermediate_size).
      initializer_range: stddev of the normal kernel initializers.
      swiglu_limit: None (DeepSeek-V2/V3), or a float L > 0 that clamps the
        pre-activations, silu(min(gate, L)) * clip(up, -L, L) (DeepSeek-V4,
        transformers `DeepseekV4Experts._apply_gate`).

    Call args:
      x: float tensor (E, S, C), row e for expert e.

    Returns:
      (E, S, C), the dtype of `x`.
    """

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int,
                 initializer_range: float = 0.02, swiglu_limit: float | None = None, **kwargs):
        super().__init__(**kwargs)
        self.num_experts = num_experts
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.initializer_range = initializer_range
        self.swiglu_limit = swiglu_limit
        e, c, f, r = num_experts, hidden_size, intermediate_size, initializer_range
        self.gate_proj = ExpertProjection(e, c, f, r, name="gate_proj", dtype=self.dtype_policy)
        self.up_proj = ExpertProjection(e, c, f, r, name="up_proj", dtype=self.dtype_policy)
        self.down_proj = ExpertProjection(e, f, c, r, name="down_proj", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        for projection in self.projections:
            projection.build()

    @property
    def projections(self) -> list[ExpertProjection]:
        """gate_proj, up_proj, down_proj."""
        return [self.gate_proj, self.up_proj, self.down_proj]

    def call(self, x):
        h = swiglu(self.gate_proj(x), self.up_proj(x), self.swiglu_limit)  # (E, S, F)
        return self.down_proj(h)  # (E, S, C)

    def call_grouped(self, x, group_sizes):
        """The experts on rows grouped by expert, with no padding: a matmul per expert
        on its contiguous rows (`ExpertProjection.call_grouped`), so the graph holds
        E of each matmul. Float and LoRA kernels; not int8.

        Args:
          x: float (P, C), the rows of expert 0, then those of expert 1, ...
          group_sizes: int32 (E,) rows per expert, summing to P.

        Returns:
          (P, C), the dtype of `x`.
        """
        pieces = tf.split(x, group_sizes, num=self.num_experts)  # E x (n_e, C)
        gate = self.gate_proj.call_grouped(pieces)  # E x (n_e, F)
        up = self.up_proj.call_grouped(pieces)  # E x (n_e, F)
        h = [swiglu(g, u, self.swiglu_limit) for g, u in zip(gate, up, strict=True)]
        return tf.concat(self.down_proj.call_grouped(h), axis=0)  # (P, C)

    def __len__(self) -> int:
        return self.num_experts

    def __getitem__(self, expert: int) -> ExpertView:
        if not -self.num_experts <= expert < self.num_experts:
            raise IndexError(f"expert {expert} of {self.num_experts}")
        return ExpertView(self, expert % self.num_experts)

    def get_config(self):
        return {
            **super().get_config(),
            "num_experts": self.num_experts,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "initializer_range": self.initializer_range,
            "swiglu_limit": self.swiglu_limit,
        }


def swiglu(gate, up, limit: float | None = None):
    """silu(gate) * up; with `limit` L, silu(min(gate, L)) * clip(up, -L, L) (DeepSeek-V4's
    clamped SwiGLU, transformers `DeepseekV4MLP` / `DeepseekV4Experts`). Shapes and dtype
    of `gate` (= those of `up`)."""
    if limit is not None:
        gate = tf.minimum(gate, tf.cast(limit, gate.dtype))
        up = tf.clip_by_value(up, tf.cast(-limit, up.dtype), tf.cast(limit, up.dtype))
    return tf.nn.silu(gate) * up


class ExpertView:
    """Expert e of a RoutedExperts: `view(x)` is its SwiGLU on x (..., C) -> (..., C)
    in float32 (kernels dequantized, LoRA included); `view.gate_proj.kernel` etc. are
    its (in, out) kernels in the variables' dtype (float32 for int8). Read-only; it
    holds no weights."""

    def __init__(self, experts: RoutedExperts, expert: int):
        self.experts = experts
        self.expert = expert
        for name in PROJECTIONS:
            setattr(self, name, _KernelView(getattr(experts, name), expert))

    def __call__(self, x):
        x = tf.cast(x, tf.float32)
        w = {name: tf.cast(getattr(self, name).kernel, tf.float32) for name in PROJECTIONS}
        h = swiglu(x @ w["gate_proj"], x @ w["up_proj"], self.experts.swiglu_limit)  # (..., F)
        return h @ w["down_proj"]  # (..., C)


class _KernelView:
    def __init__(self, projection: ExpertProjection, expert: int):
        self.projection = projection
        self.expert = expert

    @property
    def kernel(self) -> tf.Tensor:
        return self.projection.expert_kernel(self.expert)  # (in, out)
