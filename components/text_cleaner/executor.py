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

The key records and pass 2 are in `dedup.py`; the report's counts and samples in
`report.py`.
"""

from __future__ import annotations

import json
import os
from typing import Any

import apache_beam as beam
import tensorflow as tf
from tensorflow_metadata.proto.v0 import anomalies_pb2
from tfx import types
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils

from components.text_cleaner.dedup import (
    FindDuplicates,
    bloom_bits,
    doc_key,
    parse_doc_key,
    record_keys,
    split_order,
)
from components.text_cleaner.report import (
    REPAIR_PREFIX,
    SAMPLES_PER_REASON,
    build_report,
    record_report,
)
from config import DEFAULT_SOURCE, DataConfig, PipelineConfig
from config.sources import source_names
from corpus import cleaning

REPORT_FILE = "cleaning_report.json"
# The names of the deduplication's Beam classes here before `dedup.py` (tests use them).


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
    from corpus.document_record import Document
    from corpus.documents import document_to_example

    doc = Document(record["text"], record["source"], record["record"],
                   repairs=tuple(record["repairs"]), prompt=record.get("prompt"),
                   source_name=record.get("source_name", DEFAULT_SOURCE),
                   rejected=record.get("rejected"))
    return document_to_example(doc).SerializeToString()


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
        report_prefix = os.path.join(output.uri, "_report", "counts")
        tmp = os.path.join(output.uri, "_tmp")
        data = config.data
        inputs = {s: os.path.join(examples.uri, f"Split-{s}", "*") for s in splits}
        bands, _ = cleaning.lsh_parameters(data.near_dedup_threshold, data.near_dedup_num_perm)
        num_bits = bloom_bits(sum(_input_bytes(p) for p in inputs.values()), bands)
        cleaning_pipeline = _CleaningPipeline(data, splits, num_bits, tmp)
        with self._make_beam_pipeline() as p:
            cleaning_pipeline.build(p, inputs, output.uri, report_prefix)

        if tf.io.gfile.exists(tmp):
            tf.io.gfile.rmtree(tmp)
        report = read_report(report_prefix, splits, data)
        report["dedup_bloom_bits"] = num_bits
        with tf.io.gfile.GFile(os.path.join(output.uri, REPORT_FILE), "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        record_report(output, report)
        check_sources(report, data)
        check_reject_fraction(report, data.max_reject_fraction)


class _CleaningPipeline:
    """The Beam graph of one cleaning run: the three passes of the module docstring, and
    the counts and samples of every record that a pass keeps or drops.

    Every split is its own chain, and only small things (file names, counts,
    samples, duplicate keys) cross between chains: on the DirectRunner a
    Flatten of PCollections from different stages is held in memory whole.
    """

    def __init__(self, data: DataConfig, splits: list[str], num_bits: int, tmp: str):
        """`data`: the config's data section; `splits`: the input's split names;
        `num_bits`: the Bloom filters' size (`bloom_bits`); `tmp`: the directory of
        the temporary files."""
        self.data, self.splits, self.num_bits, self.tmp = data, splits, num_bits, tmp
        self.ordered = split_order(splits)
        self.dedup = data.deduplicate or data.near_dedup
        self.settings = {name: data.for_source(name) for name in source_names(data.sources)}
        self.counts, self.samples = [], []  # PCollections: ((split, source, reason), n), ...

    def build(self, p, inputs: dict[str, str], output_uri: str, report_prefix: str) -> None:
        """Adds the run to pipeline `p`: reads `inputs` ({split: file pattern}), writes
        the kept records to `output_uri/Split-<s>/` and the counts and samples to
        `report_prefix` (JSON {"counts", "samples"})."""
        key_files, clean_files = [], {}
        # pass 1: clean; count what a rule drops; keep the text on disk, not in memory.
        for s in self.splits:
            self.clean_split(p, s, inputs[s], key_files, clean_files)
        if self.dedup:
            # pass 2: find the duplicates from the compact key records.
            duplicates = beam.pvalue.AsDict(
                key_files
                | "AllKeyFiles" >> beam.Flatten()
                | "FindDuplicates" >> FindDuplicates(self.data, self.num_bits)
            )
        for s in self.splits:
            if self.dedup:
                # pass 3: read the cleaned text back, leave out the duplicates.
                kept = self.dedup_split(s, clean_files[s], duplicates)
            else:
                kept = clean_files[s]
            _ = (
                kept
                | f"Bytes[{s}]" >> beam.Map(lambda x: x[0])
                | f"Write[{s}]" >> beam.io.WriteToTFRecord(
                    os.path.join(output_uri, f"Split-{s}", "data_tfrecord"),
                    file_name_suffix=".gz",
                )
            )
        self.write_report(report_prefix)

    def clean_split(self, p, s: str, pattern: str, key_files: list, clean_files: dict) -> None:
        """Pass 1 for split `s` (its files `pattern`): cleans its records and counts what
        a rule drops. Deduplicating, appends the key file's name to `key_files` and sets
        `clean_files[s]` to the temporary cleaned TFRecords' names; else
        `clean_files[s]` holds the kept (serialized example, record) pairs, counted."""
        cleaned = (
            p
            | f"Read[{s}]" >> beam.io.ReadFromTFRecord(pattern, compression_type="auto")
            | f"Parse[{s}]" >> beam.Map(_parse, split=s)
            | f"Clean[{s}]" >> beam.Map(clean, settings=self.settings).with_outputs(
                "clean", "dropped")
        )
        if self.dedup:
            self.count_and_sample(f"rules.{s}", cleaned.dropped)
            key_files.append(
                cleaned.clean
                | f"Keys[{s}]" >> beam.Map(keys, ordered=self.ordered, data=self.data)
                | f"WriteKeys[{s}]" >> beam.io.WriteToTFRecord(
                    os.path.join(self.tmp, f"keys-{s}")))
            clean_files[s] = (
                cleaned.clean
                | f"Serialize[{s}]" >> beam.Map(_to_example)
                | f"WriteClean[{s}]" >> beam.io.WriteToTFRecord(
                    os.path.join(self.tmp, f"clean-{s}")))
        else:
            kept = cleaned.clean | f"Pair[{s}]" >> beam.Map(lambda r: (_to_example(r), r))
            self.count_and_sample(s, cleaned.dropped, kept | f"Record[{s}]" >> beam.Map(
                lambda x: x[1]))
            clean_files[s] = kept

    def dedup_split(self, s: str, clean_files, duplicates):
        """Pass 3 for split `s`: its cleaned records read back (`clean_files`: the
        temporary files' names) without the `duplicates` (side input {doc key: (reason,
        kept doc key)}), counted. Returns the kept (serialized example, record) pairs."""
        deduped = (
            clean_files
            | f"ReadClean[{s}]" >> beam.io.ReadAllFromTFRecord()
            | f"DropDuplicates[{s}]" >> beam.Map(
                drop_duplicates, duplicates=duplicates, split=s, ordered=self.ordered
            ).with_outputs("kept", "dropped")
        )
        kept = deduped.kept
        self.count_and_sample(f"dedup.{s}", deduped.dropped,
                              kept | f"Record[{s}]" >> beam.Map(lambda x: x[1]))
        return kept

    def count_and_sample(self, name: str, dropped, kept=None) -> None:
        """Adds the counts of the `dropped` records by (split, source, reason) and of the
        `kept` ones (and their repairs) to `counts`, and a few dropped records per
        (source, reason) to `samples`; `name` makes the labels unique."""
        counted = [dropped | f"DroppedKey[{name}]" >> beam.Map(
            lambda r: ((r["split"], r["source_name"], r["reason"]), 1))]
        if kept is not None:
            counted.append(kept | f"KeptKey[{name}]" >> beam.FlatMap(
                lambda r: [((r["split"], r["source_name"], cleaning.KEPT), 1)]
                + [((r["split"], r["source_name"], REPAIR_PREFIX + x), 1)
                   for x in r["repairs"]]))
        for i, part in enumerate(counted):
            self.counts.append(part | f"Count[{name}.{i}]" >> beam.CombinePerKey(sum))
        self.samples.append(
            dropped
            | f"SampleKey[{name}]" >> beam.Map(
                lambda r: ((r["source_name"], r["reason"]),
                           (r["source"], r["record"], tuple(r.get("kept", ())))))
            | f"Sample[{name}]" >> beam.combiners.Top.SmallestPerKey(SAMPLES_PER_REASON))

    def write_report(self, report_prefix: str) -> None:
        """Writes every count (summed) and the first samples per (source, reason) as one
        JSON file, `report_prefix`: {"counts": [[key, n]], "samples": [[key, samples]]}."""
        all_counts = (
            self.counts
            | "AllCounts" >> beam.Flatten()
            | "Total" >> beam.CombinePerKey(sum)
            | "CountsToList" >> beam.combiners.ToList()
        )
        all_samples = (
            self.samples
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


# The pipeline's functions: module-level, pickled with their arguments. Their names are
# in the labels of their steps (`Clean[<split>]/Map(clean)`), hence in Beam's errors.


def clean(r: dict[str, Any], settings: dict[str, DataConfig]):
    """Cleans a record (`_parse` form) with its source's settings (`settings`: {source
    name: `DataConfig.for_source`}): a document, an SFT (or GRPO) record or a DPO record.

    Returns:
      The cleaned record (with its "reason" and added "repairs"), tagged "clean" when
      kept, else "dropped".

    Raises:
      DataValidationError: the record's `source_name` is not one of `settings`.
    """
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


def keys(r: dict[str, Any], ordered: list[str], data: DataConfig) -> bytes:
    """The key record (`record_keys`) of a cleaned record; `ordered`: `split_order`."""
    return record_keys(r, ordered.index(r["split"]), data)


def drop_duplicates(serialized: bytes, duplicates: dict, split: str, ordered: list[str]):
    """A cleaned record of `split` (a serialized example), tagged "kept" as (serialized,
    record), or "dropped" as a record with its reason and the copy that was kept when
    `duplicates` ({doc key: (reason, kept doc key)}) holds it; `ordered`: `split_order`."""
    r = _parse(serialized, split)
    found = duplicates.get(doc_key(ordered.index(split), r["source"], r["record"],
                                   r["source_name"]))
    if found:
        reason, kept_key = found
        return beam.pvalue.TaggedOutput("dropped", dict(
            r, text="", reason=reason, kept=parse_doc_key(kept_key, ordered)[1:]))
    return beam.pvalue.TaggedOutput("kept", (serialized, r))


def smallest(samples_lists):
    """The first `SAMPLES_PER_REASON` of some lists of samples, merged."""
    return sorted(x for xs in samples_lists for x in xs)[:SAMPLES_PER_REASON]


def read_report(report_prefix: str, splits: list[str], data: DataConfig) -> dict[str, Any]:
    """The report (`build_report`) of the counts and samples the pipeline wrote to
    `report_prefix` (JSON lists, their tuples read back as tuples)."""
    with tf.io.gfile.GFile(report_prefix) as f:
        raw = json.loads(f.read())
    return build_report([(tuple(k), n) for k, n in raw["counts"]],
                        [(tuple(k), [tuple(tuple(v) if isinstance(v, list) else v
                                           for v in x) for x in xs])
                         for k, xs in raw["samples"]],
                        splits, names=source_names(data.sources))


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
