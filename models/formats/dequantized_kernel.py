"""An int8 Dense kernel read as float32, for writing a checkpoint (either family)."""

import tensorflow as tf

from models.formats.quantization import float_kernel, kernel_variable


class DequantizedKernel:
    """The float32 (in, out) kernel Q / s of an int8 Dense (`quantization.float_kernel`),
    computed when read (`tf.convert_to_tensor`), for writing a HF checkpoint; it has the
    `shape` and `dtype` a variable would, and no `assign`."""

    def __init__(self, layer):
        self.layer = layer
        self.shape = tuple(kernel_variable(layer).shape)  # (in, out)
        self.dtype = tf.float32

    def __tf_tensor__(self, dtype=None, name=None):
        value = float_kernel(self.layer, tf.float32)  # (in, out)
        return value if dtype is None else tf.cast(value, dtype)
