"""KV cache buffers that a decode step writes in place: shared by MLA's cache
(`mla_attention.init_layer_cache`) and DeepSeek-V4's (`deepseek_v4.kv_cache`).

On TF 2.16's CPU, `tf.tensor_scatter_nd_update` writes into a new buffer: a copy of the
whole cache per call, so a decode step's cost grows with the context (about 4.6 ms per
21 MB buffer at 64K). DeepSeek's and vLLM's caches are static buffers written in place;
here a caller that owns its cache (`generate`'s loop, a chat session, the decode
benchmark) asks for the same with `in_place=True`, and the write is
`tf.raw_ops.InplaceUpdate` on the buffer seen as (B*S, W) rows: O(rows written).

The contract: the buffer passed to an in-place write must not be used again except as
the returned tensor (the op aliases its input). `zeros_buffer` allocates with
`tf.raw_ops.Empty(init=True)`, a stateful op, so no graph folds an initial cache into a
constant that two calls would share and both write.

`tf.raw_ops` is public API, but that InplaceUpdate writes through to its input is the
kernel's behaviour, not a documented promise:
`tests/models/test_cache_in_place.py` fails loudly if a release makes it copy.
"""

from __future__ import annotations

import tensorflow as tf


def zeros_buffer(shape, dtype):
    """A new zero buffer of `shape` (a list of ints or int32 scalars) and `dtype`, a new
    one at every run (stateful: never folded into a constant, never shared)."""
    shape = tf.stack([tf.cast(d, tf.int32) for d in shape])  # (rank,)
    return tf.raw_ops.Empty(shape=shape, dtype=tf.as_dtype(dtype), init=True)


def write_rows(buffer, batch_rows, slots, values, in_place: bool = False):
    """buffer[batch_rows[k], slots[k]] = values[k] for every k.

    Args:
      buffer: (B, S, W).
      batch_rows, slots: int32 or int64 (K,), each pair inside (B, S) and no two equal
        (two equal pairs land in an unspecified order).
      values: (K, W), cast to buffer's dtype.
      in_place: write into `buffer`'s own memory (module docstring: the caller must not
        use `buffer` again except as the returned tensor). False: a new buffer
        (`tf.tensor_scatter_nd_update`, O(B*S*W) on CPU).

    Returns:
      The updated buffer (B, S, W).

    Raises:
      InvalidArgumentError (at run time, on CPU): a pair outside (B, S).
    """
    values = tf.cast(values, buffer.dtype)
    batch_rows, slots = tf.cast(batch_rows, tf.int32), tf.cast(slots, tf.int32)
    if not in_place:
        return tf.tensor_scatter_nd_update(buffer, tf.stack([batch_rows, slots], axis=-1),
                                           values)
    shape = tf.shape(buffer)  # (3,): B, S, W
    flat = tf.raw_ops.InplaceUpdate(x=tf.reshape(buffer, [-1, shape[2]]),
                                    i=batch_rows * shape[1] + slots,
                                    v=values)  # (B*S, W), the same memory
    return tf.reshape(flat, shape)  # (B, S, W)
