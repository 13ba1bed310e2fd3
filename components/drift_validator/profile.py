"""The text profile compared between runs, and the drift rules; free of Beam and TFX.

Each kept document becomes one profile record (a tf.Example) with:

  num_chars  int64         Unicode characters of the cleaned text
  num_words  int64         words (`text_cleaner.words.word_units`: whitespace-separated,
                           and each character of a script written without spaces)
  tokens     bytes list    lower-cased word and punctuation tokens; in Chinese,
                           Japanese, Thai, ... single characters (`token_units`)

`tokens` is a pre-tokenization, not the learned tokenizer: a tokenizer learned by
another run has other ids, while these tokens compare between runs in any language.

TFDV computes statistics of the profile (histograms and quantiles of the
lengths; value counts of the tokens). Drift is the Jensen-Shannon divergence
between this run's distribution and the baseline's, per feature and split,
computed by TFDV's drift comparator (`tfdv.validate_statistics(...,
previous_statistics=...)`): over the histogram buckets for the lengths, over
the token frequencies for `tokens` (TFDV documentation, "Drift and skew
detection"; JSD(P‖Q) = ½ KL(P‖M) + ½ KL(Q‖M), M = ½(P+Q), base 2, in [0, 1]).

Sources (issue 28): each profile record also carries `source_name`, the mixture source
of its document ("default" when the cleaned example has none: one source, or examples
made before sources existed). TFDV slices the statistics by it: the overall dataset
(`OVERALL_SLICE`, as before sources) and one dataset per source (`source_name_<name>`).
The `source_name` feature itself is dropped from the statistics (`without_feature`), so
the overall dataset is what it was before sources; `source_slices` splits the list.
"""

from __future__ import annotations

from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from config.sources import DEFAULT_SOURCE, SOURCE_NAME
from corpus.words import token_units, word_units

PROFILE_FEATURES = ("num_chars", "num_words", "tokens")
# The feature naming a record's mixture source (the shared design of issue 28: bytes,
# one value; `components.transform.preprocessing.SOURCE_NAME_KEY` for transformed data).
SOURCE_NAME_FEATURE = "source_name"
# TFDV's name of the unsliced dataset (`tensorflow_data_validation.constants.DEFAULT_SLICE_KEY`),
# and of a feature-value slice: "<feature>_<value>" (`tfdv.experimental_get_feature_value_slicer`).
OVERALL_SLICE = "All Examples"
SOURCE_SLICE_PREFIX = SOURCE_NAME_FEATURE + "_"


def text_profile(text: str) -> dict[str, list]:
    """{"num_chars": [int], "num_words": [int], "tokens": [bytes, ...]} of one document."""
    return {
        "num_chars": [len(text)],
        "num_words": [len(word_units(text))],
        "tokens": [t.encode("utf-8") for t in token_units(text)],
    }


def source_name(example) -> str:
    """The `source_name` of a cleaned tf.Example ("default" without one).

    Raises:
      ValueError: `source_name` has other than one value, or one that is not a
        source name (`[a-z0-9_]+`); the message names the document (source, record).
    """
    features = example.features.feature
    if SOURCE_NAME_FEATURE not in features:
        return DEFAULT_SOURCE
    values = features[SOURCE_NAME_FEATURE].bytes_list.value
    name = values[0].decode("utf-8", "replace") if len(values) == 1 else None
    if name is None or not SOURCE_NAME.fullmatch(name):
        source = b"".join(features["source"].bytes_list.value[:1]).decode("utf-8", "replace")
        record = list(features["record"].int64_list.value[:1])
        what = (f"{len(values)} values" if name is None
                else f"{name!r}, not a source name ([a-z0-9_]+)")
        raise ValueError(f"cleaned example (source {source!r}, record "
                         f"{record[0] if record else '?'}): {SOURCE_NAME_FEATURE} "
                         f"has {what}; it must be exactly one source name")
    return name


