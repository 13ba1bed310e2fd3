"""The Trainer's input pipeline: tokenized documents -> packed fixed-length batches.

Documents (Transform's `input_ids`, one row per document) are shuffled, each is
followed by `[EOS]`, the token stream is cut into windows of `seq_len + 1`, and
each window gives `input_ids = w[:-1]`, `labels = w[1:]` (nanoGPT-style packing:
no padding, no token wasted but the last partial window).

Distribution (`distribute_global_batches`): every input pipeline (one per
worker) builds the same stream of *global* batches from the same files and
seed, and keeps the rows of its own replicas; so N workers together train on
exactly the global batches of a one-device run, in the same order, and the
loss is the per-token mean over the global batch however it is split.

Sources (issue 28): every transformed example names its mixture source
(`source_name`; "default" for examples written without one). `read_documents`,
`read_sft_records` and `read_dpo_records` read all of a split, or one source's records
of it (`source_name=`); a mixture (`mixture.py`) reads the one split once per source.

Preference (DPO) and GRPO records (issue 29) have their own batches: see the sections
"DPO" and "GRPO" below.

Resuming: the data position is recomputed, not stored. The stream is a
deterministic function of the files and the seed, so a run resumed after
step s skips the first s global batches (`skip_steps`) and continues with the
batches an uninterrupted run would have seen. Skipping costs only input work
(reading and packing s batches, no model compute).
"""

from __future__ import annotations

import tensorflow as tf

from components.transform.preprocessing import (
    DEFAULT_SOURCE_NAME,
    INPUT_IDS_KEY,
    NUM_BYTES_KEY,
    PROMPT_LENGTH_KEY,
    REJECTED_IDS_KEY,
    SOURCE_NAME_KEY,
)
from tokenization.tokenizer import EOS_ID

IGNORE_LABEL = -100
TRANSFORMED_FEATURE_SPEC = {
    INPUT_IDS_KEY: tf.io.VarLenFeature(tf.int64),
    NUM_BYTES_KEY: tf.io.FixedLenFeature([], tf.int64),
    # Examples transformed before mixtures existed have none: the one source, "default".
    SOURCE_NAME_KEY: tf.io.FixedLenFeature([], tf.string, default_value=DEFAULT_SOURCE_NAME),
}
SFT_FEATURE_SPEC = {**TRANSFORMED_FEATURE_SPEC,
                    PROMPT_LENGTH_KEY: tf.io.FixedLenFeature([], tf.int64)}
# Transformed DPO examples (issue 29); their `rejected_num_bytes` is not read.
DPO_FEATURE_SPEC = {**SFT_FEATURE_SPEC, REJECTED_IDS_KEY: tf.io.VarLenFeature(tf.int64)}


def _files(file_pattern: str | list[str]) -> list[str]:
    files = tf.io.gfile.glob(file_pattern) if isinstance(file_pattern, str) else [
        f for p in file_pattern for f in tf.io.gfile.glob(p)
    ]
    if not files:
        raise FileNotFoundError(f"no transformed examples match {file_pattern}")
    return sorted(files)


def _records(file_pattern: str | list[str], spec: dict, source_name: str | None):
    """Parsed examples of the files (in file order), only those of `source_name` if given."""
    ds = tf.data.TFRecordDataset(_files(file_pattern), compression_type="GZIP")
    ds = ds.map(lambda serialized: tf.io.parse_single_example(serialized, spec),
                num_parallel_calls=tf.data.AUTOTUNE)
    if source_name is not None:
        ds = ds.filter(lambda f: tf.equal(f[SOURCE_NAME_KEY], source_name))
    return ds


def read_documents(file_pattern: str | list[str],
                   source_name: str | None = None) -> tf.data.Dataset:
    """Transformed TFRecords (gzip) -> dataset of int32 [tokens] documents, in file order:
    all of them, or those whose `source_name` is `source_name` (examples without the
    feature are source "default").

    Raises:
      FileNotFoundError: no file matches.
    """
    return _records(file_pattern, TRANSFORMED_FEATURE_SPEC, source_name).map(
        lambda f: tf.cast(tf.sparse.to_dense(f[INPUT_IDS_KEY]), tf.int32))


