"""GRPO's rollout pieces (`components/trainer/grpo.py`): the sampled rows' labels (only
the completion's tokens are targets, its EOS included) and the resumable sampling seeds."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from components.trainer import grpo
from components.trainer.data import IGNORE_LABEL

PAD = 2


def test_completion_labels_target_the_completion_and_its_eos_only():
    # Row 0: prompt [5 6 7], completion [8 9] then EOS 1 (stopped); row 1: prompt [5],
    # completion [4 4 4] (ran out of max_new_tokens), then padding.
    tokens = np.array([[5, 6, 7, 8, 9, 1, 0],
                       [5, 4, 4, 4, 0, 0, 0]])
    out = grpo.completion_labels(tokens, np.array([3, 1]), np.array([6, 4]), seq_len=8,
                                 pad_id=PAD)
    i = IGNORE_LABEL
    np.testing.assert_array_equal(out["input_ids"], [[5, 6, 7, 8, 9, 1, PAD, PAD],
                                                     [5, 4, 4, 4, PAD, PAD, PAD, PAD]])
    np.testing.assert_array_equal(out["labels"], [[i, i, 8, 9, 1, i, i, i],
                                                  [4, 4, 4, i, i, i, i, i]])
    assert out["input_ids"].dtype == out["labels"].dtype == np.int32


def test_rollout_seeds_are_a_function_of_the_seed_rollout_and_row():
    rows = tf.range(64, dtype=tf.int64)
    first = grpo.rollout_seeds(1337, tf.constant(0, tf.int64), rows).numpy()
    again = grpo.rollout_seeds(1337, tf.constant(0, tf.int64), rows).numpy()
    np.testing.assert_array_equal(first, again)  # a resumed run draws the same
    nxt = grpo.rollout_seeds(1337, tf.constant(1, tf.int64), rows).numpy()
    other = grpo.rollout_seeds(1, tf.constant(0, tf.int64), rows).numpy()
    assert len(set(first)) == 64  # every row its own stream
    assert not set(first) & set(nxt) and not set(first) & set(other)
    late = grpo.rollout_seeds(1337, tf.constant(10**9, tf.int64), rows).numpy()
    assert late.dtype == np.int32 and (late >= 0).all()
