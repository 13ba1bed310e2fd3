"""Perplexity / bits-per-byte arithmetic, checked by hand."""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from components.lm_evaluator import scoring
from components.transform.tokenizer import EOS_ID


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
