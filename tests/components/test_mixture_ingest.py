"""A mixture through ingestion: TextExampleGen reads every source with its own settings and
tags its records; TextCleaner cleans each source with its own settings, deduplicates across
sources and counts per source. English (Tiny Shakespeare) beside Chinese (Tang/Song poems)."""

from __future__ import annotations

import json
import os

import pytest

from config import DataConfig, DataSource, PipelineConfig

pytestmark = pytest.mark.slow  # Beam runs of the executors, and `import tfx`


def _mixture(tmp_path, shakespeare, chinese_poems):
    """A `plays` source (a directory of plain text) and a `poems` source (JSONL, text in
    `content`, min_chars=30): a PipelineConfig reading both."""
    plays = tmp_path / "plays"
    plays.mkdir()
    speeches = [p for p in shakespeare.split("\n\n") if len(p) >= 40][:6]
    (plays / "a.txt").write_text("\n\n".join(speeches[:4]) + "\n", encoding="utf-8")
    (plays / "b.txt").write_text("\n\n".join(speeches[4:]) + "\n", encoding="utf-8")
    poems = [p for p in dict.fromkeys(chinese_poems) if len(p) >= 40][:5]
    lines = [json.dumps({"content": p}, ensure_ascii=False) for p in poems]
    lines.append(json.dumps({"content": "床前明月光"}, ensure_ascii=False))  # < 30 chars
    (tmp_path / "poems.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = DataConfig(min_chars=1, sources=(
        DataSource("plays", str(plays), 9.0),
        DataSource("poems", str(tmp_path / "poems.jsonl"), 1.0, jsonl_text_field="content",
                   min_chars=30)))
    return _with_data(data), speeches, poems


def _with_data(data: DataConfig) -> PipelineConfig:
    import dataclasses

    from config import get_config

    return dataclasses.replace(get_config("tiny"), data=data)


def test_custom_config_fingerprints_every_source(tmp_path, shakespeare, chinese_poems):
    from google.protobuf import json_format, wrappers_pb2

    from components.text_example_gen.component import make_custom_config, sources_fingerprint
    from components.text_example_gen.executor import (
        config_from_exec_properties,
        unpack_custom_config,
    )
    from config import get_config

    config, _, _ = _mixture(tmp_path, shakespeare, chinese_poems)

    def props(c):
        return {"custom_config": json_format.MessageToJson(make_custom_config(c))}

    before = unpack_custom_config(props(config))
    assert config_from_exec_properties(props(config)) == config
    assert before["input_fingerprint"]["plays"]["num_files"] == 2
    assert before["input_fingerprint"]["poems"]["num_files"] == 1
    # Editing the second source's file (not the one TFX fingerprints) changes the config.
    poems = tmp_path / "poems.jsonl"
    poems.write_text(poems.read_text(encoding="utf-8") + '{"content": "春眠不觉晓"}\n',
                     encoding="utf-8")
    after = unpack_custom_config(props(config))
    assert after["input_fingerprint"]["poems"] != before["input_fingerprint"]["poems"]
    assert after["input_fingerprint"]["plays"] == before["input_fingerprint"]["plays"]
    # One source: no fingerprint of ours (TFX's covers it); the old form still reads.
    one = get_config("tiny")
    assert unpack_custom_config(props(one)) == {"pipeline_config": one.to_json(),
                                                "input_fingerprint": {}}
    old = make_custom_config(one)
    old.custom_config.Pack(wrappers_pb2.StringValue(value=one.to_json()))
    old_props = {"custom_config": json_format.MessageToJson(old)}
    assert unpack_custom_config(old_props)["input_fingerprint"] is None
    assert config_from_exec_properties(old_props) == one
    missing = _with_data(DataConfig(sources=(
        DataSource("web", str(tmp_path / "nothing" / "*.txt")),)))
    assert sources_fingerprint(missing)["web"]["num_files"] == 0


