"""DriftValidator's executor: text profile statistics with TFDV, drift against a baseline.

  per split: read cleaned TFRecords -> `profile.text_profile` (+ `source_name`) -> tf.Example
             -> Arrow record batches -> tfdv.GenerateStatistics sliced by `source_name`
             -> Split-<s>/FeatureStats.pb (datasets: "All Examples", source_name_<source>...)
  then, with a baseline: tfdv.validate_statistics(this, schema with Jensen-Shannon
  drift comparators, previous_statistics=baseline) per split present in both, on
  the overall dataset and, for a mixture, on each source's slice against the same
  source's slice of the baseline
  -> Split-<s>/SchemaDiff.pb (overall), Split-<s>/source_name_<source>/SchemaDiff.pb,
  `drift_report.json`, ML Metadata custom properties.

Drift beyond `validation.drift_threshold` (lengths) or
`validation.token_drift_threshold` (tokens) (in a split of at least
`validation.drift_min_documents` documents) raises `DataValidationError` (the run
stops before Transform and training) unless `accept_drift` is 1; accepted drift
is recorded (`drift_accepted` = 1) and the run goes on.

One source (this run's and the baseline's records are all of the source "default",
or the baseline predates sources): the overall statistics are compared and gated,
exactly as before sources. A mixture (any other source on either side): each source
is compared with the same source of the baseline and gated on its own (its own
document count against `drift_min_documents`); the overall drift is still measured
and recorded (`drift_<split>_<feature>`) but not gated, since a new source or new
proportions move it without any source changing. A source only in this run is
recorded as "new source: no baseline", one only in the baseline as absent now;
neither is drift.
"""

from __future__ import annotations

import json
import os

import apache_beam as beam
import tensorflow as tf
import tensorflow_data_validation as tfdv
from tfx.dsl.components.base import base_beam_executor
from tfx.types import artifact_utils
from tfx_bsl.coders import example_coder
from tfx_bsl.public.proto import slicing_spec_pb2

from components.drift_validator import profile
from components.drift_validator.resolver import DRIFT_DETECTED_PROPERTY, TEXT_PROFILE_PROPERTY
from components.text_cleaner.executor import DataValidationError
from config import PipelineConfig
from config.sources import DEFAULT_SOURCE

STATS_FILE = "FeatureStats.pb"
ANOMALIES_FILE = "SchemaDiff.pb"
REPORT_FILE = "drift_report.json"
DRIFT_BY_SOURCE_PROPERTY = "drift_by_source"
NEW_SOURCE = "new source: no baseline"
ABSENT_SOURCE = "absent now: a source of the baseline only"
# Exact token counts: sketches (Misra-Gries) distort the token distribution (the
# halves of Tiny Shakespeare measure 0.20 instead of 0.07). The counts are grouped
# per distinct token, so memory grows with the vocabulary, not with the corpus.
# Sliced by source: the overall dataset plus one per value of `source_name`.
STATS_OPTIONS = tfdv.StatsOptions(slicing_config=slicing_spec_pb2.SlicingConfig(
    slicing_specs=[slicing_spec_pb2.SlicingSpec(feature_keys=[profile.SOURCE_NAME_FEATURE])]))


def _profile_example(serialized: bytes) -> bytes:
    example = tf.train.Example.FromString(serialized)
    values = example.features.feature["text"].bytes_list.value
    p = profile.text_profile(values[0].decode("utf-8") if values else "")
    feature = {
        "num_chars": tf.train.Feature(int64_list=tf.train.Int64List(value=p["num_chars"])),
        "num_words": tf.train.Feature(int64_list=tf.train.Int64List(value=p["num_words"])),
        "tokens": tf.train.Feature(bytes_list=tf.train.BytesList(value=p["tokens"])),
        profile.SOURCE_NAME_FEATURE: tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[profile.source_name(example).encode("utf-8")])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


class _DecodeBatch(beam.DoFn):
    def setup(self):
        self._decoder = example_coder.ExamplesToRecordBatchDecoder()

    def process(self, batch):
        yield self._decoder.DecodeBatch(batch)