def pack(documents: tf.data.Dataset, seq_len: int, eos_id: int = EOS_ID) -> tf.data.Dataset:
    """Documents -> {"input_ids": int32 [seq_len], "labels": int32 [seq_len]}.

    The stream starts with `[EOS]` (so the first document's first token is
    predicted too) and every document is followed by `[EOS]` (`eos_id`, the
    tokenizer's end-of-sequence token).
    """
    eos = tf.constant([eos_id], tf.int32)
    stream = tf.data.Dataset.from_tensors(eos).concatenate(
        documents.map(lambda ids: tf.concat([ids, eos], axis=0))
    )
    windows = stream.unbatch().batch(seq_len + 1, drop_remainder=True)
    return windows.map(lambda w: {"input_ids": w[:-1], "labels": w[1:]})


def make_train_dataset(
    file_pattern, seq_len: int, batch_size: int, shuffle_buffer: int, seed: int,
    eos_id: int = EOS_ID,
) -> tf.data.Dataset:
    """Infinite, shuffled, packed training batches of [batch_size, seq_len].

    Document order is reshuffled every epoch from `seed`, so a run is
    reproducible; windows are shuffled too (a small buffer).
    """
    docs = read_documents(file_pattern).cache()
    docs = docs.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = pack(docs, seq_len, eos_id)
    ds = ds.shuffle(max(4 * batch_size, 64), seed=seed + 1)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def random_token_batches(batch_size: int, seq_len: int, vocab_size: int) -> tf.data.Dataset:
    """Endless global batches of uniform random ids, for throughput and compile checks.

    Returns:
      A dataset of {"input_ids", "labels"}: int32 (batch_size, seq_len), ids in
      [0, vocab_size); batch i is the same in every call (stateless seeds (i, 0), (i, 1)).
    """
    shape = [batch_size, seq_len]
    return tf.data.Dataset.range(2**62).map(lambda i: {
        "input_ids": tf.random.stateless_uniform(shape, [i, 0], 0, vocab_size, tf.int32),
        "labels": tf.random.stateless_uniform(shape, [i, 1], 0, vocab_size, tf.int32)})


def make_eval_dataset(file_pattern, seq_len: int, batch_size: int,
                      eos_id: int = EOS_ID) -> tf.data.Dataset:
    """One pass over the eval documents, in file order, packed the same way."""
    return pack(read_documents(file_pattern), seq_len, eos_id).batch(batch_size).prefetch(2)


# ------------------------------------------------------------------------------ SFT
#
# Supervised fine-tuning records (`data.task = "sft"`): Transform's `input_ids` are
# prompt ids ++ response ids ++ [EOS] and `prompt_length` counts the prompt ids. One
# record per row, no packing (attention has no document mask): input_ids = w[:-1]
# and labels = w[1:], padded to seq_len (pad id / IGNORE_LABEL); a label whose token
# belongs to the prompt (t < prompt_length - 1) is IGNORE_LABEL, so the targets are
# exactly the response tokens and the final EOS. A record longer than seq_len + 1
# ids does not fit and is left out, counted by `count_sft_records`.


def read_sft_records(file_pattern: str | list[str],
                     source_name: str | None = None) -> tf.data.Dataset:
    """Transformed SFT TFRecords -> (ids int32 [n], prompt_length int32 scalar): all of
    them, or those of `source_name` (as `read_documents`)."""
    return _records(file_pattern, SFT_FEATURE_SPEC, source_name).map(
        lambda f: (tf.cast(tf.sparse.to_dense(f[INPUT_IDS_KEY]), tf.int32),
                   tf.cast(f[PROMPT_LENGTH_KEY], tf.int32)))


def sft_example(ids, prompt_length, seq_len: int, pad_id: int) -> dict:
    """One record -> {"input_ids", "labels"}: int32 [seq_len] (see the section comment)."""
    n = tf.shape(ids)[0]
    inputs = tf.pad(ids[:-1], [[0, seq_len - (n - 1)]], constant_values=pad_id)  # (T,)
    targets = tf.pad(ids[1:], [[0, seq_len - (n - 1)]], constant_values=IGNORE_LABEL)  # (T,)
    is_prompt = tf.range(seq_len) < prompt_length - 1  # (T,)  targets that are prompt tokens
    labels = tf.where(is_prompt, IGNORE_LABEL, targets)
    inputs.set_shape([seq_len])
    labels.set_shape([seq_len])
    return {"input_ids": inputs, "labels": labels}


def _fits(seq_len: int):
    return lambda ids, prompt_length: tf.shape(ids)[0] <= seq_len + 1


