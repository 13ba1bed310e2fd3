"""KV caches written in place (`call_with_cache(..., in_place=True)`, as `generate`, chat
and the decode benchmark call it; `models/layers/cache_buffers.py`), MLA's (V3, V3.2)
and DeepSeek-V4's: the same logits and cache as the copying write, the given buffers
really written (no copy per step; V4: a step that closes a window writes one entry row),
a new buffer at every `init_cache` even in a compiled function, and the lightning
indexers' one-query (decode) scoring equal to their by-query / by-head scoring.

If a TF release makes `tf.raw_ops.InplaceUpdate` copy, the "writes the given buffers"
tests fail (the logits would still be right, only slower)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from v4_random_model import SMALL_V4, random_v4_model

from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.deepseek_v4.config import CSA, SLIDING
from models.deepseek_v4.lightning_indexer import _index_scores

# V3.2 at a tiny width, index_topk 4 of up to 12 slots: a decode step gathers its picks.
CONFIG = DeepSeekConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, n_group=2,
    topk_group=1, num_experts_per_tok=2, max_position_embeddings=64,
    num_nextn_predict_layers=0, index_topk=4, index_n_heads=2, index_head_dim=8,
    initializer_range=0.3)


def _decode(model, ids, prefill: int, in_place: bool):
    """(logits (B, T, V), the init_cache it started from, the last cache)."""
    batch, seq = ids.shape
    start = model.init_cache(batch, seq + 1)
    logits, cache = model.call_with_cache(ids[:, :prefill], start, 0, in_place=in_place)
    steps = [logits]
    for t in range(prefill, seq):
        logits, cache = model.call_with_cache(ids[:, t:t + 1], cache, t, in_place=in_place)
        steps.append(logits)
    return tf.concat(steps, axis=1).numpy(), start, cache


def test_in_place_equals_the_copying_write_and_writes_the_given_buffers():
    keras.utils.set_random_seed(5)
    model = DeepSeekCausalLM(CONFIG)
    ids = tf.constant(np.random.default_rng(6).integers(0, 64, (2, 11)), tf.int32)
    copied, start_copied, end_copied = _decode(model, ids, 5, in_place=False)
    written, start_written, end_written = _decode(model, ids, 5, in_place=True)
    np.testing.assert_array_equal(written, copied)  # the same ops but the write
    for layer in range(CONFIG.num_hidden_layers):
        for key in ("kv", "index_keys"):
            end = end_written[layer][key].numpy()
            np.testing.assert_array_equal(end, end_copied[layer][key].numpy())
            assert np.abs(end[:, :11]).min() > 0 and not end[:, 11:].any()
            # In place: the buffers init_cache gave now hold every token; copied: still 0.
            np.testing.assert_array_equal(start_written[layer][key].numpy(), end)
            assert not start_copied[layer][key].numpy().any()


def test_a_compiled_init_cache_is_a_new_buffer_at_every_call():
    """init_cache inside a tf.function of static shapes: two calls never share a buffer
    (a folded constant would carry the first call's entries into the second)."""
    keras.utils.set_random_seed(7)
    model = DeepSeekCausalLM(CONFIG)

    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32)])
    def prefill(ids):
        _, cache = model.call_with_cache(ids, model.init_cache(1, 8), 0, in_place=True)
        return cache[0]["kv"]  # (1, 8, R + Dr)

    first = prefill(tf.constant([[3, 4, 5, 6, 7]])).numpy()
    second = prefill(tf.constant([[9, 10]])).numpy()
    assert np.abs(first[:, :5]).min() > 0 and not first[:, 5:].any()
    assert np.abs(second[:, :2]).min() > 0 and not second[:, 2:].any(), (
        "the second call's cache holds entries it did not write")
    assert not np.array_equal(first[:, :2], second[:, :2])


def test_one_query_index_scores_equal_the_by_query_scores():
    """A decode step's indexer (T = 1: keys @ q, then the heads' weights by a matmul)
    against the (B, T, Hi, S) einsum path of the same query inside a T = 2 call."""
    keras.utils.set_random_seed(8)
    indexer = DeepSeekCausalLM(CONFIG).decoder_layers[0].self_attn.indexer
    rng = np.random.default_rng(9)
    x = tf.constant(rng.normal(size=(2, 2, CONFIG.hidden_size)), tf.float32)
    c_q = tf.constant(rng.normal(size=(2, 2, CONFIG.q_lora_rank)), tf.float32)
    keys = tf.constant(rng.normal(size=(2, 10, CONFIG.index_head_dim)), tf.float32)
    positions = tf.constant([[7, 7], [9, 9]], tf.int32)  # (B, T) the same query twice
    visible = tf.range(10)[None, None, :] <= positions[:, :, None]  # (B, T, S)
    by_query = indexer.index_scores(x, c_q, keys, positions, visible).numpy()  # (2, 2, 10)
    one = indexer.index_scores(x[:, :1], c_q[:, :1], keys, positions[:, :1],
                               visible[:, :1]).numpy()  # (2, 1, 10)
    np.testing.assert_array_equal(np.isinf(one), np.isinf(by_query[:, :1]))
    finite = np.isfinite(one)
    np.testing.assert_allclose(one[finite], by_query[:, :1][finite], rtol=1e-5, atol=1e-6)
    assert (one[finite] > 0).any()  # not all relu'd away
    # B = 1 (a chat's or the benchmark's step) takes a plain matmul: the same scores.
    alone = indexer.index_scores(x[:1, :1], c_q[:1, :1], keys[:1], positions[:1, :1],
                                 visible[:1, :1]).numpy()
    np.testing.assert_allclose(alone, one[:1], rtol=1e-5, atol=1e-6)


