"""TextCleaner's executor: a Beam pipeline over the ExampleGen splits.

  read TFRecords -> clean_document -> exact de-duplication across splits
  -> near-duplicate removal (MinHash LSH) -> write cleaned TFRecords per split,
  and count every record by reason and every repair by kind.

Duplicates are resolved deterministically: the copy in `train` wins over `eval`,
then the lowest (source, record). The counts and a few rejected records per reason
(file and record number) are written to `cleaning_report.json` in the output
artifact and set as custom properties on it, so ML Metadata shows
`records_read`, `records_kept`, `records_dropped`, `dropped_<reason>` and
`repaired_<kind>` (changes to kept records: invalid UTF-8 replaced, NUL bytes
removed, long documents split, PII redacted, ...).

Before any work, the ExampleValidator's anomalies are checked: data with
anomalies stops the pipeline here, before Transform and training.
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

from components.text_cleaner import cleaning
from pipeline.configs import PipelineConfig

REPORT_FILE = "cleaning_report.json"
REPAIR_PREFIX = "repair:"
_SAMPLES_PER_REASON = 5
_SPLIT_PRIORITY = {"train": 0, "eval": 1}


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
        "record": int(f["record"].int64_list.value[0]),
        "reject_reason": _first_string(f, "reject_reason"),
        "repairs": [x for x in _first_string(f, "repairs").split(",") if x],
    }


def _first_string(features, name: str) -> str:
    values = features[name].bytes_list.value if name in features else []
    return values[0].decode("utf-8") if values else ""


def _to_example(record: dict[str, Any]) -> bytes:
    from components.text_example_gen.documents import Document
    from components.text_example_gen.executor import document_to_example

    doc = Document(record["text"], record["source"], record["record"],
                   repairs=tuple(record["repairs"]))
    return document_to_example(doc).SerializeToString()


def _doc_key(r: dict[str, Any]) -> tuple:
    """The keep-first order of duplicates: train before eval, then file and record."""
    return (_SPLIT_PRIORITY.get(r["split"], 9), r["source"], r["record"])


def _resolve_duplicates(key_and_records):
    """Keeps one record per content key; the others are duplicates."""
    _, records = key_and_records
    records = sorted(records, key=_doc_key)
    yield beam.pvalue.TaggedOutput("kept", records[0])
    for r in records[1:]:
        yield beam.pvalue.TaggedOutput("dropped", dict(r, reason=cleaning.DROP_EXACT_DUPLICATE))


@beam.typehints.with_input_types(dict)
class _RemoveNearDuplicates(beam.PTransform):
    """Drops documents whose estimated Jaccard similarity (MinHash over word
    n-grams) with an earlier document (`_doc_key` order) reaches the threshold.

    LSH banding finds the candidate pairs: documents that agree on all rows of
    at least one of b bands (b, r chosen by datasketch for the threshold); each
    candidate pair is then checked on the full signature. Outputs `kept` and
    `dropped` (reason `near_duplicate`).
    """

    def __init__(self, data):
        super().__init__()
        self._data = data

    def expand(self, records):
        data = self._data
        bands, rows = cleaning.lsh_parameters(data.near_dedup_threshold, data.near_dedup_num_perm)

        def signature(r):
            sig = cleaning.minhash_signature(r["text"], data.near_dedup_num_perm,
                                             data.near_dedup_ngram)
            return _doc_key(r), sig

        def band_keys(key_sig):
            key, sig = key_sig
            return [(band, (key, sig)) for band in cleaning.lsh_bands(sig, bands, rows)]

        def duplicates_in_bucket(bucket):
            _, members = bucket
            members = sorted(members, key=lambda m: m[0])
            for i, (key, sig) in enumerate(members):
                for earlier_key, earlier_sig in members[:i]:
                    if cleaning.estimated_jaccard(sig, earlier_sig) >= data.near_dedup_threshold:
                        yield key, earlier_key
                        break

        keyed = records | "KeyByDoc" >> beam.Map(lambda r: (_doc_key(r), r))
        duplicate_of = (
            records
            | "MinHash" >> beam.Map(signature)
            | "Bands" >> beam.FlatMap(band_keys)
            | "GroupByBand" >> beam.GroupByKey()
            | "PairsInBucket" >> beam.FlatMap(duplicates_in_bucket)
            | "FirstOriginal" >> beam.CombinePerKey(min)
        )

        def split(joined):
            _, grouped = joined
            (record,) = grouped["record"]
            if grouped["duplicate_of"]:
                yield beam.pvalue.TaggedOutput(
                    "dropped", dict(record, reason=cleaning.DROP_NEAR_DUPLICATE))
            else:
                yield beam.pvalue.TaggedOutput("kept", record)

        return (
            {"record": keyed, "duplicate_of": duplicate_of}
            | "JoinDuplicates" >> beam.CoGroupByKey()
            | "SplitNear" >> beam.FlatMap(split).with_outputs("kept", "dropped")
        )


class Executor(base_beam_executor.BaseBeamExecutor):
    """Cleans the `examples` splits into `cleaned_examples`."""

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 (TFX API)
        config = PipelineConfig.from_json(exec_properties["pipeline_config"])
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        anomalies = artifact_utils.get_single_instance(input_dict["anomalies"])
        output = artifact_utils.get_single_instance(output_dict["cleaned_examples"])
        check_anomalies(anomalies)

        splits = artifact_utils.decode_split_names(examples.split_names)
        output.split_names = artifact_utils.encode_split_names(splits)
        report_prefix = os.path.join(output.uri, "_report", "counts")
        data = config.data

        with self._make_beam_pipeline() as p:
            records = [
                p
                | f"Read[{s}]" >> beam.io.ReadFromTFRecord(
                    os.path.join(examples.uri, f"Split-{s}", "*"), compression_type="auto"
                )
                | f"Parse[{s}]" >> beam.Map(_parse, split=s)
                for s in splits
            ] | "Flatten" >> beam.Flatten()

            def clean(r):
                text, reason, repairs = cleaning.clean_document(r["text"], r["reject_reason"], data)
                r = dict(r, text=text, reason=reason, repairs=r["repairs"] + repairs)
                tag = "clean" if reason == cleaning.KEPT else "dropped"
                return beam.pvalue.TaggedOutput(tag, r)

            cleaned = records | "Clean" >> beam.Map(clean).with_outputs("clean", "dropped")
            if data.deduplicate:
                dedup = (
                    cleaned.clean
                    | "KeyByContent" >> beam.Map(lambda r: (cleaning.content_key(r["text"]), r))
                    | "GroupByContent" >> beam.GroupByKey()
                    | "ResolveDuplicates" >> beam.FlatMap(_resolve_duplicates).with_outputs(
                        "kept", "dropped"
                    )
                )
                kept, duplicates = dedup.kept, dedup.dropped
                dropped = (cleaned.dropped, duplicates) | "AllDropped" >> beam.Flatten()
            else:
                kept, dropped = cleaned.clean, cleaned.dropped
            if data.near_dedup:
                near = kept | "NearDuplicates" >> _RemoveNearDuplicates(data)
                kept = near.kept
                dropped = (dropped, near.dropped) | "AllDroppedNear" >> beam.Flatten()

            for s in splits:
                _ = (
                    kept
                    | f"Only[{s}]" >> beam.Filter(lambda r, s=s: r["split"] == s)
                    | f"Serialize[{s}]" >> beam.Map(_to_example)
                    | f"Write[{s}]" >> beam.io.WriteToTFRecord(
                        os.path.join(output.uri, f"Split-{s}", "data_tfrecord"),
                        file_name_suffix=".gz",
                    )
                )

            counts = (
                (
                    kept | "KeptKey" >> beam.Map(lambda r: ((r["split"], cleaning.KEPT), 1)),
                    dropped | "DroppedKey" >> beam.Map(lambda r: ((r["split"], r["reason"]), 1)),
                    kept | "RepairKeys" >> beam.FlatMap(
                        lambda r: [((r["split"], REPAIR_PREFIX + x), 1) for x in r["repairs"]]),
                )
                | "AllKeys" >> beam.Flatten()
                | "Count" >> beam.CombinePerKey(sum)
                | "CountsToList" >> beam.combiners.ToList()
            )
            samples = (
                dropped
                | "SampleKey" >> beam.Map(lambda r: (r["reason"], (r["source"], r["record"])))
                | "Sample" >> beam.combiners.Top.SmallestPerKey(_SAMPLES_PER_REASON)
                | "SamplesToList" >> beam.combiners.ToList()
            )
            _ = (
                counts
                | "Report" >> beam.Map(
                    lambda c, s: json.dumps({"counts": c, "samples": s}), s=beam.pvalue.AsSingleton(samples)
                )
                | "WriteReport" >> beam.io.WriteToText(report_prefix, num_shards=1, shard_name_template="")
            )

        with tf.io.gfile.GFile(report_prefix) as f:
            raw = json.loads(f.read())
        report = build_report(raw["counts"], raw["samples"], splits)
        with tf.io.gfile.GFile(os.path.join(output.uri, REPORT_FILE), "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        record_report(output, report)
        check_reject_fraction(report, data.max_reject_fraction)


def build_report(counts, samples, splits) -> dict[str, Any]:
    """Per-split and total counts: read = kept + dropped, dropped by reason."""
    per_split: dict[str, dict[str, Any]] = {
        s: {"read": 0, "kept": 0, "dropped": 0, "dropped_by_reason": {}, "repaired": {}}
        for s in splits
    }
    for (split, reason), n in counts:
        entry = per_split[split]
        if reason.startswith(REPAIR_PREFIX):  # a change to a kept record, not a record
            name = reason[len(REPAIR_PREFIX):]
            entry["repaired"][name] = entry["repaired"].get(name, 0) + n
            continue
        entry["read"] += n
        if reason == cleaning.KEPT:
            entry["kept"] += n
        else:
            entry["dropped"] += n
            entry["dropped_by_reason"][reason] = entry["dropped_by_reason"].get(reason, 0) + n
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
        "rejected_samples": {reason: [list(x) for x in xs] for reason, xs in samples},
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
    artifact.set_json_value_custom_property("cleaning_report", report)


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
