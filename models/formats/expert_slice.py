"""One expert's kernel inside a stacked expert kernel: how a per-expert tensor of a
checkpoint on disk is read and assigned in place (either family)."""

import tensorflow as tf

from models.formats.quantization import is_quantized, kernel_variable


class ExpertSlice:
    """Expert e's (in, out) kernel inside a stacked `ExpertProjection` kernel (E, in, out):
    `shape` and `dtype` as a variable's; `tf.convert_to_tensor` reads it as float
    (Q_e / s_e for int8, + A_e B_e with LoRA); `assign(value)` writes the float (in, out)
    value into slice e of the float kernel in place (no copy of the stacked kernel)."""

    def __init__(self, projection, expert: int):
        self.projection = projection
        self.expert = expert
        variable = kernel_variable(projection)
        self.shape = tuple(variable.shape)[1:]  # (in, out)
        self.dtype = tf.float32 if is_quantized(projection) else variable.dtype

    def __tf_tensor__(self, dtype=None, name=None):
        value = self.projection.expert_kernel(self.expert)  # (in, out)
        return value if dtype is None else tf.cast(value, dtype)

    def assign(self, value) -> None:
        """Raises ValueError for an int8 kernel (quantize after assigning)."""
        if is_quantized(self.projection):
            raise ValueError(f"{self.projection.path} is int8: assign float kernels, then "
                             "quantize")
        variable = kernel_variable(self.projection)
        variable.value[self.expert].assign(tf.cast(value, variable.dtype))