@beam.ptransform_fn
def ProfileStatistics(examples):  # noqa: N802 (a Beam PTransform)
    """Serialized cleaned tf.Examples (`text`, optional `source_name`) -> one
    DatasetFeatureStatisticsList of their text profile: the overall dataset and one
    slice per source, without the `source_name` feature itself."""
    return (
        examples
        | "Profile" >> beam.Map(_profile_example)
        | "Batch" >> beam.BatchElements(min_batch_size=64, max_batch_size=1000)
        | "Decode" >> beam.ParDo(_DecodeBatch())
        | "Statistics" >> tfdv.GenerateStatistics(STATS_OPTIONS)
        | "DropSourceName" >> beam.Map(profile.without_feature, profile.SOURCE_NAME_FEATURE)
    )


def _num_examples(statistics) -> int:
    return int(statistics.datasets[0].num_examples) if statistics.datasets else 0


def load_statistics(uri: str, split: str):
    return tfdv.load_stats_binary(os.path.join(uri, f"Split-{split}", STATS_FILE))


def compare(current, baseline, thresholds: dict[str, float]):
    """TFDV drift of `current` against `baseline` statistics (one split): of their
    overall datasets when they are sliced by source (`profile.source_slices`).

    Returns:
      (anomalies proto, {feature: Jensen-Shannon divergence}, {feature: description}
      of the features beyond the threshold).
    """
    current, baseline = profile.source_slices(current)[0], profile.source_slices(baseline)[0]
    schema = profile.drift_schema(current, thresholds)
    anomalies = tfdv.validate_statistics(current, schema, previous_statistics=baseline)
    return anomalies, profile.drift_measurements(anomalies), profile.drift_anomalies(anomalies)


def compare_split(current_all, baseline_all, thresholds: dict[str, float],
                  min_documents: int, split: str) -> dict:
    """Drift of one split: overall, and per source for a mixture.

    Args:
      current_all, baseline_all: the split's profile statistics
        (DatasetFeatureStatisticsList; sliced by source or, for a run before
        sources, one dataset).
      thresholds: {feature: Jensen-Shannon threshold}.
      min_documents: fewer documents (the smaller side) are measured, not gated.
      split: the split's name, for the keys of "drift" and "not_gated".

    Returns:
      {"anomalies": overall Anomalies proto, "measured": {feature: JSD} overall,
       "drift": {key: description} (gated), "not_gated": {key: description},
       "mixture": bool, "by_source": {source: entry}, "source_anomalies": {source:
       Anomalies}}; keys are "<split>/<feature>" for one source and
       "source <name>, <split>/<feature>" per source of a mixture. An entry is
       {"drift": {feature: JSD}, "documents": n, "baseline_documents": m}, or
       {"status": NEW_SOURCE, "documents": n}, or {"status": ABSENT_SOURCE,
       "baseline_documents": m}.

    Raises:
      ValueError: statistics sliced otherwise than by source (`profile.source_slices`).
    """
    current, current_sources = profile.source_slices(current_all)
    previous, previous_sources = profile.source_slices(baseline_all)
    anomalies, measured, drifted = compare(current, previous, thresholds)
    mixture = set(current_sources) | set(previous_sources) != {DEFAULT_SOURCE}
    out = {"anomalies": anomalies, "measured": measured, "drift": {}, "not_gated": {},
           "mixture": mixture, "by_source": {}, "source_anomalies": {}}

    def gate(key, description, documents, why_not=""):
        if documents >= min_documents and not why_not:
            out["drift"][key] = description
        else:
            out["not_gated"][key] = f"{description} Not gated: " + (why_not or (
                f"{documents} documents < validation.drift_min_documents={min_documents}."))

    documents = min(_num_examples(current), _num_examples(previous))
    for feature, description in drifted.items():
        gate(f"{split}/{feature}", description, documents,
             "a mixture is gated per source." if mixture else "")
    if not mixture:
        return out
    for name in sorted(set(current_sources) | set(previous_sources)):
        if name not in previous_sources:
            out["by_source"][name] = {"status": NEW_SOURCE,
                                      "documents": _num_examples(current_sources[name])}
            continue
        if name not in current_sources:
            out["by_source"][name] = {"status": ABSENT_SOURCE,
                                      "baseline_documents": _num_examples(previous_sources[name])}
            continue
        now, before = current_sources[name], previous_sources[name]
        source_anomalies, source_measured, source_drifted = compare(now, before, thresholds)
        out["source_anomalies"][name] = source_anomalies
        out["by_source"][name] = {"drift": source_measured, "documents": _num_examples(now),
                                  "baseline_documents": _num_examples(before)}
        for feature, description in source_drifted.items():
            gate(f"source {name}, {split}/{feature}", description,
                 min(_num_examples(now), _num_examples(before)))
    return out


