"""GRPO's rollout pieces (`components/trainer/grpo.py`): the sampled rows' labels (only
the completion's tokens are targets, its EOS included) and the resumable sampling seeds."""

from __future__ import annotations

import numpy as np
import pytest
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


class _Recorder:
    """Stands for the update step: records each rollout it is given."""

    def __init__(self):
        self.rollouts = []

    def step_on(self, rollout):
        self.rollouts.append({k: v.numpy() for k, v in rollout.items()})
        return {}


class _Tokenizer:
    eos_id, pad_id = 1, 2

    def surfaces(self, skip_special=True):
        return [b"", b"", b""] + [bytes([48 + i % 10]) for i in range(509)]


def _grpo_step(consumed: int, inner: int = 2):
    import keras

    from components.trainer import model_io
    from config import get_config

    config = get_config("tiny", {"data.task": "grpo", "train.seq_len": 12,
                                 "train.batch_size": 2, "train.grpo_group_size": 3,
                                 "train.grpo_max_new_tokens": 3, "train.grpo_inner_steps": inner})
    keras.utils.set_random_seed(0)
    model = model_io.build_model(config)
    recorder = _Recorder()
    step = grpo.GRPOStep(model, tf.distribute.get_strategy(), recorder, _Tokenizer(),
                         lambda p, c, a: [float(len(x)) for x in c], config, micro_batches=1,
                         eos_id=1, pad_id=2, consumed=consumed)
    return step, recorder


def _batches(n: int):
    """n global batches of 2 prompts (k = 1 micro-batch): per-replica elements."""
    for i in range(n):
        prompts = np.full((1, 2, 12), 2, np.int32)
        prompts[0, :, :3] = [[5 + i, 6, 7], [8, 9 + i, 10]]
        yield {"prompt_ids": tf.constant(prompts), "prompt_length": tf.constant([[3, 3]]),
               "answer_ids": tf.constant(np.full((1, 2, 12), 4, np.int32)),
               "answer_length": tf.constant([[1, 1]])}


@pytest.mark.slow
def test_mu_updates_share_a_rollout_and_a_resumed_run_samples_it_again():
    step, seen = _grpo_step(consumed=0)
    batches = _batches(3)
    for _ in range(4):  # mu = 2: rollouts 0, 0, 1, 1
        step(batches)
    assert len(seen.rollouts) == 4
    np.testing.assert_array_equal(seen.rollouts[0]["input_ids"], seen.rollouts[1]["input_ids"])
    assert seen.rollouts[0]["input_ids"].shape == (1, 6, 12)  # k, 2 prompts x G = 3, T
    assert "old_logps" in seen.rollouts[0]
    # Resumed after 3 of those steps (checkpointed step + skipped = 3): rollout 1 is
    # sampled again from the second batch (the loop skips 3 // 2 = 1 batch) and gets the
    # one update left of it.
    resumed, again = _grpo_step(consumed=3)
    resumed(iter(list(_batches(3))[1:]))
    np.testing.assert_array_equal(again.rollouts[0]["input_ids"], seen.rollouts[2]["input_ids"])
    np.testing.assert_array_equal(again.rollouts[0]["rewards"], seen.rollouts[2]["rewards"])
    assert resumed.rollout is None and resumed.rollout_index == 2
