"""DriftValidator's executor: text profile statistics with TFDV, drift against a baseline.

  per split: read cleaned TFRecords -> `profile.text_profile` -> tf.Example
             -> Arrow record batches -> tfdv.GenerateStatistics -> Split-<s>/FeatureStats.pb
  then, with a baseline: tfdv.validate_statistics(this, schema with Jensen-Shannon
  drift comparators, previous_statistics=baseline) per split present in both
  -> Split-<s>/SchemaDiff.pb, `drift_report.json`, ML Metadata custom properties.

Drift beyond `validation.drift_threshold` (lengths) or
`validation.token_drift_threshold` (tokens) (in a split of at least
`validation.drift_min_documents` documents) raises `DataValidationError` (the run
stops before Transform and training) unless `accept_drift` is 1; accepted drift
is recorded (`drift_accepted` = 1) and the run goes on.
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

from components.drift_validator import profile
from components.drift_validator.resolver import DRIFT_DETECTED_PROPERTY, TEXT_PROFILE_PROPERTY
from components.text_cleaner.executor import DataValidationError
from config import PipelineConfig

STATS_FILE = "FeatureStats.pb"
ANOMALIES_FILE = "SchemaDiff.pb"
REPORT_FILE = "drift_report.json"
# Exact token counts: sketches (Misra-Gries) distort the token distribution (the
# halves of Tiny Shakespeare measure 0.20 instead of 0.07). The counts are grouped
# per distinct token, so memory grows with the vocabulary, not with the corpus.
STATS_OPTIONS = tfdv.StatsOptions()


def _profile_example(serialized: bytes) -> bytes:
    example = tf.train.Example.FromString(serialized)
    values = example.features.feature["text"].bytes_list.value
    p = profile.text_profile(values[0].decode("utf-8") if values else "")
    feature = {
        "num_chars": tf.train.Feature(int64_list=tf.train.Int64List(value=p["num_chars"])),
        "num_words": tf.train.Feature(int64_list=tf.train.Int64List(value=p["num_words"])),
        "tokens": tf.train.Feature(bytes_list=tf.train.BytesList(value=p["tokens"])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


class _DecodeBatch(beam.DoFn):
    def setup(self):
        self._decoder = example_coder.ExamplesToRecordBatchDecoder()

    def process(self, batch):
        yield self._decoder.DecodeBatch(batch)


def _num_examples(statistics) -> int:
    return int(statistics.datasets[0].num_examples) if statistics.datasets else 0


def load_statistics(uri: str, split: str):
    return tfdv.load_stats_binary(os.path.join(uri, f"Split-{split}", STATS_FILE))


def compare(current, baseline, thresholds: dict[str, float]):
    """TFDV drift of `current` against `baseline` statistics (one split).

    Returns:
      (anomalies proto, {feature: Jensen-Shannon divergence}, {feature: description}
      of the features beyond the threshold).
    """
    schema = profile.drift_schema(current, thresholds)
    anomalies = tfdv.validate_statistics(current, schema, previous_statistics=baseline)
    return anomalies, profile.drift_measurements(anomalies), profile.drift_anomalies(anomalies)


class Executor(base_beam_executor.BaseBeamExecutor):
    """Computes the text profile of `examples` and compares it with the baseline."""

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 (TFX API)
        """Profiles every split of `examples` and gates on drift from the baseline.

        Args:
          input_dict: "examples" (one Examples artifact, TFRecords of tf.Example
            with a `text` feature, per split `Split-<s>/`) and, optionally,
            "baseline_statistics" (the first ExampleStatistics is the baseline;
            ignored unless `validation.check_drift`).
          output_dict: "statistics" (one ExampleStatistics) and "anomalies" (one
            ExampleAnomalies).
          exec_properties: "pipeline_config" (PipelineConfig JSON; its
            `validation` section) and "accept_drift" (optional int, 1: record
            drift without stopping).

        Writes `statistics/Split-<s>/FeatureStats.pb` (TFDV statistics of
        num_chars, num_words and tokens; custom property `text_profile` = 1);
        `anomalies/Split-<s>/SchemaDiff.pb` (TFDV drift anomalies, empty for a
        split without a baseline) and `anomalies/drift_report.json`; and on
        `anomalies` the custom properties `drift_<split>_<feature>` (Jensen-Shannon
        divergence), `baseline_statistics`, `drift_detected`, `drift_accepted`
        and `drift_report`.

        Raises:
          DataValidationError: a feature drifted beyond its threshold in a split
            of at least `validation.drift_min_documents` documents, and
            `accept_drift` is not 1 (the outputs above are written first).
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
                    | f"Profile[{s}]" >> beam.Map(_profile_example)
                    | f"Batch[{s}]" >> beam.BatchElements(min_batch_size=64, max_batch_size=1000)
                    | f"Decode[{s}]" >> beam.ParDo(_DecodeBatch())
                    | f"Statistics[{s}]" >> tfdv.GenerateStatistics(STATS_OPTIONS)
                    | f"Write[{s}]" >> tfdv.WriteStatisticsToBinaryFile(
                        os.path.join(statistics.uri, f"Split-{s}", STATS_FILE))
                )
        statistics.set_int_custom_property(TEXT_PROFILE_PROPERTY, 1)

        thresholds = {"num_chars": config.drift_threshold, "num_words": config.drift_threshold,
                      "tokens": config.token_drift_threshold}
        report = {"baseline": baseline.uri if baseline else None,
                  "thresholds": thresholds, "splits": {}, "drift": {},
                  "not_gated": {}}
        baseline_splits = (set(artifact_utils.decode_split_names(baseline.split_names))
                           if baseline else set())
        for s in splits:
            anomalies = None
            if s in baseline_splits:
                current, previous = load_statistics(statistics.uri, s), load_statistics(baseline.uri, s)
                anomalies, measured, drifted = compare(current, previous, thresholds)
                report["splits"][s] = measured
                for feature, value in measured.items():
                    anomalies_out.set_float_custom_property(f"drift_{s}_{feature}", value)
                documents = min(_num_examples(current), _num_examples(previous))
                for feature, description in drifted.items():
                    if documents >= config.drift_min_documents:
                        report["drift"][f"{s}/{feature}"] = description
                    else:
                        report["not_gated"][f"{s}/{feature}"] = (
                            f"{description} Not gated: {documents} documents "
                            f"< validation.drift_min_documents={config.drift_min_documents}.")
            path = os.path.join(anomalies_out.uri, f"Split-{s}", ANOMALIES_FILE)
            tf.io.gfile.makedirs(os.path.dirname(path))
            with tf.io.gfile.GFile(path, "wb") as f:
                f.write(anomalies.SerializeToString() if anomalies is not None else b"")
        report["accepted"] = bool(report["drift"]) and accept
        with tf.io.gfile.GFile(os.path.join(anomalies_out.uri, REPORT_FILE), "w") as f:
            json.dump(report, f, indent=2, sort_keys=True)
        anomalies_out.set_string_custom_property("baseline_statistics", report["baseline"] or "")
        anomalies_out.set_int_custom_property(DRIFT_DETECTED_PROPERTY, int(bool(report["drift"])))
        anomalies_out.set_int_custom_property("drift_accepted", int(report["accepted"]))
        anomalies_out.set_json_value_custom_property("drift_report", report)
        if report["drift"] and not accept:
            lines = [f"{name}: {text}" for name, text in sorted(report["drift"].items())]
            raise DataValidationError(
                "the data drifted from the run of the latest blessed model; the pipeline stops "
                "before training:\n  " + "\n  ".join(lines)
                + f"\n(baseline statistics: {baseline.uri}; this run's: {statistics.uri})"
                + "\nIf the change is intended, re-run with --accept-drift "
                "(or raise validation.drift_threshold / validation.token_drift_threshold)."
            )
