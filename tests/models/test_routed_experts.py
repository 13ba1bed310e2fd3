"""Stacked routed experts (`RoutedExperts`, `ExpertProjection`) against per-expert references.

The MoE layer's routed output must equal what one SwiGLU per expert gives, each on
its own tokens, mixed with the gating weights: checked for the sigmoid router with
and without groups and the softmax routers (greedy, group-limited), with experts
that get no token, for every dispatch: grouped (dropless, 8 experts), padded
(dropless, 64 experts) and capacity. The grouped and the padded dispatch agree with each
other on the same pairs, forward and gradients, with LoRA and V4's clamped SwiGLU;
int8 experts take the padded one. int8 experts equal Keras' own int8 Dense built from
each expert's kernel; LoRA adapters are per expert. Tolerances follow tests/numerics.py:
the reference runs one (1, C) x (C, F) matmul per pair, the layer one matmul per expert
or one batched matmul over a padded buffer, the same sums over C and F terms in another
kernel.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from models.deepseek.hf_names import hf_weight_map
from models.deepseek.moe import DeepSeekMoE
from models.formats.expert_slice import ExpertSlice
from models.layers.moe_dispatch import (
    GROUPED_MAX_EXPERTS,
    dispatch_to_experts,
    expert_counts,
    grouped_dispatch,
)

ROUTERS = {
    "sigmoid, 4 groups": {},
    "sigmoid, no groups": {"n_group": 1, "topk_group": 1},
    "softmax greedy (V2-Lite)": {"topk_method": "greedy", "scoring_func": "softmax",
                                 "norm_topk_prob": False, "n_group": 1, "topk_group": 1},
    "softmax group-limited (V2)": {"topk_method": "group_limited_greedy",
                                   "scoring_func": "softmax", "norm_topk_prob": False},
}


def _moe(config, seed):
    keras.utils.set_random_seed(seed)
    moe = DeepSeekMoE(config)
    moe.build()
    return moe


def _per_expert_reference(moe, x):
    """Routed + shared output (N, C), float64, one expert at a time on its own tokens."""
    flat = tf.reshape(x, [-1, moe.config.hidden_size])
    indices, weights, _ = (np.asarray(t) for t in moe.gate(flat))
    x64 = np.asarray(flat, np.float64)
    out = np.asarray(moe.shared_experts(flat), np.float64)
    kernels = {name: np.asarray(getattr(moe.experts, name).kernel, np.float64)
               for name in ("gate_proj", "up_proj", "down_proj")}
    for e in range(moe.config.n_routed_experts):
        tokens, slot = np.nonzero(indices == e)
        if not len(tokens):
            continue
        xe = x64[tokens]  # (n_e, C)
        g = xe @ kernels["gate_proj"][e]
        h = g / (1 + np.exp(-g)) * (xe @ kernels["up_proj"][e])  # (n_e, F)
        out[tokens] += weights[tokens, slot][:, None] * (h @ kernels["down_proj"][e])
    return out, indices


@pytest.mark.parametrize("router", list(ROUTERS))
@pytest.mark.parametrize("capacity_factor", [None, 4.0])
def test_stacked_experts_equal_a_per_expert_reference(tiny_config, router, capacity_factor):
    config = tiny_config.replace(**ROUTERS[router])
    moe = _moe(config, seed=1)
    x = tf.constant(np.random.default_rng(2).normal(size=(2, 8, 32)), tf.float32)
    out, load, _, dropped = moe(x, capacity_factor=capacity_factor)
    expected, indices = _per_expert_reference(moe, x)
    np.testing.assert_allclose(np.asarray(out).reshape(16, 32), expected, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(load, np.bincount(indices.ravel(), minlength=8))
    assert float(dropped) == 0.0  # capacity = min(ceil(4 * 16 * 2 / 8), 16) = 16 = N


def test_experts_without_tokens_and_a_single_token(tiny_config):
    """E = 64 experts, N = 3 tokens, K = 2: at least 58 experts get no token."""
    config = tiny_config.replace(n_routed_experts=64, n_group=1, topk_group=1)
    moe = _moe(config, seed=3)
    for n_tokens in (3, 1):
        x = tf.constant(np.random.default_rng(n_tokens).normal(size=(1, n_tokens, 32)),
                        tf.float32)
        for capacity_factor in (None, 100.0):
            out, load, _, _ = moe(x, capacity_factor=capacity_factor)
            expected, _ = _per_expert_reference(moe, x)
            np.testing.assert_allclose(np.asarray(out)[0], expected, rtol=0, atol=1e-6)
            assert int(np.sum(np.asarray(load) == 0)) >= 64 - 2 * n_tokens


def test_dropless_gradients_equal_the_reference_gradients(tiny_config):
    """d(sum(out * probe))/d(x, stacked kernels): the layer against the same loss on the
    per-expert computation written with tf ops (each expert's slice on its tokens)."""
    moe = _moe(tiny_config, seed=4)
    x = tf.constant(np.random.default_rng(5).normal(size=(2, 6, 32)), tf.float32)
    probe = tf.sin(tf.range(32, dtype=tf.float32))
    kernels = moe.experts.trainable_variables  # gate, up, down (E, in, out)

    def reference(x):
        flat = tf.reshape(x, [-1, 32])
        indices, weights, _ = moe.gate(flat)
        out = moe.shared_experts(flat)
        for t in range(12):
            for k in range(2):
                e = int(indices[t, k])
                xt = flat[t:t + 1]
                h = tf.nn.silu(xt @ kernels[0][e]) * (xt @ kernels[1][e])
                out = tf.tensor_scatter_nd_add(out, [[t]], weights[t, k] * (h @ kernels[2][e]))
        return out

    grads = []
    for fn in (lambda x: moe(x)[0], reference):
        with tf.GradientTape() as tape:
            tape.watch(x)
            objective = tf.reduce_sum(tf.reshape(fn(x), [-1, 32]) * probe)
        grads.append([tf.convert_to_tensor(g) for g in
                      tape.gradient(objective, [x, *kernels])])
    for ours, ref, name in zip(*grads, ["x", "gate_proj", "up_proj", "down_proj"], strict=True):
        assert_float32_close(ours, ref, ulps=8, err_msg=name)


def _grouped_and_padded(moe, x, indices):
    """(grouped, padded) routed outputs (N, C) and their gradients d(sum(out * probe))/d(x,
    trainable expert weights), on the same (N, K) expert choices `indices`."""
    weights = tf.nn.softmax(tf.cast(indices, tf.float32) * 0.3 + 0.1)  # (N, K)
    counts = expert_counts(indices, len(moe.experts))
    probe = tf.cos(tf.range(x.shape[-1], dtype=tf.float32))
    results = []
    for dispatch in (lambda: grouped_dispatch(moe.experts, x, indices, weights, counts),
                     lambda: dispatch_to_experts(moe.experts, x, indices, weights, counts,
                                                 tf.reduce_max(counts))):
        with tf.GradientTape() as tape:
            tape.watch(x)
            out = dispatch()
            objective = tf.reduce_sum(out * probe)
        grads = tape.gradient(objective, [x, *moe.experts.trainable_variables])
        results.append((out, [tf.convert_to_tensor(g) for g in grads]))
    return results


@pytest.mark.parametrize("variant", ["float", "lora", "swiglu_limit"])
def test_grouped_dispatch_equals_the_padded_dispatch(tiny_config, variant):
    """The same pairs through both dropless dispatches: outputs within float32 rounding
    (the same products summed in other kernels), gradients too, with a skewed routing
    where most experts get no pair and one gets most."""
    moe = _moe(tiny_config, seed=10)
    if variant == "lora":
        for projection in moe.experts.projections:
            projection.enable_lora(2)
            projection.lora_kernel_b.assign(
                np.random.default_rng(11).normal(size=projection.lora_kernel_b.shape) * 0.1)
    if variant == "swiglu_limit":
        moe.experts.swiglu_limit = 0.05  # clamps many of the tiny model's pre-activations
    rng = np.random.default_rng(12)
    x = tf.constant(rng.normal(size=(20, 32)), tf.float32)
    skewed = np.stack([np.full(20, 3), rng.choice([0, 5], size=20)], axis=1)  # (N, K)
    for indices in (rng.permuted(np.tile(np.arange(8), (20, 1)), axis=1)[:, :2], skewed):
        (grouped, grouped_grads), (padded, padded_grads) = _grouped_and_padded(
            moe, x, tf.constant(indices, tf.int32))
        assert_float32_close(grouped, padded, ulps=4, err_msg=variant)
        names = ["x"] + [v.path for v in moe.experts.trainable_variables]
        assert len(names) == (7 if variant == "lora" else 4)
        for ours, ref, name in zip(grouped_grads, padded_grads, names, strict=True):
            assert_float32_close(ours, ref, ulps=8, err_msg=f"{variant}: {name}")


def test_dropless_dispatch_chooses_grouped_for_few_float_experts(tiny_config, monkeypatch):
    """Dropless (no slots): grouped for <= GROUPED_MAX_EXPERTS float experts, padded
    for int8 experts (their matmul is the stacked int8 one) and for more experts."""
    import models.layers.moe_dispatch as moe_module

    calls = []
    real = moe_module.grouped_dispatch
    monkeypatch.setattr(moe_module, "grouped_dispatch",
                        lambda *a: calls.append(len(a[0])) or real(*a))
    x = tf.constant(np.random.default_rng(13).normal(size=(1, 6, 32)), tf.float32)
    assert GROUPED_MAX_EXPERTS >= 8
    moe = _moe(tiny_config, seed=14)
    expected, _ = _per_expert_reference(moe, x)
    np.testing.assert_allclose(np.asarray(moe(x)[0])[0], expected, rtol=0, atol=1e-6)
    assert calls == [8]
    moe_module.dispatch_to_experts(  # more experts than the limit: padded
        _moe(tiny_config.replace(n_routed_experts=GROUPED_MAX_EXPERTS + 8, n_group=1,
                                 topk_group=1), seed=15).experts,
        x[0], tf.zeros([6, 2], tf.int32) + [0, 1], tf.ones([6, 2]),
        tf.constant([6, 6] + [0] * (GROUPED_MAX_EXPERTS + 6), tf.int32))
    assert calls == [8]
    for projection in moe.experts.projections:
        projection.quantize("int8")
    out = moe(x)[0]  # int8: padded
    assert calls == [8]
    np.testing.assert_allclose(np.asarray(out)[0], expected, rtol=0, atol=0.05)


@pytest.mark.slow
def test_int8_experts_equal_keras_int8_dense_per_expert(tiny_config):
    """Per expert, the stacked int8 call is Keras 3.6's int8 Dense on that expert's kernel:
    the same per-channel weight scales and per-token input scales."""
    moe = _moe(tiny_config, seed=6)
    buffer = tf.constant(np.random.default_rng(7).normal(size=(8, 5, 32)), tf.float32)
    dense = []
    for e in range(8):
        layer = keras.layers.Dense(16, use_bias=False)
        layer.build((None, 32))
        layer.kernel.assign(moe.experts.gate_proj.kernel[e])
        layer.quantize("int8")
        dense.append(layer)
    moe.experts.gate_proj.quantize("int8")
    projection = moe.experts.gate_proj
    assert projection.kernel_variable().dtype == "int8"
    assert tuple(projection.kernel_scale.shape) == (8, 16)  # (E, out)
    ours = np.asarray(projection(buffer))
    for e in range(8):
        np.testing.assert_array_equal(np.asarray(projection.kernel_variable()[e]),
                                      np.asarray(dense[e]._kernel))
        np.testing.assert_array_equal(np.asarray(projection.kernel_scale[e]),
                                      np.asarray(dense[e].kernel_scale))
        assert_float32_close(ours[e], np.asarray(dense[e](buffer[e])), ulps=4,
                             err_msg=f"expert {e}")
    with tf.GradientTape() as tape:  # the input gradient goes through Q / s
        tape.watch(buffer)
        y = tf.reduce_sum(projection(buffer))
    assert float(tf.norm(tape.gradient(y, buffer))) > 0


def test_lora_adapters_are_per_expert(tiny_config):
    moe = _moe(tiny_config, seed=8)
    projection = moe.experts.up_proj
    projection.enable_lora(3)
    assert tuple(projection.lora_kernel_a.shape) == (8, 32, 3)
    assert tuple(projection.lora_kernel_b.shape) == (8, 3, 16)
    assert not projection.kernel_variable().trainable
    b = np.random.default_rng(9).normal(size=(8, 3, 16)).astype(np.float32)
    projection.lora_kernel_b.assign(b)
    a = np.asarray(projection.lora_kernel_a)
    w = np.asarray(projection.kernel_variable())
    for e in (0, 5):
        np.testing.assert_allclose(np.asarray(projection.expert_kernel(e)), w[e] + a[e] @ b[e],
                                   rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="LoRA is already enabled"):
        projection.enable_lora(3)
    with pytest.raises(ValueError, match="merge them"):
        projection.quantize("int8")


def test_hf_names_map_experts_to_slices_read_and_assigned_in_place(tiny_model):
    names = hf_weight_map(tiny_model)
    entry, transpose = names["model.layers.1.mlp.experts.5.down_proj.weight"]
    assert isinstance(entry, ExpertSlice) and transpose and entry.shape == (16, 32)
    stacked = tiny_model.moe_layers[0].experts.down_proj.kernel_variable()
    np.testing.assert_array_equal(tf.convert_to_tensor(entry), np.asarray(stacked)[5])
    value = np.full((16, 32), 0.25, np.float32)
    before = np.asarray(stacked).copy()
    entry.assign(value)
    after = np.asarray(stacked)
    np.testing.assert_array_equal(after[5], value)
    np.testing.assert_array_equal(np.delete(after, 5, 0), np.delete(before, 5, 0))
    stacked.assign(before)  # the module's shared model, as it was