class Executor(base_beam_executor.BaseBeamExecutor):
    """Computes the text profile of `examples` and compares it with the baseline."""

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 (TFX API)
        """Profiles every split of `examples` and gates on drift from the baseline.

        Args:
          input_dict: "examples" (one Examples artifact, TFRecords of tf.Example
            with a `text` feature and optionally `source_name` (bytes, one value),
            per split `Split-<s>/`) and, optionally, "baseline_statistics" (the
            first ExampleStatistics is the baseline; ignored unless
            `validation.check_drift`).
          output_dict: "statistics" (one ExampleStatistics) and "anomalies" (one
            ExampleAnomalies).
          exec_properties: "pipeline_config" (PipelineConfig JSON; its
            `validation` section) and "accept_drift" (optional int, 1: record
            drift without stopping).

        Writes `statistics/Split-<s>/FeatureStats.pb` (TFDV statistics of
        num_chars, num_words and tokens: the overall dataset and one slice per
        source; custom property `text_profile` = 1); `anomalies/Split-<s>/SchemaDiff.pb`
        (TFDV drift anomalies of the overall statistics, empty for a split without
        a baseline), for a mixture `anomalies/Split-<s>/source_name_<source>/SchemaDiff.pb`
        per source compared, and `anomalies/drift_report.json`; and on `anomalies`
        the custom properties `drift_<split>_<feature>` (Jensen-Shannon divergence,
        overall), `baseline_statistics`, `drift_detected`, `drift_accepted`,
        `drift_report` and, for a mixture, `drift_by_source` (JSON {source: {split:
        entry}}, entries as `compare_split` gives them).

        Raises:
          DataValidationError: a feature drifted beyond its threshold in a split
            (for a mixture: in a source of a split) of at least
            `validation.drift_min_documents` documents, and `accept_drift` is not 1
            (the outputs above are written first).
          ValueError: a cleaned example's `source_name` is not one source name.
        """
        config = PipelineConfig.from_json(exec_properties["pipeline_config"]).validation
        accept = bool(exec_properties.get("accept_drift") or 0)
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        baselines = input_dict.get("baseline_statistics") or []
        baseline = baselines[0] if baselines and config.check_drift else None
        statistics = artifact_utils.get_single_instance(output_dict["statistics"])
        anomalies_out = artifact_utils.get_single_instance(output_dict["anomalies"])

        splits = artifact_utils.decode_split_names(examples.split_names)
        for artifact in (statistics, anomalies_out):
            artifact.split_names = artifact_utils.encode_split_names(splits)
        with self._make_beam_pipeline() as p:
            for s in splits:
                _ = (
                    p
                    | f"Read[{s}]" >> beam.io.ReadFromTFRecord(
                        os.path.join(examples.uri, f"Split-{s}", "*"), compression_type="auto")
                    | f"ProfileStatistics[{s}]" >> ProfileStatistics()
                    | f"Write[{s}]" >> tfdv.WriteStatisticsToBinaryFile(
                        os.path.join(statistics.uri, f"Split-{s}", STATS_FILE))
                )
        statistics.set_int_custom_property(TEXT_PROFILE_PROPERTY, 1)

        report = compare_splits(statistics.uri, baseline, splits, config, anomalies_out)
        record_drift_report(anomalies_out, report, accept)
        if report["drift"] and not accept:
            raise drift_error(report, baseline.uri, statistics.uri)


