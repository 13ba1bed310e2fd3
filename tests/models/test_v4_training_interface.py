"""DeepSeekV4CausalLM's training interface: the one of `DeepSeekCausalLM` the trainer uses.

`forward_train` (MTP logits, MoE statistics, indexer loss, recomputation), `mtp_layers` /
`moe_layers` / `num_moe_layers`, `update_router_biases` (score-routed layers only), the
float32 mHC parameters under bf16 policies with Sinkhorn-Knopp differentiated through, the
frozen `tid2eid`, and the import of a checkpoint without MTP weights.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM
from models.deepseek_v4.config import CSA, HCA, MTP_LAYER_TYPE, SLIDING, DeepSeekV4Config
from models.deepseek_v4.hf_checkpoint import load_v4_checkpoint, save_hf_checkpoint
from models.deepseek_v4.hf_config import config_from_hf, config_to_hf
from models.deepseek_v4.hyper_connection import HyperConnection, sinkhorn_knopp
from models.deepseek_v4.mtp import DeepSeekV4MTPLayer

# 3 blocks (sliding + hash, CSA, HCA), 2 MTP depths; compress rates small enough that a
# 16-token input has CSA and HCA entries.
TINY = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "moe", "moe"),
    hc_mult=2, hc_sinkhorn_iters=5, sliding_window=6, o_groups=2, o_lora_rank=8,
    index_n_heads=2, index_head_dim=8, index_topk=3, swiglu_limit=1.0,
    num_nextn_predict_layers=2)
SEQ = 16


def _model(dtype=None, seed=0):
    keras.utils.set_random_seed(seed)
    model = DeepSeekV4CausalLM(TINY, dtype=dtype)
    rng = np.random.default_rng(seed)
    for block in model.decoder_layers:  # a non-trivial hash table: 2 distinct experts
        gate = block.mlp.gate
        if gate.tid2eid is not None:
            table = np.stack([rng.permutation(TINY.n_routed_experts)[:2]
                              for _ in range(TINY.vocab_size)])
            gate.tid2eid.assign(table.astype(np.int32))
    return model


@pytest.fixture(scope="module")
def model():
    return _model()


def _ids(batch=2, seq=SEQ, seed=1):
    return tf.constant(np.random.default_rng(seed).integers(0, TINY.vocab_size, (batch, seq)),
                       tf.int32)


def _hc_variables(model):
    """Every mHC weight: blocks' attn_hc / ffn_hc, the model's and the MTP depths' heads."""
    blocks = list(model.decoder_layers) + [m.block for m in model.mtp_layers]
    layers = [hc for b in blocks for hc in (b.attn_hc, b.ffn_hc)]
    layers += [model.hc_head] + [m.hc_head for m in model.mtp_layers]
    return [v for layer in layers for v in layer.weights]


# ----------------------------------------------------------------------------- structure


def test_mtp_blocks_are_sliding_score_routed_v4_blocks(model):
    ext = TINY.mtp_block_config()
    assert ext.num_hidden_layers == 5 and ext.num_nextn_predict_layers == 0
    assert ext.layer_types[3:] == (MTP_LAYER_TYPE,) * 2 == (SLIDING, SLIDING)
    assert ext.mlp_layer_types[3:] == ("moe", "moe")
    assert not TINY.is_hash_layer(3) and TINY.is_hash_layer(0)
    assert [m.name for m in model.mtp_layers] == ["mtp.0", "mtp.1"]
    for d, mtp in enumerate(model.mtp_layers):
        assert mtp.block.layer_idx == TINY.num_hidden_layers + d
        assert mtp.block.self_attn.layer_type == SLIDING and mtp.block.self_attn.indexer is None
        assert not mtp.block.mlp.is_hash
        assert mtp.block.mlp.gate.e_score_correction_bias is not None
    blocks = list(model.decoder_layers) + [m.block for m in model.mtp_layers]
    assert all(b.is_moe for b in blocks)
    assert model.num_moe_layers == 5
    assert [id(m) for m in model.moe_layers] == [id(b.mlp) for b in blocks]
    with pytest.raises(ValueError, match="layer_idx=2 must be >= num_hidden_layers=3"):
        DeepSeekV4MTPLayer(TINY, 2)
    # the trainer's weight paths: `mtp.0/...` (trainable.py's "mtp." prefix)
    assert any(v.path.split("/", 1)[1].startswith("mtp.1/block/mlp/") for v in model.weights)


