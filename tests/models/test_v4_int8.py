"""int8 weights for DeepSeek-V4 (`models/formats/quantization.py`): which projections,
closeness to float, bytes, `quantize_like`, and cached decoding on int8 weights."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from v4_random_model import random_v4_model

from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.formats import quantization as Q
from models.layers.expert_projection import ExpertProjection

TINY = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA, CSA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "moe", "moe", "moe"),
    hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=3, swiglu_limit=1.0)


def _ids(seed=1, shape=(2, 24)):
    return tf.constant(np.random.default_rng(seed).integers(0, TINY.vocab_size, shape), tf.int32)


def _names(layers):
    return [layer.path.split("/", 1)[1] for layer in layers]


def test_the_v4_projections_are_listed_and_the_indexer_stays_float():
    model = random_v4_model(TINY.replace(num_nextn_predict_layers=1))
    names = _names(Q.quantized_layers(model))
    attention = ["q_a_proj", "q_b_proj", "kv_proj", "o_a_proj", "o_b_proj"]
    mlp = [f"mlp/{s}/{p}" for s in ("experts", "shared_experts")
           for p in ("gate_proj", "up_proj", "down_proj")]
    expected = []
    for i, kind in enumerate(TINY.layer_types):
        expected += [f"layers.{i}/self_attn/{p}" for p in attention]
        if kind != SLIDING:
            expected += [f"layers.{i}/self_attn/compressor/{p}" for p in ("kv_proj", "gate_proj")]
        expected += [f"layers.{i}/{m}" for m in mlp]
    expected += [f"mtp.0/block/self_attn/{p}" for p in attention]
    expected += [f"mtp.0/block/{m}" for m in mlp] + ["mtp.0/e_proj", "mtp.0/h_proj", "lm_head"]
    assert names == expected
    assert isinstance(model.decoder_layers[0].self_attn.o_a_proj, ExpertProjection)
    assert _names(Q.unquantized_projections(model)) == [
        f"layers.{i}/self_attn/indexer/{p}" for i in (1, 3)
        for p in ("compressor/kv_proj", "compressor/gate_proj", "q_b_proj", "weights_proj")]


def test_quantized_v4_logits_stay_close_to_float_and_the_weights_shrink():
    model = random_v4_model(TINY)
    ids = _ids()
    reference = model(ids).numpy()
    before = Q.weight_bytes(model)
    n = Q.quantize_int8(model)
    assert n == len(Q.quantized_layers(model)) == 4 * (5 + 6) + 3 * 2 + 1  # 3 compressors
    assert Q.is_quantized_model(model)
    after = Q.weight_bytes(model)
    out = model(ids).numpy()
    # Measured (seed 0): max |delta| / max |logit| = 0.022, relative RMS error 0.011
    # (0.011-0.026 and 0.010-0.012 over seeds 0-2).
    assert np.abs(out - reference).max() <= 0.05 * np.abs(reference).max()
    assert np.sqrt(np.mean((out - reference) ** 2) / np.mean(reference ** 2)) <= 0.03
    assert before["quantized_layers"] / after["quantized_layers"] >= 3.0  # measured 3.43
    assert after["other"] == before["other"]  # mHC, norms, routers, indexer, tid2eid
    for block in model.decoder_layers:
        attn = block.self_attn
        assert attn.o_a_proj.kernel_scale.shape == (TINY.o_groups, TINY.o_lora_rank)
        assert block.attn_hc.fn.dtype == "float32" and block.mlp.gate.weight.dtype == "float32"
        if attn.indexer is not None:
            assert not Q.is_quantized(attn.indexer.q_b_proj)
            assert not Q.is_quantized(attn.indexer.compressor.kv_proj)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_quantize_like_rebuilds_the_same_int8_layers_and_decoding_runs_on_them():
    model = random_v4_model(TINY, seed=2)
    Q.quantize_int8(model, head=False)
    fresh = random_v4_model(TINY, seed=3)
    assert Q.quantize_like(fresh, model) == len(Q.quantized_layers(model)) - 1
    assert [Q.is_quantized(a) for a in Q.quantized_layers(fresh)] == [
        Q.is_quantized(b) for b in Q.quantized_layers(model)]
    assert not Q.is_quantized(fresh.lm_head)
    for a, b in zip(fresh.weights, model.weights, strict=True):
        a.assign(b)  # same paths, shapes and dtypes: an int8 checkpoint restores into it
    ids = _ids(4, (1, 18))
    full = model(ids).numpy()
    np.testing.assert_array_equal(fresh(ids).numpy(), full)
    # Cached decoding (prefill 16, then 2 single tokens) on int8 weights matches the
    # stateless forward, as in float (per-token activation quantization: same rows).
    cache = model.init_cache(1, 32)
    logits, cache = model.call_with_cache(ids[:, :16], cache, 0)
    steps = [logits.numpy()]
    for t in range(16, 18):
        logits, cache = model.call_with_cache(ids[:, t:t + 1], cache, t)
        steps.append(logits.numpy())
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-4, atol=1e-4)


def test_a_lora_grouped_output_projection_is_refused():
    model = random_v4_model(TINY, seed=4)
    model.decoder_layers[1].self_attn.o_a_proj.enable_lora(2)
    with pytest.raises(ValueError, match="o_a_proj has LoRA adapters"):
        Q.quantize_int8(model)