def make_sft_train_dataset(file_pattern, seq_len: int, batch_size: int, shuffle_buffer: int,
                           seed: int, pad_id: int) -> tf.data.Dataset:
    """Infinite, shuffled SFT batches {"input_ids", "labels"}: int32 [batch_size, seq_len],
    deterministic from `seed` (records reshuffled every epoch)."""
    records = read_sft_records(file_pattern).filter(_fits(seq_len)).cache()
    records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = records.map(lambda ids, p: sft_example(ids, p, seq_len, pad_id))
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_sft_eval_dataset(file_pattern, seq_len: int, batch_size: int,
                          pad_id: int) -> tf.data.Dataset:
    """One pass over the SFT eval records that fit, in file order."""
    ds = read_sft_records(file_pattern).filter(_fits(seq_len))
    return ds.map(lambda ids, p: sft_example(ids, p, seq_len, pad_id)).batch(batch_size)


def count_sft_records(file_pattern, seq_len: int) -> dict:
    """{"records", "used", "rejected": {"too_long": n}, "response_tokens"} of SFT records
    (response tokens: the targets of the records used, their EOS included).

    Raises:
      ValueError: no record fits `seq_len` (naming the files and the longest record).
    """
    records = used = targets = 0
    shortest = None
    for ids, prompt_length in read_sft_records(file_pattern).as_numpy_iterator():
        records += 1
        shortest = len(ids) if shortest is None else min(shortest, len(ids))
        if len(ids) <= seq_len + 1:
            used += 1
            targets += len(ids) - int(prompt_length)
    if not used:
        raise ValueError(f"no SFT record of {file_pattern} fits train.seq_len={seq_len} "
                         f"({records} records; the shortest has {shortest} ids, "
                         f"prompt + response + EOS): raise train.seq_len or shorten them")
    return {"records": records, "used": used, "rejected": {"too_long": records - used},
            "response_tokens": targets}


def write_sft_examples(path: str, records, source_name: str | None = None) -> None:
    """Writes (ids, prompt_length, num_bytes) records as transformed SFT examples (gzip
    TFRecords), for tests and benchmarks that train without running Transform; with
    `source_name`, each names that source (else none: source "default")."""
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for ids, prompt_length, num_bytes in records:
            feature = {
                INPUT_IDS_KEY: tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[int(i) for i in ids])),
                PROMPT_LENGTH_KEY: tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[int(prompt_length)])),
                NUM_BYTES_KEY: tf.train.Feature(int64_list=tf.train.Int64List(
                    value=[int(num_bytes)])),
                **_source_feature(source_name),
            }
            writer.write(tf.train.Example(features=tf.train.Features(
                feature=feature)).SerializeToString())


# ------------------------------------------------------------------------------ DPO
#
# Preference records (`data.task = "dpo"`, issue 29): Transform's `input_ids` are
# prompt ++ chosen ++ [EOS], `rejected_ids` prompt ++ rejected ++ [EOS], and
# `prompt_length` counts the prompt ids of both. Each sequence becomes an SFT row
# (`sft_example`: prompt targets and padding are IGNORE_LABEL), the two stacked on
# axis 1: {"input_ids", "labels"} int32 [B, 2, T], [:, 0] chosen and [:, 1] rejected,
# so every key's dim 0 is the global batch (`split_for_replicas`). A pair either of
# whose sequences is longer than seq_len + 1 ids is left out, counted by
# `count_dpo_records`.


def _dpo_records(file_pattern, source_name: str | None = None) -> tf.data.Dataset:
    """(chosen_ids int32 [n], rejected_ids int32 [m], prompt_length int32, num_bytes int64)."""
    return _records(file_pattern, DPO_FEATURE_SPEC, source_name).map(
        lambda f: (tf.cast(tf.sparse.to_dense(f[INPUT_IDS_KEY]), tf.int32),
                   tf.cast(tf.sparse.to_dense(f[REJECTED_IDS_KEY]), tf.int32),
                   tf.cast(f[PROMPT_LENGTH_KEY], tf.int32), f[NUM_BYTES_KEY]))


def read_dpo_records(file_pattern: str | list[str],
                     source_name: str | None = None) -> tf.data.Dataset:
    """Transformed DPO TFRecords -> (chosen_ids int32 [n], rejected_ids int32 [m],
    prompt_length int32 scalar), in file order: all of them, or those of `source_name`
    (as `read_documents`).

    Raises:
      FileNotFoundError: no file matches.
    """
    return _dpo_records(file_pattern, source_name).map(lambda c, r, p, b: (c, r, p))