def test_from_config_builds_the_same_weights(model):
    clone = DeepSeekV4CausalLM.from_config(json.loads(json.dumps(model.get_config())))
    assert [v.path.split("/", 1)[1] for v in clone.weights] == [
        v.path.split("/", 1)[1] for v in model.weights]


# ----------------------------------------------------------------------------- forward_train


def test_forward_train_contract(model):
    ids = _ids()
    out = model.forward_train(ids)
    assert out["logits"].shape == (2, SEQ, TINY.vocab_size)
    np.testing.assert_allclose(out["logits"].numpy(), model(ids).numpy(), rtol=1e-5, atol=1e-6)
    assert [t.shape for t in out["mtp_logits"]] == [(2, SEQ - 1, 64), (2, SEQ - 2, 64)]
    assert all(t.dtype == tf.float32 for t in out["mtp_logits"])
    assert out["expert_load"].shape == (5, TINY.n_routed_experts)
    k = TINY.num_experts_per_tok
    np.testing.assert_allclose(out["moe_pairs"].numpy(),
                               [2 * SEQ * k] * 3 + [2 * (SEQ - 1) * k, 2 * (SEQ - 2) * k])
    np.testing.assert_array_equal(out["moe_dropped"].numpy(), np.zeros(5))
    for name in ("balance_loss", "indexer_loss"):
        assert out[name].shape == () and out[name].dtype == tf.float32
    assert out["balance_loss"].numpy() > 0
    assert np.isfinite(out["indexer_loss"].numpy()) and out["indexer_loss"].numpy() > 0
    loss = model.compute_loss(ids, tf.roll(ids, -1, axis=1))
    assert loss["mtp_loss"].numpy() > 0 and np.isfinite(loss["loss"].numpy())
    capped = model.forward_train(ids, moe_capacity_factor=0.5)
    assert capped["moe_dropped"].shape == (5,) and capped["moe_dropped"].numpy().sum() > 0


def test_mtp_depth_k_sees_tokens_up_to_t_plus_k(model):
    """mtp_logits[d] at position t predicts token t + 2 + d from tokens 0 .. t + 1 + d."""
    ids = _ids(seq=SEQ)
    j = 10
    changed = tf.concat([ids[:, :j], (ids[:, j:j + 1] + 1) % TINY.vocab_size, ids[:, j + 1:]], 1)
    a, b = model.forward_train(ids), model.forward_train(changed)
    for d in range(2):
        first = j - 1 - d  # the first position whose inputs include token j
        x, y = a["mtp_logits"][d].numpy(), b["mtp_logits"][d].numpy()
        np.testing.assert_allclose(x[:, :first], y[:, :first], rtol=1e-5, atol=1e-6)
        assert np.abs(x[:, first] - y[:, first]).max() > 1e-4


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_recompute_blocks_gives_the_same_loss_and_gradients(model):
    ids = _ids()
    labels = tf.roll(ids, -1, axis=1)

    def loss_and_grads(recompute):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(ids, labels, recompute_blocks=recompute)["loss"]
            loss += model.forward_train(ids, recompute_blocks=recompute)["indexer_loss"]
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = loss_and_grads(False)
    loss_r, grads_r = loss_and_grads(True)
    np.testing.assert_allclose(loss_r.numpy(), loss.numpy(), rtol=1e-6)
    assert all(g is not None for g in grads)
    for v, g, g_r in zip(model.trainable_variables, grads, grads_r, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(g_r).numpy(),
                                   tf.convert_to_tensor(g).numpy(), rtol=1e-4, atol=1e-7,
                                   err_msg=v.path)


# ----------------------------------------------------------------------------- mHC precision