def drift_schema(statistics: statistics_pb2.DatasetFeatureStatisticsList,
                 thresholds: dict[str, float]) -> schema_pb2.Schema:
    """A schema inferred from `statistics`, with a Jensen-Shannon drift comparator
    on every profile feature (`thresholds[feature]`) and no value domains (new
    tokens are expected; only the shift of the distributions counts).

    Raises:
      ValueError: the statistics lack a profile feature.
    """
    import tensorflow_data_validation as tfdv

    schema = tfdv.infer_schema(statistics, max_string_domain_size=0)
    names = {f.name for f in schema.feature}
    missing = sorted(set(PROFILE_FEATURES) - names)
    if missing:
        raise ValueError(f"profile statistics lack the features {missing}")
    for feature in schema.feature:
        feature.ClearField("domain")
        feature.ClearField("presence")
        feature.ClearField("value_count")
        feature.drift_comparator.jensen_shannon_divergence.threshold = thresholds[feature.name]
    del schema.string_domain[:]
    return schema


def drift_measurements(anomalies: anomalies_pb2.Anomalies) -> dict[str, float]:
    """{feature: Jensen-Shannon divergence} from TFDV's `drift_skew_info`."""
    out = {}
    for info in anomalies.drift_skew_info:
        name = ".".join(info.path.step)
        for m in info.drift_measurements:
            if m.type == anomalies_pb2.DriftSkewInfo.Measurement.JENSEN_SHANNON_DIVERGENCE:
                out[name] = float(m.value)
    return out


def drift_anomalies(anomalies: anomalies_pb2.Anomalies) -> dict[str, str]:
    """{feature: description} of the drift anomalies TFDV raised."""
    out = {}
    for name, info in anomalies.anomaly_info.items():
        reasons = [r for r in info.reason
                   if r.type in (anomalies_pb2.AnomalyInfo.COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH,
                                 anomalies_pb2.AnomalyInfo.COMPARATOR_L_INFTY_HIGH)]
        if reasons:
            out[name] = "; ".join(r.description for r in reasons)
    return out


def without_feature(statistics: statistics_pb2.DatasetFeatureStatisticsList,
                    name: str) -> statistics_pb2.DatasetFeatureStatisticsList:
    """A copy of `statistics` without the feature `name` in any dataset (slice)."""
    out = statistics_pb2.DatasetFeatureStatisticsList()
    out.CopyFrom(statistics)
    for dataset in out.datasets:
        kept = [f for f in dataset.features if ".".join(f.path.step) != name and f.name != name]
        del dataset.features[:]
        dataset.features.extend(kept)
    return out


def source_slices(statistics: statistics_pb2.DatasetFeatureStatisticsList) -> tuple[
        statistics_pb2.DatasetFeatureStatisticsList,
        dict[str, statistics_pb2.DatasetFeatureStatisticsList]]:
    """(the overall statistics, {source name: that source's statistics}), each a
    one-dataset list as `tfdv.validate_statistics` takes it.

    Statistics without source slices (one dataset: a run before sources) are the
    source "default" as a whole: `(statistics, {"default": statistics})`.

    Raises:
      ValueError: several datasets and none is the overall one (`OVERALL_SLICE`), or
        a dataset that is neither the overall one nor a source slice.
    """
    def single(dataset):
        out = statistics_pb2.DatasetFeatureStatisticsList()
        out.datasets.add().CopyFrom(dataset)
        return out

    if len(statistics.datasets) <= 1:
        return statistics, {DEFAULT_SOURCE: statistics}
    overall, sources = None, {}
    for dataset in statistics.datasets:
        if dataset.name == OVERALL_SLICE:
            overall = single(dataset)
        elif dataset.name.startswith(SOURCE_SLICE_PREFIX):
            sources[dataset.name[len(SOURCE_SLICE_PREFIX):]] = single(dataset)
        else:
            raise ValueError(f"profile statistics: dataset {dataset.name!r} is neither "
                             f"{OVERALL_SLICE!r} nor a slice {SOURCE_SLICE_PREFIX}<source>")
    if overall is None:
        raise ValueError(f"profile statistics: {len(statistics.datasets)} datasets and none "
                         f"is the overall one ({OVERALL_SLICE!r})")
    return overall, sources