def _dpo_fits(seq_len: int):
    return lambda chosen, rejected, prompt_length, *_: tf.logical_and(
        tf.shape(chosen)[0] <= seq_len + 1, tf.shape(rejected)[0] <= seq_len + 1)


def dpo_example(chosen, rejected, prompt_length, seq_len: int, pad_id: int) -> dict:
    """One pair -> {"input_ids", "labels"}: int32 [2, seq_len], row 0 the chosen sequence,
    row 1 the rejected one, each an `sft_example`."""
    rows = [sft_example(ids, prompt_length, seq_len, pad_id) for ids in (chosen, rejected)]
    return {key: tf.stack([rows[0][key], rows[1][key]]) for key in ("input_ids", "labels")}


def make_dpo_train_dataset(file_pattern, seq_len: int, batch_size: int, shuffle_buffer: int,
                           seed: int, pad_id: int) -> tf.data.Dataset:
    """Infinite, shuffled DPO batches {"input_ids", "labels"}: int32 [batch_size, 2,
    seq_len] ([:, 0] chosen, [:, 1] rejected), deterministic from `seed` (pairs
    reshuffled every epoch); pairs that do not fit `seq_len` are left out."""
    records = read_dpo_records(file_pattern).filter(_dpo_fits(seq_len)).cache()
    records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = records.map(lambda c, r, p: dpo_example(c, r, p, seq_len, pad_id))
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_dpo_eval_dataset(file_pattern, seq_len: int, batch_size: int,
                          pad_id: int) -> tf.data.Dataset:
    """One pass over the DPO eval pairs that fit, in file order: {"input_ids", "labels"}
    int32 [B, 2, seq_len] as in training, and "num_bytes" int64 [B] (the chosen
    response's UTF-8 bytes, for its bits per byte); the last batch may be smaller."""
    ds = _dpo_records(file_pattern).filter(_dpo_fits(seq_len))
    return ds.map(lambda c, r, p, b: {**dpo_example(c, r, p, seq_len, pad_id),
                                      "num_bytes": b}).batch(batch_size)


def count_dpo_records(file_pattern, seq_len: int) -> dict:
    """{"records", "used", "rejected": {"too_long": n}, "response_tokens"} of DPO pairs
    (response tokens: the targets of the chosen sequences used, their EOS included).

    Raises:
      ValueError: no pair fits `seq_len` (naming the files and the shortest pair).
    """
    records = used = targets = 0
    shortest = None
    for chosen, rejected, prompt_length in read_dpo_records(file_pattern).as_numpy_iterator():
        records += 1
        longer = max(len(chosen), len(rejected))
        shortest = longer if shortest is None else min(shortest, longer)
        if longer <= seq_len + 1:
            used += 1
            targets += len(chosen) - int(prompt_length)
    if not used:
        raise ValueError(f"no DPO pair of {file_pattern} fits train.seq_len={seq_len} "
                         f"({records} pairs; the shortest has {shortest} ids in its longer "
                         "sequence, prompt + response + EOS): raise train.seq_len or "
                         "shorten them")
    return {"records": records, "used": used, "rejected": {"too_long": records - used},
            "response_tokens": targets}


def write_dpo_examples(path: str, records, source_name: str | None = None) -> None:
    """Writes (chosen_ids, rejected_ids, prompt_length, num_bytes) records as transformed
    DPO examples (gzip TFRecords; no `rejected_num_bytes`, which the Trainer does not
    read), for tests and benchmarks that train without running Transform; with
    `source_name`, each names that source (else none: source "default")."""

    def int64s(values) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))

    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for chosen, rejected, prompt_length, num_bytes in records:
            feature = {INPUT_IDS_KEY: int64s(chosen), REJECTED_IDS_KEY: int64s(rejected),
                       PROMPT_LENGTH_KEY: int64s([prompt_length]),
                       NUM_BYTES_KEY: int64s([num_bytes]), **_source_feature(source_name)}
            writer.write(tf.train.Example(features=tf.train.Features(
                feature=feature)).SerializeToString())