@pytest.mark.parametrize("dtype", ["mixed_bfloat16", "bfloat16"])
def test_hyper_connections_stay_float32_and_train(dtype):
    model = _model(dtype)
    hc_vars = _hc_variables(model)
    assert len(hc_vars) == 3 * (2 * 5 + 1 + 2)  # fn, base, scale of 2 x 5 blocks + 3 heads
    assert {v.dtype for v in hc_vars} == {"float32"}
    assert model.decoder_layers[0].self_attn.q_a_proj.kernel.dtype == (
        "bfloat16" if dtype == "bfloat16" else "float32")
    streams = tf.random.normal([1, 5, TINY.hc_mult, TINY.hidden_size], dtype=tf.bfloat16)
    post, comb, collapsed = model.decoder_layers[1].attn_hc(streams)
    assert post.dtype == comb.dtype == collapsed.dtype == tf.float32
    np.testing.assert_allclose(tf.reduce_sum(comb, axis=-2).numpy(), 1.0, atol=1e-5)

    ids = _ids()
    with tf.GradientTape() as tape:
        loss = model.compute_loss(ids, tf.roll(ids, -1, axis=1))["loss"]
    grads = tape.gradient(loss, hc_vars)
    for v, g in zip(hc_vars, grads, strict=True):
        assert g is not None, v.path
        g = tf.convert_to_tensor(g)
        assert g.dtype == tf.float32, v.path
        assert np.all(np.isfinite(g.numpy())) and np.abs(g.numpy()).max() > 0, v.path


def _random_hyper_connection(rng, n: int, c: int) -> HyperConnection:
    """An mHC layer (20 Sinkhorn-Knopp iterations) with random `fn` and `base`."""
    layer = HyperConnection(n, c, 20, 1e-6, 1e-6)
    layer.build()
    layer.fn.assign(rng.normal(0, 0.5, layer.fn.shape).astype(np.float32))
    layer.base.assign(rng.normal(0, 0.5, layer.base.shape).astype(np.float32))
    return layer


