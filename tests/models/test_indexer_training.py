"""The lightning indexer's training signal (DeepSeek-V3.2-Exp report §2.1.1, sparse stage):
`models.layers.indexer_scores.indexer_kl_loss`, MLA's `return_indexer_loss`, and
`DeepSeekCausalLM.forward_train(...)["indexer_loss"]`. Tiny configs, seconds each.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.layers.indexer_scores import indexer_kl_loss

V32 = DeepSeekConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, n_group=2,
    topk_group=1, num_experts_per_tok=2, max_position_embeddings=64,
    num_nextn_predict_layers=1, index_topk=4, index_n_heads=2, index_head_dim=8)


def _ids(batch=2, seq=12, seed=8):
    return tf.constant(np.random.default_rng(seed).integers(0, 64, (batch, seq)), tf.int32)


def test_kl_loss_by_hand():
    """Two queries: one with keys {0, 2} kept, one with none (not counted)."""
    mass = tf.constant([[[0.2, 5.0, 0.6], [1.0, 1.0, 1.0]]])  # (1, 2, 3)
    scores = tf.constant([[[1.0, 9.0, 0.0], [0.0, 0.0, 0.0]]])
    kept = tf.constant([[[True, False, True], [False, False, False]]])
    p = np.array([0.25, 0.75])
    q = np.exp([1.0, 0.0]) / np.exp([1.0, 0.0]).sum()
    expected = float((p * np.log(p / q)).sum())  # mean over the 1 query with keys
    assert abs(float(indexer_kl_loss(mass, scores, kept)) - expected) < 1e-6
    # The gradient is (q - p) / count on the kept scores, 0 elsewhere; none for the mass.
    scores_var = tf.Variable(scores)
    mass_var = tf.Variable(mass)
    with tf.GradientTape(persistent=True) as tape:
        loss = indexer_kl_loss(mass_var, scores_var, kept)
    np.testing.assert_allclose(tape.gradient(loss, scores_var).numpy()[0],
                               [[q[0] - p[0], 0, q[1] - p[1]], [0, 0, 0]], atol=1e-6)
    assert tape.gradient(loss, mass_var) is None
    assert float(indexer_kl_loss(mass, scores, tf.zeros_like(kept))) == 0.0
    # The same distribution gives 0 (a zero mass row too: p = 0, no NaN).
    same = indexer_kl_loss(tf.constant([[[1.0, np.e]]]), tf.constant([[[0.0, 1.0]]]),
                           tf.constant([[[True, True]]]))
    assert abs(float(same)) < 1e-6
    zero = indexer_kl_loss(tf.zeros([1, 1, 2]), tf.constant([[[0.0, 1.0]]]),
                           tf.constant([[[True, True]]]))
    assert float(zero) == 0.0


def test_forward_train_returns_the_indexer_loss_and_keeps_the_logits():
    keras.utils.set_random_seed(1)
    model = DeepSeekCausalLM(V32)
    ids = _ids()
    out = model.forward_train(ids, training=False)
    loss = out["indexer_loss"]
    assert loss.dtype == tf.float32 and loss.shape == () and float(loss) > 0
    np.testing.assert_array_equal(out["logits"].numpy(), model(ids).numpy())
    per_layer = [b.self_attn(b.input_layernorm(model.embed_tokens(ids)),
                             return_indexer_loss=True)[1] for b in model.decoder_layers[:1]]
    assert float(per_layer[0]) > 0
    recomputed = model.forward_train(ids, training=False, recompute_blocks=True)
    assert abs(float(recomputed["indexer_loss"]) - float(loss)) < 1e-6

    plain = DeepSeekCausalLM(V32.replace(index_topk=None, index_n_heads=None,
                                         index_head_dim=None))
    zero = plain.forward_train(ids)["indexer_loss"]
    assert zero.dtype == tf.float32 and float(zero) == 0.0


def test_mla_refuses_the_indexer_loss_with_a_cache():
    keras.utils.set_random_seed(1)
    model = DeepSeekCausalLM(V32)
    attn = model.decoder_layers[0].self_attn
    cache = model.init_cache(1, 8)[0]
    with pytest.raises(ValueError, match="return_indexer_loss is for the stateless"):
        attn(tf.zeros([1, 2, 32]), cache=cache, cache_index=0, return_indexer_loss=True)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_indexer_loss_trains_only_the_indexer_and_moves_it():
    """indexer_loss has no
    gradient on any other weight, a non-zero one on every indexer weight; the LM loss has
    none on the indexers; SGD on indexer_loss alone lowers it (weights drawn wider than
    the default 0.02, so that the main attention is far from uniform)."""
    keras.utils.set_random_seed(2)
    model = DeepSeekCausalLM(V32.replace(initializer_range=0.2))
    indexers = [b.self_attn.indexer for b in [*model.decoder_layers,
                                             *(m.block for m in model.mtp_layers)]]
    assert all(ix.trainable_weights for ix in indexers)  # trainable: indexer_loss trains them
    index_vars = [v for ix in indexers for v in ix.trainable_weights]
    index_ids = {id(v) for v in index_vars}
    others = [v for v in model.trainable_variables if id(v) not in index_ids]
    ids = _ids(seed=3)
    with tf.GradientTape(persistent=True) as tape:
        out = model.forward_train(ids)
        lm = tf.reduce_mean(tf.square(out["logits"]))
    loss = out["indexer_loss"]
    assert all(g is None for g in tape.gradient(loss, others))
    grads = tape.gradient(loss, index_vars)
    assert all(g is not None and float(tf.reduce_max(tf.abs(g))) > 0 for g in grads), [
        v.path for v, g in zip(index_vars, grads, strict=True)
        if g is None or float(tf.reduce_max(tf.abs(g))) == 0]
    assert all(g is None for g in tape.gradient(lm, index_vars))

    optimizer = keras.optimizers.SGD(learning_rate=1.0)
    first = float(loss)
    for _ in range(8):
        with tf.GradientTape() as tape:
            loss = model.forward_train(ids)["indexer_loss"]
        optimizer.apply_gradients(zip(tape.gradient(loss, index_vars), index_vars, strict=True))
    last = float(model.forward_train(ids)["indexer_loss"])
    assert last < 0.5 * first, (first, last)  # 0.252 -> 0.094 measured
