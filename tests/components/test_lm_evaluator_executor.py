"""The LmEvaluator's executor on a two-source eval split (English "web", Chinese "poems")
with two tiny SavedModels (candidate and baseline): metrics.json `by_source` and
`baseline_by_source`, the `bits_per_byte_<source>` properties, and a per-source
threshold that fails naming the source. No pipeline: Executor.Do on artifacts made here."""

from __future__ import annotations

import json
import math

import pytest
import tensorflow as tf
from tiny_text_model import save_tiny_text_model

pytestmark = pytest.mark.slow  # TFX imported, two models traced and scored: ~1 min

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, "\n": 30, "床前": 6,
         "明月": 4, "。": 10, "，": 20}
VOCAB, CONTEXT = 300, 64
WEB = ["the quick brown fox jumps over the lazy dog.", "the fox, the dog\nand the quick one"]
POEMS = ["床前明月光，疑是地上霜。", "举头望明月，低头思故乡。", "春眠不觉晓，处处闻啼鸟。"]


def _examples(path, model_dir):
    """Transformed examples as Transform writes them: input_ids, num_bytes, source_name."""
    tokenize = tf.saved_model.load(str(model_dir)).signatures["tokenize"]
    split = path / "Split-eval"
    split.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(split / "data.gz"), options="GZIP") as writer:
        for name, texts in (("web", WEB), ("poems", POEMS), ("web", WEB[:1])):
            out = tokenize(text=tf.constant(texts))
            for text, row, n in zip(texts, out["input_ids"].numpy(), out["lengths"].numpy(),
                                    strict=True):
                feature = {
                    "input_ids": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=row[:n].tolist())),
                    "num_bytes": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[len(text.encode("utf-8"))])),
                    "source_name": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[name.encode()]))}
                writer.write(tf.train.Example(
                    features=tf.train.Features(feature=feature)).SerializeToString())


def _artifact(kind, uri, artifact_id=0):
    artifact = kind()
    artifact.uri = str(uri)
    artifact.id = artifact_id
    return artifact


def test_the_executor_writes_each_sources_figures_and_names_a_failing_source(tmp_path):
    from tfx.types import standard_artifacts

    from components.lm_evaluator.executor import Executor
    from config import get_config
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    tokenizer = ByteLevelBpe(learn(UNITS, VOCAB).json)
    for name, seed in (("candidate", 0), ("baseline", 1)):
        save_tiny_text_model(tmp_path / name / "Format-Serving", tokenizer, context=CONTEXT,
                             max_new_tokens=4, vocab_size=VOCAB, seed=seed)
    _examples(tmp_path / "examples", tmp_path / "candidate" / "Format-Serving")
    config = get_config("tiny", {"train.seq_len": 32, "eval.max_bits_per_byte": 100.0,
                                 "eval.baseline_tolerance": 10.0,
                                 "eval.max_bits_per_byte_by_source": {"poems": 0.5}})
    evaluation = _artifact(standard_artifacts.ModelEvaluation, tmp_path / "evaluation")
    blessing = _artifact(standard_artifacts.ModelBlessing, tmp_path / "blessing")
    Executor().Do(
        {"examples": [_artifact(standard_artifacts.Examples, tmp_path / "examples")],
         "model": [_artifact(standard_artifacts.Model, tmp_path / "candidate", 2)],
         "baseline_model": [_artifact(standard_artifacts.Model, tmp_path / "baseline", 1)]},
        {"evaluation": [evaluation], "blessing": [blessing]},
        {"pipeline_config": config.to_json()})

    report = json.loads((tmp_path / "evaluation" / "metrics.json").read_text())
    by_source, baseline = report["by_source"], report["baseline_by_source"]
    assert sorted(by_source) == sorted(baseline) == ["poems", "web"]
    assert by_source["web"]["documents"] == 3 and by_source["poems"]["documents"] == 3
    assert set(by_source["web"]) == {"bits_per_byte", "perplexity", "tokens", "bytes",
                                     "documents"}
    # the mixture's figure: the same scores, summed (each document scored once)
    candidate = report["candidate"]
    assert candidate["bytes"] == sum(s["bytes"] for s in by_source.values())
    assert candidate["tokens"] == sum(s["tokens"] for s in by_source.values())
    weighted = sum(s["bits_per_byte"] * s["bytes"] for s in by_source.values())
    assert math.isclose(candidate["bits_per_byte"], weighted / candidate["bytes"], rel_tol=1e-9)
    assert "by_source" not in candidate and "by_source" not in report["baseline"]
    # the blessing names the source and both numbers
    poems = by_source["poems"]["bits_per_byte"]
    assert not report["blessed"]
    assert report["message"] == (f"bits per byte on source 'poems' {poems:.4f} > "
                                 "eval.max_bits_per_byte_by_source['poems'] = 0.5000")
    for artifact in (evaluation, blessing):
        assert artifact.get_float_custom_property("bits_per_byte_poems") == poems
        assert artifact.get_float_custom_property("baseline_bits_per_byte_web") == \
            baseline["web"]["bits_per_byte"]
    assert (tmp_path / "blessing" / "NOT_BLESSED").is_file()
