"""MLA's cache written in place (`call_with_cache(..., in_place=True)`, as `generate`, chat
and the decode benchmark call it): the same logits and cache as the copying write, the
given buffers really written (no copy per step), a new buffer at every `init_cache` even
in a compiled function, and the lightning indexer's one-query (decode) scoring equal to
its by-query scoring."""

import keras
import numpy as np
import tensorflow as tf

from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig

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
