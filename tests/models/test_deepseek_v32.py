"""DeepSeek-V3.2: DeepSeek Sparse Attention (the lightning indexer) against transformers 5.24.

The fixtures under tests/fixtures/hf_deepseek_v32/ were made offline by
`make_fixtures.py` (transformers 5.24 `DeepseekV32ForCausalLM` + torch, float32, eager):

  bf16  hidden 64, 3 layers (1 dense), 8 experts, q_lora_rank 32, kv_lora_rank 32,
        YaRN with an attention factor != 1, index_n_heads 16, index_head_dim 32,
        index_topk 8; BF16 on disk with float32 router biases and indexer.weights_proj;
        config.json as transformers 5.24 writes it
  fp8   DeepSeek's release layout: block FP8 (ue8m0 scales, partial blocks) for the
        projections and the indexer's wq_b / wk, bf16 weights_proj, float32 k_norm;
        3 shards; an MTP module (with its own indexer); config.json in the 4.x form

each with transformers' logits on 2 rows of 300 tokens, so every query after the 8th
keeps 8 of the tokens it could see.
"""

import json
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek import flops, hf_checkpoint
from models.deepseek import memory_plan as mp
from models.deepseek.config import DeepSeekConfig
from models.deepseek.hf_config import config_from_hf, config_to_hf
from models.deepseek.lightning_indexer import LightningIndexer
from models.formats.checkpoint_error import CheckpointError
from models.formats.safetensors_reader import open_checkpoint

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v32"
TOLERANCE = 1e-4
PREFILL = 290

# A tiny V3.2 for the unit tests (no checkpoint).
TINY = DeepSeekConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, n_group=2,
    topk_group=1, num_experts_per_tok=2, max_position_embeddings=64,
    num_nextn_predict_layers=1, index_topk=4, index_n_heads=2, index_head_dim=8)


def _fixture(name):
    d = FIXTURES / name
    return d, np.load(d / "input_ids.npy"), np.load(d / "expected_logits.npy")


@pytest.fixture(scope="module")
def bf16_model():
    return hf_checkpoint.load_hf_checkpoint(str(FIXTURES / "bf16"))


def _max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_logits_match_transformers(name):
    d, input_ids, expected = _fixture(name)
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    logits = model(tf.constant(input_ids, tf.int32)).numpy()
    assert logits.shape == expected.shape == (2, 300, 128)
    max_diff = _max_diff(logits, expected)
    assert max_diff <= TOLERANCE, f"{name}: max |logits - transformers| = {max_diff:.2e}"