def _run_example_gen(config, tmp_path, path=None):
    """Runs the TextExampleGen executor as FileBasedExampleGen would (the first source as
    input_base/pattern); returns the Examples artifact and its records by split."""
    import tensorflow as tf
    from google.protobuf import json_format
    from tfx.proto import example_gen_pb2
    from tfx.types import standard_artifacts

    from common.files import split_input_path
    from components.text_example_gen import component, executor

    base, pattern = split_input_path(path or config.data.sources[0].path)
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    exec_properties = {
        "input_base": base,
        "input_config": json_format.MessageToJson(example_gen_pb2.Input(splits=[
            example_gen_pb2.Input.Split(name="all", pattern=pattern)])),
        "output_config": json_format.MessageToJson(example_gen_pb2.Output(
            split_config=example_gen_pb2.SplitConfig(splits=[
                example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=4),
                example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=1)],
                partition_feature_name="text"))),
        "custom_config": json_format.MessageToJson(component.make_custom_config(config)),
    }
    executor.Executor().Do({}, {"examples": [examples]}, exec_properties)
    records = {}
    for split in ("train", "eval"):
        files = tf.io.gfile.glob(os.path.join(examples.uri, f"Split-{split}", "*"))
        records[split] = [tf.train.Example.FromString(x.numpy()) for x in
                          tf.data.TFRecordDataset(files, compression_type="GZIP")]
    return examples, records


def test_example_gen_reads_every_source_with_its_own_settings(tmp_path, shakespeare,
                                                              chinese_poems):
    config, speeches, poems = _mixture(tmp_path, shakespeare, chinese_poems)
    examples, records = _run_example_gen(config, tmp_path)

    def value(example, name):
        v = example.features.feature[name]
        return v.bytes_list.value[0].decode("utf-8") if v.bytes_list.value else \
            v.int64_list.value[0]

    got = sorted((value(e, "source_name"), value(e, "source"), value(e, "record"),
                  value(e, "text"), value(e, "reject_reason"))
                 for split in records.values() for e in split)
    plays = [("plays", f, r, t, "") for f, part in (("a.txt", speeches[:4]), ("b.txt", speeches[4:]))
             for r, t in enumerate(part)]
    expected = [("poems", "poems.jsonl", i, p, "") for i, p in enumerate(poems + ["床前明月光"])]
    assert [g[:3] for g in got] == sorted(x[:3] for x in plays + expected)
    # Each source read with its own jsonl_text_field; the poems are the poems' records.
    assert {g[3] for g in got if g[0] == "poems"} == set(poems + ["床前明月光"])
    assert all(g[4] == "" for g in got)
    files = examples.get_json_value_custom_property("input_files")
    assert sorted((f["source_name"], f["path"]) for f in files) == [
        ("plays", "a.txt"), ("plays", "b.txt"), ("poems", "poems.jsonl")]

    # One source (no data.sources): input_base/pattern, tagged "default".
    _, one = _run_example_gen(_with_data(DataConfig()), tmp_path / "one",
                              str(tmp_path / "plays" / "b.txt"))
    assert sorted((value(e, "source_name"), value(e, "source"), value(e, "record"))
                  for split in one.values() for e in split) == [
        ("default", "b.txt", r) for r in range(len(speeches) - 4)]

    empty = _with_data(DataConfig(sources=(
        *config.data.sources, DataSource("web", str(tmp_path / "nothing" / "*.txt")))))
    with pytest.raises(FileNotFoundError, match=r"data source 'web': no input files match "
                       r"its path .*nothing/\*\.txt"):
        _run_example_gen(empty, tmp_path / "again")


def _run_cleaner(config, examples_uri, tmp_path):
    from tensorflow_metadata.proto.v0 import anomalies_pb2
    from tfx.types import artifact_utils, standard_artifacts

    from components.text_cleaner.executor import Executor

    examples = standard_artifacts.Examples()
    examples.uri = examples_uri
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    anomalies = standard_artifacts.ExampleAnomalies()
    anomalies.uri = str(tmp_path / "anomalies")
    anomalies.split_names = artifact_utils.encode_split_names(["train", "eval"])
    for split in ("train", "eval"):
        os.makedirs(os.path.join(anomalies.uri, f"Split-{split}"))
        with open(os.path.join(anomalies.uri, f"Split-{split}", "SchemaDiff.pb"), "wb") as f:
            f.write(anomalies_pb2.Anomalies().SerializeToString())
    cleaned = standard_artifacts.Examples()
    cleaned.uri = str(tmp_path / "cleaned")
    Executor().Do({"examples": [examples], "anomalies": [anomalies]},
                  {"cleaned_examples": [cleaned]}, {"pipeline_config": config.to_json()})
    with open(os.path.join(cleaned.uri, "cleaning_report.json")) as f:
        return cleaned, json.load(f)


