"""tokenization/ragged_ops.py: the same ragged tensors as TensorFlow's and
tensorflow-text's checked constructors, and graphs without their checks."""

from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

from tokenization import ragged_ops
from tokenization.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer

TEXTS = ["床前明月光，疑是地上霜。\n举头望明月， 低头思故乡。", "ROMEO:\nBut soft,   what light?",
         "", "  \t\n ", "x\x00y 你好", "😀 emoji 123456 ...!!"]
PATTERNS = ["\\s+", "[一-龥]+", "[0-9]{1,3}", "[.!?]+", "x"]


def _equal(a: tf.RaggedTensor, b: tf.RaggedTensor):
    assert a.to_list() == b.to_list()
    assert a.row_splits.dtype == b.row_splits.dtype == tf.int64


def test_regex_split_equals_tensorflow_text():
    """Also the guard of the op wrapper it calls (tensorflow-text's `gen_regex_split_ops`):
    if that moves, this fails here, by name."""
    texts = tf.constant(TEXTS)
    for pattern in PATTERNS:
        _equal(ragged_ops.regex_split(texts, pattern), tf_text.regex_split(texts, pattern, pattern))
    _equal(ragged_ops.regex_split(tf.constant([], tf.string), "x"),
           tf_text.regex_split(tf.constant([], tf.string), "x", "x"))


def test_merge_inner_equals_merge_dims():
    outer = tf.ragged.constant([["a", "b"], [], ["c"]])  # (3, (P)) P = 3
    inner = tf.ragged.constant([[1, 2], [], [3, 4, 5]], tf.int64)  # (3, (Q))
    _equal(ragged_ops.merge_inner(outer, inner), outer.with_flat_values(inner).merge_dims(1, 2))


def test_constructors_equal_the_checked_ones():
    values = tf.constant([1, 2, 3, 4], tf.int64)
    _equal(ragged_ops.from_row_lengths(values, tf.constant([1, 0, 3], tf.int64)),
           tf.RaggedTensor.from_row_lengths(values, tf.constant([1, 0, 3], tf.int64)))
    rowids = tf.constant([0, 0, 2, 2], tf.int64)
    _equal(ragged_ops.from_value_rowids(values, rowids, tf.constant(4, tf.int64)),
           tf.RaggedTensor.from_value_rowids(values, rowids, nrows=4))


def test_the_pre_tokenizer_graph_has_no_partition_checks():
    """The reason for the module: a checked constructor is an Assert in a tf.cond."""
    pre_tokenizer = PreTokenizer(PRE_TOKENIZERS["deepseek_v3"])
    graph = tf.function(pre_tokenizer, input_signature=[tf.TensorSpec([None], tf.string)]
                        ).get_concrete_function().graph.as_graph_def()
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
    assert "Assert" not in ops
    assert ops.count("RegexSplitWithOffsets") >= len(pre_tokenizer.steps)