def compare_splits(statistics_uri: str, baseline, splits: list[str], config,
                   anomalies_out) -> dict:
    """Compares each split's statistics (in `statistics_uri`) with the same split of the
    `baseline` ExampleStatistics (None: no baseline), writes each split's anomalies
    (`Split-<s>/SchemaDiff.pb`, empty without a baseline; per source for a mixture) to
    `anomalies_out` and sets its `drift_<split>_<feature>` custom properties.

    Args:
      statistics_uri: this run's ExampleStatistics' URI.
      baseline: the baseline ExampleStatistics artifact, or None.
      splits: this run's splits.
      config: the pipeline config's `validation` section.
      anomalies_out: the ExampleAnomalies artifact.

    Returns:
      The drift report: {"baseline": its URI or None, "thresholds", "splits": {split:
      {feature: JSD}}, "drift": {key: description} (gated), "not_gated", and
      "by_source": {source: {split: entry}} for a mixture (`compare_split`)}.

    Raises:
      ValueError: statistics sliced otherwise than by source (`compare_split`).
    """
    thresholds = {"num_chars": config.drift_threshold, "num_words": config.drift_threshold,
                  "tokens": config.token_drift_threshold}
    report = {"baseline": baseline.uri if baseline else None,
              "thresholds": thresholds, "splits": {}, "drift": {},
              "not_gated": {}}
    by_source: dict[str, dict[str, dict]] = {}
    baseline_splits = (set(artifact_utils.decode_split_names(baseline.split_names))
                       if baseline else set())
    for s in splits:
        anomalies = None
        if s in baseline_splits:
            result = compare_split(load_statistics(statistics_uri, s),
                                   load_statistics(baseline.uri, s), thresholds,
                                   config.drift_min_documents, s)
            anomalies = result["anomalies"]
            _add_split(report, by_source, anomalies_out, s, result)
        _write(os.path.join(anomalies_out.uri, f"Split-{s}", ANOMALIES_FILE),
               anomalies.SerializeToString() if anomalies is not None else b"")
    if by_source:
        report["by_source"] = by_source
    return report


def _add_split(report: dict, by_source: dict, anomalies_out, split: str, result: dict) -> None:
    """Adds split `split`'s drift (`result`: `compare_split`'s) to `report` and
    `by_source` ({source: {split: entry}}), sets its `drift_<split>_<feature>` properties
    on `anomalies_out` and writes its sources' anomalies there."""
    report["splits"][split] = result["measured"]
    for feature, value in result["measured"].items():
        anomalies_out.set_float_custom_property(f"drift_{split}_{feature}", value)
    report["drift"].update(result["drift"])
    report["not_gated"].update(result["not_gated"])
    for name, entry in result["by_source"].items():
        by_source.setdefault(name, {})[split] = entry
    for name, source_anomalies in result["source_anomalies"].items():
        _write(os.path.join(anomalies_out.uri, f"Split-{split}",
                            profile.SOURCE_SLICE_PREFIX + name, ANOMALIES_FILE),
               source_anomalies.SerializeToString())


def record_drift_report(anomalies_out, report: dict, accept: bool) -> None:
    """Marks `report` (`compare_splits`') accepted (drift and `accept`), writes it to
    `drift_report.json` in `anomalies_out` and sets the artifact's custom properties
    `baseline_statistics`, `drift_detected`, `drift_accepted`, `drift_report` and, for a
    mixture, `drift_by_source`."""
    by_source = report.get("by_source")
    report["accepted"] = bool(report["drift"]) and accept
    with tf.io.gfile.GFile(os.path.join(anomalies_out.uri, REPORT_FILE), "w") as f:
        json.dump(report, f, indent=2, sort_keys=True)
    anomalies_out.set_string_custom_property("baseline_statistics", report["baseline"] or "")
    anomalies_out.set_int_custom_property(DRIFT_DETECTED_PROPERTY, int(bool(report["drift"])))
    anomalies_out.set_int_custom_property("drift_accepted", int(report["accepted"]))
    anomalies_out.set_json_value_custom_property("drift_report", report)
    if by_source:
        anomalies_out.set_json_value_custom_property(DRIFT_BY_SOURCE_PROPERTY, by_source)


def drift_error(report: dict, baseline_uri: str, statistics_uri: str) -> DataValidationError:
    """The error that stops the run on the gated drift of `report` (`compare_splits`'),
    naming each drifted feature, both statistics' URIs and how to go on."""
    lines = [f"{name}: {text}" for name, text in sorted(report["drift"].items())]
    return DataValidationError(
        "the data drifted from the run of the latest blessed model; the pipeline stops "
        "before training:\n  " + "\n  ".join(lines)
        + f"\n(baseline statistics: {baseline_uri}; this run's: {statistics_uri})"
        + "\nIf the change is intended, re-run with --accept-drift "
        "(or raise validation.drift_threshold / validation.token_drift_threshold)."
    )


def _write(path: str, data: bytes) -> None:
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, "wb") as f:
        f.write(data)
