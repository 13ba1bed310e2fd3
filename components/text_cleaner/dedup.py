"""TextCleaner's deduplication (pass 2 of `executor.py`): the compact key records of the
cleaned documents, and the Beam transform that finds the duplicates among them.

A key record (`pack_keys`) holds a document's key (`doc_key`: its keep-first order),
its content hash and its MinHash signature. `FindDuplicates` reads the key files twice:
Bloom filters of the content hashes and LSH band keys that occur more than once
(`SeenTwiceCombineFn`, sized by `bloom_bits`), then groups only the keys that may
repeat.
"""

from __future__ import annotations

import struct
from typing import Any

import apache_beam as beam
import numpy as np

from config import DEFAULT_SOURCE, DataConfig
from corpus import cleaning

_SPLIT_PRIORITY = {"train": 0, "eval": 1}
# Bloom filter sizing: documents are assumed to average >= 512 bytes of
# uncompressed example, the gzip'd input to expand 4x, and 8 bits per key.
_BYTES_PER_DOC_ESTIMATE = 512
_GZIP_EXPANSION_ESTIMATE = 4
_BITS_PER_KEY = 8


def split_order(splits: list[str]) -> list[str]:
    """Splits in keep-first order: train, eval, then the others by name."""
    return sorted(splits, key=lambda s: (_SPLIT_PRIORITY.get(s, 9), s))


def doc_key(split_index: int, source: str, record: int,
            source_name: str = DEFAULT_SOURCE) -> bytes:
    """A byte string whose order is the keep-first order of duplicates: split
    (`split_order` index), then source name, then source file, then record number."""
    return (struct.pack(">B", split_index) + source_name.encode("utf-8") + b"\0"
            + source.encode("utf-8") + b"\0" + struct.pack(">Q", record))


def parse_doc_key(key: bytes, splits: list[str]) -> tuple[str, str, str, int]:
    """(split, source_name, source, record) of a `doc_key`, given `split_order(...)`."""
    name, _, source = key[1:-9].partition(b"\0")
    return (splits[key[0]], name.decode("utf-8"), source.decode("utf-8"),
            struct.unpack(">Q", key[-8:])[0])


def pack_keys(key: bytes, content: bytes, signature: np.ndarray) -> bytes:
    """doc key, 16-byte content hash and uint32 MinHash signature, as one record."""
    return struct.pack("<H", len(key)) + key + content[:16] + signature.astype("<u4").tobytes()


def unpack_keys(packed: bytes) -> tuple[bytes, bytes, np.ndarray]:
    n = struct.unpack("<H", packed[:2])[0]
    key, content = packed[2:2 + n], packed[2 + n:18 + n]
    return key, content, np.frombuffer(packed[18 + n:], dtype="<u4")


def record_keys(r: dict[str, Any], split_index: int, data: DataConfig) -> bytes:
    """The `pack_keys` record of a cleaned record (`executor._parse` form): its doc key,
    content hash and MinHash signature; an SFT or GRPO record (`prompt` not None) is keyed
    on the (prompt, response) pair (`cleaning.sft_content_key`, `cleaning.sft_dedup_text`), a
    DPO record (a `rejected` key, not None) on the (prompt, chosen, rejected) triple
    (`cleaning.dpo_content_key`, `cleaning.dpo_dedup_text`)."""
    if r.get("rejected") is not None:
        text = cleaning.dpo_dedup_text(r["prompt"], r["text"], r["rejected"])
        content = cleaning.dpo_content_key(r["prompt"], r["text"], r["rejected"])
    elif r["prompt"] is not None:
        text = cleaning.sft_dedup_text(r["prompt"], r["text"])
        content = cleaning.sft_content_key(r["prompt"], r["text"])
    else:
        text = r["text"]
        content = cleaning.content_key(text)
    signature = (cleaning.minhash_signature(text, data.near_dedup_num_perm, data.near_dedup_ngram)
                 if data.near_dedup else np.zeros(0, dtype=np.uint32))
    return pack_keys(doc_key(split_index, r["source"], r["record"],
                             r.get("source_name", DEFAULT_SOURCE)), content,
                     signature)


def bloom_bits(input_bytes: int, bands: int) -> int:
    """Bloom filter size for a corpus of `input_bytes` (gzip'd examples): a power of two."""
    docs = input_bytes * _GZIP_EXPANSION_ESTIMATE // _BYTES_PER_DOC_ESTIMATE + 1
    wanted = max(docs * max(bands, 1) * _BITS_PER_KEY, 1 << 16)
    return min(1 << (wanted - 1).bit_length(), 1 << 32)


def _hash64(content: bytes) -> int:
    return int.from_bytes(content[:8], "little")