# ------------------------------------------------------------------------------ GRPO
#
# GRPO records (`data.task = "grpo"`, issue 29) are SFT records: ids = prompt ++ answer
# ++ [EOS]. The Trainer samples completions of the prompt and rewards them against the
# answer, so a batch holds the two apart, each right-padded to seq_len with pad_id:
#   "prompt_ids"  int32 [B, seq_len], "prompt_length" int32 [B],
#   "answer_ids"  int32 [B, seq_len] (no EOS), "answer_length" int32 [B].
# A record is used when prompt_length + max_new_tokens <= seq_len (every completion fits
# the model's window) and its answer has at most seq_len ids; others are counted as
# too_long by `count_grpo_records`.


def _check_max_new_tokens(seq_len: int, max_new_tokens: int) -> None:
    if not 0 < max_new_tokens < seq_len:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be in [1, seq_len) "
                         f"(seq_len={seq_len}): a prompt needs at least one id")


def _grpo_fits(seq_len: int, max_new_tokens: int):
    def fits(ids, prompt_length):
        answer_length = tf.shape(ids)[0] - 1 - prompt_length
        return tf.logical_and(prompt_length + max_new_tokens <= seq_len,
                              answer_length <= seq_len)
    return fits


def grpo_example(ids, prompt_length, seq_len: int, pad_id: int) -> dict:
    """One record (ids = prompt ++ answer ++ [EOS]) -> {"prompt_ids", "answer_ids"}: int32
    [seq_len], right-padded with `pad_id`, and {"prompt_length", "answer_length"}: int32."""
    answer = ids[prompt_length:-1]  # (A,)  the EOS is no part of the answer
    answer_length = tf.shape(answer)[0]
    prompt_ids = tf.pad(ids[:prompt_length], [[0, seq_len - prompt_length]],
                        constant_values=pad_id)  # (T,)
    answer_ids = tf.pad(answer, [[0, seq_len - answer_length]], constant_values=pad_id)  # (T,)
    prompt_ids.set_shape([seq_len])
    answer_ids.set_shape([seq_len])
    return {"prompt_ids": prompt_ids, "prompt_length": prompt_length,
            "answer_ids": answer_ids, "answer_length": answer_length}


def make_grpo_train_dataset(file_pattern, seq_len: int, max_new_tokens: int, batch_size: int,
                            shuffle_buffer: int, seed: int, pad_id: int) -> tf.data.Dataset:
    """Infinite, shuffled GRPO batches (see the section comment: "prompt_ids",
    "answer_ids" int32 [batch_size, seq_len], "prompt_length", "answer_length" int32
    [batch_size]), deterministic from `seed` (records reshuffled every epoch).

    Raises:
      ValueError: max_new_tokens is not in [1, seq_len).
    """
    _check_max_new_tokens(seq_len, max_new_tokens)
    records = read_sft_records(file_pattern).filter(_grpo_fits(seq_len, max_new_tokens)).cache()
    records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).repeat()
    ds = records.map(lambda ids, p: grpo_example(ids, p, seq_len, pad_id))
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_grpo_eval_dataset(file_pattern, seq_len: int, max_new_tokens: int, batch_size: int,
                           pad_id: int) -> tf.data.Dataset:
    """One pass over the GRPO eval records that fit, in file order, batched as in
    training; the last batch may be smaller.

    Raises:
      ValueError: max_new_tokens is not in [1, seq_len).
    """
    _check_max_new_tokens(seq_len, max_new_tokens)
    ds = read_sft_records(file_pattern).filter(_grpo_fits(seq_len, max_new_tokens))
    return ds.map(lambda ids, p: grpo_example(ids, p, seq_len, pad_id)).batch(batch_size)


def count_grpo_records(file_pattern, seq_len: int, max_new_tokens: int) -> dict:
    """{"records", "used", "rejected": {"too_long": n}} of GRPO records.

    Raises:
      ValueError: max_new_tokens is not in [1, seq_len); no record fits (naming the
        files and the shortest prompt).
    """
    _check_max_new_tokens(seq_len, max_new_tokens)
    records = used = 0
    shortest = None
    for ids, prompt_length in read_sft_records(file_pattern).as_numpy_iterator():
        records += 1
        prompt_length = int(prompt_length)
        shortest = prompt_length if shortest is None else min(shortest, prompt_length)
        if prompt_length + max_new_tokens <= seq_len and len(ids) - 1 - prompt_length <= seq_len:
            used += 1
    if not used:
        raise ValueError(f"no GRPO record of {file_pattern} fits train.seq_len={seq_len} "
                         f"with max_new_tokens={max_new_tokens} ({records} records; the "
                         f"shortest prompt has {shortest} ids): raise train.seq_len, lower "
                         "max_new_tokens or shorten the prompts")
    return {"records": records, "used": used, "rejected": {"too_long": records - used}}


