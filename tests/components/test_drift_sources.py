"""Drift per source (issue 28): the profile statistics sliced by `source_name`, each
source compared with the same source of the baseline; one source as before sources."""

from __future__ import annotations

import pytest

THRESHOLDS = {"num_chars": 0.15, "num_words": 0.15, "tokens": 0.3}
MIN_DOCUMENTS = 10


def _examples(texts, source_name=None, first_record=0):
    """Serialized cleaned examples of `texts`, with `source_name` when given."""
    from corpus.documents import Document, document_to_example

    out = []
    for i, t in enumerate(texts, start=first_record):
        example = document_to_example(Document(t, f"{source_name or 'corpus'}.txt", i,
                                               source_name=source_name or "default"))
        if source_name is None:  # as examples made before mixtures
            del example.features.feature["source_name"]
        out.append(example.SerializeToString())
    return out


def _statistics(tmp_path, runs, unsliced=()):
    """{run: profile statistics} of {run: serialized examples}, in one Beam pipeline.

    Runs named in `unsliced` get the statistics of a run before sources: no
    `source_name` slicing (TFDV's default options), as their FeatureStats.pb held.
    """
    import apache_beam as beam
    import tensorflow_data_validation as tfdv

    from components.drift_validator.executor import (
        ProfileStatistics,
        _DecodeBatch,
        _profile_example,
    )
    from components.drift_validator.profile import SOURCE_NAME_FEATURE, without_feature

    paths = {run: str(tmp_path / f"{run}.pb") for run in runs}
    with beam.Pipeline() as p:
        for run, examples in runs.items():
            read = p | f"Create[{run}]" >> beam.Create(examples)
            if run in unsliced:
                stats = (read | f"Profile[{run}]" >> beam.Map(_profile_example)
                         | f"Batch[{run}]" >> beam.BatchElements(min_batch_size=64,
                                                                 max_batch_size=1000)
                         | f"Decode[{run}]" >> beam.ParDo(_DecodeBatch())
                         | f"Stats[{run}]" >> tfdv.GenerateStatistics(tfdv.StatsOptions())
                         | f"Drop[{run}]" >> beam.Map(without_feature, SOURCE_NAME_FEATURE))
            else:
                stats = read | f"ProfileStatistics[{run}]" >> ProfileStatistics()
            _ = stats | f"Write[{run}]" >> tfdv.WriteStatisticsToBinaryFile(paths[run])
    return {run: tfdv.load_stats_binary(path) for run, path in paths.items()}


# TFDV's numeric histograms come from a quantiles sketch (KLL, epsilon 0.01) fed in
# batches that Beam's BatchElements sizes by timing: two runs over the same examples can
# move a few examples across a bucket boundary. Everything else is exact.
HISTOGRAM_TOLERANCE = 0.02


def _assert_same_profile(dataset, other):
    """Two DatasetFeatureStatistics of the same examples: exact counts and moments,
    histogram counts equal up to HISTOGRAM_TOLERANCE of the examples per bucket."""
    assert dataset.num_examples == other.num_examples
    features = sorted(dataset.features, key=lambda f: f.path.step[0])
    other_features = sorted(other.features, key=lambda f: f.path.step[0])
    assert [f.path for f in features] == [f.path for f in other_features]
    for feature, other_feature in zip(features, other_features, strict=True):
        a, b = feature.num_stats, other_feature.num_stats
        assert a.common_stats == b.common_stats, feature.path
        for moment in ("mean", "std_dev", "min", "max", "num_zeros"):
            assert getattr(a, moment) == pytest.approx(getattr(b, moment)), (feature.path,
                                                                             moment)
        assert len(a.histograms) == len(b.histograms), feature.path
        for h, g in zip(a.histograms, b.histograms, strict=True):
            assert (h.type, len(h.buckets)) == (g.type, len(g.buckets)), feature.path
            assert h.num_nan == g.num_nan and h.num_undefined == g.num_undefined
            slack = HISTOGRAM_TOLERANCE * dataset.num_examples
            for x, y in zip(h.buckets, g.buckets, strict=True):
                assert x.sample_count == pytest.approx(y.sample_count, abs=slack), (
                    feature.path, h.type, x, y)
                # Standard buckets split [min, max] evenly; quantile boundaries move
                # with the sketch's rank error.
                rel = 1e-9 if h.type == h.STANDARD else 0.1
                assert (x.low_value, x.high_value) == pytest.approx(
                    (y.low_value, y.high_value), rel=rel, abs=1e-9 if rel < 0.1 else 2.0), (
                    feature.path, h.type, x, y)


