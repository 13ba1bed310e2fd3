"""int8 weights through Keras' `Dense.quantize("int8")` (`models/formats/quantization.py`):
which layers, how many bytes, what stays float, and the three places that read a
kernel instead of calling the layer (absorbed MLA decoding, the capacity MoE dispatch,
the HF layout)."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from models.deepseek import hf_save
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.deepseek_presets import deepseek_preset
from models.formats import quantization as Q

# Untied head and an MTP module: every kind of projection is there.
CONFIG = deepseek_preset("tiny").replace(tie_word_embeddings=False, num_nextn_predict_layers=1)


def _model(seed=21, config=CONFIG):
    keras.utils.set_random_seed(seed)
    return DeepSeekCausalLM(config)


def _ids(seed, shape, vocab=CONFIG.vocab_size):
    return tf.constant(np.random.default_rng(seed).integers(0, vocab, size=shape), tf.int32)


def test_projections_become_int8_with_per_channel_scales_and_the_rest_stays_float():
    model = _model()
    float_kernels = {id(layer): layer.kernel.numpy() for layer in Q.quantized_layers(model)}
    before = Q.weight_bytes(model)
    assert Q.quantize_int8(model) == len(float_kernels)
    assert Q.quantize_int8(model) == 0  # already int8
    after = Q.weight_bytes(model)
    for layer in Q.quantized_layers(model):
        q = Q.kernel_variable(layer)
        assert q.dtype == "int8" and not q.trainable
        # A Dense (in, out) has scales (out,); the routed experts' stacked kernel
        # (E, in, out) has (E, out), one per expert and output channel.
        assert layer.kernel_scale.shape == (*q.shape[:-2], layer.units)
        # abs_max per output channel: the largest |W| of each column maps to +-127, and
        # every weight is within half a step (1 / (2 s)) of its float value.
        w = float_kernels[id(layer)]
        np.testing.assert_array_equal(np.abs(q.numpy()).max(axis=-2), 127)
        err = np.abs(Q.float_kernel(layer, tf.float32).numpy() - w)
        assert np.all(err <= 0.5 / layer.kernel_scale.numpy()[..., None, :] + 1e-7)
    # Embedding, norms and the router keep float32 and are not "quantized layers".
    assert model.embed_tokens.embeddings.dtype == "float32"
    assert model.norm.weight.dtype == "float32"
    for moe in model.moe_layers:
        assert moe.gate.weight.dtype == "float32"
    assert after["other"] == before["other"]
    # int8 + a float32 scale per output column: 4 in / (in + 4) >= 3.5 for in >= 28.
    assert before["quantized_layers"] / after["quantized_layers"] >= 3.5
    assert Q.is_quantized_model(model)


def test_the_head_stays_float_when_asked_and_a_lora_layer_is_refused():
    model = _model()
    Q.quantize_int8(model, head=False)
    assert not Q.is_quantized(model.lm_head)
    other = _model()
    other.decoder_layers[0].self_attn.o_proj.enable_lora(2)
    with pytest.raises(ValueError, match="o_proj has LoRA adapters"):
        Q.quantize_int8(other)


def test_the_quantized_model_stays_close_to_float():
    model = _model()
    ids = _ids(1, (2, 16))
    reference = model(ids).numpy()
    Q.quantize_int8(model)
    out = model(ids).numpy()
    # int8 weights and per-token int8 activations: each product is off by about 1/254 of
    # its row's and column's absmax; the logits move by a few percent of their scale.
    assert np.abs(out - reference).max() <= 0.05 * np.abs(reference).max()
    assert not np.array_equal(out, reference)


def _decode(model, ids, prefill, absorb):
    """Logits (B, T, V) of a prefill then one token per step over the latent cache."""
    batch, seq = ids.shape
    cache = model.init_cache(batch, seq + 2)
    logits, cache = model.call_with_cache(ids[:, :prefill], cache, 0, absorb=absorb)
    steps = [logits]
    for t in range(prefill, seq):
        logits, cache = model.call_with_cache(ids[:, t:t + 1], cache, t, absorb=absorb)
        steps.append(logits)
    return tf.concat(steps, axis=1).numpy()


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_absorbed_equals_expanded_decoding_on_the_quantized_model(q_lora_rank):
    model = _model(22, CONFIG.replace(q_lora_rank=q_lora_rank))
    Q.quantize_int8(model)
    ids = _ids(2, (2, 9))
    absorbed = _decode(model, ids, 5, absorb=True)
    expanded = _decode(model, ids, 5, absorb=False)
    # Both read kv_b_proj's dequantized kernel Q / s; the other int8 layers run the same
    # int8 ops on the same inputs, so the paths differ by the order of the attention sums
    # only: 128 ulps, as test_mla_absorbed_decode.py allows in float32.
    assert_float32_close(absorbed, expanded, ulps=128, err_msg="absorbed vs expanded (int8)")
    assert_float32_close(absorbed, model(ids).numpy(), ulps=128, err_msg="decode vs forward")


def test_capacity_dispatch_reads_dequantized_expert_kernels():
    # Capacity large enough that no pair is dropped: the batched einsum over the stacked
    # Q / s kernels equals each expert's own layer on its tokens, up to the order of sums.
    model = _model(23)
    Q.quantize_int8(model)
    moe = model.moe_layers[0]
    x = tf.random.stateless_normal((2, 7, CONFIG.hidden_size), seed=(3, 4))
    dropless, *_ = moe(x)
    with_capacity, _, _, dropped = moe(x, capacity_factor=float(CONFIG.n_routed_experts))
    assert float(dropped) == 0.0
    # The dropless path quantizes each expert's input per token (Keras' int8 call); the
    # capacity path runs the float kernels on float inputs: within int8 rounding.
    scale = np.abs(dropless.numpy()).max()
    assert np.abs(with_capacity.numpy() - dropless.numpy()).max() <= 0.02 * scale


def test_hf_layout_writes_the_dequantized_kernels_as_float32():
    model = _model(24)
    Q.quantize_int8(model)
    tensors = hf_save.model_tensors(model)
    layer = model.decoder_layers[0].self_attn.kv_b_proj
    hf = tensors["model.layers.0.self_attn.kv_b_proj.weight"]
    assert hf.dtype == tf.float32
    np.testing.assert_array_equal(hf.numpy().T, Q.float_kernel(layer, tf.float32).numpy())


def test_lora_on_an_int8_layer_trains_the_adapters_and_requantizes_on_merge():
    model = _model(25)
    Q.quantize_int8(model)
    layer = model.decoder_layers[0].self_attn.o_proj
    q_before = Q.kernel_variable(layer).numpy().copy()
    layer.enable_lora(2)
    assert [v.name for v in layer.trainable_weights] == ["lora_kernel_a", "lora_kernel_b"]
    layer.lora_kernel_b.assign(np.random.default_rng(5).normal(0, 0.05, layer.lora_kernel_b.shape))
    merged = (q_before / layer.kernel_scale.numpy()[None, :]
              + layer.lora_kernel_a.numpy() @ layer.lora_kernel_b.numpy())
    np.testing.assert_allclose(Q.float_kernel(layer, tf.float32).numpy(), merged, rtol=1e-6,
                               atol=1e-7)
    q, scale = Q.requantized(layer)
    assert q.dtype == np.int8 and scale.shape == (layer.units,)
    assert np.all(np.abs(q / scale[None, :] - merged) <= 0.5 / scale[None, :] + 1e-7)
    np.testing.assert_array_equal(Q.kernel_variable(layer).numpy(), q_before)  # base unchanged
