"""Copying one checkpoint tensor into a model variable, in row blocks when it is large
(either family's loader)."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from models.formats.expert_slice import ExpertSlice


def numpy_dtype(variable) -> np.dtype:
    """The numpy dtype of a Keras or TF variable's values (`ml_dtypes.bfloat16` for bf16)."""
    name = getattr(variable.dtype, "name", variable.dtype)
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


# A tensor larger than this is assigned in row blocks of about this size, in place.
ASSIGN_BLOCK_BYTES = 64 * 1024 * 1024
# Stored dtypes read whole and dequantized (FP8; MXFP4 pairs in I8); I64: tid2eid tables.
QUANTIZED_DTYPES = ("F8_E4M3", "I8", "I64")


def assign_tensor(checked, name: str, variable, transpose: bool,
                  stored: str | None = None) -> None:
    """Copies tensor `name` into `variable` (its transpose for a Dense kernel).

    `checked` is a `CheckedCheckpoint` or anything with its `files` (the
    `safetensors_reader.Checkpoint`) and `read_float(name)` (the tensor as a float array,
    dequantized; `models/deepseek_v4/hf_checkpoint.CheckedV4Checkpoint` too); `stored` is
    the tensor's name in the files when it differs from `name` (an alias).

    A 2-D unquantized tensor larger than `ASSIGN_BLOCK_BYTES` goes in row blocks written
    in place into the variable's buffer (`tf.Variable` slice assign), so loading holds
    one block beside the model, not the whole tensor, its converted copy and the
    variable's old buffer (an embedding of 129,280 x 2,048 bf16 is 0.53 GB each)."""
    stored = name if stored is None else stored
    info, dtype = checked.files.info(stored), numpy_dtype(variable)
    if (info.dtype in QUANTIZED_DTYPES or len(info.shape) != 2
            or info.nbytes <= ASSIGN_BLOCK_BYTES
            or isinstance(variable, ExpertSlice)):  # a slice assigns in place itself
        value = checked.read_float(name).astype(dtype, copy=False)
        variable.assign(value.T if transpose else value)
        return
    rows = max(1, ASSIGN_BLOCK_BYTES // (info.nbytes // info.shape[0]))
    target = variable.value  # the backend's tf.Variable: its slices assign in place
    for r0 in range(0, info.shape[0], rows):
        r1 = min(r0 + rows, info.shape[0])
        block = checked.files.read(stored, (r0, r1)).astype(dtype, copy=False)  # (r1-r0, in)
        if transpose:
            target[:, r0:r1].assign(block.T)
        else:
            target[r0:r1].assign(block)
