"""Expert pruning of DeepSeek-V4 models (`models/deepseek_v4/expert_pruning.py`): the kept
experts' weights and router rows, `tid2eid` kept valid in hash layers, exact logits when
nothing is pruned, int8 copied as int8, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from v4_random_model import random_v4_model

from models.deepseek_v4 import expert_pruning as P
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.formats import quantization as Q

# Hash routing in two layers, learned top-k in two, 8 experts, top-2.
TINY = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=8, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA, CSA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "hash_moe", "moe", "moe"),
    hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=3, swiglu_limit=1.0)


@pytest.fixture(scope="module")
def model():
    return random_v4_model(TINY, seed=3)


def _ids(seed=1, shape=(2, 16)):
    return tf.constant(np.random.default_rng(seed).integers(0, TINY.vocab_size, shape), tf.int32)


def _load(seed=0, rows=4):
    return np.random.default_rng(seed).permutation(rows * 8).reshape(rows, 8).astype(float)


def test_expert_load_counts_every_routing(model):
    load = P.expert_load(model, [_ids(1), _ids(2)])
    assert load.shape == (4, 8) and load.dtype == np.float64
    np.testing.assert_array_equal(load.sum(axis=1), 2 * 2 * 16 * 2)  # batches * B*T * k
    with pytest.raises(ValueError, match="token_batches is empty"):
        P.expert_load(model, [])


def test_keep_all_experts_gives_the_same_logits(model):
    pruned = P.prune_experts(model, 8, _load())
    ids = _ids(4)
    np.testing.assert_array_equal(pruned(ids).numpy(), model(ids).numpy())


def test_the_pruned_model_keeps_the_chosen_experts_and_runs(model):
    load = _load(1)
    kept = P.select_experts(TINY, 4, load)
    pruned = P.prune_experts(model, 4, load)
    assert pruned.config.n_routed_experts == 4
    assert pruned.config.to_dict() == {**TINY.to_dict(), "n_routed_experts": 4}
    for old, new, rows, row_load in zip(model.moe_layers, pruned.moe_layers, kept, load,
                                        strict=True):
        np.testing.assert_array_equal(rows, np.sort(np.argsort(-row_load)[:4]))
        for a, b in zip(old.experts.projections, new.experts.projections, strict=True):
            np.testing.assert_array_equal(b.kernel.numpy(), a.kernel.numpy()[rows])
        np.testing.assert_array_equal(new.gate.weight.numpy(), old.gate.weight.numpy()[rows])
        if old.is_hash:
            table = new.gate.tid2eid.numpy()
            assert table.min() >= 0 and table.max() < 4
            assert (np.sort(table, 1)[:, 1:] != np.sort(table, 1)[:, :-1]).all()
        else:
            np.testing.assert_array_equal(new.gate.e_score_correction_bias.numpy(),
                                          old.gate.e_score_correction_bias.numpy()[rows])
    out = pruned.forward_train(_ids(5), training=False)
    assert out["logits"].shape == (2, 16, TINY.vocab_size)
    assert out["expert_load"].shape == (4, 4)


def test_a_hash_layer_routes_fully_kept_tokens_as_before(model):
    load = _load(2)
    pruned = P.prune_experts(model, 4, load)
    rows = P.select_experts(TINY, 4, load)[0]
    old, new = model.moe_layers[0], pruned.moe_layers[0]
    table = old.gate.tid2eid.numpy()
    new_id = np.full(8, -1)
    new_id[rows] = np.arange(4)
    kept_tokens = np.flatnonzero(np.isin(table, rows).all(axis=1))
    assert 0 < kept_tokens.size < TINY.vocab_size  # some tokens lost an expert
    np.testing.assert_array_equal(new.gate.tid2eid.numpy()[kept_tokens],
                                  new_id[table[kept_tokens]])
    # The layer's output for those tokens is unchanged.
    ids = tf.constant(kept_tokens[None, :], tf.int32)  # (1, N)
    x = tf.random.normal([1, kept_tokens.size, TINY.hidden_size], seed=3)
    np.testing.assert_allclose(new(x, input_ids=ids)[0].numpy(),
                               old(x, input_ids=ids)[0].numpy(), rtol=1e-6, atol=1e-6)


def test_a_score_layer_routes_as_the_original_with_the_dropped_experts_masked(model):
    load = _load(3)
    pruned = P.prune_experts(model, 4, load)
    rows = P.select_experts(TINY, 4, load)[2]
    old, new = model.moe_layers[2].gate, pruned.moe_layers[2].gate
    x = tf.random.normal([32, TINY.hidden_size], seed=4)
    _, _, scores = old(x)
    choice = scores.numpy() + old.e_score_correction_bias.numpy()
    masked = np.full_like(choice, -np.inf)
    masked[:, rows] = choice[:, rows]
    expected = np.sort(np.argsort(-masked, axis=1)[:, :2], axis=1)  # original ids
    idx, weights, _ = new(x)
    order = np.argsort(idx.numpy(), axis=1)
    np.testing.assert_array_equal(rows[np.take_along_axis(idx.numpy(), order, 1)], expected)
    chosen = np.take_along_axis(scores.numpy(), expected, axis=1)
    np.testing.assert_allclose(np.take_along_axis(weights.numpy(), order, 1),
                               chosen / chosen.sum(1, keepdims=True) * 1.5, rtol=1e-5)


def test_dropped_table_entries_take_the_most_routed_kept_expert_not_in_the_row():
    table = np.array([[0, 1], [2, 5], [5, 6], [6, 0], [4, 5]])
    kept = np.array([0, 2, 4, 6])  # new ids 0, 1, 2, 3
    load_row = np.array([5.0, 9.0, 1.0, 0.0, 7.0, 8.0, 3.0, 0.0])  # kept ranked: 4, 0, 6, 2
    out = P.prune_tid2eid(table, kept, load_row)
    np.testing.assert_array_equal(out, [
        [0, 2],  # 1 dropped: 4 (new id 2) is the most routed kept expert
        [1, 2],  # 5 dropped: 4
        [2, 3],  # 5 dropped -> 4; 6 kept (new id 3)
        [3, 0],  # both kept
        [2, 0],  # 5 dropped: 4 is in the row already -> 0
    ])
    both = P.prune_tid2eid(np.array([[1, 3], [7, 5]]), kept, load_row)
    np.testing.assert_array_equal(both, [[2, 0], [2, 0]])  # two dropped: 4, then 0


def test_an_int8_model_is_pruned_to_an_int8_model_with_the_same_codes():
    model = random_v4_model(TINY, seed=4)
    Q.quantize_int8(model)
    ids = _ids(6)
    same = P.prune_experts(model, 8, _load())
    np.testing.assert_array_equal(same(ids).numpy(), model(ids).numpy())
    load = _load(5)
    rows = P.select_experts(TINY, 4, load)
    pruned = P.prune_experts(model, 4, load)
    assert Q.is_quantized_model(pruned)
    assert [Q.is_quantized(a) for a in Q.quantized_layers(model)] == [
        Q.is_quantized(b) for b in Q.quantized_layers(pruned)]
    old, new = model.moe_layers[1].experts.down_proj, pruned.moe_layers[1].experts.down_proj
    np.testing.assert_array_equal(Q.kernel_variable(new).numpy(),
                                  Q.kernel_variable(old).numpy()[rows[1]])
    np.testing.assert_array_equal(new.kernel_scale.numpy(), old.kernel_scale.numpy()[rows[1]])
    assert np.isfinite(pruned(ids).numpy()).all()


def test_lora_adapters_are_merged_into_the_pruned_kernels():
    model = random_v4_model(TINY, seed=5)
    attn = model.decoder_layers[0].self_attn
    attn.q_a_proj.enable_lora(2)
    attn.q_a_proj.lora_kernel_b.assign(tf.random.normal(attn.q_a_proj.lora_kernel_b.shape))
    experts = model.moe_layers[3].experts.up_proj
    experts.enable_lora(2)
    experts.lora_kernel_b.assign(tf.random.normal(experts.lora_kernel_b.shape))
    ids = _ids(7)
    pruned = P.prune_experts(model, 8, _load())
    assert not pruned.decoder_layers[0].self_attn.q_a_proj.lora_enabled
    np.testing.assert_allclose(pruned(ids).numpy(), model(ids).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("keep,match", [
    (1, r"keep=1 must be in \[num_experts_per_tok=2, n_routed_experts=8\]"),
    (9, r"keep=9 must be in \[num_experts_per_tok=2, n_routed_experts=8\]"),
    (3.0, r"keep=3.0 must be an integer"),
])
def test_bad_keep_is_refused_naming_the_fields(model, keep, match):
    with pytest.raises(ValueError, match=match):
        P.prune_experts(model, keep, _load())


def test_bad_load_is_refused(model):
    with pytest.raises(ValueError, match=r"load has shape \(3, 8\), expected \(num_moe_layers=4"):
        P.prune_experts(model, 4, _load(rows=3))
    with pytest.raises(ValueError, match="load must be finite and >= 0"):
        P.select_experts(TINY, 4, -_load())
    assert P.pruned_config(TINY, 2).n_routed_experts == 2


def test_mtp_blocks_are_pruned_too():
    config = TINY.replace(num_nextn_predict_layers=1)
    model = random_v4_model(config, seed=6)
    load = P.expert_load(model, [_ids(8)])
    assert load.shape == (5, 8)
    pruned = P.prune_experts(model, 4, load)
    rows = P.select_experts(config, 4, load)[4]
    old, new = model.mtp_layers[0].block.mlp, pruned.mtp_layers[0].block.mlp
    np.testing.assert_array_equal(new.gate.weight.numpy(), old.gate.weight.numpy()[rows])
    np.testing.assert_array_equal(pruned.mtp_layers[0].e_proj.kernel.numpy(),
                                  model.mtp_layers[0].e_proj.kernel.numpy())
    assert len(pruned.forward_train(_ids(9), training=False)["mtp_logits"]) == 1