def _paragraphs(text):
    return [p for p in text.split("\n\n") if p.strip()]


def test_source_name_must_be_one_source_name():
    import tensorflow as tf

    from components.drift_validator.profile import source_name as _source_name

    (serialized,) = _examples(["床前明月光"], "poems", first_record=7)
    example = tf.train.Example.FromString(serialized)
    assert _source_name(example) == "poems"
    del example.features.feature["source_name"]
    assert _source_name(example) == "default"  # before sources, or tests' examples
    example.features.feature["source_name"].bytes_list.value.extend([b"a", b"b"])
    with pytest.raises(ValueError, match=r"source 'poems.txt', record 7\): source_name has 2"):
        _source_name(example)
    example.features.feature["source_name"].bytes_list.value[:] = ["唐诗".encode()]
    with pytest.raises(ValueError, match="'唐诗', not a source name"):
        _source_name(example)


def test_source_slices_of_statistics():
    from tensorflow_metadata.proto.v0 import statistics_pb2

    from components.drift_validator import profile

    stats = statistics_pb2.DatasetFeatureStatisticsList()
    stats.datasets.add(name="All Examples", num_examples=3)
    stats.datasets.add(name="source_name_web_2024", num_examples=2)
    stats.datasets.add(name="source_name_poems", num_examples=1)
    overall, sources = profile.source_slices(stats)
    assert [d.num_examples for d in overall.datasets] == [3]
    assert {k: v.datasets[0].num_examples for k, v in sources.items()} == {
        "web_2024": 2, "poems": 1}
    # A run before sources: one unsliced dataset is the source "default".
    old = statistics_pb2.DatasetFeatureStatisticsList()
    old.datasets.add(num_examples=5)
    overall, sources = profile.source_slices(old)
    assert overall is old and sources == {"default": old}
    stats.datasets.add(name="lang_en")
    with pytest.raises(ValueError, match="'lang_en' is neither"):
        profile.source_slices(stats)
    del stats.datasets[0]
    del stats.datasets[-1]
    with pytest.raises(ValueError, match="none is the overall one"):
        profile.source_slices(stats)


@pytest.mark.slow
def test_one_source_is_compared_as_before_sources(shakespeare, tmp_path):
    from components.drift_validator.executor import compare, compare_split

    paragraphs = _paragraphs(shakespeare[:300_000])
    half = len(paragraphs) // 2
    stats = _statistics(tmp_path, {
        "before": _examples(paragraphs[:half]),
        "before_unsliced": _examples(paragraphs[:half]),
        "now": _examples(paragraphs[half:]),
        "now_default": _examples(paragraphs[half:], "default"),
    }, unsliced={"before_unsliced"})

    # Sliced by source, the overall statistics are those of a run before sources.
    assert [d.name for d in stats["before"].datasets] == ["All Examples",
                                                          "source_name_default"]
    assert len(stats["before_unsliced"].datasets) == 1
    overall = stats["before"].datasets[0]
    unsliced = stats["before_unsliced"].datasets[0]
    assert overall.num_examples == unsliced.num_examples == half
    assert sorted(f.path.step[0] for f in overall.features) == ["num_chars", "num_words",
                                                                "tokens"]
    _assert_same_profile(overall, unsliced)
    # The one source's slice is the whole of it.
    assert stats["before"].datasets[1].num_examples == half
    # Examples without `source_name` and with "default" are the same source.
    assert [d.name for d in stats["now"].datasets] == [
        d.name for d in stats["now_default"].datasets]
    for dataset, default_dataset in zip(stats["now"].datasets, stats["now_default"].datasets,
                                        strict=True):
        _assert_same_profile(dataset, default_dataset)

    _, expected, _ = compare(stats["now"], stats["before_unsliced"], THRESHOLDS)
    for baseline in ("before", "before_unsliced"):  # this run's baseline, an older run's
        result = compare_split(stats["now"], stats[baseline], THRESHOLDS, MIN_DOCUMENTS,
                               "train")
        assert not result["mixture"] and result["by_source"] == {}, baseline
        assert result["source_anomalies"] == {}
        # Equal up to the quantile sketch's error (HISTOGRAM_TOLERANCE).
        assert result["measured"] == pytest.approx(expected, abs=0.02) and set(
            expected) == set(THRESHOLDS)
        assert result["drift"] == {} and result["not_gated"] == {}, result["measured"]