def _write_examples(path, docs):
    import tensorflow as tf

    from corpus.documents import document_to_example

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path, "GZIP") as w:
        for doc in docs:
            w.write(document_to_example(doc).SerializeToString())


def test_cleaner_cleans_each_source_with_its_settings_and_dedups_across(
        tmp_path, shakespeare, chinese_poems):
    from components.text_cleaner.executor import DataValidationError
    from corpus.documents import Document

    config, speeches, poems = _mixture(tmp_path, shakespeare, chinese_poems)
    short = "To be, or not"  # 13 characters: kept in plays (min_chars 1), not in poems
    train = [Document(t, "a.txt", i, source_name="plays") for i, t in enumerate(speeches)]
    train += [Document(short, "b.txt", 0, source_name="plays"),
              Document(poems[0], "b.txt", 1, source_name="plays")]  # a poem in the plays
    train += [Document(p, "poems.jsonl", i, source_name="poems") for i, p in enumerate(poems)]
    train += [Document(short, "poems.jsonl", 9, source_name="poems"),
              Document("床前明月光", "poems.jsonl", 10, source_name="poems")]
    uri = str(tmp_path / "examples")
    _write_examples(os.path.join(uri, "Split-train", "data.gz"), train)
    _write_examples(os.path.join(uri, "Split-eval", "data.gz"),
                    [Document(speeches[0] + " again", "a.txt", 99, source_name="plays")])
    cleaned, report = _run_cleaner(config, uri, tmp_path / "run1")

    plays, poem_counts = report["by_source"]["plays"], report["by_source"]["poems"]
    # min_chars=30 applies to the poems' records only: the short line is kept in plays.
    assert poem_counts["dropped"] == {"too_short": 2, "exact_duplicate": 1}
    assert plays["dropped"] == {}
    assert plays["records_kept"] == len(speeches) + 3  # the short line, the poem, eval's
    # The poem in both sources is kept once: in `plays` (the lower name), and the poems'
    # copy, dropped, names it.
    assert poem_counts["rejected_samples"]["exact_duplicate"] == [{
        "source_name": "poems", "source": "poems.jsonl", "record": 0,
        "kept": {"source_name": "plays", "source": "b.txt", "record": 1}}]
    assert (poem_counts["records_read"], poem_counts["records_kept"]) == (len(poems) + 2,
                                                                         len(poems) - 1)
    assert report["total"]["dropped_by_reason"] == {"exact_duplicate": 1, "too_short": 2}
    assert report["total"]["read"] == len(train) + 1
    by_source = cleaned.get_json_value_custom_property("by_source")
    assert by_source["poems"]["records_kept"] == len(poems) - 1
    assert "rejected_samples" not in by_source["poems"]
    assert cleaned.get_int_custom_property("records_dropped") == 3

    # A source whose every record is rejected stops the run by name, though the
    # mixture's fraction (2 of 9) passes.
    all_short = [Document(short, "poems.jsonl", i, source_name="poems") for i in range(2)]
    uri = str(tmp_path / "examples2")
    _write_examples(os.path.join(uri, "Split-train", "data.gz"), train[:len(speeches)] + all_short)
    _write_examples(os.path.join(uri, "Split-eval", "data.gz"), train[:1])
    with pytest.raises(DataValidationError, match=r"data source 'poems': 2 of 2 records "
                       r"rejected \(all rejected\):\n  too_short: 2 \(e\.g\. poems\.jsonl "
                       r"record 0, poems\.jsonl record 1\)"):
        _run_cleaner(config, uri, tmp_path / "run2")
