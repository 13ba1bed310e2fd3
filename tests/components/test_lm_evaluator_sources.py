"""The LmEvaluator's scoring by mixture source (components/lm_evaluator/source_scoring.py):
the eval split grouped by `source_name`, each source packed on its own, the mixture's
figure from the same scores, checked against numpy and against the one-stream figure."""

from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest
import tensorflow as tf

from components.lm_evaluator import source_scoring
from components.lm_evaluator.source_scoring import (
    evaluate_sources,
    read_eval_sources,
    source_token_caps,
)
from config import get_config
from savedmodel import scoring
from tokenization.tokenizer import EOS_ID, PAD_ID

TOKENIZER = types.SimpleNamespace(eos_id=EOS_ID, pad_id=PAD_ID)
VOCAB = 259  # byte ids 3..258
OFFSET = 3


def _ids(text: str) -> list[int]:
    """A byte-level tokenizer: one token per UTF-8 byte (so tokens = bytes)."""
    return [b + OFFSET for b in text.encode("utf-8")]


def counting_model(x):
    """A tiny model whose prediction depends on its whole window: the logit of token v at
    position t is log(1 + count of v in x[:t+1]) (int32 [B, T] -> float32 [B, T, V])."""
    counts = tf.cumsum(tf.one_hot(x, VOCAB), axis=1)  # (B, T, V)
    return tf.math.log1p(counts)


def numpy_nll(stream: list[int], seq_len: int) -> float:
    """The counting model's summed NLL on `stream`, windows of seq_len, by hand."""
    nll = 0.0
    for start in range(0, len(stream) - 1, seq_len):
        window = stream[start:start + seq_len + 1]
        counts = np.zeros(VOCAB)
        for t in range(len(window) - 1):
            counts[window[t]] += 1
            logits = np.log1p(counts)
            log_z = np.log(np.exp(logits).sum())
            nll += log_z - logits[window[t + 1]]
    return nll


def _config(**settings):
    return get_config("tiny", {"train.seq_len": 16, "eval.batch_size": 3, **settings})


def _sources(shakespeare_docs, poems):
    english = [_ids(d) for d in shakespeare_docs]
    chinese = [_ids(p) for p in poems]
    return {"poems": (chinese, sum(len(p.encode()) for p in poems)),
            "web": (english, sum(len(d.encode()) for d in shakespeare_docs))}


ENGLISH = ["First Citizen:\nBefore we proceed any further, hear me speak.",
           "All:\nSpeak, speak.", "First Citizen:\nYou are all resolved rather to die?"]


def test_each_source_is_scored_on_its_own_as_numpy_scores_it(chinese_poems):
    poems = chinese_poems[:3]
    config = _config()
    metrics = evaluate_sources(counting_model, TOKENIZER, _sources(ENGLISH, poems), config)
    by_source = metrics["by_source"]
    assert sorted(by_source) == ["poems", "web"]
    total_nll = total_bytes = 0
    for name, texts in (("web", ENGLISH), ("poems", poems)):
        # [EOS] d1 [EOS] d2 [EOS] d3: this source's documents only
        stream = [EOS_ID]
        for i, text in enumerate(texts):
            stream += ([EOS_ID] if i else []) + _ids(text)
        nll = numpy_nll(stream, 16)
        num_bytes = sum(len(t.encode()) for t in texts) + len(texts) - 1  # + the separators
        got = by_source[name]
        assert got["tokens"] == len(stream) - 1 and got["bytes"] == num_bytes
        assert got["documents"] == 3
        assert math.isclose(got["bits_per_byte"], nll / math.log(2) / num_bytes, rel_tol=1e-5)
        assert math.isclose(got["perplexity"], math.exp(nll / (len(stream) - 1)), rel_tol=1e-5)
        total_nll, total_bytes = total_nll + nll, total_bytes + num_bytes
    # The mixture's figure is the same scores summed: each document scored once.
    assert metrics["bytes"] == total_bytes
    assert math.isclose(metrics["bits_per_byte"], total_nll / math.log(2) / total_bytes,
                        rel_tol=1e-5)
    # Chinese takes 3 bytes a character: a byte-level model is surer of its continuation
    # bytes, so the two sources' figures differ (and are not the mixture's).
    assert by_source["poems"]["bits_per_byte"] != pytest.approx(
        by_source["web"]["bits_per_byte"], rel=1e-3)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_one_source_gives_exactly_the_one_stream_figure(chinese_poems):
    """One source ("default") is packed and scored exactly as before mixtures: the same
    floats, with and without eval.max_eval_tokens, on a tiny DeepSeek model."""
    from models.deepseek import DeepSeekCausalLM

    tf.keras.utils.set_random_seed(0)
    config = _config()
    model = DeepSeekCausalLM(dataclasses.replace(config.model, vocab_size=VOCAB))
    model(tf.zeros([1, 4], tf.int32))

    def logits_fn(x):
        return model(x, training=False)

    docs = [_ids(t) for t in ENGLISH + chinese_poems[:2]]
    num_bytes = sum(len(d) for d in docs)
    for cap in (0, 50):
        cfg = dataclasses.replace(config, eval=dataclasses.replace(config.eval,
                                                                   max_eval_tokens=cap))
        # Before mixtures: one stream of the whole split.
        stream = scoring.token_stream(docs, cap, eos_id=EOS_ID)
        result = scoring.score_stream(logits_fn, stream, 16, 3, pad_id=PAD_ID)
        total = sum(len(d) for d in docs) + len(docs) - 1
        expected_bytes = (round((num_bytes + len(docs) - 1) * result["tokens"] / total)
                          if cap else num_bytes + len(docs) - 1)
        expected = scoring.summarize(result["nll"], result["tokens"], expected_bytes)
        got = evaluate_sources(logits_fn, TOKENIZER, {"default": (docs, num_bytes)}, cfg)
        by_source = got.pop("by_source")
        assert got == expected  # exactly, every float
        assert by_source["default"]["bits_per_byte"] == expected["bits_per_byte"]
        assert by_source["default"]["documents"] == len(docs)
    assert expected["tokens"] == 50  # the cap applied


