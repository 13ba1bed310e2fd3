"""SFT rows for the Trainer (labels only on response tokens and EOS, records too
long for seq_len counted) and the LmEvaluator's response-only scoring."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import data
from savedmodel import scoring

PAD, EOS = 2, 1


@pytest.fixture
def records_file(tmp_path):
    path = str(tmp_path / "sft.gz")
    # (ids = prompt ++ response ++ [EOS], prompt_length, response bytes)
    data.write_sft_examples(path, [
        ([5, 6, 7, 8, 9, EOS], 3, 10),   # prompt 5 6 7, response 8 9
        ([5, 6, EOS], 1, 3),             # prompt 5, response 6
        (list(range(3, 50)) + [EOS], 2, 90),  # too long for seq_len 8
    ])
    return path


def test_labels_cover_the_response_and_eos_only(records_file):
    (batch,) = list(data.make_sft_eval_dataset(records_file, 8, 4, PAD))
    np.testing.assert_array_equal(batch["input_ids"].numpy(), [[5, 6, 7, 8, 9, PAD, PAD, PAD],
                                                               [5, 6, PAD, PAD, PAD, PAD, PAD, PAD]])
    np.testing.assert_array_equal(batch["labels"].numpy(),
                                  [[-100, -100, 8, 9, EOS, -100, -100, -100],
                                   [6, EOS, -100, -100, -100, -100, -100, -100]])


def test_records_too_long_are_counted(records_file):
    assert data.count_sft_records(records_file, 8) == {
        "records": 3, "used": 2, "rejected": {"too_long": 1}, "response_tokens": 3 + 2}
    with pytest.raises(ValueError, match="fits train.seq_len=1"):
        data.count_sft_records(records_file, 1)


def test_training_rows_are_the_fitting_records(records_file):
    batch = next(iter(data.make_sft_train_dataset(records_file, 8, 2, 10, seed=0, pad_id=PAD)))
    assert sorted(int(np.sum(r >= 0)) for r in batch["labels"].numpy()) == [2, 3]


def test_response_scoring_by_hand():
    vocab = 4
    rng = np.random.default_rng(0)
    table = rng.normal(size=(6, vocab)).astype(np.float32)  # logits depend on position only

    def logits_fn(x):
        return tf.constant(np.broadcast_to(table, (x.shape[0], 6, vocab)))

    records = [([0, 3, 2, 1], 2, 5), ([3, 1], 1, 2), ([0] * 9, 1, 100)]
    out = scoring.score_responses(logits_fn, records, seq_len=6, batch_size=2)
    log_softmax = table - np.log(np.exp(table).sum(axis=1, keepdims=True))
    # Record 1: targets at positions 1, 2 (ids 2, 1); record 2: position 0 (id 1).
    expected = -(log_softmax[1, 2] + log_softmax[2, 1] + log_softmax[0, 1])
    assert out["nll"] == pytest.approx(float(expected), rel=1e-6)
    assert out["tokens"] == 3 and out["bytes"] == 7 and out["skipped_too_long"] == 1
    summary = scoring.summarize(out["nll"], out["tokens"], out["bytes"])
    assert summary["perplexity"] == pytest.approx(math.exp(expected / 3), rel=1e-6)