@pytest.mark.slow
def test_only_the_drifted_source_is_named(shakespeare, chinese_poems, tmp_path):
    from components.drift_validator.executor import ABSENT_SOURCE, NEW_SOURCE, compare_split

    paragraphs = _paragraphs(shakespeare[:300_000])
    half = len(paragraphs) // 2
    poems = list(chinese_poems)
    middle = len(poems) // 2
    # The poems source now holds documents of ten poems each: ~10x longer.
    long_documents = ["\n\n".join(poems[i:i + 10]) for i in range(middle, len(poems), 10)]
    assert len(long_documents) >= 2 * MIN_DOCUMENTS
    code = [f"def f{i}(x):\n    return x * {i}\n" for i in range(30)]
    stats = _statistics(tmp_path, {
        "before": (_examples(paragraphs[:half], "shakespeare")
                   + _examples(poems[:middle], "poems")
                   + _examples(code[:MIN_DOCUMENTS], "retired")),
        "now": (_examples(paragraphs[half:], "shakespeare")
                + _examples(long_documents, "poems")
                + _examples(code, "code")),
    })
    result = compare_split(stats["now"], stats["before"], THRESHOLDS, MIN_DOCUMENTS, "train")

    assert result["mixture"]
    assert set(result["by_source"]) == {"shakespeare", "poems", "retired", "code"}
    poems_entry, shakespeare_entry = result["by_source"]["poems"], result["by_source"]["shakespeare"]
    assert poems_entry["documents"] == len(long_documents)
    assert poems_entry["baseline_documents"] == middle
    assert poems_entry["drift"]["num_chars"] > 0.5, poems_entry
    assert all(shakespeare_entry["drift"][f] < THRESHOLDS[f] for f in THRESHOLDS), \
        shakespeare_entry
    assert result["by_source"]["code"] == {"status": NEW_SOURCE, "documents": 30}
    assert result["by_source"]["retired"] == {"status": ABSENT_SOURCE,
                                              "baseline_documents": MIN_DOCUMENTS}
    # Gated: the poems' lengths, by source; nothing of Shakespeare; the overall
    # drift of the mixture (a new source moves it) is recorded, not gated.
    assert {"source poems, train/num_chars", "source poems, train/num_words"} <= set(
        result["drift"]), result["drift"]
    assert all(key.startswith("source poems, ") for key in result["drift"]), result["drift"]
    assert all("gated per source" in text for text in result["not_gated"].values())
    assert set(result["source_anomalies"]) == {"shakespeare", "poems"}
    assert set(result["measured"]) == set(THRESHOLDS)

    # A source of fewer than MIN_DOCUMENTS documents is measured, not gated.
    few = compare_split(stats["now"], stats["before"], THRESHOLDS, len(long_documents) + 1,
                        "eval")
    assert few["drift"] == {}
    assert "source poems, eval/num_chars" in few["not_gated"]
    assert "documents < validation.drift_min_documents" in few["not_gated"][
        "source poems, eval/num_chars"]


def _artifacts(tmp_path, name, examples=None):
    """(Examples with one split "train" holding `examples`, ExampleStatistics,
    ExampleAnomalies) under tmp_path/name."""
    import tensorflow as tf
    from tfx.types import artifact_utils, standard_artifacts

    made = []
    for kind in (standard_artifacts.Examples, standard_artifacts.ExampleStatistics,
                 standard_artifacts.ExampleAnomalies):
        artifact = kind()
        artifact.uri = str(tmp_path / name / kind.TYPE_NAME)
        made.append(artifact)
    if examples is not None:
        made[0].split_names = artifact_utils.encode_split_names(["train"])
        tf.io.gfile.makedirs(f"{made[0].uri}/Split-train")
        with tf.io.TFRecordWriter(f"{made[0].uri}/Split-train/data.tfrecord") as writer:
            for example in examples:
                writer.write(example)
    return made