class SeenTwiceCombineFn(beam.CombineFn):
    """Bloom filters of repeated content hashes and repeated LSH band keys."""

    def __init__(self, num_bits: int, bands: int, rows: int, near: bool):
        self._num_bits, self._bands, self._rows, self._near = num_bits, bands, rows, near

    def create_accumulator(self):
        # one content key per document against `bands` band keys: 1/bands of the bits.
        exact_bits = 1 << max((self._num_bits // max(self._bands, 1)).bit_length() - 1, 16)
        exact = cleaning.SeenTwiceFilter(exact_bits)
        near = cleaning.SeenTwiceFilter(self._num_bits if self._near else 8)
        return exact, near

    def add_input(self, accumulator, packed):
        exact, near = accumulator
        _, content, signature = unpack_keys(packed)
        exact.add(np.array([_hash64(content)], dtype=np.uint64))
        if self._near:
            near.add(cleaning.key_hashes(cleaning.lsh_bands(signature, self._bands, self._rows)))
        return accumulator

    def merge_accumulators(self, accumulators):
        accumulators = iter(accumulators)
        exact, near = next(accumulators)
        for other_exact, other_near in accumulators:
            exact.merge(other_exact)
            near.merge(other_near)
        return exact, near

    def extract_output(self, accumulator):
        return accumulator


class FindDuplicates(beam.PTransform):
    """Key files (`pack_keys` records) -> (doc key, (reason, kept doc key)) of every
    duplicate, the kept key naming the copy it duplicates (for a near duplicate, the
    first earlier document it is near).

    Exact duplicates: same content hash; all but the first (`doc_key` order) are
    dropped. Near duplicates: documents whose estimated Jaccard similarity
    (MinHash over word n-grams) with an earlier document reaches the threshold;
    LSH banding (b bands of r rows, chosen by datasketch for the threshold) finds
    the candidate pairs, each checked on the full signature. A document that is
    both is counted as an exact duplicate. Only keys that the Bloom filters say
    may repeat are grouped.
    """

    def __init__(self, data: DataConfig, num_bits: int):
        super().__init__()
        self._data, self._num_bits = data, num_bits

    def expand(self, key_files):
        data = self._data
        bands, rows = cleaning.lsh_parameters(data.near_dedup_threshold, data.near_dedup_num_perm)
        near_on = data.near_dedup
        filters = (
            key_files
            | "ReadKeysForFilters" >> beam.io.ReadAllFromTFRecord()
            | "SeenTwice" >> beam.CombineGlobally(
                SeenTwiceCombineFn(self._num_bits, bands, rows, near_on))
        )

        def candidates(packed, filters):
            exact_filter, near_filter = filters
            key, content, signature = unpack_keys(packed)
            if data.deduplicate and exact_filter.may_repeat(
                    np.array([_hash64(content)], dtype=np.uint64))[0]:
                yield beam.pvalue.TaggedOutput("exact", (content, key))
            if near_on:
                band_keys = cleaning.lsh_bands(signature, bands, rows)
                repeat = near_filter.may_repeat(cleaning.key_hashes(band_keys))
                for band_key, may in zip(band_keys, repeat, strict=True):
                    if may:
                        yield beam.pvalue.TaggedOutput("near", (band_key, (key, signature)))

        grouped = (
            key_files
            | "ReadKeysForCandidates" >> beam.io.ReadAllFromTFRecord()
            | "Candidates" >> beam.FlatMap(
                candidates, filters=beam.pvalue.AsSingleton(filters)).with_outputs("exact", "near")
        )

        def exact_duplicates(content_and_keys):
            _, keys = content_and_keys
            keys = sorted(keys)
            for key in keys[1:]:
                yield key, (cleaning.DROP_EXACT_DUPLICATE, keys[0])

        def near_duplicates(bucket):
            _, members = bucket
            members = sorted(members, key=lambda m: m[0])
            for i, (key, sig) in enumerate(members):
                for earlier_key, earlier_sig in members[:i]:
                    if cleaning.estimated_jaccard(sig, earlier_sig) >= data.near_dedup_threshold:
                        yield key, earlier_key
                        break

        exact = grouped.exact | "GroupByContent" >> beam.GroupByKey() | "Exact" >> beam.FlatMap(
            exact_duplicates)
        near = (
            grouped.near
            | "GroupByBand" >> beam.GroupByKey()
            | "PairsInBucket" >> beam.FlatMap(near_duplicates)
            | "FirstOriginal" >> beam.CombinePerKey(min)
            | "Near" >> beam.Map(lambda kv: (kv[0], (cleaning.DROP_NEAR_DUPLICATE, kv[1])))
        )

        def first_reason(key_reasons):
            key, reasons = key_reasons
            reasons = sorted(reasons)  # (reason, kept key): exact_duplicate < near_duplicate
            yield key, reasons[0]

        return (
            (exact, near)
            | "AllDuplicates" >> beam.Flatten()
            | "GroupByDoc" >> beam.GroupByKey()
            | "OneReason" >> beam.FlatMap(first_reason)
        )
