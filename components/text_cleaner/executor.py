"""TextCleaner's executor: a Beam pipeline over the ExampleGen splits, in bounded memory.

  pass 1  read TFRecords -> clean_document -> records dropped by a rule are counted;
          kept ones go to temporary TFRecords (one set per split), and a compact key
          record per document (document key, content hash, MinHash signature) to
          another temporary file.
  pass 2  two reads of the key file: the first builds Bloom filters of the content
          hashes and LSH band keys that occur more than once
          (`cleaning.SeenTwiceFilter`); the second groups only the documents whose
          keys may repeat: exact duplicates by content, near-duplicate candidates by
          LSH band, each candidate pair checked on the full signature.
  pass 3  read the temporary TFRecords back, drop the duplicates found in pass 2
          (side inputs holding only their keys), write the cleaned TFRecords per split.

No grouping holds documents' text, and none holds every document: the groupings
hold the repeated keys only, so memory grows with the number of duplicates, not
with the corpus (Beam's DirectRunner keeps every grouping and every PCollection
between fused stages in memory; the temporary files keep the text out of both).

A mixture (`data.sources`): every record carries its source's name (`source_name`,
"default" when absent: examples made before mixtures) and is cleaned with that
source's settings (`DataConfig.for_source`: min/max_chars, quality_filter,
redact_pii, ...); exact and near-duplicate removal runs across all sources with the
shared settings, so a document in two sources is kept once.

Duplicates are resolved deterministically: the copy in `train` wins over `eval`,
then the lowest (source_name, source, record); each dropped duplicate's sample names
the copy that was kept. The counts and a few rejected records per reason
(file and record number) are written to `cleaning_report.json` in the output
artifact and set as custom properties on it, so ML Metadata shows
`records_read`, `records_kept`, `records_dropped`, `dropped_<reason>` and
`repaired_<kind>` (changes to kept records: invalid UTF-8 replaced, NUL bytes
removed, long documents split, PII redacted, ...), and `by_source` (the same counts
per source). Each source's share of rejected records is checked against its own
`max_reject_fraction`, and a source whose every record was rejected stops the run.

Supervised fine-tuning examples (with a `prompt` feature; `text` is the response)
are cleaned by `cleaning.clean_sft_record` and deduplicated on the (prompt,
response) pair; the `prompt` feature is written back. GRPO examples (`text` is the
reference answer) are SFT examples here. Preference (DPO) examples (a `rejected`
feature too; `text` is the chosen response) are cleaned by
`cleaning.clean_dpo_record` and deduplicated on the (prompt, chosen, rejected)
triple; `prompt` and `rejected` are written back.

Before any work, the ExampleValidator's anomalies are checked: data with
anomalies stops the pipeline here, before Transform and training.
"""

from __future__ import annotations

import json
import os
import struct
from typing import Any

import apache_beam as beam
import numpy as np
import tensorflow as tf
from tensorflow_metadata.proto.v0 import anomalies_pb2
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils

from config import DEFAULT_SOURCE, DataConfig, PipelineConfig
from config.sources import source_names
from corpus import cleaning

REPORT_FILE = "cleaning_report.json"
REPAIR_PREFIX = "repair:"
_SAMPLES_PER_REASON = 5
_SPLIT_PRIORITY = {"train": 0, "eval": 1}
# Bloom filter sizing: documents are assumed to average >= 512 bytes of
# uncompressed example, the gzip'd input to expand 4x, and 8 bits per key.
_BYTES_PER_DOC_ESTIMATE = 512
_GZIP_EXPANSION_ESTIMATE = 4
_BITS_PER_KEY = 8


class DataValidationError(RuntimeError):
    """The data has anomalies or too many rejected records; training must not start."""