def test_sinkhorn_gradient_matches_finite_differences():
    # float64: Sinkhorn-Knopp itself, every input entry.
    rng = np.random.default_rng(0)
    x = tf.constant(rng.uniform(0.1, 1.0, (3, 3)))
    w = tf.constant(rng.normal(size=(3, 3)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        value = tf.reduce_sum(sinkhorn_knopp(x, 20, 1e-6) * w)
    grad = tape.gradient(value, x).numpy()
    eps, fd = 1e-6, np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            step = np.zeros((3, 3))
            step[i, j] = eps
            fd[i, j] = (tf.reduce_sum(sinkhorn_knopp(x + step, 20, 1e-6) * w)
                        - tf.reduce_sum(sinkhorn_knopp(x - step, 20, 1e-6) * w)).numpy() / (
                            2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-8)
    assert np.abs(grad).max() > 1e-3

    # float32: the mHC layer's comb scale and a comb base entry, which reach its outputs only
    # through softmax and the 20 Sinkhorn-Knopp iterations.
    n, c = 3, 8
    layer = _random_hyper_connection(rng, n, c)
    streams = tf.constant(rng.normal(size=(2, 4, n, c)).astype(np.float32))
    w_comb = tf.constant(rng.normal(size=(2, 4, n, n)).astype(np.float32))

    def objective():
        _, comb, _ = layer(streams)
        return tf.reduce_sum(comb * w_comb)

    with tf.GradientTape() as tape:
        value = objective()
    g_scale, g_base = tape.gradient(value, [layer.scale, layer.base])
    g_base = tf.convert_to_tensor(g_base)
    assert np.abs(g_scale.numpy()[2]) > 1e-3 and np.abs(g_base.numpy()[2 * n + 1]) > 1e-3
    for variable, index, analytic in ((layer.scale, 2, g_scale.numpy()[2]),
                                      (layer.base, 2 * n + 1, g_base.numpy()[2 * n + 1])):
        original = variable.numpy()
        values = []
        for sign in (1, -1):
            bumped = original.copy()
            bumped[index] += sign * 1e-2
            variable.assign(bumped)
            values.append(float(objective().numpy()))
        variable.assign(original)
        np.testing.assert_allclose(analytic, (values[0] - values[1]) / 2e-2, rtol=2e-2,
                                   err_msg=variable.path)


def test_mhc_in_training_equals_mhc_in_inference_with_its_gradients():
    # training=True runs Sinkhorn-Knopp compiled with XLA, training=False the graph
    # function: the same outputs and the same gradients to float32 rounding.
    rng = np.random.default_rng(1)
    n, c = 4, 16
    layer = _random_hyper_connection(rng, n, c)
    streams = tf.constant(rng.normal(size=(2, 6, n, c)).astype(np.float32))
    weights = [tf.constant(rng.normal(size=shape).astype(np.float32))
               for shape in ((2, 6, n), (2, 6, n, n), (2, 6, c))]
    results = []
    for training in (False, True):
        with tf.GradientTape() as tape:
            tape.watch(streams)
            outputs = layer(streams, training=training)
            value = sum(tf.reduce_sum(o * w) for o, w in zip(outputs, weights, strict=True))
        grads = tape.gradient(value, [streams, layer.fn, layer.base, layer.scale])
        results.append([o.numpy() for o in outputs] + [tf.convert_to_tensor(g).numpy()
                                                       for g in grads])
    names = ("post", "comb", "collapsed", "d streams", "d fn", "d base", "d scale")
    for name, graph, xla in zip(names, *results, strict=True):
        assert np.abs(graph).max() > 0, name
        np.testing.assert_allclose(xla, graph, rtol=1e-5, atol=1e-6, err_msg=name)


# ----------------------------------------------------------------------------- routers


def test_bias_update_changes_score_routed_layers_only():
    model = _model()
    hash_gates = [m.gate for m in model.moe_layers if m.is_hash]
    score_gates = [m.gate for m in model.moe_layers if not m.is_hash]
    assert len(hash_gates) == 1 and len(score_gates) == 4  # 2 decoder + 2 MTP blocks
    tables = [g.tid2eid.numpy().copy() for g in hash_gates]
    biases = [g.e_score_correction_bias.numpy().copy() for g in score_gates]
    load = tf.constant([[9.0, 1.0, 0.0, 2.0]] * model.num_moe_layers)
    model.update_router_biases(load, update_speed=0.01)
    for gate, table in zip(hash_gates, tables, strict=True):
        assert gate.e_score_correction_bias is None
        np.testing.assert_array_equal(gate.tid2eid.numpy(), table)
    expected_step = -0.01 * np.sign(load.numpy()[0] - load.numpy()[0].mean())
    for gate, bias in zip(score_gates, biases, strict=True):
        np.testing.assert_allclose(gate.e_score_correction_bias.numpy(), bias + expected_step,
                                   atol=1e-7)
    model.update_router_biases(load)  # default speed: config.router_bias_update_speed
    np.testing.assert_allclose(score_gates[0].e_score_correction_bias.numpy(),
                               biases[0] + expected_step * (1 + TINY.router_bias_update_speed
                                                            / 0.01), atol=1e-7)


def test_tid2eid_and_router_biases_are_not_trainable(model):
    trainable = {id(v) for v in model.trainable_variables}
    frozen = [m.gate.tid2eid for m in model.moe_layers if m.is_hash]
    frozen += [m.gate.e_score_correction_bias for m in model.moe_layers if not m.is_hash]
    assert len(frozen) == 5
    assert not any(id(v) in trainable for v in frozen)
    assert all(not v.trainable for v in frozen)
    assert frozen[0].dtype == "int32"
    assert all(id(v) in {id(w) for w in model.non_trainable_variables} for v in frozen)


# ----------------------------------------------------------------------------- HF import


def test_checkpoint_without_mtp_weights_imports_without_mtp(model, tmp_path):
    hf = config_to_hf(model.config)
    assert hf["num_nextn_predict_layers"] == 0  # the exported files hold no mtp.* tensor
    assert config_from_hf({**hf, "num_nextn_predict_layers": 1}).num_nextn_predict_layers == 0
    save_hf_checkpoint(model, str(tmp_path))
    loaded = load_v4_checkpoint(str(tmp_path))
    assert loaded.mtp_layers == [] and loaded.num_moe_layers == 3
    ids = _ids()
    np.testing.assert_array_equal(loaded(ids).numpy(), model(ids).numpy())
    out = loaded.forward_train(ids)
    assert out["mtp_logits"] == [] and out["expert_load"].shape == (3, TINY.n_routed_experts)