def _validate(tmp_path, name, examples, baseline=None, accept=False):
    """Runs the DriftValidator executor; returns (statistics, anomalies) artifacts."""
    import dataclasses

    from components.drift_validator.executor import Executor
    from config import get_config

    config = get_config("tiny")
    config = dataclasses.replace(config, validation=dataclasses.replace(
        config.validation, drift_min_documents=MIN_DOCUMENTS))
    examples_in, statistics, anomalies = _artifacts(tmp_path, name, examples)
    Executor().Do({"examples": [examples_in],
                   "baseline_statistics": [baseline] if baseline else []},
                  {"statistics": [statistics], "anomalies": [anomalies]},
                  {"pipeline_config": config.to_json(), "accept_drift": int(accept)})
    return statistics, anomalies


@pytest.mark.slow
def test_executor_gates_and_records_drift_per_source(shakespeare, chinese_poems, tmp_path):
    import json
    import os

    from components.drift_validator.executor import DRIFT_BY_SOURCE_PROPERTY, load_statistics
    from components.text_cleaner.executor import DataValidationError

    paragraphs = _paragraphs(shakespeare[:150_000])
    half = len(paragraphs) // 2
    poems = list(chinese_poems)
    middle = len(poems) // 2
    long_documents = ["\n\n".join(poems[i:i + 10]) for i in range(middle, len(poems), 10)]

    # One source, as before sources: the same properties and report as then.
    before, _ = _validate(tmp_path, "one0", _examples(paragraphs[:half]))
    _, anomalies = _validate(tmp_path, "one1", _examples(paragraphs[half:]), before)
    assert set(anomalies.mlmd_artifact.custom_properties) == {
        "drift_train_num_chars", "drift_train_num_words", "drift_train_tokens",
        "baseline_statistics", "drift_detected", "drift_accepted", "drift_report"}
    report = json.loads(open(os.path.join(anomalies.uri, "drift_report.json")).read())
    assert set(report) == {"baseline", "thresholds", "splits", "drift", "not_gated",
                           "accepted"}
    assert anomalies.get_int_custom_property("drift_detected") == 0, report

    # A mixture where only the poems drift: the error names that source, not the other.
    mixture_before = (_examples(paragraphs[:half], "shakespeare")
                      + _examples(poems[:middle], "poems"))
    baseline, _ = _validate(tmp_path, "mix0", mixture_before)
    assert [d.name for d in load_statistics(baseline.uri, "train").datasets] == [
        "All Examples", "source_name_shakespeare", "source_name_poems"]
    mixture_now = (_examples(paragraphs[half:], "shakespeare")
                   + _examples(long_documents, "poems"))
    with pytest.raises(DataValidationError) as stopped:
        _validate(tmp_path, "mix1", mixture_now, baseline)
    message = str(stopped.value)
    assert "source poems, train/num_chars: " in message and "--accept-drift" in message
    assert "shakespeare" not in message

    _, anomalies = _validate(tmp_path, "mix2", mixture_now, baseline, accept=True)
    assert anomalies.get_int_custom_property("drift_detected") == 1
    assert anomalies.get_int_custom_property("drift_accepted") == 1
    by_source = json.loads(json.dumps(
        anomalies.get_json_value_custom_property(DRIFT_BY_SOURCE_PROPERTY)))
    assert set(by_source) == {"shakespeare", "poems"}
    assert by_source["poems"]["train"]["drift"]["num_chars"] > 0.5, by_source
    assert by_source["poems"]["train"]["documents"] == len(long_documents)
    assert by_source["shakespeare"]["train"]["drift"]["num_chars"] < 0.15, by_source
    for source in ("poems", "shakespeare"):
        assert os.path.getsize(os.path.join(anomalies.uri, "Split-train",
                                            f"source_name_{source}", "SchemaDiff.pb")) > 0
    # The overall figures stay where they were.
    assert anomalies.get_float_custom_property("drift_train_num_chars") > 0
