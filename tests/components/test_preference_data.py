"""DPO and GRPO batches for the Trainer (issue 29): the [B, 2, T] chosen/rejected layout and
its masking, the too-long filters and counts, the GRPO prompt/answer layout, and both
through `split_for_replicas`."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import data

PAD, EOS, IGNORE = 2, 1, data.IGNORE_LABEL


@pytest.fixture
def dpo_file(tmp_path):
    path = str(tmp_path / "dpo.gz")
    # (chosen = prompt ++ chosen ++ [EOS], rejected = prompt ++ rejected ++ [EOS],
    #  prompt_length, chosen bytes)
    data.write_dpo_examples(path, [
        ([5, 6, 7, 8, 9, EOS], [5, 6, 7, 4, EOS], 3, 10),    # prompt 5 6 7
        ([5, 6, EOS], [5, 3, 3, 3, EOS], 1, 3),              # prompt 5
        ([5, 6, EOS], list(range(3, 20)) + [EOS], 1, 4),     # rejected too long for 8
        (list(range(3, 20)) + [EOS], [5, 6, EOS], 1, 30),    # chosen too long for 8
        ([5, 6, 7, 8, 9, 10, 11, 12, EOS], [5, 4, EOS], 2, 14),  # 9 ids = seq_len + 1: fits
    ])
    return path


def test_dpo_rows_stack_chosen_and_rejected_with_response_only_labels(dpo_file):
    (batch,) = list(data.make_dpo_eval_dataset(dpo_file, 8, 4, PAD))
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 2, 8)
    ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
    np.testing.assert_array_equal(ids[0], [[5, 6, 7, 8, 9, PAD, PAD, PAD],
                                           [5, 6, 7, 4, PAD, PAD, PAD, PAD]])
    # prompt_length 3: the targets of positions 0, 1 (ids 6, 7) are prompt ids.
    np.testing.assert_array_equal(labels[0], [[IGNORE, IGNORE, 8, 9, EOS, IGNORE, IGNORE, IGNORE],
                                              [IGNORE, IGNORE, 4, EOS, IGNORE, IGNORE, IGNORE,
                                               IGNORE]])
    np.testing.assert_array_equal(ids[1], [[5, 6, PAD, PAD, PAD, PAD, PAD, PAD],
                                           [5, 3, 3, 3, PAD, PAD, PAD, PAD]])
    np.testing.assert_array_equal(labels[1], [[6, EOS] + [IGNORE] * 6,
                                              [3, 3, 3, EOS] + [IGNORE] * 4])
    # A sequence of seq_len + 1 ids fills the row: 8 inputs, 8 targets, no padding.
    np.testing.assert_array_equal(ids[2, 0], [5, 6, 7, 8, 9, 10, 11, 12])
    np.testing.assert_array_equal(labels[2, 0], [IGNORE, 7, 8, 9, 10, 11, 12, EOS])
    np.testing.assert_array_equal(batch["num_bytes"].numpy(), [10, 3, 14])
    assert batch["num_bytes"].dtype.name == "int64" and batch["input_ids"].dtype.name == "int32"


def test_dpo_pairs_too_long_are_counted(dpo_file):
    # Chosen targets of the 3 pairs used: 6 - 3, 3 - 1, 9 - 2 = 3 + 2 + 7.
    assert data.count_dpo_records(dpo_file, 8) == {
        "records": 5, "used": 3, "rejected": {"too_long": 2}, "response_tokens": 12}
    with pytest.raises(ValueError, match=r"no DPO pair of .*dpo\.gz fits train\.seq_len=2 "
                                         r"\(5 pairs; the shortest has 5 ids"):
        data.count_dpo_records(dpo_file, 2)


def test_read_dpo_records(dpo_file):
    chosen, rejected, prompt_length = next(iter(data.read_dpo_records(dpo_file)))
    assert chosen.numpy().tolist() == [5, 6, 7, 8, 9, EOS]
    assert rejected.numpy().tolist() == [5, 6, 7, 4, EOS]
    assert int(prompt_length) == 3 and chosen.dtype.name == "int32"


def test_dpo_training_batches_are_the_fitting_pairs_reshuffled_from_the_seed(dpo_file):
    def epochs(seed):
        """Each batch of 3 is one epoch of the 3 pairs that fit; a pair is named by its
        (chosen, rejected) response targets: (3, 2), (2, 4), (7, 1)."""
        ds = data.make_dpo_train_dataset(dpo_file, 8, 3, 10, seed=seed, pad_id=PAD)
        return [tuple(tuple(int(n) for n in np.sum(row >= 0, axis=-1))
                      for row in b["labels"].numpy()) for b in ds.take(6)]

    got = epochs(0)
    assert all(sorted(epoch) == [(2, 4), (3, 2), (7, 1)] for epoch in got)
    assert len(set(got)) > 1  # reshuffled every epoch
    assert epochs(0) == got  # deterministic from the seed
    batch = next(iter(data.make_dpo_train_dataset(dpo_file, 8, 3, 10, seed=0, pad_id=PAD)))
    assert batch["input_ids"].shape == batch["labels"].shape == (3, 2, 8)


def test_dpo_batches_split_for_replicas(dpo_file):
    ds = data.make_dpo_train_dataset(dpo_file, 8, 4, 10, seed=0, pad_id=PAD)
    global_batch = next(iter(ds))
    parts = list(data.split_for_replicas(tf.data.Dataset.from_tensors(global_batch),
                                         micro_batches=1, num_replicas=2))
    assert [p["input_ids"].shape for p in parts] == [(1, 2, 2, 8)] * 2  # (k, b, 2, T)
    np.testing.assert_array_equal(
        np.concatenate([p["labels"].numpy()[0] for p in parts]), global_batch["labels"].numpy())


@pytest.fixture
def grpo_file(tmp_path):
    path = str(tmp_path / "grpo.gz")
    # ids = prompt ++ answer ++ [EOS], prompt_length, answer bytes
    data.write_sft_examples(path, [
        ([5, 6, 7, 8, 9, EOS], 3, 2),         # prompt 5 6 7, answer 8 9
        ([5, 6, EOS], 1, 1),                  # prompt 5, answer 6
        (list(range(3, 9)) + [4, EOS], 6, 1),  # prompt of 6 ids: 6 + 4 > 8, too long
        ([5] + list(range(10, 20)) + [EOS], 1, 10),  # answer of 10 ids > seq_len 8
    ])
    return path


def test_grpo_rows_hold_the_prompt_and_the_answer_apart(grpo_file):
    (batch,) = list(data.make_grpo_eval_dataset(grpo_file, 8, 4, 4, PAD))
    np.testing.assert_array_equal(batch["prompt_ids"].numpy(), [[5, 6, 7] + [PAD] * 5,
                                                                [5] + [PAD] * 7])
    np.testing.assert_array_equal(batch["prompt_length"].numpy(), [3, 1])
    np.testing.assert_array_equal(batch["answer_ids"].numpy(), [[8, 9] + [PAD] * 6,
                                                                [6] + [PAD] * 7])
    np.testing.assert_array_equal(batch["answer_length"].numpy(), [2, 1])
    assert {k: v.dtype.name for k, v in batch.items()} == dict.fromkeys(batch, "int32")
    # With room for 6 new ids, a prompt of 3 ids no longer fits 8: one record left.
    (batch,) = list(data.make_grpo_eval_dataset(grpo_file, 8, 6, 4, PAD))
    np.testing.assert_array_equal(batch["prompt_length"].numpy(), [1])


def test_grpo_counts_and_training_batches(grpo_file, tmp_path):
    assert data.count_grpo_records(grpo_file, 8, 4) == {
        "records": 4, "used": 2, "rejected": {"too_long": 2}}
    long_prompts = str(tmp_path / "long.gz")
    data.write_sft_examples(long_prompts, [([5, 6, 7, 8, 9, EOS], 3, 2)])
    with pytest.raises(ValueError, match=r"no GRPO record of .*long\.gz fits train\.seq_len=8 "
                                         r"with max_new_tokens=6 \(1 records; the shortest "
                                         r"prompt has 3 ids\)"):
        data.count_grpo_records(long_prompts, 8, 6)
    with pytest.raises(ValueError, match=r"max_new_tokens=8 must be in \[1, seq_len\)"):
        data.make_grpo_train_dataset(grpo_file, 8, 8, 2, 10, seed=0, pad_id=PAD)
    ds = data.make_grpo_train_dataset(grpo_file, 8, 4, 2, 10, seed=0, pad_id=PAD)
    batch = next(iter(ds))
    assert {k: tuple(v.shape) for k, v in batch.items()} == {
        "prompt_ids": (2, 8), "prompt_length": (2,), "answer_ids": (2, 8),
        "answer_length": (2,)}
    assert sorted(batch["prompt_length"].numpy().tolist()) == [1, 3]
    parts = list(data.split_for_replicas(tf.data.Dataset.from_tensors(batch),
                                         micro_batches=1, num_replicas=2))
    assert [tuple(p["prompt_ids"].shape) for p in parts] == [(1, 1, 8)] * 2
    assert [tuple(p["answer_length"].shape) for p in parts] == [(1, 1)] * 2
    np.testing.assert_array_equal(
        np.concatenate([p["answer_ids"].numpy()[0] for p in parts]), batch["answer_ids"].numpy())
