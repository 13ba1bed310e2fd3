"""Ragged tensors for the in-graph tokenizer, built without runtime partition checks.

TensorFlow's ragged constructors (`RaggedTensor.from_row_splits`, `from_row_lengths`,
`from_value_rowids`, and `merge_dims`, which calls them) and tensorflow-text's
`regex_split` validate the row partition they are given by default. In a graph each
check is an `Assert` guarded by a `tf.cond` (the splits are int64), traced every time
the graph is built and run at every call. The tokenizer's partitions come from ops that
make them valid by construction (`regex_split`'s own row splits, lengths that are
counts, splits gathered from valid splits), so its graph leaves the checks out.

Measured (2-core AMD EPYC, DeepSeek-V3's pre-tokenizer, `tokenizer.units` and
`PreTokenizer.__call__` in one tf.function): 3,868 graph nodes and 1,801 function
nodes with the checks, 821 and 330 without; tracing 2.3-3.1 s -> 0.4-0.9 s
(`benchmarks/ragged_checks.py` compares the whole encoder both ways).
tf.Transform traces `preprocessing_fn` about ten times per Transform run, and every
SavedModel that holds the tokenizer (the pushed model's `tokenize`, `generate`,
`serving_default`) builds and loads that graph.

`regex_split` calls tensorflow-text's op wrapper (`gen_regex_split_ops`, the module
`tensorflow_text.regex_split_with_offsets` itself calls); `tests/components/
test_ragged_ops.py` checks it against the public `tensorflow_text.regex_split` and
fails loudly if the wrapper moves.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow_text.python.ops import regex_split_ops


def regex_split(texts: tf.Tensor, pattern: str) -> tf.RaggedTensor:
    """`tensorflow_text.regex_split(texts, pattern, pattern)`: every match of `pattern`
    and every stretch between matches is a piece (behaviour "Isolated").

    Args:
      texts: tf.string [N].
      pattern: RE2.

    Returns:
      tf.string ragged [N, (pieces)], int64 row splits; joining a row gives its text
      (up to its first NUL byte, as tensorflow-text; see `pre_tokenizer.nul_safe`).
    """
    group = f"({pattern})".encode()
    tokens, _, _, row_splits = regex_split_ops.gen_regex_split_ops.regex_split_with_offsets(
        tf.reshape(texts, [-1]), group, group)
    return tf.RaggedTensor.from_row_splits(tokens, row_splits, validate=False)


def merge_inner(outer: tf.RaggedTensor, inner: tf.RaggedTensor) -> tf.RaggedTensor:
    """`outer.with_flat_values(inner).merge_dims(1, 2)`: each row of `outer` becomes the
    concatenation of the rows of `inner` its values stand for.

    Args:
      outer: ragged [N, (P)] (ragged rank 1), int64 row splits; only its partition is
        read.
      inner: ragged [P, (Q)] (ragged rank 1), int64 row splits, one row per value of
        `outer`.

    Returns:
      ragged [N, (Q)] of `inner`'s values.
    """
    splits = tf.gather(inner.row_splits, outer.row_splits)  # (N + 1,)
    return tf.RaggedTensor.from_row_splits(inner.values, splits, validate=False)


def from_row_lengths(values: tf.Tensor, row_lengths: tf.Tensor) -> tf.RaggedTensor:
    """`tf.RaggedTensor.from_row_lengths(values, row_lengths)` for lengths that are
    counts of `values` (non-negative, summing to its length): ragged [N, (L)]."""
    return tf.RaggedTensor.from_row_lengths(values, row_lengths, validate=False)


def from_value_rowids(values: tf.Tensor, value_rowids: tf.Tensor,
                      nrows: tf.Tensor) -> tf.RaggedTensor:
    """`tf.RaggedTensor.from_value_rowids(values, value_rowids, nrows)` for row ids that
    are sorted and in [0, nrows): ragged [nrows, (L)]."""
    return tf.RaggedTensor.from_value_rowids(values, value_rowids, nrows=nrows,
                                             validate=False)
