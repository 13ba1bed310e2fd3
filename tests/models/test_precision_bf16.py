"""A DeepSeekCausalLM built in the pure "bfloat16" Keras policy (the policy of a bf16
import): bf16 variables except the float32 router, float32 logits and losses, and
logits within bf16 rounding of the float32 model holding the same (bf16) weights."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from models.deepseek.causal_lm import DeepSeekCausalLM


def test_a_bf16_model_keeps_bf16_variables_and_float32_outputs(tiny_config):
    bf16 = DeepSeekCausalLM(tiny_config, dtype="bfloat16")
    router = [v for v in bf16.weights if "/gate/" in v.path]
    assert router and {v.dtype for v in router} == {"float32"}
    assert {v.dtype for v in bf16.weights if "/gate/" not in v.path} == {"bfloat16"}

    f32 = DeepSeekCausalLM(tiny_config, dtype="float32")
    for a, b in zip(f32.weights, bf16.weights, strict=True):
        a.assign(tf.cast(b, tf.float32))
    ids = tf.constant(np.arange(1, 17, dtype=np.int32)[None] % tiny_config.vocab_size)
    logits = bf16(ids)
    assert logits.dtype == tf.float32
    np.testing.assert_allclose(logits.numpy(), f32(ids).numpy(), atol=3e-2)
    out = bf16.compute_loss(ids, tf.roll(ids, -1, axis=1))
    assert all(out[k].dtype == tf.float32 for k in ("loss", "lm_loss", "balance_loss"))
    assert np.isfinite(out["loss"].numpy())