def test_fixtures_are_what_they_claim():
    for name in ("bf16", "fp8"):
        d, input_ids, _ = _fixture(name)
        raw = json.loads((d / "config.json").read_text())
        config = config_from_hf(raw)
        assert raw["model_type"] == "deepseek_v32" and config.uses_sparse_attention
        assert config.index_topk < input_ids.shape[1]  # the indexer drops tokens
        assert config.index_head_dim > config.qk_rope_head_dim  # [rot | pass] both present
        checks = json.loads((d / "fixture.json").read_text())["checks"]
        # The logits tell dense attention and the two wrong indexer RoPE layouts apart.
        assert min(checks["logits_max_abs_diff_if"].values()) > 1e-2
        assert min(checks["index_topk_margins"].values()) > 1e-5
    bf16 = json.loads((FIXTURES / "bf16" / "config.json").read_text())
    assert "rope_parameters" in bf16 and "num_nextn_predict_layers" not in bf16
    assert config_from_hf(bf16).num_nextn_predict_layers == 0  # as transformers: no MTP
    tensors = open_checkpoint(str(FIXTURES / "bf16")).tensors
    assert {i.dtype for n, i in tensors.items() if n.endswith("indexer.weights_proj.weight")} == {
        "F32"}
    fp8 = json.loads((FIXTURES / "fp8" / "config.json").read_text())
    assert fp8["quantization_config"]["scale_fmt"] == "ue8m0" and "rope_scaling" in fp8
    ckpt = open_checkpoint(str(FIXTURES / "fp8"))
    dtypes = {n: i.dtype for n, i in ckpt.tensors.items()}
    for layer in (0, 1, 2):  # main layers and the MTP block
        p = f"model.layers.{layer}.self_attn.indexer."
        assert dtypes[p + "wq_b.weight"] == dtypes[p + "wk.weight"] == "F8_E4M3"
        assert dtypes[p + "weights_proj.weight"] == "BF16"
        assert dtypes[p + "k_norm.weight"] == dtypes[p + "k_norm.bias"] == "F32"
    scale = ckpt.read("model.layers.0.self_attn.indexer.wq_b.weight_scale_inv")
    assert scale.shape == (4, 1) and np.all(np.frexp(scale)[0] == 0.5)  # 512 rows, 2^k


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_cached_decoding_equals_the_full_forward_pass(bf16_model):
    """Prefill 290 tokens, then one token per step: the indexer scores each new query
    against the cached keys and keeps the same tokens as the full pass."""
    _, input_ids, expected = _fixture("bf16")
    ids = tf.constant(input_ids, tf.int32)
    full = bf16_model(ids).numpy()
    for absorb in (True, False):
        cache = bf16_model.init_cache(2, 300)
        logits, cache = bf16_model.call_with_cache(ids[:, :PREFILL], cache, 0, absorb=absorb)
        steps = [logits]
        for t in range(PREFILL, 300):
            logits, cache = bf16_model.call_with_cache(ids[:, t:t + 1], cache, t, absorb=absorb)
            steps.append(logits)
        cached = tf.concat(steps, axis=1).numpy()
        assert _max_diff(cached, full) < 1e-4, absorb
        assert _max_diff(cached, expected) <= TOLERANCE, absorb


def test_indexer_keys_are_cached_and_read_back(bf16_model):
    """The cache holds [c_kv | k_pe] and the indexer key per token; a decode step reads the
    prefix's indexer keys from it (changing them changes the step; nothing recomputes
    them: the step never sees the prefix's tokens)."""
    c = bf16_model.config
    _, input_ids, _ = _fixture("bf16")
    ids = tf.constant(input_ids[:, :40], tf.int32)
    cache = bf16_model.init_cache(2, 48)
    r = c.kv_lora_rank + c.qk_rope_head_dim
    assert [{k: v.shape for k, v in layer.items()} for layer in cache] == [
        {"kv": (2, 48, r), "index_keys": (2, 48, c.index_head_dim)}] * 3
    assert r + c.index_head_dim == c.cache_width
    _, cache = bf16_model.call_with_cache(ids[:, :39], cache, 0)
    # Layer 0's indexer keys are those of its input, the normalized embeddings.
    block = bf16_model.decoder_layers[0]
    x = block.input_layernorm(bf16_model.embed_tokens(ids[:, :39]))
    keys = block.self_attn.indexer.keys(x, tf.range(39))  # (2, 39, Di)
    np.testing.assert_allclose(cache[0]["index_keys"][:, :39].numpy(), keys.numpy(),
                               atol=1e-6)
    step, _ = bf16_model.call_with_cache(ids[:, 39:], cache, 39)
    # Slots after the current position are never read.
    junk = tf.nest.map_structure(
        lambda t: tf.concat([t[:, :40], tf.fill(tf.shape(t[:, 40:]), 7.0)], axis=1), cache)
    np.testing.assert_array_equal(bf16_model.call_with_cache(ids[:, 39:], junk, 39)[0], step)
    # The prefix's indexer keys are: permuting them across tokens changes the step.
    moved = tuple({"kv": layer["kv"], "index_keys": tf.concat(
        [layer["index_keys"][:, :39][:, ::-1], layer["index_keys"][:, 39:]], axis=1)}
        for layer in cache)
    assert _max_diff(bf16_model.call_with_cache(ids[:, 39:], moved, 39)[0], step) > 1e-3


# ----------------------------------------------------------------------------- the indexer