# ------------------------------------------------ DeepSeek-V4 (sliding / CSA / HCA / CSA)


@pytest.fixture(scope="module")
def v4_model():
    return random_v4_model(SMALL_V4)


def test_v4_in_place_equals_the_copying_write_and_writes_the_given_buffers(v4_model):
    model = v4_model
    ids = tf.constant(np.random.default_rng(6).integers(0, 64, (2, 17)), tf.int32)
    copied, start_copied, end_copied = _decode(model, ids, 6, in_place=False)
    written, start_written, end_written = _decode(model, ids, 6, in_place=True)
    np.testing.assert_array_equal(written, copied)  # the same ops but the write
    for layer, kind in enumerate(SMALL_V4.layer_types):
        if kind == SLIDING:
            continue
        closed = 17 // SMALL_V4.compress_rates[kind]  # windows the 17 tokens close
        for key in ("entries", "index_entries") if kind == CSA else ("entries",):
            end = end_written[layer][key].numpy()
            np.testing.assert_array_equal(end, end_copied[layer][key].numpy())
            assert np.abs(end[:, :closed]).max(axis=-1).min() > 0
            assert not end[:, closed:].any()
            # In place: the buffers init_cache gave now hold every entry; copied: still 0.
            np.testing.assert_array_equal(start_written[layer][key].numpy(), end)
            assert not start_copied[layer][key].numpy().any()


@pytest.mark.slow  # 11 s: the trace of the whole model (the fast tier's budget)
def test_v4_compiled_init_cache_is_a_new_buffer_at_every_call(v4_model):
    """init_cache inside a tf.function of static shapes: two calls never share a buffer
    (a folded constant would carry the first call's entries into the second)."""
    model = v4_model

    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32)])
    def prefill(ids):
        _, cache = model.call_with_cache(ids, model.init_cache(1, 16), 0, in_place=True)
        return cache[1]["entries"]  # (1, 5, D): CSA, m 4

    first = prefill(tf.constant([[3, 4, 5, 6, 7, 8, 9, 10]])).numpy()  # closes windows 0, 1
    second = prefill(tf.constant([[9, 10, 11, 12]])).numpy()  # closes window 0
    assert np.abs(first[0, :2]).max(axis=-1).min() > 0 and not first[:, 2:].any()
    assert np.abs(second[0, 0]).max() > 0
    assert not second[:, 1:].any(), "the second call's cache holds entries it did not write"


def test_v4_one_query_index_scores_equal_the_by_head_scores():
    """A decode step's indexer (T = 1: keys @ q once, then the heads' weights by a matmul)
    against the head-by-head path of the same query inside a T = 2 call."""
    keras.utils.set_random_seed(8)
    rng = np.random.default_rng(9)
    q = tf.constant(rng.normal(size=(2, 1, 4, 8)), tf.float32)  # (B, 1, n^I, c^I)
    weights = tf.constant(rng.normal(size=(2, 1, 4)), tf.float32)
    keys = tf.constant(rng.normal(size=(2, 10, 8)), tf.float32)  # (B, N, c^I)
    positions = tf.constant([[29, 29], [37, 37]], tf.int32)  # 7 and 9 complete entries
    by_head = _index_scores(tf.concat([q, q], 1), tf.concat([weights, weights], 1), keys,
                            positions, 4).numpy()  # (2, 2, 10)
    one = _index_scores(q, weights, keys, positions[:, :1], 4).numpy()  # (2, 1, 10)
    np.testing.assert_array_equal(np.isinf(one), np.isinf(by_head[:, :1]))
    assert np.isinf(one).sum(axis=-1).tolist() == [[3], [1]]
    finite = np.isfinite(one)
    np.testing.assert_allclose(one[finite], by_head[:, :1][finite], rtol=1e-5, atol=1e-6)
    assert (one[finite] != 0).any()  # not all relu'd away
    # B = 1 (a chat's or the benchmark's step) takes a plain matmul: the same scores.
    alone = _index_scores(q[:1], weights[:1], keys[:1], positions[:1, :1], 4).numpy()
    np.testing.assert_allclose(alone, one[:1], rtol=1e-5, atol=1e-6)