def check_anomalies(anomalies: types.Artifact) -> None:
    """Raises DataValidationError listing every anomaly of every split."""
    problems = []
    for split in artifact_utils.decode_split_names(anomalies.split_names):
        path = os.path.join(anomalies.uri, f"Split-{split}", "SchemaDiff.pb")
        proto = anomalies_pb2.Anomalies()
        with tf.io.gfile.GFile(path, "rb") as f:
            proto.ParseFromString(f.read())
        for feature, info in sorted(proto.anomaly_info.items()):
            reasons = "; ".join(r.description or r.short_description for r in info.reason)
            problems.append(f"split '{split}', feature '{feature}': {reasons}")
        if proto.HasField("dataset_anomaly_info"):
            for r in proto.dataset_anomaly_info.reason:
                problems.append(f"split '{split}', dataset: {r.description}")
    if problems:
        raise DataValidationError(
            "ExampleValidator found anomalies; the pipeline stops before training:\n  "
            + "\n  ".join(problems)
            + f"\n(anomalies artifact: {anomalies.uri})"
        )


def _parse(serialized: bytes, split: str) -> dict[str, Any]:
    example = tf.train.Example.FromString(serialized)
    f = example.features.feature
    return {
        "split": split,
        "text": f["text"].bytes_list.value[0].decode("utf-8") if f["text"].bytes_list.value else "",
        "source": f["source"].bytes_list.value[0].decode("utf-8"),
        # the mixture source; examples made before mixtures have none: "default".
        "source_name": _first_string(f, "source_name") or DEFAULT_SOURCE,
        "record": int(f["record"].int64_list.value[0]),
        "reject_reason": _first_string(f, "reject_reason"),
        "repairs": [x for x in _first_string(f, "repairs").split(",") if x],
        # None for pretraining documents; the rendered prompt of an SFT record.
        "prompt": _first_string(f, "prompt") if "prompt" in f else None,
        # the rejected response of a DPO record; only DPO records have the key.
        **({"rejected": _first_string(f, "rejected")} if "rejected" in f else {}),
    }


def _first_string(features, name: str) -> str:
    values = features[name].bytes_list.value if name in features else []
    return values[0].decode("utf-8") if values else ""


def _to_example(record: dict[str, Any]) -> bytes:
    from corpus.documents import Document, document_to_example

    doc = Document(record["text"], record["source"], record["record"],
                   repairs=tuple(record["repairs"]), prompt=record.get("prompt"),
                   source_name=record.get("source_name", DEFAULT_SOURCE),
                   rejected=record.get("rejected"))
    return document_to_example(doc).SerializeToString()


