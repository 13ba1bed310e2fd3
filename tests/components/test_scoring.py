"""Perplexity / bits-per-byte arithmetic, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from savedmodel import scoring
from tokenization.tokenizer import EOS_ID


def test_token_stream_layout():
    stream = scoring.token_stream([[5, 6], [7]])
    assert stream.tolist() == [EOS_ID, 5, 6, EOS_ID, 7]
    assert scoring.token_stream([[5, 6], [7]], max_tokens=2).tolist() == [EOS_ID, 5, 6]


def test_uniform_model_scores_log_vocab():
    vocab = 16

    def uniform(x):
        return tf.zeros(tf.concat([tf.shape(x), [vocab]], 0))

    stream = np.arange(23, dtype=np.int32) % vocab
    result = scoring.score_stream(uniform, stream, seq_len=5, batch_size=2)
    # Every token but the first is scored: 22 tokens at ln(16) nats each.
    assert result["tokens"] == 22
    assert math.isclose(result["nll"], 22 * math.log(16), rel_tol=1e-6)
    m = scoring.summarize(result["nll"], result["tokens"], num_bytes=44)
    assert math.isclose(m["perplexity"], 16, rel_tol=1e-6)
    # 22 tokens x 4 bits over 44 bytes = 2 bits per byte.
    assert math.isclose(m["bits_per_byte"], 2.0, rel_tol=1e-6)


def test_perfect_model_scores_zero():
    stream = np.array([2, 3, 4, 5, 6, 7, 8], np.int32)

    def oracle(x):
        # Predicts x + 1 with certainty.
        return tf.one_hot(x + 1, 16) * 100.0

    result = scoring.score_stream(oracle, stream, seq_len=3, batch_size=8)
    assert result["tokens"] == 6
    assert result["nll"] < 1e-6


@pytest.mark.slow
def test_a_baseline_with_another_tokenizer_scores_the_same_text(shakespeare, tmp_path):
    """The LmEvaluator gives a baseline model the eval text in its own ids: the
    candidate's ids decoded (lossless) and encoded by the baseline's tokenizer."""
    import dataclasses

    from config import GenerationConfig, get_config
    from models.deepseek import DeepSeekCausalLM
    from savedmodel.export import save_text_model
    from tokenization import tokenizer

    docs = [d for d in shakespeare[:40_000].split("\n\n") if d]
    dirs = []
    for name, part, size in (("a", docs[:100], 400), ("b", docs[100:], 450)):
        counts: dict = {}
        for unit in tokenizer.units(tf.constant(part), _pre()).flat_values.numpy().tolist():
            counts[unit] = counts.get(unit, 0) + 1
        spec = tokenizer.learn(counts, size)
        model = DeepSeekCausalLM(dataclasses.replace(get_config("tiny").model, vocab_size=size))
        model(tf.zeros([1, 4], tf.int32))
        dirs.append(save_text_model(model, spec, GenerationConfig(), str(tmp_path / name)))
    texts = docs[200:210] + ["你好，世界 😀"]
    a, b = (tf.saved_model.load(d).signatures["tokenize"] for d in dirs)

    def ids(tokenize):
        out = tokenize(text=tf.constant(texts))
        return [r[:n].tolist() for r, n in zip(out["input_ids"].numpy(), out["lengths"].numpy(),
                                               strict=True)]

    ids_a, ids_b = ids(a), ids(b)
    assert ids_a != ids_b
    assert scoring.retokenize(ids_a, dirs[0], dirs[1]) == ids_b
    assert scoring.retokenize(ids_a, dirs[0], dirs[0]) is ids_a


def _pre():
    from tokenization.pre_tokenizer import DEEPSEEK_V3_PRE_TOKENIZER, PreTokenizer

    return PreTokenizer(DEEPSEEK_V3_PRE_TOKENIZER)
