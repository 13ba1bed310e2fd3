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
"""

from __future__ import annotations

from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2, statistics_pb2

from corpus.words import token_units, word_units

PROFILE_FEATURES = ("num_chars", "num_words", "tokens")



def text_profile(text: str) -> dict[str, list]:
    """{"num_chars": [int], "num_words": [int], "tokens": [bytes, ...]} of one document."""
    return {
        "num_chars": [len(text)],
        "num_words": [len(word_units(text))],
        "tokens": [t.encode("utf-8") for t in token_units(text)],
    }


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