# ----------------------------------------------------------------------------- keys


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
    """The `pack_keys` record of a cleaned record (`_parse` form): its doc key, content
    hash and MinHash signature; an SFT or GRPO record (`prompt` not None) is keyed on the
    (prompt, response) pair (`cleaning.sft_content_key`, `cleaning.sft_dedup_text`), a
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


class _SeenTwiceCombineFn(beam.CombineFn):
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


class _FindDuplicates(beam.PTransform):
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
                _SeenTwiceCombineFn(self._num_bits, bands, rows, near_on))
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


def _input_bytes(pattern: str) -> int:
    return sum(tf.io.gfile.stat(p).length for p in tf.io.gfile.glob(pattern))


class Executor(base_beam_executor.BaseBeamExecutor):
    """Cleans the `examples` splits into `cleaned_examples`."""

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 (TFX API)
        """Cleans and deduplicates every split of `examples` (the passes above).

        Args:
          input_dict: "examples" (one Examples artifact: ExampleGen's TFRecords
            of tf.Example with `text` and the record's source, per split
            `Split-<s>/`) and "anomalies" (one ExampleAnomalies: the
            ExampleValidator's, per split `Split-<s>/SchemaDiff.pb`).
          output_dict: "cleaned_examples" (one Examples artifact).
          exec_properties: "pipeline_config" (PipelineConfig JSON; the `data`
            section holds the cleaning and deduplication rules).

        Writes the kept records to `cleaned_examples/Split-<s>/data_tfrecord-*.gz`
        (same splits as the input), the counts and rejected samples to
        `cleaned_examples/cleaning_report.json` (`build_report`), and the counts as
        custom properties (`records_read`, `records_kept`, `records_dropped`,
        `dropped_<reason>`, `repaired_<kind>`, `by_source` (JSON {source name:
        counts}), `cleaning_report`).

        Raises:
          DataValidationError: the anomalies artifact lists an anomaly (before
            any work); a record's `source_name` is not a source of `data.sources`;
            the corpus has no records; a mixture's source has no records, all of
            them dropped, or more than its own `max_reject_fraction` (naming it,
            `check_sources`); or more than `data.max_reject_fraction` of the
            records, or all of them, were dropped (after the outputs above are
            written).
        """
        config = PipelineConfig.from_json(exec_properties["pipeline_config"])
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        anomalies = artifact_utils.get_single_instance(input_dict["anomalies"])
        output = artifact_utils.get_single_instance(output_dict["cleaned_examples"])
        check_anomalies(anomalies)

        splits = artifact_utils.decode_split_names(examples.split_names)
        output.split_names = artifact_utils.encode_split_names(splits)
        ordered = split_order(splits)
        report_prefix = os.path.join(output.uri, "_report", "counts")
        tmp = os.path.join(output.uri, "_tmp")
        data = config.data
        dedup = data.deduplicate or data.near_dedup
        inputs = {s: os.path.join(examples.uri, f"Split-{s}", "*") for s in splits}
        bands, _ = cleaning.lsh_parameters(data.near_dedup_threshold, data.near_dedup_num_perm)
        num_bits = bloom_bits(sum(_input_bytes(p) for p in inputs.values()), bands)

        settings = {name: data.for_source(name) for name in source_names(data.sources)}

        def clean(r):
            source_data = settings.get(r["source_name"])
            if source_data is None:
                raise DataValidationError(
                    f"{r['source']} record {r['record']}: source_name '{r['source_name']}' "
                    f"is not a source of data.sources ({', '.join(settings)})")
            if r["prompt"] is None:
                text, reason, repairs = cleaning.clean_document(r["text"], r["reject_reason"],
                                                                source_data)
                r = dict(r, text=text, reason=reason, repairs=r["repairs"] + repairs)
            elif r.get("rejected") is not None:  # a DPO record
                prompt, text, rejected, reason, repairs = cleaning.clean_dpo_record(
                    r["prompt"], r["text"], r["rejected"], r["reject_reason"], source_data)
                r = dict(r, prompt=prompt, text=text, rejected=rejected, reason=reason,
                         repairs=r["repairs"] + repairs)
            else:
                prompt, text, reason, repairs = cleaning.clean_sft_record(
                    r["prompt"], r["text"], r["reject_reason"], source_data)
                r = dict(r, prompt=prompt, text=text, reason=reason,
                         repairs=r["repairs"] + repairs)
            tag = "clean" if reason == cleaning.KEPT else "dropped"
            return beam.pvalue.TaggedOutput(tag, r)

        def keys(r):
            return record_keys(r, ordered.index(r["split"]), data)

        def drop_duplicates(serialized, duplicates, split):
            r = _parse(serialized, split)
            found = duplicates.get(doc_key(ordered.index(split), r["source"], r["record"],
                                           r["source_name"]))
            if found:
                reason, kept_key = found
                return beam.pvalue.TaggedOutput("dropped", dict(
                    r, text="", reason=reason, kept=parse_doc_key(kept_key, ordered)[1:]))
            return beam.pvalue.TaggedOutput("kept", (serialized, r))

        # Every split is its own chain, and only small things (file names, counts,
        # samples, duplicate keys) cross between chains: on the DirectRunner a
        # Flatten of PCollections from different stages is held in memory whole.
        with self._make_beam_pipeline() as p:
            counts, samples, key_files, clean_files = [], [], [], {}

            def count_and_sample(name, dropped, kept=None):
                counted = [dropped | f"DroppedKey[{name}]" >> beam.Map(
                    lambda r: ((r["split"], r["source_name"], r["reason"]), 1))]
                if kept is not None:
                    counted.append(kept | f"KeptKey[{name}]" >> beam.FlatMap(
                        lambda r: [((r["split"], r["source_name"], cleaning.KEPT), 1)]
                        + [((r["split"], r["source_name"], REPAIR_PREFIX + x), 1)
                           for x in r["repairs"]]))
                for i, part in enumerate(counted):
                    counts.append(part | f"Count[{name}.{i}]" >> beam.CombinePerKey(sum))
                samples.append(
                    dropped
                    | f"SampleKey[{name}]" >> beam.Map(
                        lambda r: ((r["source_name"], r["reason"]),
                                   (r["source"], r["record"], tuple(r.get("kept", ())))))
                    | f"Sample[{name}]" >> beam.combiners.Top.SmallestPerKey(_SAMPLES_PER_REASON))

            # pass 1: clean; count what a rule drops; keep the text on disk, not in memory.
            for s in splits:
                cleaned = (
                    p
                    | f"Read[{s}]" >> beam.io.ReadFromTFRecord(inputs[s], compression_type="auto")
                    | f"Parse[{s}]" >> beam.Map(_parse, split=s)
                    | f"Clean[{s}]" >> beam.Map(clean).with_outputs("clean", "dropped")
                )
                if dedup:
                    count_and_sample(f"rules.{s}", cleaned.dropped)
                    key_files.append(
                        cleaned.clean
                        | f"Keys[{s}]" >> beam.Map(keys)
                        | f"WriteKeys[{s}]" >> beam.io.WriteToTFRecord(
                            os.path.join(tmp, f"keys-{s}")))
                    clean_files[s] = (
                        cleaned.clean
                        | f"Serialize[{s}]" >> beam.Map(_to_example)
                        | f"WriteClean[{s}]" >> beam.io.WriteToTFRecord(
                            os.path.join(tmp, f"clean-{s}")))
                else:
                    kept = cleaned.clean | f"Pair[{s}]" >> beam.Map(lambda r: (_to_example(r), r))
                    count_and_sample(s, cleaned.dropped, kept | f"Record[{s}]" >> beam.Map(
                        lambda x: x[1]))
                    clean_files[s] = kept

            if dedup:
                # pass 2: find the duplicates from the compact key records.
                duplicates = beam.pvalue.AsDict(
                    key_files
                    | "AllKeyFiles" >> beam.Flatten()
                    | "FindDuplicates" >> _FindDuplicates(data, num_bits)
                )
            for s in splits:
                if dedup:
                    # pass 3: read the cleaned text back, leave out the duplicates.
                    deduped = (
                        clean_files[s]
                        | f"ReadClean[{s}]" >> beam.io.ReadAllFromTFRecord()
                        | f"DropDuplicates[{s}]" >> beam.Map(
                            drop_duplicates, duplicates=duplicates, split=s
                        ).with_outputs("kept", "dropped")
                    )
                    kept = deduped.kept
                    count_and_sample(f"dedup.{s}", deduped.dropped,
                                     kept | f"Record[{s}]" >> beam.Map(lambda x: x[1]))
                else:
                    kept = clean_files[s]
                _ = (
                    kept
                    | f"Bytes[{s}]" >> beam.Map(lambda x: x[0])
                    | f"Write[{s}]" >> beam.io.WriteToTFRecord(
                        os.path.join(output.uri, f"Split-{s}", "data_tfrecord"),
                        file_name_suffix=".gz",
                    )
                )

            def smallest(samples_lists):
                return sorted(x for xs in samples_lists for x in xs)[:_SAMPLES_PER_REASON]

            all_counts = (
                counts
                | "AllCounts" >> beam.Flatten()
                | "Total" >> beam.CombinePerKey(sum)
                | "CountsToList" >> beam.combiners.ToList()
            )
            all_samples = (
                samples
                | "AllSamples" >> beam.Flatten()
                | "MergeSamples" >> beam.CombinePerKey(smallest)
                | "SamplesToList" >> beam.combiners.ToList()
            )
            _ = (
                all_counts
                | "Report" >> beam.Map(
                    lambda c, s: json.dumps({"counts": c, "samples": s}),
                    s=beam.pvalue.AsSingleton(all_samples))
                | "WriteReport" >> beam.io.WriteToText(report_prefix, num_shards=1, shard_name_template="")
            )

        if tf.io.gfile.exists(tmp):
            tf.io.gfile.rmtree(tmp)
        with tf.io.gfile.GFile(report_prefix) as f:
            raw = json.loads(f.read())
        report = build_report([(tuple(k), n) for k, n in raw["counts"]],
                              [(tuple(k), [tuple(tuple(v) if isinstance(v, list) else v
                                                 for v in x) for x in xs])
                               for k, xs in raw["samples"]],
                              splits, names=source_names(data.sources))
        report["dedup_bloom_bits"] = num_bits
        with tf.io.gfile.GFile(os.path.join(output.uri, REPORT_FILE), "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        record_report(output, report)
        check_sources(report, data)
        check_reject_fraction(report, data.max_reject_fraction)


def _sample(source_name: str, sample) -> dict[str, Any]:
    """A rejected record's sample as the report writes it: {"source_name", "source",
    "record"} and, for a duplicate, "kept": the same of the copy that was kept."""
    source, record, kept = sample
    out = {"source_name": source_name, "source": source, "record": record}
    if kept:
        out["kept"] = dict(zip(("source_name", "source", "record"), kept, strict=True))
    return out


def build_report(counts, samples, splits, names=()) -> dict[str, Any]:
    """Per-split, per-source and total counts: read = kept + dropped, dropped by reason.

    Args:
      counts: [((split, source_name, reason or KEPT or "repair:<kind>"), n)].
      samples: [((source_name, reason), [(source, record, kept copy's (source_name,
        source, record) or ())])], a few per key.
      splits: the split names.
      names: the sources to report even when they have no records (`data.sources`).

    Returns:
      {"total", "splits": {split: counts}, "by_source": {name: {"records_read",
      "records_kept", "records_dropped", "dropped": {reason: n}, "repaired": {kind: n},
      "rejected_samples": {reason: [sample]}}}, "rejected_samples": {reason: [[source,
      record]]} (the first few over every source), "rejected_records": {reason:
      [sample]} (the same with their source names and kept copies)}; a sample is
      {"source_name", "source", "record"} with "kept" (the same) for a duplicate.
    """
    per_split: dict[str, dict[str, Any]] = {
        s: {"read": 0, "kept": 0, "dropped": 0, "dropped_by_reason": {}, "repaired": {}}
        for s in splits
    }
    by_source: dict[str, dict[str, Any]] = {}

    def source_entry(name: str) -> dict[str, Any]:
        return by_source.setdefault(name, {
            "records_read": 0, "records_kept": 0, "records_dropped": 0, "dropped": {},
            "repaired": {}, "rejected_samples": {}})

    for name in names:
        source_entry(name)
    for (split, source_name, reason), n in counts:
        entry, source = per_split[split], source_entry(source_name)
        if reason.startswith(REPAIR_PREFIX):  # a change to a kept record, not a record
            kind = reason[len(REPAIR_PREFIX):]
            entry["repaired"][kind] = entry["repaired"].get(kind, 0) + n
            source["repaired"][kind] = source["repaired"].get(kind, 0) + n
            continue
        entry["read"] += n
        source["records_read"] += n
        if reason == cleaning.KEPT:
            entry["kept"] += n
            source["records_kept"] += n
        else:
            entry["dropped"] += n
            entry["dropped_by_reason"][reason] = entry["dropped_by_reason"].get(reason, 0) + n
            source["records_dropped"] += n
            source["dropped"][reason] = source["dropped"].get(reason, 0) + n
    merged: dict[str, list] = {}
    for (source_name, reason), xs in samples:
        ordered = sorted(xs)
        source_entry(source_name)["rejected_samples"][reason] = [
            _sample(source_name, x) for x in ordered]
        merged.setdefault(reason, []).extend((x[0], x[1], source_name, x) for x in ordered)
    firsts = {reason: sorted(xs)[:_SAMPLES_PER_REASON] for reason, xs in merged.items()}
    total: dict[str, Any] = {"read": 0, "kept": 0, "dropped": 0, "dropped_by_reason": {},
                             "repaired": {}}
    for entry in per_split.values():
        for k in ("read", "kept", "dropped"):
            total[k] += entry[k]
        for group in ("dropped_by_reason", "repaired"):
            for reason, n in entry[group].items():
                total[group][reason] = total[group].get(reason, 0) + n
    assert total["read"] == total["kept"] + total["dropped"]
    return {
        "total": total,
        "splits": per_split,
        "by_source": dict(sorted(by_source.items())),
        "rejected_samples": {reason: [[source, record] for source, record, _, _ in xs]
                             for reason, xs in firsts.items()},
        "rejected_records": {reason: [_sample(name, x) for _, _, name, x in xs]
                             for reason, xs in firsts.items()},
    }


def record_report(artifact: types.Artifact, report: dict[str, Any]) -> None:
    """Sets the counts as ML Metadata custom properties of the output artifact."""
    total = report["total"]
    artifact.set_int_custom_property("records_read", total["read"])
    artifact.set_int_custom_property("records_kept", total["kept"])
    artifact.set_int_custom_property("records_dropped", total["dropped"])
    for reason, n in sorted(total["dropped_by_reason"].items()):
        artifact.set_int_custom_property(f"dropped_{reason}", n)
    for repair, n in sorted(total["repaired"].items()):
        artifact.set_int_custom_property(f"repaired_{repair}", n)
    artifact.set_json_value_custom_property("by_source", {
        name: {k: v for k, v in counts.items() if k != "rejected_samples"}
        for name, counts in report.get("by_source", {}).items()})
    artifact.set_json_value_custom_property("cleaning_report", report)


def _reasons(dropped: dict[str, int], samples: dict[str, list]) -> list[str]:
    """One line per reason, most frequent first: `reason: n (e.g. file record r, ...)`."""
    lines = []
    for reason, n in sorted(dropped.items(), key=lambda kv: (-kv[1], kv[0])):
        where = ", ".join(f"{x['source']} record {x['record']}" + (
            f" (kept: source '{x['kept']['source_name']}', {x['kept']['source']} record "
            f"{x['kept']['record']})" if "kept" in x else "") for x in samples.get(reason, []))
        lines.append(f"{reason}: {n}" + (f" (e.g. {where})" if where else ""))
    return lines


def check_sources(report: dict[str, Any], data: DataConfig) -> None:
    """A mixture's per-source checks (none without `data.sources`: the total is that
    one source's, `check_reject_fraction`).

    Raises:
      DataValidationError: a source has no records, every record of a source was
        rejected, or more than its own `max_reject_fraction` (`data.for_source`) was;
        the message names the source, its record counts and its reasons.
    """
    if not data.sources:
        return
    by_source = report.get("by_source", {})
    for name in source_names(data.sources):
        counts = by_source.get(name)
        if not counts or counts["records_read"] == 0:
            raise DataValidationError(f"data source '{name}' has no records")
        read, dropped = counts["records_read"], counts["records_dropped"]
        max_fraction = data.for_source(name).max_reject_fraction
        fraction = dropped / read
        if counts["records_kept"] == 0 or fraction > max_fraction:
            what = ("all rejected" if counts["records_kept"] == 0
                    else f"{fraction:.1%} > its max_reject_fraction={max_fraction:.1%}")
            raise DataValidationError(
                f"data source '{name}': {dropped} of {read} records rejected ({what}):\n  "
                + "\n  ".join(_reasons(counts["dropped"], counts["rejected_samples"])))


def check_reject_fraction(report: dict[str, Any], max_fraction: float) -> None:
    total = report["total"]
    if total["read"] == 0:
        raise DataValidationError("the corpus has no records")
    fraction = total["dropped"] / total["read"]
    if fraction > max_fraction or total["kept"] == 0:
        lines = []
        for reason, n in sorted(total["dropped_by_reason"].items(), key=lambda kv: -kv[1]):
            where = ", ".join(
                f"{src} record {rec}" for src, rec in report["rejected_samples"].get(reason, [])
            )
            lines.append(f"{reason}: {n} (e.g. {where})")
        raise DataValidationError(
            f"{total['dropped']} of {total['read']} records rejected "
            f"({fraction:.1%} > data.max_reject_fraction={max_fraction:.1%}):\n  " + "\n  ".join(lines)
        )
