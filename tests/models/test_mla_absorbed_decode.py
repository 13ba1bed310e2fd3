"""Absorbed MLA decoding (W_UK into q, W_UV after the latent values) equals expanding."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from models.deepseek.causal_lm import DeepSeekCausalLM

TOLERANCE = 1e-5  # absolute, on float32 logits


def _decode(model, ids, prefill, absorb):
    """Logits (B, T, V) of a prefill of `prefill` tokens then one token per step."""
    batch, seq = ids.shape
    cache = model.init_cache(batch, seq + 2)  # spare slots: masked, never attended
    logits, cache = model.call_with_cache(ids[:, :prefill], cache, 0, absorb=absorb)
    steps = [logits]
    for t in range(prefill, seq):
        logits, cache = model.call_with_cache(ids[:, t:t + 1], cache, t, absorb=absorb)
        steps.append(logits)
    return tf.concat(steps, axis=1).numpy(), [layer["kv"].numpy() for layer in cache]


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_absorbed_equals_expanded_decoding(tiny_config, q_lora_rank):
    keras.utils.set_random_seed(11)
    model = DeepSeekCausalLM(tiny_config.replace(q_lora_rank=q_lora_rank))
    ids = tf.constant(np.random.default_rng(12).integers(0, 64, size=(2, 9)), tf.int32)
    absorbed, absorbed_cache = _decode(model, ids, 5, absorb=True)
    expanded, expanded_cache = _decode(model, ids, 5, absorb=False)
    assert absorbed.shape == (2, 9, 64)
    assert float(np.abs(absorbed - expanded).max()) <= TOLERANCE
    # Layer 0 writes the same latents either way (how a cache is read changes only
    # the layers after it).
    np.testing.assert_array_equal(absorbed_cache[0], expanded_cache[0])
    # And both are the full forward pass, up to the order of the sums (as
    # test_cached_decoding_matches_full_forward: 128 ulps).
    assert_float32_close(absorbed, model(ids).numpy(), ulps=128, err_msg="absorbed")


def test_absorbed_uses_the_lora_merged_kernel(tiny_config):
    """With Keras LoRA enabled, `kernel` is W + (alpha / r) A B: absorption sees the adapter."""
    keras.utils.set_random_seed(13)
    model = DeepSeekCausalLM(tiny_config)
    rng = np.random.default_rng(14)
    for block in model.decoder_layers:
        dense = block.self_attn.kv_b_proj
        dense.enable_lora(2)
        dense.lora_kernel_b.assign(rng.normal(0, 0.2, dense.lora_kernel_b.shape))
    ids = tf.constant(rng.integers(0, 64, size=(1, 6)), tf.int32)
    absorbed, _ = _decode(model, ids, 3, absorb=True)
    expanded, _ = _decode(model, ids, 3, absorb=False)
    assert float(np.abs(absorbed - expanded).max()) <= TOLERANCE
    assert_float32_close(absorbed, model(ids).numpy(), ulps=128, err_msg="LoRA absorbed")


def test_absorbed_decoding_in_mixed_bfloat16(tiny_config):
    """Under mixed_bfloat16 scores and softmax stay float32; logits follow float32 closely."""
    keras.utils.set_random_seed(15)
    reference = DeepSeekCausalLM(tiny_config)
    ids = tf.constant(np.random.default_rng(16).integers(0, 64, size=(1, 6)), tf.int32)
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = DeepSeekCausalLM(tiny_config)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.set_weights(reference.get_weights())
    absorbed, cache = _decode(model, ids, 3, absorb=True)
    assert cache[0].dtype == tf.bfloat16.as_numpy_dtype
    expanded, _ = _decode(model, ids, 3, absorb=False)
    full = reference(ids).numpy()
    # bfloat16 keeps 8 significant bits: both paths within a few bf16 ulps of float32.
    scale = np.abs(full).max()
    assert np.abs(absorbed - full).max() <= 0.05 * scale
    assert np.abs(expanded - full).max() <= 0.05 * scale
