"""One linear projection of all the routed experts of a MoE layer, as one stacked kernel.

The kernel is (E, in, out): expert e's (in, out) matrix is `kernel[e]` (the
transpose of the [out, in] `mlp.experts.e.<proj>.weight` a Hugging Face checkpoint
stores). The layer maps a buffer of E rows of tokens, (E, S, in), to (E, S, out) in
one batched matmul: row e goes through expert e only. DeepSeekMoE fills the buffer
with each expert's tokens (`moe.py`).

It offers what Keras' `Dense` offers the model's other projections, with the same
names, so the code that walks projections (`quantization.py`, `trainable.py`,
`hf_names.py`) treats both alike:
  - `kernel`: the float kernel computed with, W (+ A B with LoRA);
  - `enable_lora(rank)`: per-expert low-rank adapters `lora_kernel_a` (E, in, r),
    he-uniform, and `lora_kernel_b` (E, r, out), zeros, so W_e + A_e B_e starts at
    W_e (Hu et al. 2021, "LoRA", §4.1; transformers/PEFT adapt stacked experts with
    one pair of factors per expert as well); W is frozen;
  - `quantize("int8")`: the kernel becomes int8 Q (E, in, out) with a float32 scale
    s (E, out) per expert and output channel,

        s_ej = 127 / max_i |W_eij|     Q_e = round(W_e * s_e)     W_e ~ Q_e / s_e

    (`keras.quantizers.abs_max_quantize` over the `in` axis), and the call quantizes
    each token's input the same way and runs an int8 x int8 -> int32 batched matmul,
    de-scaled: per expert exactly Keras 3.6's `Dense` int8 scheme (LLM.int8()'s
    vector-wise quantization, Dettmers et al. 2022, arXiv 2208.07339, §3.2). The
    input gradient is taken through Q / s, as Keras' Dense does.

Keras 3.6 lets a layer add weights after `build` only inside `quantize` (its
wrapper unlocks the layer's tracker); `enable_lora` unlocks it the way Keras'
`Dense.enable_lora` does, through `Layer._tracker`, and `quantize` sets
`_is_quantized` as Dense does, so that the int8 dtype policy it sets does not
quantize the layer again. Both are private to Keras; tests/models/test_tracking.py
pins them and fails, naming them, when an upgrade changes either.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.layers import initializers

INT8 = "int8"


@keras.saving.register_keras_serializable(package="deepseek")
class ExpertProjection(keras.layers.Layer):
    """E stacked (in, out) kernels without bias, applied expert by expert.

    Args:
      num_experts: E.
      input_dim: in.
      units: out.
      initializer_range: stddev of the normal kernel initializer.

    Call args:
      x: float tensor (E, S, in): row e holds the S tokens of expert e.

    Returns:
      (E, S, out), the compute dtype.
    """

    def __init__(self, num_experts: int, input_dim: int, units: int,
                 initializer_range: float = 0.02, **kwargs):
        super().__init__(**kwargs)
        self.num_experts = num_experts
        self.input_dim = input_dim
        self.units = units
        self.initializer_range = initializer_range
        self.lora_enabled = False
        self.lora_rank = None

    def build(self, input_shape=None):
        self._kernel = self.add_weight(
            name="kernel", shape=(self.num_experts, self.input_dim, self.units),
            initializer=initializers.normal(self.initializer_range))

    @property
    def kernel(self):
        """The float kernel (E, in, out): W, or W + A B with LoRA (not for int8)."""
        if self.quantization_mode == INT8:
            raise AttributeError(f"{self.path} is int8: read quantization.float_kernel")
        if self.lora_enabled:
            return self._kernel + tf.matmul(self.lora_kernel_a, self.lora_kernel_b)
        return self._kernel

    def kernel_variable(self):
        """The variable the kernel lives in: float or int8 (E, in, out)."""
        return self._kernel

    def expert_kernel(self, expert: int, dtype=None) -> tf.Tensor:
        """Expert `expert`'s float (in, out) kernel: W_e (+ A_e B_e), or Q_e / s_e for int8;
        in `dtype`, by default the variable's own (float32 for int8)."""
        if dtype is None:
            dtype = tf.float32 if self.quantization_mode == INT8 else self._kernel.dtype
        if self.quantization_mode != INT8 and not self.lora_enabled:
            return tf.cast(self._kernel[expert], dtype)  # (in, out) as stored
        w = tf.cast(self._kernel[expert], tf.float32)  # (in, out)
        if self.quantization_mode == INT8:
            w = w / self.kernel_scale[expert][None, :]
        if self.lora_enabled:
            w += tf.matmul(tf.cast(self.lora_kernel_a[expert], tf.float32),
                           tf.cast(self.lora_kernel_b[expert], tf.float32))
        return tf.cast(w, dtype)

    def call(self, x):
        return tf.matmul(x, tf.cast(self.kernel, x.dtype))  # (E, S, in) @ (E, in, out)

    def call_grouped(self, pieces: list[tf.Tensor]) -> list[tf.Tensor]:
        """Each expert on its own rows, one matmul per expert (float or LoRA kernel).

        Args:
          pieces: E float tensors (n_e, in), expert e's rows in pieces[e].

        Returns:
          E tensors (n_e, out), the dtype of the pieces.

        Raises:
          ValueError: the kernel is int8 (the stacked `call` runs int8).
        """
        if self.quantization_mode == INT8:
            raise ValueError(f"{self.path} is int8: call it on an (E, S, in) buffer")
        # unstack, not kernel[e]: its gradient is one stack, not E zero-padded kernels.
        kernels = tf.unstack(tf.cast(self.kernel, pieces[0].dtype), num=self.num_experts)
        return [tf.matmul(p, k) for p, k in zip(pieces, kernels, strict=True)]  # (n_e, out)

    def quantized_call(self, x):
        """The int8 call (the dtype policy is "int8_from_..."): Q and a per-token input
        quantization, int32 accumulation, de-scaled; plus x A B with LoRA."""
        dtype = self.compute_dtype

        @tf.custom_gradient
        def int8_matmul(inputs):
            q_in, in_scale = keras.quantizers.abs_max_quantize(inputs, axis=-1)  # (E,S,in), (E,S,1)
            y = tf.matmul(q_in, self._kernel, output_type=tf.int32)  # (E, S, out) int32
            y = tf.cast(y, dtype) / (in_scale * tf.cast(self.kernel_scale, dtype)[:, None, :])

            def grad(upstream):  # d/dx through the float kernel Q / s, as Keras' Dense
                w = tf.cast(self._kernel, dtype) / tf.cast(self.kernel_scale, dtype)[:, None, :]
                return tf.matmul(upstream, w, transpose_b=True)  # (E, S, in)

            return y, grad

        y = int8_matmul(x)  # (E, S, out)
        if self.lora_enabled:
            y += tf.matmul(tf.matmul(x, tf.cast(self.lora_kernel_a, dtype)),
                           tf.cast(self.lora_kernel_b, dtype))  # (E, S, r) -> (E, S, out)
        return y

    def quantize(self, mode, type_check=True):
        """Quantizes the kernel in place (module docstring); only "int8".

        Raises:
          NotImplementedError: another mode.
          ValueError: LoRA is enabled (merge the adapters first).
        """
        if mode != INT8:
            raise NotImplementedError(f"{self.path}: quantization mode {mode!r}; only int8")
        if self.lora_enabled:
            raise ValueError(f"{self.path} has LoRA adapters: merge them into the kernel "
                             "before quantizing it")
        q, scale = keras.quantizers.abs_max_quantize(
            self._kernel, axis=-2, to_numpy=True)  # (E, in, out) int8, (E, 1, out)
        del self._kernel
        self._kernel = self.add_weight(
            name="kernel", shape=q.shape, dtype="int8", trainable=False,
            initializer=lambda shape, dtype: q)
        self.kernel_scale = self.add_weight(
            name="kernel_scale", shape=(self.num_experts, self.units), trainable=False,
            initializer=lambda shape, dtype: scale[:, 0, :])
        # Keras' quantization protocol (Dense does the same): a layer whose
        # `_is_quantized` is set is not quantized again by the dtype policy's setter.
        self._is_quantized = True
        if self.dtype_policy.quantization_mode is None:
            self.dtype_policy = keras.dtype_policies.get(f"{mode}_from_{self.dtype_policy.name}")

    def enable_lora(self, rank: int, a_initializer="he_uniform", b_initializer="zeros"):
        """Adds per-expert adapters A (E, in, r) and B (E, r, out) and freezes W.

        Raises:
          ValueError: the layer is not built, or LoRA is already enabled.
        """
        if not self.built:
            raise ValueError(f"{self.name}: build the layer before enabling LoRA")
        if self.lora_enabled:
            raise ValueError(f"{self.path}: LoRA is already enabled")
        self._tracker.unlock()  # as keras.layers.Dense.enable_lora (module docstring)
        try:
            self.lora_kernel_a = self.add_weight(
                name="lora_kernel_a", shape=(self.num_experts, self.input_dim, rank),
                initializer=_per_expert(keras.initializers.get(a_initializer)))
            self.lora_kernel_b = self.add_weight(
                name="lora_kernel_b", shape=(self.num_experts, rank, self.units),
                initializer=keras.initializers.get(b_initializer))
        finally:
            self._tracker.lock()
        self._kernel.trainable = False
        self.lora_enabled = True
        self.lora_rank = rank

    def get_config(self):
        return {
            **super().get_config(),
            "num_experts": self.num_experts,
            "input_dim": self.input_dim,
            "units": self.units,
            "initializer_range": self.initializer_range,
        }


def _per_expert(initializer):
    """`initializer` for (E, in, r) with the fan-in of one expert's (in, r) matrix: drawn
    as one (in, E*r) matrix, then split by expert (a 3-D shape would count E into the
    fan-in of he_uniform)."""

    def init(shape, dtype=None):
        experts, fan_in, rank = shape
        value = initializer((fan_in, experts * rank), dtype=dtype)  # (in, E*r)
        return tf.transpose(tf.reshape(value, [fan_in, experts, rank]), [1, 0, 2])  # (E, in, r)

    return init
