"""The Trainer's input pipeline: tokenized documents -> packed fixed-length batches.

Documents (Transform's `input_ids`, one row per document) are shuffled, each is
followed by `[EOS]`, the token stream is cut into windows of `seq_len + 1`, and
each window gives `input_ids = w[:-1]`, `labels = w[1:]` (nanoGPT-style packing:
no padding, no token wasted but the last partial window).
"""

from __future__ import annotations

import tensorflow as tf

from components.transform.preprocessing import INPUT_IDS_KEY, NUM_BYTES_KEY
from components.transform.tokenizer import EOS_ID

TRANSFORMED_FEATURE_SPEC = {
    INPUT_IDS_KEY: tf.io.VarLenFeature(tf.int64),
    NUM_BYTES_KEY: tf.io.FixedLenFeature([], tf.int64),
}


def read_documents(file_pattern: str | list[str]) -> tf.data.Dataset:
    """Transformed TFRecords (gzip) -> dataset of int32 [tokens] documents."""
    files = tf.io.gfile.glob(file_pattern) if isinstance(file_pattern, str) else [
        f for p in file_pattern for f in tf.io.gfile.glob(p)
    ]
    if not files:
        raise FileNotFoundError(f"no transformed examples match {file_pattern}")
    ds = tf.data.TFRecordDataset(sorted(files), compression_type="GZIP")

    def parse(serialized):
        features = tf.io.parse_single_example(serialized, TRANSFORMED_FEATURE_SPEC)
        return tf.cast(tf.sparse.to_dense(features[INPUT_IDS_KEY]), tf.int32)

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def pack(documents: tf.data.Dataset, seq_len: int) -> tf.data.Dataset:
    """Documents -> {"input_ids": int32 [seq_len], "labels": int32 [seq_len]}.

    The stream starts with `[EOS]` (so the first document's first token is
    predicted too) and every document is followed by `[EOS]`.
    """
    eos = tf.constant([EOS_ID], tf.int32)
    stream = tf.data.Dataset.from_tensors(eos).concatenate(
        documents.map(lambda ids: tf.concat([ids, eos], axis=0))
    )
    windows = stream.unbatch().batch(seq_len + 1, drop_remainder=True)
    return windows.map(lambda w: {"input_ids": w[:-1], "labels": w[1:]})


def make_train_dataset(
    file_pattern, seq_len: int, batch_size: int, shuffle_buffer: int, seed: int
) -> tf.data.Dataset:
    """Infinite, shuffled, packed training batches of [batch_size, seq_len].

    Document order is reshuffled every epoch from `seed`, so a run is
    reproducible; windows are shuffled too (a small buffer).
    """
    docs = read_documents(file_pattern).cache()
    docs = docs.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = pack(docs, seq_len)
    ds = ds.shuffle(max(4 * batch_size, 64), seed=seed + 1)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_eval_dataset(file_pattern, seq_len: int, batch_size: int) -> tf.data.Dataset:
    """One pass over the eval documents, in file order, packed the same way."""
    return pack(read_documents(file_pattern), seq_len).batch(batch_size).prefetch(2)