def test_the_token_cap_is_shared_in_proportion_and_keeps_every_source():
    assert source_token_caps(0, {"a": 30, "b": 10}) == {"a": 0, "b": 0}
    assert source_token_caps(100, {"a": 30, "b": 10}) == {"a": 75, "b": 25}
    assert source_token_caps(7, {"default": 1000}) == {"default": 7}
    assert source_token_caps(10, {"big": 10_000, "tiny": 3}) == {"big": 9, "tiny": 1}
    metrics = evaluate_sources(counting_model, TOKENIZER, _sources(ENGLISH, ["静夜思"]),
                               _config(**{"eval.max_eval_tokens": 40}))
    tokens = {k: v["tokens"] for k, v in metrics["by_source"].items()}
    # web: 3 documents, 145 bytes + 2 separators; poems: 9 bytes -> 40 * 9 // 156 = 2
    assert tokens == {"poems": 2, "web": 37} and metrics["tokens"] == 39


def test_a_source_with_nothing_to_score_is_named():
    with pytest.raises(ValueError, match="source 'empty' of the eval split: nothing to score"):
        evaluate_sources(counting_model, TOKENIZER, {"empty": ([[]], 0),
                                                     "web": ([_ids("abc")], 3)}, _config())
    with pytest.raises(ValueError, match="no documents"):
        evaluate_sources(counting_model, TOKENIZER, {}, _config())


def test_sft_records_are_scored_per_source_and_summed():
    config = _config(**{"data.task": "sft"})
    a = [(_ids("Q?") + _ids("yes") + [EOS_ID], 2, 3)]
    b = [(_ids("问") + _ids("好的") + [EOS_ID], 3, 6), (_ids("x" * 40), 1, 39)]
    metrics = evaluate_sources(counting_model, TOKENIZER, {"a": (a, 3), "b": (b, 45)}, config)
    one = scoring.score_responses(counting_model, a, 16, 3, PAD_ID)
    two = scoring.score_responses(counting_model, b, 16, 3, PAD_ID)
    assert metrics["records"] == 2 and metrics["skipped_too_long"] == 1
    assert metrics["by_source"]["b"]["documents"] == 2 and metrics["bytes"] == 9
    assert math.isclose(metrics["response_bits_per_byte"],
                        (one["nll"] + two["nll"]) / math.log(2) / 9, rel_tol=1e-9)


def _write(path, examples):
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path), options="GZIP") as writer:
        for ids, num_bytes, name in examples:
            feature = {"input_ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
                       "num_bytes": tf.train.Feature(int64_list=tf.train.Int64List(
                           value=[num_bytes]))}
            if name is not None:
                feature[source_scoring.SOURCE_NAME_KEY] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=name))
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())


def test_the_eval_split_is_grouped_by_source_name_and_missing_is_default(tmp_path):
    _write(tmp_path / "Split-eval" / "a.gz", [([5, 6], 2, [b"web"]), ([7], 1, [b"poems"]),
                                              ([8, 9, 10], 3, [b"web"])])
    _write(tmp_path / "Split-eval" / "b.gz", [([11], 1, None)])  # made before mixtures
    sources = read_eval_sources(types.SimpleNamespace(uri=str(tmp_path)))
    assert sources == {"default": ([[11]], 1), "poems": ([[7]], 1),
                       "web": ([[5, 6], [8, 9, 10]], 5)}
    _write(tmp_path / "Split-eval" / "c.gz", [([12], 1, [b"web"]), ([13], 1, [b"a", b"b"])])
    with pytest.raises(ValueError, match=r"c.gz record 1: feature 'source_name' has 2 values"):
        read_eval_sources(types.SimpleNamespace(uri=str(tmp_path)))
    with pytest.raises(FileNotFoundError, match="no transformed examples"):
        read_eval_sources(types.SimpleNamespace(uri=str(tmp_path)), "train")
