"""DeepSeekMoE capacity dispatch: equal to dropless when nothing drops, drops by hand, XLA.

Tolerances follow tests/numerics.py. The capacity path computes the same sums as the
dropless one with other kernels: per expert the same dot products over C = 32 and
F = 16 terms, but one batched einsum (BatchMatMulV2) over an (E, S, C) buffer with
zero rows instead of one MatMul per expert; the K = 2 weighted expert outputs of a
token are summed as a + b either way (unsorted_segment_sum adds them to 0 in expert
order, reduce_sum over K in top-k order: a two-term sum is commutative). Measured on
this machine (AVX-512, oneDNN): outputs, expert load and balance loss bitwise equal;
gradients within 2 ulps of their scale (the einsum's gradient is another matmul
kernel, reducing over C, F or the E*S slots in another order). Allowed: 4 ulps
(8 for the LoRA factors, 16 with XLA, 32 for a whole model's gradients with XLA).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from models.deepseek.config import DeepSeekConfig
from models.deepseek.moe import DeepSeekMoE
from models.layers.moe_dispatch import expert_capacity

ULPS = 4  # another kernel for the same sums of 32 and 16 terms (module docstring)
XLA_ULPS = 16  # XLA also fuses SwiGLU and uses its own sigmoid; measured <= 3


def _moe(config, seed=0, **kwargs):
    keras.utils.set_random_seed(seed)
    moe = DeepSeekMoE(config, **kwargs)
    moe.build()
    return moe


def _forward_and_grads(moe, x, capacity_factor):
    """MoE outputs and the gradients of a fixed projection of them (plus the balance
    loss) w.r.t. x and every trainable variable."""
    probe = tf.sin(tf.range(x.shape[-1], dtype=tf.float32))  # (C,) fixed, not symmetric
    with tf.GradientTape() as tape:
        tape.watch(x)
        out, load, balance_loss, dropped = moe(x, capacity_factor=capacity_factor)
        objective = tf.reduce_sum(tf.cast(out, tf.float32) * probe) + 10.0 * balance_loss
    grads = tape.gradient(objective, [x, *moe.trainable_variables])
    return out, load, balance_loss, dropped, [tf.convert_to_tensor(g) for g in grads]


def _assert_same(a, b, variables, ulps, what):
    out_a, load_a, bal_a, _, grads_a = a
    out_b, load_b, bal_b, _, grads_b = b
    assert_float32_close(out_b, out_a, ulps=ulps, err_msg=f"{what} output")
    np.testing.assert_array_equal(load_b, load_a)
    assert_float32_close(bal_b, bal_a, ulps=ulps, err_msg=f"{what} balance_loss")
    names = ["x"] + [v.path for v in variables]
    for name, ga, gb in zip(names, grads_a, grads_b, strict=True):
        assert_float32_close(gb, ga, ulps=ulps, err_msg=f"{what} grad {name}")


def test_expert_capacity_by_hand():
    # capacity = ceil(1.25 * 8 * 2 / 4) = 5
    assert expert_capacity(8, 4, 2, 1.25) == 5
    # capacity = ceil(1.1 * 100 * 1 / 10) = 11 (float arithmetic gives 11.000000000000002)
    assert expert_capacity(100, 10, 1, 1.1) == 11
    # capacity = min(ceil(4.0 * 8 * 2 / 4), 8) = min(16, 8) = 8: no expert gets > N pairs
    assert expert_capacity(8, 4, 2, 4.0) == 8
    # capacity = ceil(0.25 * 8 * 2 / 4) = 1
    assert expert_capacity(8, 4, 2, 0.25) == 1
    assert expert_capacity(0, 4, 2, 1.25) == 0
    for n, e, k, cf in [(8, 4, 2, 1.25), (100, 10, 1, 1.1), (8, 4, 2, 4.0), (2048, 64, 6, 1.25),
                        (7, 8, 2, 0.3), (0, 4, 2, 1.0)]:
        assert int(expert_capacity(tf.constant(n), e, k, cf)) == expert_capacity(n, e, k, cf)
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(8, 4, 2, 0.0)


def test_capacity_covering_every_load_equals_dropless(tiny_config):
    moe = _moe(tiny_config, seed=2)
    x = tf.constant(np.random.default_rng(3).normal(size=(2, 8, 32)), tf.float32)
    # capacity = min(ceil(4.0 * 16 * 2 / 8), 16) = 16 = N >= any expert's load (cf = E/K)
    dropless = _forward_and_grads(moe, x, None)
    capacity = _forward_and_grads(moe, x, 4.0)
    assert dropless[3].numpy() == 0.0 and capacity[3].numpy() == 0.0
    assert capacity[0].dtype == tf.float32 and capacity[3].dtype == tf.float32
    _assert_same(dropless, capacity, moe.trainable_variables, ULPS, "cf=E/K")
    # The routed experts all received gradient (the comparison is not of zeros).
    stacked = capacity[4][1 + 1:1 + 1 + 3]  # after x and gate.weight: (E, in, out) each
    expert_grads = [g[e] for g in stacked for e in range(8)]
    assert sum(float(tf.norm(g)) > 0 for g in expert_grads) >= 3 * 6


def _crafted(tiny_kwargs):
    """E = 4 experts, K = 2, N = 8 tokens; all tokens pick expert 1, tokens 0-3 expert 2,
    tokens 4-7 expert 3: expert load [0, 8, 4, 4]."""
    config = DeepSeekConfig(**{**tiny_kwargs, "n_routed_experts": 4, "n_group": 1, "topk_group": 1})
    moe = _moe(config, seed=4)
    weight = np.zeros((4, 32), np.float32)
    weight[2, 0], weight[3, 0] = 5.0, -5.0  # s_2 = sigmoid(5 x_0), s_3 = sigmoid(-5 x_0)
    moe.gate.weight.assign(weight)
    moe.gate.e_score_correction_bias.assign([0.0, 1.0, 0.0, 0.0])  # s_1 + 1.5 wins always
    x = np.random.default_rng(5).normal(size=(1, 8, 32)).astype(np.float32)
    x[0, :, 0] = [1, 1, 1, 1, -1, -1, -1, -1]
    return moe, tf.constant(x)


def test_small_capacity_drops_the_pairs_counted_by_hand(tiny_kwargs):
    moe, x = _crafted(tiny_kwargs)
    out, load, _, dropped = moe(x, capacity_factor=1.25)
    np.testing.assert_array_equal(load, [0, 8, 4, 4])  # routed load, before dropping
    # capacity = ceil(1.25 * 8 * 2 / 4) = 5: expert 1 keeps tokens 0-4 and drops the
    # pairs (5, 1), (6, 1), (7, 1); experts 2 and 3 keep their 4 each.
    assert dropped.numpy() == 3.0

    flat = x[0]  # (8, C)
    indices, weights, _ = (t.numpy() for t in moe.gate(flat))
    assert [set(row) for row in indices] == [{1, 2}] * 4 + [{1, 3}] * 4
    kept = {(t, e) for t in range(8) for e in indices[t] if not (e == 1 and t >= 5)}
    expected = moe.shared_experts(flat).numpy()
    for t in range(8):
        for e, w in zip(indices[t], weights[t], strict=True):
            if (t, e) in kept:
                expected[t] += w * moe.experts[e](flat[t:t + 1]).numpy()[0]
    assert_float32_close(out[0], expected, ulps=ULPS, err_msg="crafted routing")

    # Dropped pairs contribute nothing, not even gradient: tokens 5-7 do not reach expert 1.
    stacked = moe.experts.trainable_variables  # (E, in, out) kernels; expert 1 is [1]
    with tf.GradientTape() as tape:
        out = moe(x, capacity_factor=1.25)[0]
        tail = tf.reduce_sum(out[:, 5:] ** 2)
    for g in tape.gradient(tail, stacked):
        g = tf.convert_to_tensor(g)[1]
        np.testing.assert_array_equal(g, np.zeros_like(g))

    # capacity = ceil(0.25 * 8 * 2 / 4) = 1: experts 1, 2, 3 keep one pair each,
    # dropped = (8 - 1) + (4 - 1) + (4 - 1) = 13.
    assert moe(x, capacity_factor=0.25)[3].numpy() == 13.0
    # Dropless: nothing dropped, same load.
    _, load, _, dropped = moe(x)
    np.testing.assert_array_equal(load, [0, 8, 4, 4])
    assert dropped.numpy() == 0.0


def test_capacity_path_compiles_with_xla(tiny_config):
    moe = _moe(tiny_config, seed=6)
    x = tf.constant(np.random.default_rng(7).normal(size=(2, 8, 32)), tf.float32)
    # capacity = ceil(1.0 * 16 * 2 / 8) = 4 slots; the random routing overloads some experts.
    eager = _forward_and_grads(moe, x, 1.0)
    compiled = tf.function(lambda x: _forward_and_grads(moe, x, 1.0), jit_compile=True)(x)
    assert eager[3].numpy() > 0
    assert compiled[3].numpy() == eager[3].numpy()
    _assert_same(eager, compiled, moe.trainable_variables, XLA_ULPS, "XLA")


def test_forward_train_reports_dropped_pairs(tiny_model):
    ids = tf.constant(np.random.default_rng(8).integers(0, 64, size=(2, 8)), tf.int32)
    dropless = tiny_model.forward_train(ids)
    np.testing.assert_array_equal(dropless["moe_dropped"], [0.0, 0.0])
    # Pairs N*K: block 1 on 2*8 tokens, the MTP block on 2*7 tokens; K = 2.
    np.testing.assert_array_equal(dropless["moe_pairs"], [32.0, 28.0])

    # cf = E/K: capacity = N in both layers, nothing drops, the same model output.
    full = tiny_model.forward_train(ids, moe_capacity_factor=4.0)
    np.testing.assert_array_equal(full["moe_dropped"], [0.0, 0.0])
    np.testing.assert_array_equal(full["expert_load"], dropless["expert_load"])
    assert_float32_close(full["logits"], dropless["logits"], ulps=ULPS, err_msg="logits")
    assert_float32_close(full["mtp_logits"][0], dropless["mtp_logits"][0], ulps=ULPS,
                         err_msg="mtp_logits")

    # cf = 0.5: capacity = ceil(0.5 * 16 * 2 / 8) = 2 in block 1 and
    # ceil(0.5 * 14 * 2 / 8) = ceil(1.75) = 2 in the MTP block; dropped = load beyond 2.
    half = tiny_model.forward_train(ids, moe_capacity_factor=0.5)
    load = half["expert_load"].numpy()
    np.testing.assert_array_equal(half["moe_dropped"], np.maximum(load - 2, 0).sum(-1))
    assert half["moe_dropped"].dtype == tf.float32 and half["moe_dropped"].numpy().min() > 0
    losses = tiny_model.compute_loss(ids, ids, moe_capacity_factor=0.5)
    np.testing.assert_array_equal(losses["moe_dropped"], half["moe_dropped"])

    # Activation recomputation reruns the same capacity dispatch in the backward pass.
    def loss_and_grads(recompute):
        with tf.GradientTape() as tape:
            loss = tiny_model.compute_loss(ids, ids, recompute_blocks=recompute,
                                           moe_capacity_factor=0.5)["loss"]
        return loss, tape.gradient(loss, tiny_model.trainable_variables)

    (loss, grads), (loss_re, grads_re) = loss_and_grads(False), loss_and_grads(True)
    np.testing.assert_array_equal(loss_re, loss)
    # Recomputation reorders the backward pass's sums: the bound of
    # test_trainer_loop's recomputation test, 64 ulps; measured <= 2.
    for v, g, g_re in zip(tiny_model.trainable_variables, grads, grads_re, strict=True):
        assert_float32_close(tf.convert_to_tensor(g_re), tf.convert_to_tensor(g), ulps=64,
                             err_msg=f"recompute {v.path}")


@pytest.mark.slow
def test_forward_train_with_capacity_compiles_with_xla(tiny_model):
    ids = tf.constant(np.random.default_rng(9).integers(0, 64, size=(2, 8)), tf.int32)
    variables = tiny_model.trainable_variables

    def step(ids):
        with tf.GradientTape() as tape:
            losses = tiny_model.compute_loss(ids[:, :-1], ids[:, 1:], moe_capacity_factor=1.0)
        return losses, tape.gradient(losses["loss"], variables)

    eager_losses, eager_grads = step(ids)
    xla_losses, xla_grads = tf.function(step, jit_compile=True)(ids)
    np.testing.assert_array_equal(xla_losses["moe_dropped"], eager_losses["moe_dropped"])
    np.testing.assert_array_equal(xla_losses["expert_load"], eager_losses["expert_load"])
    for name in ("loss", "lm_loss", "mtp_loss", "balance_loss"):
        assert_float32_close(xla_losses[name], eager_losses[name], ulps=XLA_ULPS, err_msg=name)
    for v, ge, gx in zip(variables, eager_grads, xla_grads, strict=True):
        # Whole model: attention softmax, RMSNorm, 3 blocks chained, XLA's own exp and
        # rsqrt; measured <= 6 ulps of each gradient's scale.
        assert_float32_close(tf.convert_to_tensor(gx), tf.convert_to_tensor(ge), ulps=32,
                             err_msg=v.path)


def test_capacity_with_lora_experts_equals_dropless(tiny_config):
    moe = _moe(tiny_config, seed=10)
    rng = np.random.default_rng(11)
    for proj in moe.experts.projections:  # per-expert adapters, stacked
        proj.enable_lora(2)
        b = proj.lora_kernel_b
        b.assign(rng.normal(scale=0.05, size=b.shape).astype(np.float32))  # B starts at 0
    w = moe.experts.gate_proj
    assert not np.array_equal(w.kernel, w.kernel_variable())  # `kernel` includes LoRA
    x = tf.constant(rng.normal(size=(2, 8, 32)), tf.float32)
    dropless = _forward_and_grads(moe, x, None)
    capacity = _forward_and_grads(moe, x, 4.0)  # capacity = N: nothing drops
    lora = [v.path for v in moe.trainable_variables if "lora" in v.path]
    assert len(lora) == 3 * 2  # A (E, in, r) and B (E, r, out) per projection
    # The LoRA gradients take one more matmul (dK B^T, A^T dK) after the kernel's
    # gradient: measured <= 3.6 ulps; allowed 2 * ULPS.
    _assert_same(dropless, capacity, moe.trainable_variables, 2 * ULPS, "LoRA")


def test_capacity_under_mixed_precision_and_dynamic_shapes(tiny_config):
    moe = _moe(tiny_config, seed=12, dtype="mixed_bfloat16")
    x = tf.constant(np.random.default_rng(13).normal(size=(2, 8, 32)), tf.float32)
    out, _, _, dropped = moe(x, capacity_factor=4.0)
    reference = moe(x)[0]
    assert out.dtype == tf.bfloat16 and dropped.numpy() == 0.0
    # bfloat16 keeps 8 significant bits: allow 2 ulps of bfloat16 at the output's scale.
    np.testing.assert_allclose(tf.cast(out, tf.float32), tf.cast(reference, tf.float32),
                               atol=2 * 2.0**-7 * float(tf.reduce_max(tf.abs(
                                   tf.cast(reference, tf.float32)))))

    # Unknown N at trace time: the capacity is a tensor, computed per call.
    moe = _moe(tiny_config, seed=14)

    @tf.function(input_signature=[tf.TensorSpec([None, None, 32], tf.float32)])
    def step(x):
        return moe(x, capacity_factor=1.0)

    for shape in [(1, 3, 32), (2, 8, 32)]:
        x = tf.random.stateless_normal(shape, seed=[1, shape[1]])
        out, load, _, dropped = step(x)
        eager = moe(x, capacity_factor=1.0)
        assert out.shape == shape
        assert dropped.numpy() == eager[3].numpy()
        np.testing.assert_array_equal(load, eager[1])
        assert_float32_close(out, eager[0], ulps=ULPS, err_msg=f"dynamic {shape}")
