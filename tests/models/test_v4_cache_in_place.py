"""DeepSeek-V4's cache written in place (`call_with_cache(..., in_place=True)`, as
`generate`, chat and the decode benchmark call it): the same logits and cache as the
copying write, the given entry buffers really written (a decode step that closes a window
writes one row, not a copy of T/m), a new buffer at every `init_cache` even in a compiled
function, and the indexer's one-query (decode) scoring equal to its by-head scoring."""

import keras
import numpy as np
import tensorflow as tf
from v4_random_model import random_v4_model

from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.deepseek_v4.lightning_indexer import _index_scores

# Sliding / CSA (m 4) / HCA (m 8) / CSA, top-k 3: 30 tokens close 7 CSA windows, 3 HCA.
CONFIG = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA, CSA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "moe", "moe", "moe"),
    hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=3, swiglu_limit=1.0, max_position_embeddings=64)
GROWING = ("entries", "index_entries")  # the buffers written in place


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
    model = random_v4_model(CONFIG)
    ids = tf.constant(np.random.default_rng(6).integers(0, 64, (2, 30)), tf.int32)
    copied, start_copied, end_copied = _decode(model, ids, 9, in_place=False)
    written, start_written, end_written = _decode(model, ids, 9, in_place=True)
    np.testing.assert_array_equal(written, copied)  # the same ops but the write
    for layer, kind in enumerate(CONFIG.layer_types):
        if kind == SLIDING:
            continue
        closed = 30 // CONFIG.compress_rates[kind]  # windows the 30 tokens close
        for key in GROWING if kind == CSA else GROWING[:1]:
            end = end_written[layer][key].numpy()
            np.testing.assert_array_equal(end, end_copied[layer][key].numpy())
            assert np.abs(end[:, :closed]).max(axis=-1).min() > 0
            assert not end[:, closed:].any()
            # In place: the buffers init_cache gave now hold every entry; copied: still 0.
            np.testing.assert_array_equal(start_written[layer][key].numpy(), end)
            assert not start_copied[layer][key].numpy().any()


def test_a_compiled_init_cache_is_a_new_buffer_at_every_call():
    """init_cache inside a tf.function of static shapes: two calls never share a buffer
    (a folded constant would carry the first call's entries into the second)."""
    model = random_v4_model(CONFIG)

    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32)])
    def prefill(ids):
        _, cache = model.call_with_cache(ids, model.init_cache(1, 16), 0, in_place=True)
        return cache[1]["entries"]  # (1, 5, D): CSA, m 4

    first = prefill(tf.constant([[3, 4, 5, 6, 7, 8, 9, 10]])).numpy()  # closes windows 0, 1
    second = prefill(tf.constant([[9, 10, 11, 12]])).numpy()  # closes window 0
    assert np.abs(first[0, :2]).max(axis=-1).min() > 0 and not first[:, 2:].any()
    assert np.abs(second[0, 0]).max() > 0
    assert not second[:, 1:].any(), "the second call's cache holds entries it did not write"


def test_one_query_index_scores_equal_the_by_head_scores():
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