def _reference_keep(indexer, x, c_q, positions, visible):
    """numpy: DeepSeek-V3.2 eq. 1 as transformers 5.24 `DeepseekV32Indexer` computes it
    (rotate_half RoPE on the FIRST qk_rope_head_dim dims), then the top-k set."""
    c = indexer.config
    hi, di, dr = c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim
    wq = indexer.wq_b.kernel.numpy()
    wk = indexer.wk.kernel.numpy()
    ww = indexer.weights_proj.kernel.numpy()
    g, b = indexer.k_norm.gamma.numpy(), indexer.k_norm.beta.numpy()
    inv = 1.0 / (c.rope_theta ** (np.arange(0, dr, 2) / dr))
    ang = positions[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))

    def rope(v):  # (..., T, [H,] Di) with T at axis 1
        rot, rest = v[..., :dr], v[..., dr:]
        half = np.concatenate([-rot[..., dr // 2:], rot[..., :dr // 2]], -1)
        shape = (1, len(positions)) + (1,) * (v.ndim - 3) + (dr,)
        return np.concatenate([rot * cos.reshape(shape) + half * sin.reshape(shape), rest], -1)

    q = rope((c_q @ wq).reshape(*c_q.shape[:2], hi, di))
    k = x @ wk
    k = (k - k.mean(-1, keepdims=True)) / np.sqrt(k.var(-1, keepdims=True) + 1e-6) * g + b
    k = rope(k)
    scores = np.maximum(np.einsum("bthd,bsd->bths", q, k) * di ** -0.5, 0)
    index = np.einsum("bth,bths->bts", (x @ ww) * hi ** -0.5, scores)
    index = np.where(visible, index, -np.inf)
    keep = np.zeros(index.shape, bool)
    top = np.argsort(-index, axis=-1, kind="stable")[..., : c.index_topk]
    np.put_along_axis(keep, top, True, axis=-1)
    return keep & visible


def test_indexer_keeps_the_top_k_visible_tokens_and_never_a_future_one():
    keras.utils.set_random_seed(3)
    config = TINY.replace(index_topk=5)
    indexer = LightningIndexer(config)
    indexer.build()
    assert LightningIndexer.from_config(indexer.get_config()).config == config
    rng = np.random.default_rng(4)
    for w in (indexer.k_norm.gamma, indexer.k_norm.beta):  # away from ones / zeros
        w.assign(w.numpy() + rng.normal(0, 0.3, w.shape))
    batch, seq = 2, 13
    x = rng.normal(size=(batch, seq, config.hidden_size)).astype(np.float32)
    c_q = rng.normal(size=(batch, seq, config.q_lora_rank)).astype(np.float32)
    positions = np.arange(seq)
    causal = np.tril(np.ones((seq, seq), bool))[None]
    keys = indexer.keys(tf.constant(x), tf.constant(positions, tf.int32))
    keep = indexer(tf.constant(x), tf.constant(c_q), keys, tf.constant(positions, tf.int32),
                   tf.constant(causal)).numpy()
    assert keep.shape == (batch, seq, seq) and keep.dtype == bool
    np.testing.assert_array_equal(keep.sum(-1), np.minimum(5, positions + 1)[None].repeat(2, 0))
    assert not (keep & ~causal).any()  # never a future token
    np.testing.assert_array_equal(keep, _reference_keep(indexer, x, c_q, positions, causal))

    # Cached form: 3 queries at per-row positions against a buffer of 16 slots; slots
    # past a query's position (garbage) are never kept.
    slots = np.concatenate([keys.numpy(), rng.normal(size=(batch, 3, 8))], 1)  # (2, 16, 8)
    q_pos = np.array([[4, 5, 6], [10, 11, 12]], np.int32)
    visible = np.arange(16)[None, None, :] <= q_pos[:, :, None]
    rows = np.stack([x[0, 4:7], x[1, 10:13]])
    lat = np.stack([c_q[0, 4:7], c_q[1, 10:13]])
    kept = indexer(tf.constant(rows), tf.constant(lat), tf.constant(slots, tf.float32),
                   tf.constant(q_pos), tf.constant(visible)).numpy()
    np.testing.assert_array_equal(kept.sum(-1), np.minimum(5, q_pos + 1))
    assert not (kept & ~visible).any() and not kept[:, :, 13:].any()
    # The same choice as the full pass: the queries and the keys they see are the same.
    np.testing.assert_array_equal(kept[:, :, :13], np.stack([keep[0, 4:7], keep[1, 10:13]]))


def test_index_topk_above_the_length_is_dense_attention():
    """With index_topk >= every length the indexer keeps every visible token: the logits
    are those of the same weights without DSA (V3)."""
    keras.utils.set_random_seed(5)
    from models.deepseek.causal_lm import DeepSeekCausalLM

    sparse = DeepSeekCausalLM(TINY.replace(index_topk=64))
    dense = DeepSeekCausalLM(TINY.replace(index_topk=None, index_n_heads=None,
                                          index_head_dim=None))
    by_path = {v.path.split("/", 1)[1]: v for v in sparse.weights}
    for v in dense.weights:
        v.assign(by_path[v.path.split("/", 1)[1]])
    ids = tf.constant(np.random.default_rng(6).integers(0, 64, (2, 11)), tf.int32)
    np.testing.assert_array_equal(sparse(ids).numpy(), dense(ids).numpy())
    small = DeepSeekCausalLM(TINY.replace(index_topk=2))
    for v in small.weights:
        v.assign(by_path[v.path.split("/", 1)[1]])
    assert _max_diff(small(ids), dense(ids)) > 1e-3


def test_generate_with_sparse_attention_rows_of_different_lengths():
    """`generate` (generation.py) with the wider cache: right-padded prompts of different
    lengths, cached, equal the uncached (full forward) greedy continuation."""
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek.generation import generate

    keras.utils.set_random_seed(10)
    model = DeepSeekCausalLM(TINY.replace(index_topk=3))
    prompt = tf.constant(np.random.default_rng(11).integers(0, 64, (2, 7)), tf.int32)
    lengths = tf.constant([7, 4], tf.int32)
    cached, n = generate(model, prompt, 6, temperature=0.0, prompt_lengths=lengths)
    uncached, _ = generate(model, prompt, 6, temperature=0.0, prompt_lengths=lengths,
                           use_cache=False)
    np.testing.assert_array_equal(n, [13, 10])
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_array_equal(tf.argmax(model(cached[1:, :9]), -1)[0, 3:],
                                  cached[1, 4:10])  # row 1 alone: greedy over its own tokens


def test_indexer_is_trained_by_its_kl_only_and_not_quantized():
    """The LM loss reaches no indexer weight (top-k has no gradient, its inputs are
    detached); `indexer_loss` reaches every one; int8 quantization leaves it float."""
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.formats.quantization import quantize_int8

    keras.utils.set_random_seed(7)
    model = DeepSeekCausalLM(TINY)
    indexer = [v for b in model.decoder_layers for v in b.self_attn.indexer.weights]
    assert indexer and {id(v) for v in indexer} <= {id(v) for v in model.trainable_variables}
    ids = tf.constant(np.random.default_rng(8).integers(0, 64, (2, 9)), tf.int32)
    with tf.GradientTape(persistent=True) as tape:
        out = model.compute_loss(ids, ids)
    assert all(g is None for g in tape.gradient(out["lm_loss"], indexer))
    assert all(g is not None for g in tape.gradient(out["indexer_loss"], indexer))
    assert all(g is not None for g in tape.gradient(out["loss"], model.trainable_variables))
    assert quantize_int8(model) > 0
    layer = model.decoder_layers[0].self_attn.indexer
    assert layer.wq_b.kernel.dtype == "float32" and layer.wq_b.quantization_mode is None
    assert np.isfinite(model(ids).numpy()).all()


# ----------------------------------------------------------------------------- config


def test_config_fields_are_validated_by_name():
    assert DeepSeekConfig().index_topk is None and not DeepSeekConfig().uses_sparse_attention
    assert DeepSeekConfig().cache_width == 64 + 16
    assert TINY.cache_width == 16 + 4 + 8
    assert DeepSeekConfig.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ValueError, match="index_topk=4 given without index_n_heads"):
        TINY.replace(index_n_heads=None, index_head_dim=None)
    with pytest.raises(ValueError, match="index_n_heads=0 must be an integer >= 1"):
        TINY.replace(index_n_heads=0)
    with pytest.raises(ValueError, match="index_head_dim=2 must be >= qk_rope_head_dim=4"):
        TINY.replace(index_head_dim=2)
    with pytest.raises(ValueError, match="index_topk=4 needs q_lora_rank"):
        TINY.replace(q_lora_rank=None)
    with pytest.raises(ValueError, match="LightningIndexer needs"):
        LightningIndexer(TINY.replace(index_topk=None, index_n_heads=None, index_head_dim=None))


def _hf_v32(**changes):
    hf = config_to_hf(TINY)
    hf.update(changes)
    return hf


def test_hf_config_round_trip_and_refusals():
    hf = config_to_hf(TINY)
    assert hf["model_type"] == "deepseek_v32"
    assert hf["architectures"] == ["DeepseekV32ForCausalLM"] and "rope_interleave" not in hf
    assert hf["mlp_layer_types"] == ["dense", "sparse"]
    assert hf["layer_types"] == ["indexed_attention"] * 2
    assert config_from_hf(hf) == TINY
    assert config_from_hf(config_to_hf(TINY, "4.x")) == TINY
    # transformers' DeepseekV32Config defaults for keys a config.json leaves out
    bare = {k: v for k, v in hf.items() if k not in (
        "index_topk", "index_n_heads", "index_head_dim", "first_k_dense_replace",
        "num_nextn_predict_layers", "mlp_layer_types")}
    bare["num_hidden_layers"] = 4
    del bare["layer_types"]
    c = config_from_hf(bare)
    assert (c.index_topk, c.index_n_heads, c.index_head_dim) == (2048, 64, 128)
    assert (c.first_k_dense_replace, c.num_nextn_predict_layers) == (3, 0)
    assert config_from_hf(_hf_v32(mlp_layer_types=["dense", "dense"],
                                  first_k_dense_replace=2)).first_k_dense_replace == 2
    refusals = [
        (dict(rope_interleave=False), "rope_interleave=False with model_type 'deepseek_v32'"),
        (dict(q_lora_rank=None), "q_lora_rank=None with model_type 'deepseek_v32'"),
        (dict(layer_types=["full_attention"] * 2), "layer_types=\\['full_attention'"),
        (dict(mlp_layer_types=["sparse", "dense"]), "mlp_layer_types=\\['sparse', 'dense'\\]"),
        (dict(mlp_layer_types=["dense", "sparse"], first_k_dense_replace=2),
         "first_k_dense_replace=2 disagrees with mlp_layer_types"),
        (dict(hidden_act="gelu"), "hidden_act='gelu' with model_type 'deepseek_v32'"),
    ]
    for changes, message in refusals:
        with pytest.raises(CheckpointError, match=message):
            config_from_hf(_hf_v32(**changes))
    with pytest.raises(ValueError, match="index_topk=0"):
        config_from_hf(_hf_v32(index_topk=0))
    with pytest.raises(ValueError, match="topk_method='greedy' with index_topk=4"):
        config_to_hf(TINY.replace(topk_method="greedy", scoring_func="softmax", seq_aux=True,
                                  n_group=1, topk_group=1))
    with pytest.raises(ValueError, match="rope_interleave=False with index_topk=4"):
        config_to_hf(TINY.replace(rope_interleave=False))


# ----------------------------------------------------------------------------- export


@pytest.mark.parametrize("name", ["bf16", "fp8"])
def test_hf_save_round_trip(name, tmp_path):
    """save_hf_checkpoint writes transformers' names (and, for bf16, its dtypes: float32
    router biases and indexer.weights_proj); reloading gives the same logits."""
    from models.deepseek.hf_save import save_hf_checkpoint

    d, input_ids, expected = _fixture(name)
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    ids = tf.constant(input_ids, tf.int32)
    logits = model(ids).numpy()
    save_hf_checkpoint(model, str(tmp_path), dtype="bfloat16" if name == "bf16" else "float32",
                       config_form="5.x" if name == "bf16" else "4.x")
    written = open_checkpoint(str(tmp_path)).tensors
    stored = {n for n in open_checkpoint(str(d)).tensors if not n.endswith("_scale_inv")}
    assert set(written) == stored
    if name == "bf16":
        assert {n: i.dtype for n, i in written.items()} == {
            n: i.dtype for n, i in open_checkpoint(str(d)).tensors.items()}
        raw = json.loads((tmp_path / "config.json").read_text())
        fixture_cfg = json.loads((d / "config.json").read_text())
        for key in ("model_type", "architectures", "index_topk", "index_n_heads",
                    "index_head_dim", "mlp_layer_types", "layer_types", "q_lora_rank"):
            assert raw[key] == fixture_cfg[key], key
    again = hf_checkpoint.load_hf_checkpoint(str(tmp_path))
    np.testing.assert_array_equal(again(ids).numpy(), logits)
    assert _max_diff(logits, expected) <= TOLERANCE


@pytest.mark.slow
def test_hf_import_export_round_trip(tmp_path):
    """hf-import (bf16 by default) -> SavedModel -> hf-export writes the checkpoint back
    tensor for tensor, the float32 indexer.weights_proj (values not representable in
    bf16) included; importing that export in float32 gives transformers' logits."""
    from savedmodel.hf_interop import hf_export, hf_import, load_model_from_savedmodel

    d, input_ids, expected = _fixture("bf16")
    imported = hf_import(str(d), str(tmp_path / "saved"))
    assert imported.weight_dtype == "bfloat16"
    served = tf.saved_model.load(imported.path).signatures["logits"](
        input_ids=tf.constant(input_ids))["logits"].numpy()
    # bf16 compute is not compared with float32 logits: a bf16 rounding moves routing and
    # top-k choices whose margins are ~1e-4 / ~1e-5 in these tiny random models.
    assert served.shape == expected.shape and np.isfinite(served).all()
    model = load_model_from_savedmodel(imported.path)
    assert model.decoder_layers[0].self_attn.indexer.weights_proj.kernel.dtype == "float32"
    assert model.decoder_layers[0].self_attn.indexer.wq_b.kernel.dtype == "bfloat16"

    hf_export(imported.path, str(tmp_path / "hf"))
    written, original = open_checkpoint(str(tmp_path / "hf")), open_checkpoint(str(d))
    assert set(written.tensors) == set(original.tensors)
    for name, info in original.tensors.items():
        assert written.tensors[name].dtype == info.dtype, name
        np.testing.assert_array_equal(written.read(name), original.read(name), err_msg=name)
    reimported = hf_import(str(tmp_path / "hf"), str(tmp_path / "saved2"), dtype="float32")
    served2 = tf.saved_model.load(reimported.path).signatures["logits"](
        input_ids=tf.constant(input_ids))["logits"].numpy()
    assert _max_diff(served2, expected) <= TOLERANCE


# ----------------------------------------------------------------------------- planner


# MICRO of test_memory_plan.py with q_lora_rank 2 and an indexer of 1 head of width 2.
MICRO = DeepSeekConfig(
    vocab_size=10, hidden_size=4, num_hidden_layers=2, num_attention_heads=1, q_lora_rank=2,
    kv_lora_rank=2, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, intermediate_size=6,
    moe_intermediate_size=3, n_routed_experts=2, n_shared_experts=1, num_experts_per_tok=1,
    n_group=1, topk_group=1, first_k_dense_replace=1, tie_word_embeddings=False,
    num_nextn_predict_layers=0, max_position_embeddings=8, index_topk=2, index_n_heads=1,
    index_head_dim=2)
DENSE_MICRO = MICRO.replace(index_topk=None, index_n_heads=None, index_head_dim=None)


def test_planner_counts_the_indexer():
    # Indexer per layer: wq_b 2*(1*2) = 4, wk 4*2 = 8, k_norm 2 + 2, weights_proj 4*1 = 4.
    per_layer = 4 + 8 + 4 + 4
    assert flops.total_params(MICRO) - flops.total_params(DENSE_MICRO) == 2 * per_layer
    assert sum(t.size for t in mp.weight_tensors(MICRO)) == flops.total_params(MICRO)
    full, dense = mp.parameter_counts(MICRO, "full"), mp.parameter_counts(DENSE_MICRO, "full")
    assert full.trained - dense.trained == 2 * per_layer  # the indexer trains by its KL
    assert full.frozen == dense.frozen
    # Inference: per token and layer R + Dr + Di = 2 + 2 + 2 numbers (bf16), 2 seqs x 3 tokens.
    p = mp.plan(mp.PlanInput(MICRO, mode="inference", batch_per_device=2, seq_len=3))
    assert p.kv_cache == 2 * 6 * 2 * 2 * 3
    assert flops.kv_cache_bytes_per_token(MICRO, 2) == 2 * 6 * 2
    # FLOPs: the indexer runs forward only: +2 per parameter (not 6) and 2 T Hi (Di + 1)
    # per layer and token for its scores.
    t, masked = 3, MICRO.replace(attn_implementation="dense")
    indexer = 2 * (2 * per_layer) + 2 * (2 * t * 1 * 3)
    assert (flops.flops_per_token(masked, t) - flops.flops_per_token(DENSE_MICRO, t)
            == indexer)
    assert (flops.decode_flops_per_token(masked, t)
            - flops.decode_flops_per_token(DENSE_MICRO, t) == indexer)
    # Gathered (the default; index_topk 2 < 3 keys): per layer and token, training
    # 6 H (k (2R + Dr) + R (Dn + Dv)) = 6 (2*6 + 2*4) = 120 instead of 6 H T (Dqk + Dv) = 108;
    # decode 2 H Dn R + 2 k H (2R + Dr) + 2 H R Dv = 8 + 24 + 8 = 40 instead of 52.
    assert flops.flops_per_token(MICRO, t) - flops.flops_per_token(masked, t) == 2 * (120 - 108)
    assert (flops.decode_flops_per_token(MICRO, t)
            - flops.decode_flops_per_token(masked, t) == 2 * (40 - 52))
    # Activations: the (B, T, S) bool top-k mask, T bytes per token and block.
    a = mp.activation_bytes(MICRO, 1, t, "float32") - mp.activation_bytes(DENSE_MICRO, 1, t,
                                                                            "float32")
    assert a == t * 2 * t


def test_planner_deepseek_v32_sizes():
    """DeepSeek-V3.2-Exp: V3's shapes plus a 64 x 128 indexer in each of 61 + 1 layers."""
    from models.deepseek.deepseek_presets import deepseek_v3_config

    v3 = deepseek_v3_config()
    v32 = v3.replace(index_topk=2048, index_n_heads=64, index_head_dim=128)
    per_layer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    assert per_layer == 13_959_424
    assert flops.total_params(v32) - flops.total_params(v3) == 62 * per_layer  # MTP too
    assert flops.kv_cache_bytes_per_token(v32, 2) == 61 * (512 + 64 + 128) * 2 == 85_888


def test_weight_tensors_are_the_built_model():
    from components.trainer import trainable
    from models.deepseek.causal_lm import DeepSeekCausalLM

    keras.utils.set_random_seed(9)
    model = DeepSeekCausalLM(TINY)
    assert [(trainable.weight_path(v), tuple(v.shape), v.trainable) for v in model.weights] == [
        (t.path, t.shape, t.trainable) for t in mp.weight_tensors(TINY)]
    assert model.count_params() == flops.total_params(TINY)
