"""Transform's `source_name` passthrough (`preprocessing.source_names`), without Beam: the
mixture source of each example, "default" where the examples carry none (issue 28)."""

from __future__ import annotations

import tensorflow as tf

from components.transform import preprocessing

TEXT = tf.constant(["床前明月光", "To be, or not to be", "疑是地上霜"])  # (B,)


def test_dense_names_pass_through():
    names = tf.constant([[b"poems"], [b"shakespeare"], [b"poems"]])  # (B, 1)
    got = preprocessing.source_names({preprocessing.SOURCE_NAME_KEY: names}, TEXT)
    assert got.numpy().tolist() == [b"poems", b"shakespeare", b"poems"]


def test_missing_feature_or_value_is_the_default_source():
    got = preprocessing.source_names({}, TEXT)
    assert got.numpy().tolist() == [b"default"] * 3
    sparse = tf.SparseTensor(indices=[[1, 0]], values=[b"web"], dense_shape=[3, 1])
    got = preprocessing.source_names({preprocessing.SOURCE_NAME_KEY: sparse}, TEXT)
    assert got.numpy().tolist() == [b"default", b"web", b"default"]
    empty = tf.SparseTensor(tf.zeros([0, 2], tf.int64), tf.constant([], tf.string), [3, 1])
    got = preprocessing.source_names({preprocessing.SOURCE_NAME_KEY: empty}, TEXT)
    assert got.numpy().tolist() == [b"default"] * 3
