"""DeepSeekCausalLM: golden parameter counts, shapes, causality, caching, losses, SavedModel."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.deepseek.flops import activated_params, total_params

# Golden parameter count of the tiny config (C=32, V=64, H=4, q_lora 16, kv_lora R=16,
# nope 8, rope 4, v 8, d_qk=12, E=8 experts of width 16, 1 shared, I=64), by hand:
#   embed_tokens              64*32                          = 2048
#   attention (per block)
#     q_a_proj                32*16                          =  512
#     q_a_layernorm           16                             =   16
#     q_b_proj                16*(4*12)                      =  768
#     kv_a_proj_with_mqa      32*(16+4)                      =  640
#     kv_a_layernorm          16                             =   16
#     kv_b_proj               16*(4*(8+8))                   = 1024
#     o_proj                  (4*8)*32                       = 1024
#                                                      total = 4000
#   norms (per block)         2*32                           =   64
#   dense mlp (block 0)       3*32*64                        = 6144
#   moe (blocks 1 and MTP)    gate 8*32 + bias 8             =  264
#                             experts 8*3*32*16              = 12288
#                             shared 3*32*(16*1)             = 1536
#                                                      total = 14088
#   block 0 (dense)           4000 + 64 + 6144               = 10208
#   block 1 (MoE)             4000 + 64 + 14088              = 18152
#   final norm                32                             =   32
#   lm_head (untied)          32*64                          = 2048
#   MTP: enorm 32 + hnorm 32 + eh_proj 64*32 + MoE block 18152 + shared_head.norm 32
#                                                            = 20296
#   total  2048 + 10208 + 18152 + 32 + 2048 + 20296          = 52784
TINY_PARAMS = 52784
# q_lora_rank=None: q_proj 32*48 = 1536 replaces 512 + 16 + 768 = 1296, i.e. +240 in each
# of the 3 blocks (2 main + 1 MTP): 52784 + 720 = 53504.
TINY_PARAMS_NO_Q_LORA = 53504
# tie_word_embeddings=True drops lm_head: 52784 - 2048 = 50736.
TINY_PARAMS_TIED = 50736
# Activated per token (no MTP): block 0 10208 + block 1 (4000 + 64 + 264 + 2*1536 + 1536
# = 8936) + final norm 32 + lm_head 2048 = 21224.
TINY_ACTIVE = 21224


def _ids(batch, seq, seed=0, vocab=64):
    return tf.constant(np.random.default_rng(seed).integers(0, vocab, size=(batch, seq)),
                       tf.int32)


def test_golden_parameter_counts(tiny_model, tiny_config):
    assert tiny_model.count_params() == TINY_PARAMS == total_params(tiny_config)
    assert activated_params(tiny_config) == TINY_ACTIVE
    no_q_lora = tiny_config.replace(q_lora_rank=None)
    assert DeepSeekCausalLM(no_q_lora).count_params() == TINY_PARAMS_NO_Q_LORA
    assert total_params(no_q_lora) == TINY_PARAMS_NO_Q_LORA
    tied = tiny_config.replace(tie_word_embeddings=True)
    tied_model = DeepSeekCausalLM(tied)
    assert tied_model.lm_head is None
    assert tied_model.count_params() == TINY_PARAMS_TIED == total_params(tied)
    # The router bias is the only non-trainable weight: one per MoE layer (block 1, MTP).
    non_trainable = [w.path for w in tiny_model.non_trainable_weights]
    assert len(non_trainable) == 2
    assert all(p.endswith("mlp/gate/e_score_correction_bias") for p in non_trainable)


def test_output_shapes_dtypes_and_causality(tiny_model):
    ids = _ids(2, 8)
    logits = tiny_model(ids)
    assert logits.shape == (2, 8, 64) and logits.dtype == tf.float32
    changed = tf.tensor_scatter_nd_update(ids, [[0, 5], [1, 5]], [1, 2])
    logits2 = tiny_model(changed)
    # Same positions, other later tokens: equal in exact arithmetic (causal mask), but
    # the masked softmax sums run over other rows of one matmul. Logits chain ~8
    # reductions of <= 64 terms (hidden 32/64, 8 positions): 8 x sqrt(64) = 64 ulps.
    assert_float32_close(logits2[:, :5], logits[:, :5], ulps=64, err_msg="causal prefix")
    assert not np.allclose(logits[:, 5:], logits2[:, 5:])


def test_forward_train_outputs_and_alignment(tiny_model):
    ids = _ids(2, 8, seed=1)
    out = tiny_model.forward_train(ids)
    # The training forward (with MoE balance statistics) against the plain call: the
    # same sums, possibly fused otherwise; bound as for the causal prefix.
    assert_float32_close(out["logits"], tiny_model(ids), ulps=64, err_msg="forward_train")
    assert len(out["mtp_logits"]) == 1 and out["mtp_logits"][0].shape == (2, 7, 64)
    # Rows: block 1 and the MTP block; 2*8 tokens * 2 experts in block 1, 2*7 * 2 in MTP.
    assert out["expert_load"].shape == (2, 8) and tiny_model.num_moe_layers == 2
    np.testing.assert_array_equal(out["expert_load"].numpy().sum(-1), [32, 28])
    assert out["balance_loss"].dtype == tf.float32
    assert np.isfinite(out["balance_loss"].numpy()) and out["balance_loss"].numpy() > 0
    # MTP depth 1 at position t sees tokens 0..t+1 only: changing token 6 leaves t < 5 alone.
    changed = tf.tensor_scatter_nd_update(ids, [[0, 6]], [3])
    mtp2 = tiny_model.forward_train(changed)["mtp_logits"][0]
    assert_float32_close(mtp2[:, :5], out["mtp_logits"][0][:, :5], ulps=64,
                         err_msg="MTP causal prefix")
    assert not np.allclose(out["mtp_logits"][0][0, 5], mtp2[0, 5])


def test_compute_loss_includes_mtp_and_call_skips_it(tiny_config):
    keras.utils.set_random_seed(3)
    model = DeepSeekCausalLM(tiny_config)
    ids = _ids(2, 9, seed=2)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    losses = model.compute_loss(inputs, labels)
    assert set(losses) == {"loss", "lm_loss", "mtp_loss", "balance_loss", "distill_loss",
                           "indexer_loss", "expert_load", "moe_dropped"}
    assert losses["distill_loss"].numpy() == 0.0  # no teacher
    assert losses["indexer_loss"].numpy() == 0.0  # no lightning indexer (V3)
    for name in ("loss", "lm_loss", "mtp_loss", "balance_loss"):
        assert losses[name].dtype == tf.float32 and losses[name].shape == ()
    assert losses["mtp_loss"].numpy() > 0
    np.testing.assert_allclose(
        losses["loss"],
        losses["lm_loss"] + 0.3 * losses["mtp_loss"] + losses["balance_loss"], rtol=1e-6)
    # lm_loss is the plain next-token cross-entropy of call()'s logits.
    logits = model(inputs)
    expected = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
    np.testing.assert_allclose(losses["lm_loss"], expected, rtol=1e-6)
    # MTP weights do not influence call(), but do change the MTP loss.
    before = model(inputs).numpy()
    eh = model.mtp_layers[0].eh_proj.kernel
    eh.assign(eh * 10.0)
    np.testing.assert_array_equal(model(inputs).numpy(), before)
    assert model.compute_loss(inputs, labels)["mtp_loss"].numpy() != losses["mtp_loss"].numpy()
    # Without MTP modules the MTP loss is exactly 0.
    no_mtp = DeepSeekCausalLM(tiny_config.replace(num_nextn_predict_layers=0))
    assert no_mtp.compute_loss(inputs, labels)["mtp_loss"].numpy() == 0.0
    assert no_mtp.forward_train(inputs)["expert_load"].shape == (1, 8)


def test_config_round_trip(tiny_model, tiny_config):
    config = tiny_model.get_config()
    assert DeepSeekConfig.from_dict(config["config"]) == tiny_config
    clone = DeepSeekCausalLM.from_config(config)
    assert clone.config == tiny_config and clone.count_params() == TINY_PARAMS
    clone.set_weights(tiny_model.get_weights())
    ids = _ids(1, 5)
    # The same computation on the same weights, on this machine: exactly equal.
    np.testing.assert_array_equal(clone(ids), tiny_model(ids))


def test_keras_native_save_and_load(tiny_model, tmp_path):
    tiny_model.save(str(tmp_path / "model.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "model.keras"))
    assert isinstance(loaded, DeepSeekCausalLM)
    ids = _ids(1, 5, seed=9)
    np.testing.assert_array_equal(loaded(ids), tiny_model(ids))


def test_cached_decoding_matches_full_forward(tiny_model):
    ids = _ids(2, 10, seed=4)
    full = tiny_model(ids).numpy()
    cache = tiny_model.init_cache(2, 12)
    # One buffer per layer: (B, S, kv_lora_rank + qk_rope_head_dim).
    assert [{k: v.shape for k, v in layer.items()} for layer in cache] == [
        {"kv": (2, 12, 16 + 4)}] * 2
    logits, cache = tiny_model.call_with_cache(ids[:, :6], cache, 0)
    steps = [logits.numpy()]
    for t in range(6, 10):
        logits, cache = tiny_model.call_with_cache(ids[:, t:t + 1], cache, t)
        steps.append(logits.numpy())
    # Decoding one token at a time against one pass: attention sums over the cached
    # positions in other chunks (same bound as the causal prefix, x2 for the cache's
    # stored latent being re-expanded per step): 128 ulps.
    assert_float32_close(np.concatenate(steps, axis=1), full, ulps=128, err_msg="cached")


def test_a_cache_of_another_layout_gets_a_named_error(tiny_model):
    stacked = tf.zeros([2, 1, 12, 20])  # the (L, B, S, W) tensor of earlier releases
    with pytest.raises(ValueError, match="tuple of 2 layer caches"):
        tiny_model.call_with_cache(_ids(1, 3), stacked, 0)
    cache = tiny_model.init_cache(1, 12)
    with pytest.raises(ValueError, match=r"keys \['kv'\].*got \['index_keys', 'kv'\]"):
        tiny_model.call_with_cache(
            _ids(1, 3), tuple({**c, "index_keys": c["kv"]} for c in cache), 0)


def test_cache_overflow_raises(tiny_model):
    cache = tiny_model.init_cache(1, 4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="overflow"):
        tiny_model.call_with_cache(_ids(1, 5), cache, 0)


@pytest.mark.slow
def test_saved_model_round_trip(tiny_model, tmp_path):
    from models.deepseek.generation import generate

    module = tf.Module()
    module.model = tiny_model
    module.logits = tf.function(
        lambda ids: tiny_model(ids), input_signature=[tf.TensorSpec([None, None], tf.int32)])
    module.greedy = tf.function(
        lambda ids: generate(tiny_model, ids, 4, temperature=0.0)[0],
        input_signature=[tf.TensorSpec([None, None], tf.int32)])
    ids = _ids(2, 6, seed=5)
    expected_logits, expected_tokens = module.logits(ids), module.greedy(ids)
    tf.saved_model.save(module, str(tmp_path / "model"))

    loaded = tf.saved_model.load(str(tmp_path / "model"))
    # A traced SavedModel graph may fuse what the eager call does not (grappler): the
    # same sums in another order, bounded as forward_train above.
    assert_float32_close(loaded.logits(ids), expected_logits, ulps=64, err_msg="SavedModel")
    np.testing.assert_array_equal(loaded.greedy(ids), expected_tokens)
    assert loaded.logits(_ids(1, 3)).shape == (1, 3, 64)


@pytest.mark.slow
def test_tiny_overfit_trains_attention_moe_and_mtp(tiny_config):
    keras.utils.set_random_seed(7)
    model = DeepSeekCausalLM(tiny_config.replace(aux_loss_alpha=0.001))
    ids = _ids(2, 17, seed=6)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    optimizer = keras.optimizers.AdamW(learning_rate=1e-2, weight_decay=0.0)
    optimizer.build(model.trainable_variables)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            losses = model.compute_loss(inputs, labels, training=True)
        grads = tape.gradient(losses["loss"], model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        model.update_router_biases(losses["expert_load"])
        return losses, grads

    losses, grads = train_step()
    grad_norms = {v.path.split("/", 1)[1]: float(tf.norm(g)) for v, g in
                  zip(model.trainable_variables, grads, strict=True)}
    # The routed experts' stacked kernels (E, in, out): one norm per expert and projection.
    for v, g in zip(model.trainable_variables, grads, strict=True):
        path = v.path.split("/", 1)[1]
        if path.startswith("layers.1/mlp/experts/"):
            for e in range(v.shape[0]):
                grad_norms[f"layers.1/mlp/experts.{e}/{path.split('/')[3]}"] = float(
                    tf.norm(tf.convert_to_tensor(g)[e]))
    assert all(np.isfinite(n) for n in grad_norms.values())
    for name in ("layers.0/self_attn/kv_b_proj/kernel", "layers.1/mlp/gate/weight",
                 "layers.1/mlp/shared_experts/up_proj/kernel", "mtp.0/eh_proj/kernel",
                 "mtp.0/block/mlp/gate/weight"):
        assert grad_norms[name] > 0, name
    routed = [n for p, n in grad_norms.items() if p.startswith("layers.1/mlp/experts.")]
    assert sum(n > 0 for n in routed) >= 2 * 3  # routed experts in use receive gradients
    first = {k: float(v) for k, v in losses.items() if k not in ("expert_load", "moe_dropped")}
    for _ in range(39):
        losses, _ = train_step()
    # 4.2 (= ln 64) -> ~0.02 for both in practice.
    assert float(losses["lm_loss"]) < 0.2 * first["lm_loss"]
    assert float(losses["mtp_loss"]) < 0.2 * first["mtp_loss"]


def test_tf_train_checkpoint_covers_every_weight(tiny_model, tiny_config, tmp_path):
    path = tf.train.Checkpoint(model=tiny_model).save(str(tmp_path / "ckpt"))
    saved = [name for name, _ in tf.train.list_variables(path) if name.startswith("model/")]
    assert len(saved) == len(tiny_model.weights)  # blocks and experts live in lists
    restored = DeepSeekCausalLM(tiny_config)
    tf.train.Checkpoint(model=restored).restore(path).assert_consumed()
    for a, b in zip(tiny_model.weights, restored.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_two_mtp_depths(tiny_config):
    keras.utils.set_random_seed(8)
    model = DeepSeekCausalLM(tiny_config.replace(num_nextn_predict_layers=2))
    ids = _ids(2, 8, seed=7)
    out = model.forward_train(ids)
    # Depth k has T - k positions; position t predicts labels[t + k].
    assert [m.shape for m in out["mtp_logits"]] == [(2, 7, 64), (2, 6, 64)]
    assert out["expert_load"].shape == (3, 8)  # block 1 + two MTP blocks
    losses = model.compute_loss(ids, ids)
    assert np.isfinite(losses["mtp_loss"].numpy()) and losses["mtp_loss"].numpy() > 0
    before = [v.numpy() for v in (moe.gate.e_score_correction_bias for moe in model.moe_layers)]
    model.update_router_biases(out["expert_load"], update_speed=0.5)
    for b, moe in zip(before, model.moe_layers, strict=True):
        assert np.abs(moe.gate.e_score_correction_bias.numpy() - b).max() == 0.5
