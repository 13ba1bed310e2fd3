"""Unit tests of the DeepSeek-V4 model (models/deepseek_v4/) on tiny configs.

Parity with transformers' `DeepseekV4ForCausalLM` is in test_hf_v4_parity.py; here the
pieces are checked against hand-computed values and their stated invariants.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from v4_random_model import random_v4_model

from models.deepseek_v4.attention import attend_with_sink, compressed_block_mask
from models.deepseek_v4.compressor import KVCompressor, pool_windows
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.deepseek_v4.hf_checkpoint import (
    check_tid2eid,
    load_v4_checkpoint,
    save_hf_checkpoint,
)
from models.deepseek_v4.hf_config import CheckpointError, config_from_hf, config_to_hf
from models.deepseek_v4.hf_names import (
    expected_hf_shapes,
    hf_weight_map,
    to_release_name,
    to_transformers_name,
)
from models.deepseek_v4.hyper_connection import HyperConnection, sinkhorn_knopp
from models.deepseek_v4.lightning_indexer import LightningIndexer
from models.deepseek_v4.ops import apply_rope, rope_cos_sin, sliding_window_mask
from models.deepseek_v4.router import DeepSeekV4Router

# 4 layers, one of each attention type, hash routing in the first; compress rates small
# enough that a 24-token input has CSA and HCA entries.
TINY = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA, CSA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "moe", "moe", "moe"),
    hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=3, swiglu_limit=1.0)


@pytest.fixture(scope="module")
def tiny_model():
    return random_v4_model(TINY)


def _ids(batch=2, seq=24, seed=1):
    return tf.constant(np.random.default_rng(seed).integers(0, TINY.vocab_size, (batch, seq)),
                       tf.int32)


# ----------------------------------------------------------------------------- config


def test_config_fills_transformers_defaults_and_round_trips():
    c = DeepSeekV4Config(num_hidden_layers=5)
    assert c.layer_types == (HCA, HCA, HCA, CSA, HCA)  # 2 x HCA, then HCA/CSA alternating
    assert c.mlp_layer_types == ("hash_moe",) * 3 + ("moe",) * 2
    assert c.compress_rates == {CSA: 4, HCA: 128}
    assert c.compress_ratios == (128, 128, 128, 4, 128)
    assert DeepSeekV4Config.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    yarn = DeepSeekV4Config(rope_scaling={"type": "yarn", "factor": 16,
                                          "original_max_position_embeddings": 64})
    assert yarn.rope_scaling["attention_factor"] == 1.0  # V4 never scales cos/sin


@pytest.mark.parametrize("changes,match", [
    (dict(layer_types=(SLIDING,) * 3), "layer_types has 3 entries, must equal num_hidden_layers"),
    (dict(mlp_layer_types=("moe",) * 5), "mlp_layer_types has 5 entries"),
    (dict(layer_types=(SLIDING, CSA, "full_attention", CSA)), "layer_types entries"),
    (dict(mlp_layer_types=("dense",) * 4), "mlp_layer_types entries"),
    (dict(hc_mult=0), "hc_mult=0"),
    (dict(index_topk=0), "index_topk=0"),
    (dict(hc_sinkhorn_iters=0), "hc_sinkhorn_iters=0"),
    (dict(o_groups=3), "o_groups=3 must divide num_attention_heads"),
    (dict(qk_rope_head_dim=5), "qk_rope_head_dim=5 must be even"),
    (dict(qk_rope_head_dim=10), "qk_rope_head_dim=10 must be <= index_head_dim"),
    (dict(compress_rates={"csa": 4}), "compress_rates has unknown keys"),
    (dict(compress_rates={CSA: 0, HCA: 8}), "compress_rates"),
    (dict(n_shared_experts=2), "n_shared_experts=2"),
    (dict(norm_topk_prob=False), "norm_topk_prob"),
    (dict(scoring_func="softmax"), "scoring_func='softmax'"),
    (dict(swiglu_limit=0.0), "swiglu_limit"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0, "truncate": False}), "truncate"),
])
def test_config_errors_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        TINY.replace(**changes)


# ----------------------------------------------------------------------------- mHC


def test_sinkhorn_gives_a_doubly_stochastic_matrix():
    rng = np.random.default_rng(0)
    comb = tf.nn.softmax(tf.constant(rng.normal(size=(5, 4, 4)) * 3, tf.float32), -1) + 1e-6
    out = sinkhorn_knopp(comb, iters=20, eps=1e-6).numpy()  # the config's t_max
    np.testing.assert_allclose(out.sum(axis=-2), 1.0, atol=1e-5)  # columns (normalized last)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, atol=1e-2)  # rows, nearly
    assert (out > 0).all()
    out = sinkhorn_knopp(comb, iters=500, eps=1e-6).numpy()  # converges to doubly stochastic
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, atol=1e-4)
    np.testing.assert_allclose(out.sum(axis=-2), 1.0, atol=1e-5)
    once = sinkhorn_knopp(comb, iters=1, eps=0.0).numpy()  # t_max = 1: one column pass
    np.testing.assert_allclose(once, comb.numpy() / comb.numpy().sum(-2, keepdims=True),
                               rtol=1e-6)


def test_hyper_connection_shapes_and_weights():
    hc = HyperConnection(hc_mult=3, hidden_size=8, hc_sinkhorn_iters=20, hc_eps=1e-6,
                         rms_norm_eps=1e-6, name="hc")
    hc.build()
    assert tuple(hc.fn.shape) == (15, 24) and tuple(hc.base.shape) == (15,)
    streams = tf.random.normal([2, 5, 3, 8], seed=0)
    post, comb, collapsed = hc(streams)
    assert post.shape == (2, 5, 3) and comb.shape == (2, 5, 3, 3)
    assert collapsed.shape == (2, 5, 8)
    np.testing.assert_allclose(comb.numpy().sum(-2), 1.0, atol=1e-5)
    assert ((post.numpy() > 0) & (post.numpy() < 2)).all()  # 2 * sigmoid
    # With fn = 0 the mixes are the bases (zeros): pre = 1/2 + eps, post = 1, comb = 1/n.
    hc.fn.assign(tf.zeros_like(hc.fn))
    post, comb, collapsed = hc(streams)
    np.testing.assert_allclose(post.numpy(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(comb.numpy(), 1 / 3, rtol=1e-5)
    np.testing.assert_allclose(collapsed.numpy(), (0.5 + 1e-6) * streams.numpy().sum(2),
                               rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- attention


def test_sliding_window_mask_shows_each_query_window_keys():
    mask = sliding_window_mask(tf.range(20), tf.range(20), 6).numpy()
    assert mask.sum(axis=1).tolist() == [min(q + 1, 6) for q in range(20)]
    assert mask[10].nonzero()[0].tolist() == [5, 6, 7, 8, 9, 10]  # q-6 < k <= q


def test_sink_takes_probability_mass_without_value():
    q = tf.ones([1, 1, 2, 4])  # (B, T, H, D)
    keys = tf.constant([[[1.0, 0.0, 0.0, 0.0]]])  # one key: q.k = 1
    mask = tf.constant([[[True]]])
    # Without the sink the lone key gets weight 1; with sink s, e / (e + e^s) at scale 1.
    out = attend_with_sink(q, keys, mask, tf.constant([-1e4, 1.0]), scale=1.0).numpy()
    np.testing.assert_allclose(out[0, 0, 0], [1.0, 0, 0, 0], atol=1e-6)
    weight = np.e / (np.e + np.e ** 1.0)
    np.testing.assert_allclose(out[0, 0, 1], [weight, 0, 0, 0], rtol=1e-6)
    assert abs(weight - 0.5) < 1e-9  # the sink took half the mass


def test_rope_rotates_interleaved_pairs_of_the_trailing_dims():
    x = tf.constant(np.arange(1, 7, dtype=np.float32).reshape(1, 1, 1, 6))  # rope dims 2..5
    inv_freq = np.array([0.5, 0.25], np.float32)
    cos, sin = rope_cos_sin(tf.constant([2]), inv_freq)  # angles 1.0 and 0.5
    y = apply_rope(x, cos, sin).numpy()[0, 0, 0]
    c1, s1, c2, s2 = np.cos(1.0), np.sin(1.0), np.cos(0.5), np.sin(0.5)
    expected = [1, 2, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1, 5 * c2 - 6 * s2, 6 * c2 + 5 * s2]
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    back = apply_rope(apply_rope(x, cos, sin), cos, sin, inverse=True).numpy()
    np.testing.assert_allclose(back, x.numpy(), rtol=1e-6)


# ----------------------------------------------------------------------------- compressor


def test_hca_pooling_is_a_gated_softmax_over_each_window():
    # m = 2, D = 1: tokens c = 1, 2, 3, 4 with gates z = 0, ln 3, 0, 0 and bias B = 0, 0.
    kv = tf.constant([[[1.0], [2.0], [3.0], [4.0]]])
    gate = tf.constant([[[0.0], [np.log(3.0)], [0.0], [0.0]]], tf.float32)
    out = pool_windows(kv, gate, tf.zeros([2, 1]), 2, overlap=False).numpy()
    np.testing.assert_allclose(out[0, :, 0], [(1 * 1 + 2 * 3) / 4, (3 + 4) / 2], rtol=1e-6)
    # The position bias adds per slot: B = (ln 3, 0) weights the first token 3:1.
    out = pool_windows(kv, tf.zeros_like(gate), tf.constant([[np.log(3.0)], [0.0]]), 2,
                       overlap=False).numpy()
    np.testing.assert_allclose(out[0, :, 0], [(3 * 1 + 2) / 4, (3 * 3 + 4) / 4], rtol=1e-6)


def test_csa_pooling_overlaps_the_previous_windows_ca_series():
    # m = 2, D = 1, channels [Ca, Cb]; zero gates = uniform over the usable slots.
    kv = tf.constant([[[10.0, 1.0], [20.0, 2.0], [30.0, 3.0], [40.0, 4.0]]])
    out = pool_windows(kv, tf.zeros_like(kv), tf.zeros([2, 2]), 2, overlap=True).numpy()
    # Window 0: no previous window (weight 0), mean of Cb_0, Cb_1. Window 1: Ca_0, Ca_1
    # of window 0 and Cb_2, Cb_3.
    np.testing.assert_allclose(out[0, :, 0], [(1 + 2) / 2, (10 + 20 + 3 + 4) / 4], rtol=1e-6)
    # A carried state (the previous call's last window) fills window 0's Ca slots.
    prior = tf.constant([[[50.0], [60.0]]])
    out = pool_windows(kv, tf.zeros_like(kv), tf.zeros([2, 2]), 2, True, prior,
                       tf.zeros_like(prior)).numpy()
    np.testing.assert_allclose(out[0, 0, 0], (50 + 60 + 1 + 2) / 4, rtol=1e-6)


def test_compressor_entries_are_normalized_and_rotated_at_window_starts():
    comp = KVCompressor(8, 4, 3, False, 2, 160000.0, None, 1e-6, name="c")
    comp.build()
    h = tf.random.normal([1, 10, 8], seed=2)
    entries = comp(h).numpy()
    assert entries.shape == (1, 3, 4)  # 10 // 3 windows; the incomplete one is dropped
    pooled = pool_windows(comp.kv_proj(h[:, :9]), comp.gate_proj(h[:, :9]), comp.position_bias,
                          3, False).numpy()
    normed = pooled / np.sqrt((pooled ** 2).mean(-1, keepdims=True) + 1e-6)
    cos, sin = rope_cos_sin(tf.constant([0, 3, 6]), comp.inv_freq)
    expected = apply_rope(tf.constant(normed)[:, :, None, :], cos, sin)[:, :, 0, :].numpy()
    np.testing.assert_allclose(entries, expected, rtol=1e-5, atol=1e-6)


def test_hca_block_mask_shows_complete_windows_only():
    mask = compressed_block_mask(tf.range(10), 3, 3, 1).numpy()[0]
    # entry w is complete at position p iff (w + 1) * 3 <= p + 1
    assert mask.sum(axis=1).tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3]
    picks = tf.constant([[[2, -1], [0, 1]]])  # CSA: the indexer's picks, -1 ignored
    mask = compressed_block_mask(tf.range(2), 3, 4, 1, picks).numpy()[0]
    assert mask.tolist() == [[False, False, True], [True, True, False]]


def test_indexer_picks_complete_entries_and_marks_missing_ones():
    keras.utils.set_random_seed(3)
    indexer = LightningIndexer(TINY, name="indexer")
    indexer.build()
    h = tf.random.normal([2, 24, TINY.hidden_size], seed=4)
    q = tf.random.normal([2, 24, TINY.q_lora_rank], seed=5)
    picks = indexer(h, q).numpy()
    assert picks.shape == (2, 24, 3)  # min(index_topk, 24 // 4 entries)
    visible = (np.arange(24) + 1) // 4
    for t in range(24):
        row = picks[:, t]
        assert ((row == -1) | (row < visible[t])).all()  # never a future entry
        assert ((row >= 0).sum(axis=1) == min(3, visible[t])).all()  # -1 only when too few


# ----------------------------------------------------------------------------- MoE


def test_hash_routing_uses_tid2eid_and_sqrtsoftplus_weights():
    router = DeepSeekV4Router(TINY, is_hash=True, name="gate")
    router.build()
    table = np.array([[(i + 1) % 4, i % 4] for i in range(TINY.vocab_size)], np.int32)
    router.tid2eid.assign(table)
    x = tf.random.normal([5, TINY.hidden_size], seed=6)
    ids = tf.constant([0, 1, 2, 3, 63])
    idx, weights, scores = router(x, ids)
    np.testing.assert_array_equal(idx.numpy(), table[ids.numpy()])
    logits = x.numpy() @ router.weight.numpy().T
    np.testing.assert_allclose(scores.numpy(), np.sqrt(np.log1p(np.exp(logits))), rtol=1e-5)
    chosen = np.take_along_axis(scores.numpy(), table[ids.numpy()], axis=1)
    np.testing.assert_allclose(weights.numpy(), chosen / chosen.sum(1, keepdims=True) * 1.5,
                               rtol=1e-5)


def test_topk_routing_selects_with_the_bias_and_weights_without_it():
    router = DeepSeekV4Router(TINY, is_hash=False, name="gate")
    router.build()
    x = tf.random.normal([6, TINY.hidden_size], seed=7)
    router.e_score_correction_bias.assign([0.0, 0.0, 0.0, 100.0])  # expert 3 always chosen
    idx, weights, scores = router(x)
    assert (idx.numpy() == 3).any(axis=1).all()
    chosen = np.take_along_axis(scores.numpy(), idx.numpy(), axis=1)
    np.testing.assert_allclose(weights.numpy(), chosen / chosen.sum(1, keepdims=True) * 1.5,
                               rtol=1e-5)


def test_hash_layer_output_follows_the_token_ids(tiny_model):
    moe = tiny_model.decoder_layers[0].mlp
    assert moe.is_hash
    x = tf.random.normal([1, 3, TINY.hidden_size], seed=8)
    a = moe(x, input_ids=tf.constant([[1, 2, 3]]))[0].numpy()
    b = moe(x, input_ids=tf.constant([[1, 2, 3]]))[0].numpy()
    c = moe(x, input_ids=tf.constant([[1, 9, 3]]))[0].numpy()
    np.testing.assert_array_equal(a, b)
    assert np.abs(a[0, 1] - c[0, 1]).max() > 0 and np.array_equal(a[0, 0], c[0, 0])
    with pytest.raises(ValueError, match="hash routing needs input_ids"):
        moe(x)


def test_expert_swiglu_is_clamped_by_swiglu_limit(tiny_model):
    experts = tiny_model.decoder_layers[1].mlp.experts
    assert experts.swiglu_limit == 1.0
    x = tf.random.normal([4, 3, TINY.hidden_size], seed=9) * 30.0  # large pre-activations
    w = {n: getattr(experts, n).kernel.numpy() for n in ("gate_proj", "up_proj", "down_proj")}
    gate = np.minimum(np.einsum("esc,ecf->esf", x.numpy(), w["gate_proj"]), 1.0)
    up = np.clip(np.einsum("esc,ecf->esf", x.numpy(), w["up_proj"]), -1.0, 1.0)
    expected = np.einsum("esf,efc->esc", gate / (1 + np.exp(-gate)) * up, w["down_proj"])
    np.testing.assert_allclose(experts(x).numpy(), expected, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(experts[2](x[2]).numpy(), expected[2], rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- model


def test_causal_lm_shapes_and_causality(tiny_model):
    ids = _ids()
    logits = tiny_model(ids)
    assert logits.shape == (2, 24, TINY.vocab_size) and logits.dtype == tf.float32
    changed = tf.concat([ids[:, :20], (ids[:, 20:] + 1) % TINY.vocab_size], axis=1)
    np.testing.assert_allclose(tiny_model(changed).numpy()[:, :20], logits.numpy()[:, :20],
                               rtol=1e-5, atol=1e-6)  # a later token changes nothing before


def test_forward_train_and_loss(tiny_model):
    ids = _ids()
    out = tiny_model.forward_train(ids)
    assert out["expert_load"].shape == (4, TINY.n_routed_experts)
    np.testing.assert_allclose(out["moe_pairs"].numpy(), 2 * 24 * 2)
    loss = tiny_model.compute_loss(ids, tf.roll(ids, -1, axis=1))
    assert np.isfinite(loss["loss"].numpy()) and loss["balance_loss"].numpy() > 0
    capped = tiny_model.forward_train(ids, moe_capacity_factor=0.5)
    assert capped["moe_dropped"].numpy().sum() > 0


# ----------------------------------------------------------------------------- HF interop


@pytest.mark.parametrize("form", ["transformers", "release"])
def test_weight_map_matches_expected_shapes(tiny_model, form):
    names = hf_weight_map(tiny_model, form)
    shapes = expected_hf_shapes(TINY, form)
    assert set(names) == set(shapes)
    for name, (variable, transpose) in names.items():
        shape = tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)
        assert shape == shapes[name], name
    if form == "release":
        assert {"embed.weight", "head.weight", "norm.weight", "hc_head_fn",
                "layers.1.attn.indexer.compressor.ape", "layers.0.ffn.gate.tid2eid",
                "layers.1.ffn.gate.bias", "layers.3.ffn.experts.2.w3.weight"} <= set(names)
        assert all(to_release_name(to_transformers_name(n)) == n for n in names)


def test_hf_config_round_trip_and_legacy_keys():
    hf = config_to_hf(TINY)
    assert hf["rope_parameters"]["main"] == {"rope_type": "default", "rope_theta": 10000.0,
                                             "partial_rotary_factor": 0.25}
    assert config_from_hf(json.loads(json.dumps(hf))) == TINY
    legacy = {k: v for k, v in hf.items()
              if k not in ("layer_types", "mlp_layer_types", "compress_rates",
                           "partial_rotary_factor", "rope_parameters")}
    legacy.update(compress_ratios=[0, 4, 128, 4, 0], num_hash_layers=1, qk_rope_head_dim=4,
                  compress_rate_hca=8,
                  rope_scaling={"type": "yarn", "factor": 16, "original_max_position_embeddings": 64})
    c = config_from_hf(legacy)
    assert c.layer_types == (SLIDING, CSA, HCA, CSA)  # truncated to num_hidden_layers
    assert c.mlp_layer_types == TINY.mlp_layer_types and c.compress_rates[HCA] == 8
    assert c.qk_rope_head_dim == 4 and c.rope_scaling["factor"] == 16.0


@pytest.mark.parametrize("changes,match", [
    (dict(model_type="deepseek_v4_1"), "no transformers reference for V4.1's Engram tables"),
    (dict(engram_vocab_size=1000), "key 'engram_vocab_size'.*V4.1"),
    (dict(vision_config={}), "key 'vision_config'.*V4.1"),
    (dict(model_type="deepseek_v3"), "model_type='deepseek_v3'"),
    (dict(hidden_act="gelu"), "hidden_act='gelu'"),
    (dict(num_key_value_heads=4), "num_key_value_heads=4"),
    (dict(compress_ratios=[0, 4, 64, 4], layer_types=None), "compress_ratios has 64"),
])
def test_hf_config_refuses_what_it_does_not_implement(changes, match):
    hf = {**config_to_hf(TINY), **changes}
    hf = {k: v for k, v in hf.items() if v is not None}
    with pytest.raises(CheckpointError, match=match):
        config_from_hf(hf)


def test_tid2eid_check_names_the_row():
    good = np.array([[0, 1], [3, 2]])
    check_tid2eid("t", good, 4)
    with pytest.raises(CheckpointError, match=r"t: row 1 \(token id 1\) has experts \[3, 4\]"):
        check_tid2eid("t", np.array([[0, 1], [3, 4]]), 4)
    with pytest.raises(CheckpointError, match=r"t: row 0 \(token id 0\) repeats an expert"):
        check_tid2eid("t", np.array([[2, 2], [0, 1]]), 4)


def test_save_and_load_round_trip(tiny_model, tmp_path):
    save_hf_checkpoint(tiny_model, str(tmp_path), max_shard_bytes=200_000)  # a few shards
    assert (tmp_path / "model.safetensors.index.json").exists()
    loaded = load_v4_checkpoint(str(tmp_path))
    ids = _ids(seq=17)
    np.testing.assert_array_equal(loaded(ids).numpy(), tiny_model(ids).numpy())
    table = tiny_model.decoder_layers[0].mlp.gate.tid2eid.numpy()
    np.testing.assert_array_equal(loaded.decoder_layers[0].mlp.gate.tid2eid.numpy(), table)


def _rewrite(src, dst, rename=lambda n: n, edit=None):
    """Copies checkpoint `src` to `dst` (one file) with renamed / edited tensors."""
    from models.formats.safetensors_reader import open_checkpoint, write_safetensors

    files = open_checkpoint(str(src))
    tensors = {rename(n): files.read(n) for n in files.tensors}
    if edit is not None:
        edit(tensors)
    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    write_safetensors(str(dst / "model.safetensors"), tensors)


def test_release_names_load_and_bad_checkpoints_are_named(tiny_model, tmp_path):
    save_hf_checkpoint(tiny_model, str(tmp_path / "hf"))

    def add_mtp(tensors):  # DeepSeek's release carries the MTP module; it is skipped
        tensors["mtp.0.attn.wq_a.weight"] = np.zeros([2, 2], np.float32)

    _rewrite(tmp_path / "hf", tmp_path / "release", to_release_name, add_mtp)
    ids = _ids(seq=13)
    np.testing.assert_array_equal(load_v4_checkpoint(str(tmp_path / "release"))(ids).numpy(),
                                  tiny_model(ids).numpy())
    assert to_release_name("model.layers.1.attn.norm.weight") == "layers.1.attn.kv_norm.weight"
    # transformers also loads DeepSeek-form names with the attention norm spelled `attn.norm`
    _rewrite(tmp_path / "hf", tmp_path / "release_norm",
             lambda n: to_release_name(n).replace("attn.kv_norm.", "attn.norm."))
    np.testing.assert_array_equal(
        load_v4_checkpoint(str(tmp_path / "release_norm"))(ids).numpy(), tiny_model(ids).numpy())

    def bad_table(tensors):
        tensors["model.layers.0.ffn.gate.tid2eid"][5] = [1, 1]

    _rewrite(tmp_path / "hf", tmp_path / "bad_table", edit=bad_table)
    with pytest.raises(CheckpointError, match=r"model.layers.0.ffn.gate.tid2eid: row 5 "):
        load_v4_checkpoint(str(tmp_path / "bad_table"))
    _rewrite(tmp_path / "hf", tmp_path / "extra", edit=lambda t: t.update(
        {"model.layers.0.attn.extra.weight": np.zeros([1], np.float32)}))
    with pytest.raises(CheckpointError, match=r"1 tensors have no place.*attn.extra.weight"):
        load_v4_checkpoint(str(tmp_path / "extra"))
    _rewrite(tmp_path / "hf", tmp_path / "missing",
             edit=lambda t: t.pop("model.layers.2.attn.compressor.ape"))
    with pytest.raises(CheckpointError, match=r"missing.*layers.2.attn.compressor.ape"):
        load_v4_checkpoint(str(tmp_path / "missing"))
    _rewrite(tmp_path / "hf", tmp_path / "shape", edit=lambda t: t.update(
        {"model.layers.1.attn.wo_a.weight": np.zeros([3, 3], np.float32)}))
    with pytest.raises(CheckpointError, match=r"tensor model.layers.1.attn.wo_a.weight has shape"):
        load_v4_checkpoint(str(tmp_path / "shape"))