def split_for_replicas(
    global_batches: tf.data.Dataset, micro_batches: int, num_replicas: int,
    first_replica: int = 0, num_local_replicas: int | None = None,
) -> tf.data.Dataset:
    """Global batches -> per-replica elements, `num_local_replicas` per global batch.

    Row layout of a global batch of B sequences, k = micro_batches, R =
    num_replicas, b = B / (k R): micro-batch m is rows [m B/k, (m+1) B/k);
    within it replica r takes rows [m B/k + r b, m B/k + (r+1) b). The union
    over replicas of micro-batch m is therefore the same B/k rows whatever R is.

    Args:
      global_batches: elements {key: [B, ...]} with a static B.
      micro_batches: k, micro-batches per optimizer step.
      num_replicas: R, replicas in sync (all workers).
      first_replica, num_local_replicas: the replicas this input pipeline
        feeds (default: all of them).

    Returns:
      A dataset with, per global batch, `num_local_replicas` consecutive
      elements {key: [k, b, ...]}, for replicas first_replica, first_replica + 1, ...
      (tf.distribute hands consecutive elements to local replicas in turn).

    Raises:
      ValueError: B is not divisible by k * R.
    """
    if num_local_replicas is None:
        num_local_replicas = num_replicas - first_replica
    spec = next(iter(global_batches.element_spec.values()))
    global_batch = spec.shape[0]
    if global_batch is None or global_batch % (micro_batches * num_replicas):
        raise ValueError(
            f"global batch {global_batch} must be divisible by grad_accum_steps "
            f"({micro_batches}) x replicas ({num_replicas})"
        )
    rows = global_batch // (micro_batches * num_replicas)
    last = first_replica + num_local_replicas

    def split(batch):
        out = {}
        for key, value in batch.items():
            rest = value.shape[1:].as_list()
            x = tf.reshape(value, [micro_batches, num_replicas, rows] + rest)  # (k, R, b, ...)
            x = x[:, first_replica:last]  # (k, L, b, ...)
            out[key] = tf.transpose(x, [1, 0, 2] + list(range(3, 3 + len(rest))))  # (L, k, b, ...)
        return out

    return global_batches.map(split).unbatch()


def distribute_global_batches(strategy: tf.distribute.Strategy, dataset_fn, micro_batches: int,
                              skip_steps: int = 0):
    """A distributed dataset of per-replica micro-batch stacks {key: [k, b, T]}.

    Args:
      strategy: the tf.distribute strategy (the default one for one device).
      dataset_fn: () -> dataset of global batches {key: [B, T]}; called once
        per input pipeline (on each worker), so each builds the same stream.
      micro_batches: k (train.grad_accum_steps).
      skip_steps: global batches already trained on (resuming).
    """

    def input_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        local = context.num_replicas_in_sync // context.num_input_pipelines
        ds = dataset_fn().skip(skip_steps)
        ds = split_for_replicas(ds, micro_batches, context.num_replicas_in_sync,
                                context.input_pipeline_id * local, local)
        return ds.prefetch(tf.data.AUTOTUNE)

    return strategy.distribute_datasets_from_function(input_fn)


def write_examples(path: str, documents, source_name: str | None = None) -> None:
    """Writes token-id documents as transformed examples (gzip TFRecords), for
    tests and benchmarks that train without running Transform.

    Args:
      path: output file.
      documents: iterable of int sequences (token ids); `num_bytes` is set to
        the number of tokens.
      source_name: the mixture source every document names (`source_name`), or None
        for none (the examples of the one source, "default", as before mixtures).
    """
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for ids in documents:
            ids = [int(i) for i in ids]
            example = tf.train.Example(features=tf.train.Features(feature={
                INPUT_IDS_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                NUM_BYTES_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[len(ids)])),
                **_source_feature(source_name),
            }))
            writer.write(example.SerializeToString())


def _source_feature(source_name: str | None) -> dict:
    if source_name is None:
        return {}
    return {SOURCE_NAME_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(
        value=[source_name.encode()]))}
