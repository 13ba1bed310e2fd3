"""Balanced `tid2eid` tables for from-scratch DeepSeek-V4 models
(`models/deepseek_v4/hash_routing.py`): valid rows, balanced expected load, determinism,
errors, and a model whose hash layers route by the assigned table."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from v4_random_model import random_v4_model

from models.deepseek_v4 import hash_routing as H
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config

TINY = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=8, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "hash_moe", "moe"),
    hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=3)


def _zipf_counts(vocab=4096, tokens=1_000_000, seed=0, zero_tail=96):
    """Counts of a Zipf(1) unigram distribution in a shuffled vocabulary, the last
    `zero_tail` ids never seen."""
    p = 1.0 / np.arange(1, vocab + 1)
    p[-zero_tail:] = 0.0
    counts = np.round(p / p.sum() * tokens).astype(np.int64)
    return np.random.default_rng(seed).permutation(counts)


def _assert_valid(table, vocab, experts, k):
    assert table.dtype == np.int32 and table.shape == (vocab, k)
    assert table.min() >= 0 and table.max() < experts
    ordered = np.sort(table, axis=1)
    assert (ordered[:, 1:] != ordered[:, :-1]).all()  # distinct experts per row


@pytest.mark.parametrize("experts,k", [(8, 2), (16, 3), (6, 6)])
def test_rows_are_distinct_experts_in_range(experts, k):
    counts = _zipf_counts()
    table = H.balanced_tid2eid(counts, experts, k, seed=1)
    _assert_valid(table, counts.size, experts, k)


def test_expected_load_is_balanced_on_a_zipfian_distribution():
    counts = _zipf_counts()
    experts, k = 8, 2
    table = H.balanced_tid2eid(counts, experts, k)
    load = H.expected_expert_load(table, counts)
    mean = k * counts.sum() / experts
    assert load.sum() == k * counts.sum()
    spread = np.abs(load / mean - 1).max()
    assert spread < 0.01  # measured: 5.4e-5 (the largest token is 11% of the tokens)
    # A uniformly random table is far less even on the same counts.
    rng = np.random.default_rng(0)
    random = np.stack([rng.permutation(experts)[:k] for _ in range(counts.size)])
    assert np.abs(H.expected_expert_load(random, counts) / mean - 1).max() > 0.1  # 0.51


def test_the_table_is_a_function_of_the_seed_and_unseen_ids_are_spread():
    counts = _zipf_counts()
    a = H.balanced_tid2eid(counts, 8, 2, seed=3)
    np.testing.assert_array_equal(a, H.balanced_tid2eid(counts, 8, 2, seed=3))
    assert not np.array_equal(a, H.balanced_tid2eid(counts, 8, 2, seed=4))
    unseen = a[counts == 0]  # 96 ids: round-robin, every expert used 96 * 2 / 8 times
    np.testing.assert_array_equal(np.bincount(unseen.reshape(-1), minlength=8), [24] * 8)
    # No counts at all (a new vocabulary): still a valid, even table.
    empty = H.balanced_tid2eid(np.zeros(10), 4, 2)
    _assert_valid(empty, 10, 4, 2)
    np.testing.assert_array_equal(np.bincount(empty.reshape(-1)), [5, 5, 5, 5])


@pytest.mark.parametrize("args,match", [
    ((np.ones(8), 4, 5), r"num_experts_per_tok=5 must be <= n_routed_experts=4"),
    ((np.array([1.0, -2.0]), 4, 2), r"token_counts\[1\]=-2.0 is negative"),
    ((np.ones((2, 3)), 4, 2), r"token_counts must be a non-empty \(vocab_size,\) vector"),
    ((np.array([1.0, np.inf]), 4, 2), "token_counts must be finite"),
    ((np.ones(4), 0, 1), r"n_routed_experts=0 must be an integer >= 1"),
    ((np.ones(4), 4, 2.0), r"num_experts_per_tok=2.0 must be an integer >= 1"),
])
def test_bad_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        H.balanced_tid2eid(*args)


def test_count_tokens_counts_ids_and_names_a_bad_one():
    counts = H.count_tokens([np.array([[0, 1, 1]]), tf.constant([3, 1])], 5)
    np.testing.assert_array_equal(counts, [1, 3, 0, 1, 0])
    with pytest.raises(ValueError, match=r"token id 5 is outside \[0, vocab_size=5\)"):
        H.count_tokens([np.array([5])], 5)


def test_assigned_table_drives_every_hash_layer():
    model = random_v4_model(TINY, seed=2)
    ids = np.random.default_rng(5).integers(0, TINY.vocab_size, (2, 12))
    counts = H.count_tokens([ids], TINY.vocab_size)
    table = H.balanced_tid2eid(counts, TINY.n_routed_experts, TINY.num_experts_per_tok)
    assert H.assign_tid2eid(model, table) == 2
    routers = H.hash_routers(model)
    assert len(routers) == 2
    x = tf.random.normal([ids.size, TINY.hidden_size], seed=1)
    for router in routers:
        np.testing.assert_array_equal(router.tid2eid.numpy(), table)
        chosen, _, _ = router(x, tf.constant(ids.reshape(-1)))
        np.testing.assert_array_equal(chosen.numpy(), table[ids.reshape(-1)])
    # The hash layers' measured routings are the table's expected load on these ids.
    load = model.forward_train(tf.constant(ids, tf.int32), training=False)["expert_load"]
    for row in load.numpy()[:2]:
        np.testing.assert_array_equal(row, H.expected_expert_load(table, counts))
    # One table per hash layer, and the errors.
    per_layer = np.stack([table, np.roll(table, 1, axis=1)])
    assert H.assign_tid2eid(model, per_layer) == 2
    np.testing.assert_array_equal(routers[1].tid2eid.numpy(), per_layer[1])
    with pytest.raises(ValueError, match=r"table has shape \(64, 3\), expected \(64, 2\)"):
        H.assign_tid2eid(model, np.zeros((64, 3), np.int32))
    bad = table.copy()
    bad[7] = [1, 1]
    with pytest.raises(ValueError, match=r"row 7 \(token id 7\) repeats an expert"):
        H.assign_tid2eid(model, bad)
