"""Data mixtures: global batches drawn from named sources in proportion to their weights.

A source is a set of transformed files (`sources = {name: file_pattern}`), or the
records of one `source_name` in a set of files (`{name: SourceFiles(files, name)}`):
the Trainer's case, where Transform wrote every source into one train split
(`split_sources`). Each source is read and packed on its own, exactly as
`data.make_train_dataset` does for one corpus (documents shuffled, `[EOS]` after each, cut
into windows of `seq_len + 1`, windows shuffled), so a window never mixes sources and its
source is known. Windows are then drawn by weight with
`tf.data.Dataset.sample_from_datasets` and batched into global batches; every sequence
carries its source's index (`"source"`, int32) so the loop can count realized tokens per
source (`tokens_by_source`, `SourceTokenCounter`, `realized_shares`).

Sources are ordered by name (`source_names`): the source index, and so the stream, does not
depend on the order the sources were given in. Source i shuffles its documents with seed
`seed + 2i` and its windows with `seed + 2i + 1`; the sampler uses `seed + 2n` (n sources).
So source 0 alone is exactly `make_train_dataset`, and the whole stream is a pure function
of (files, weights, seed): a resumed run and every worker of a multi-worker run skip and
split the same global batches (`data.distribute_global_batches`), as with one source.

When a source runs out (`on_exhausted`):
  - "repeat": every source repeats forever (documents reshuffled each epoch), so a small
    source is up-sampled; the stream never ends.
  - "stop": every source is read once; the mixture ends the first time the sampler picks a
    source that has no window left (`stop_on_empty_dataset=True`). The windows drawn before
    are kept, the last partial global batch is dropped. Other sources keep what they had
    not yet given.

Per-source epochs: `measure_sources` reads each source once and counts its documents and
stream tokens per epoch (ids plus one `[EOS]` each); a window takes `seq_len + 1` stream
tokens, so `epochs_drawn` turns windows drawn per source into epochs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import tensorflow as tf

from components.trainer import data
from tokenization.tokenizer import EOS_ID

ON_EXHAUSTED = ("repeat", "stop")
SOURCE_KEY = "source"


@dataclasses.dataclass(frozen=True)
class SourceFiles:
    """One source of a mixture: the records of `files` (a pattern or a list of them)
    whose `source_name` is `source_name` (every record when None)."""

    files: str | list[str]
    source_name: str | None = None

    def __str__(self) -> str:
        where = f"records with source_name {self.source_name!r} in " if self.source_name else ""
        return f"{where}{self.files}"


def as_source_files(value) -> SourceFiles:
    """A `sources` value as `SourceFiles`: a file pattern (or list) means all its records."""
    return value if isinstance(value, SourceFiles) else SourceFiles(value)


def split_sources(files: str | list[str], names) -> dict[str, SourceFiles]:
    """{name: SourceFiles(files, name)} for each of `names`: the sources of one split
    whose records name their source (Transform's `source_name`)."""
    return {name: SourceFiles(files, name) for name in names}


def read_source(source) -> tf.data.Dataset:
    """A source's documents (int32 [tokens]), in file order (`data.read_documents`)."""
    source = as_source_files(source)
    return data.read_documents(source.files, source.source_name)


def source_names(sources: Mapping[str, object]) -> list[str]:
    """The sources in index order (by name): `"source" == i` means `source_names(...)[i]`."""
    return sorted(sources)


def normalized_weights(sources: Mapping[str, object], weights: Mapping[str, float]) -> list[float]:
    """Weights in `source_names` order, summing to 1.

    Raises:
      ValueError: no source; the names of `weights` differ from those of `sources`; a weight
        that is not a finite number > 0.
    """
    if not sources:
        raise ValueError("a mixture needs at least one source")
    names = source_names(sources)
    if set(weights) != set(names):
        raise ValueError(f"weights name {sorted(weights)}, sources name {names}: "
                         "give each source exactly one weight")
    bad = {n: w for n, w in weights.items() if not (math.isfinite(w) and w > 0)}
    if bad:
        raise ValueError(f"weights must be finite and > 0: {bad}")
    total = sum(float(weights[n]) for n in names)
    return [float(weights[n]) / total for n in names]


def source_windows(file_pattern, seq_len: int, batch_size: int, shuffle_buffer: int, seed: int,
                   eos_id: int = EOS_ID, repeat: bool = True) -> tf.data.Dataset:
    """One source's shuffled windows {"input_ids", "labels"}: int32 [seq_len], packed
    as `data.make_train_dataset` packs (same seeds, same window shuffle buffer), before
    batching; `repeat=False` reads the documents once. `file_pattern`: a `sources`
    value (a pattern, a list, or `SourceFiles`)."""
    docs = read_source(file_pattern).cache()
    docs = docs.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        docs = docs.repeat()
    windows = data.pack(docs, seq_len, eos_id)
    return windows.shuffle(max(4 * batch_size, 64), seed=seed + 1)


def make_mixture_train_dataset(
    sources: Mapping[str, object], weights: Mapping[str, float], seq_len: int, batch_size: int,
    shuffle_buffer: int, seed: int, eos_id: int = EOS_ID, on_exhausted: str = "repeat",
) -> tf.data.Dataset:
    """Global batches drawn from `sources` by weight (see the module docstring).

    Args:
      sources: {name: file_pattern} of transformed examples (a pattern or a list of them),
        or {name: SourceFiles} (one source's records of a split: `split_sources`).
      weights: {name: weight > 0}, normalized; a source's expected share of sequences (and,
        every sequence being seq_len tokens, of tokens).
      seq_len, batch_size, shuffle_buffer, seed, eos_id: as `data.make_train_dataset`.
      on_exhausted: "repeat" (sources repeat: infinite) or "stop" (one pass per source;
        the stream ends when the sampler first picks an exhausted source).

    Returns:
      A dataset of {"input_ids", "labels": int32 [batch_size, seq_len],
      "source": int32 [batch_size]} (the index in `source_names(sources)`). With one
      source, "input_ids" and "labels" are exactly `data.make_train_dataset`'s batches.

    Raises:
      ValueError: bad weights (`normalized_weights`) or `on_exhausted`.
      FileNotFoundError: a source's pattern matches no file.
    """
    if on_exhausted not in ON_EXHAUSTED:
        raise ValueError(f"on_exhausted must be one of {ON_EXHAUSTED}, not {on_exhausted!r}")
    names = source_names(sources)
    probabilities = normalized_weights(sources, weights)
    tagged = []
    for i, name in enumerate(names):
        windows = source_windows(sources[name], seq_len, batch_size, shuffle_buffer,
                                 seed + 2 * i, eos_id, repeat=on_exhausted == "repeat")
        tagged.append(windows.map(
            lambda w, i=i: {**w, SOURCE_KEY: tf.constant(i, tf.int32)}))
    mixed = tf.data.Dataset.sample_from_datasets(
        tagged, weights=probabilities, seed=seed + 2 * len(names), stop_on_empty_dataset=True)
    return mixed.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


@dataclasses.dataclass(frozen=True)
class SourceSize:
    """One epoch of a source: its documents and stream tokens (ids plus one [EOS] each)."""

    documents: int
    tokens: int

    def windows_per_epoch(self, seq_len: int) -> float:
        """Windows of `seq_len + 1` stream tokens in one epoch (a fraction: windows
        straddle epochs when the source repeats)."""
        return self.tokens / (seq_len + 1)


def measure_sources(sources: Mapping[str, object]) -> dict[str, SourceSize]:
    """{name: SourceSize}, reading every source once (cost: one pass over the files).

    Raises:
      ValueError: a source has no token (a mixture would never draw from it).
    """
    sizes = {}
    for name in source_names(sources):
        documents = tokens = 0
        for ids in read_source(sources[name]).as_numpy_iterator():
            documents += 1
            tokens += len(ids) + 1
        if documents == 0:
            raise ValueError(f"source {name!r} has no document ({as_source_files(sources[name])}"
                             "): were all its records rejected, or is it misnamed?")
        sizes[name] = SourceSize(documents, tokens)
    return sizes


def epochs_drawn(windows: Mapping[str, int], sizes: Mapping[str, SourceSize],
                 seq_len: int) -> dict[str, float]:
    """{name: epochs of that source drawn}, from windows (sequences) drawn per source."""
    return {name: windows.get(name, 0) / sizes[name].windows_per_epoch(seq_len)
            for name in sizes}


def tokens_by_source(source: tf.Tensor, labels: tf.Tensor, num_sources: int) -> tf.Tensor:
    """Trained tokens (labels other than `data.IGNORE_LABEL`) per source, int64 [num_sources].

    Args:
      source: int32 [...], one index per sequence (e.g. (b,) or (k, b)).
      labels: int32 [..., T] of the same sequences.

    Graph-friendly: inside a replica step, all-reduce (SUM) the result and add it to a
    tf.Variable of shape [num_sources] to count over a run.
    """
    per_row = tf.reduce_sum(tf.cast(labels != data.IGNORE_LABEL, tf.int64), axis=-1)  # (...,)
    return tf.math.unsorted_segment_sum(tf.reshape(per_row, [-1]),
                                        tf.reshape(tf.cast(source, tf.int32), [-1]),
                                        num_sources)  # (S,)


class SourceTokenCounter:
    """Tokens trained per source so far (host side, numpy int64)."""

    def __init__(self, names: list[str]):
        self.names = list(names)
        self.tokens = np.zeros(len(self.names), np.int64)
        self.sequences = np.zeros(len(self.names), np.int64)

    def add(self, batch: Mapping[str, object]) -> None:
        """Counts a batch {"source": [...], "labels": [..., T]} (numpy or tf tensors)."""
        source = np.asarray(batch[SOURCE_KEY]).reshape(-1)
        labels = np.asarray(batch["labels"])
        per_row = (labels != data.IGNORE_LABEL).sum(axis=-1).reshape(-1)
        self.tokens += np.bincount(source, weights=per_row,
                                   minlength=len(self.names)).astype(np.int64)
        self.sequences += np.bincount(source, minlength=len(self.names))

    def add_counts(self, tokens) -> None:
        """Adds per-source token counts already summed (e.g. `tokens_by_source`'s); the
        sequence counts (`sequences`, for `epochs_drawn`) come from `add` only."""
        self.tokens += np.asarray(tokens, np.int64)

    def counts(self) -> dict[str, int]:
        return {n: int(t) for n, t in zip(self.names, self.tokens, strict=True)}

    def shares(self) -> dict[str, float]:
        return realized_shares(self.counts())


def realized_shares(counts: Mapping[str, int]) -> dict[str, float]:
    """{name: share of the tokens} (0.0 each while nothing is counted)."""
    total = sum(counts.values())
    return {n: (c / total if total else 0.0) for n, c in counts.items()}
