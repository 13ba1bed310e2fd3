"""Router and DeepSeekMoE: group-limited routing, sparse dispatch, balancing."""

import keras
import numpy as np
import tensorflow as tf

from models.deepseek.moe import DeepSeekMoE
from models.deepseek.router import DeepSeekTopKRouter


def _router(config, seed=0):
    keras.utils.set_random_seed(seed)
    router = DeepSeekTopKRouter(config, name="gate")
    router.build()
    return router


def test_routing_respects_groups_and_uses_unbiased_scores(tiny_config):
    config = tiny_config.replace(routed_scaling_factor=2.5)
    router = _router(config)
    rng = np.random.default_rng(0)
    router.weight.assign(rng.normal(scale=0.3, size=(8, 32)).astype("float32"))
    bias = rng.normal(scale=0.5, size=8).astype("float32")  # some biased scores < 0
    router.e_score_correction_bias.assign(bias)
    x = rng.normal(size=(64, 32)).astype("float32")

    indices, weights, scores = (t.numpy() for t in router(x))
    assert indices.shape == (64, 2) and indices.dtype == np.int32
    assert weights.dtype == np.float32 and scores.shape == (64, 8)

    # Expected by hand: 4 groups of 2 experts; group score = sum of both biased scores.
    biased = 1 / (1 + np.exp(-(x @ router.weight.numpy().T))) + bias  # (64, 8)
    group_scores = biased.reshape(64, 4, 2).sum(-1)  # (64, 4)
    kept_groups = np.argsort(-group_scores, axis=-1)[:, :2]  # (64, 2)
    for t in range(64):
        chosen_groups = set(indices[t] // 2)
        assert chosen_groups <= set(kept_groups[t]), (t, indices[t], kept_groups[t])
        in_kept = [e for e in range(8) if e // 2 in kept_groups[t]]
        best = sorted(in_kept, key=lambda e: -biased[t, e])[:2]
        assert set(indices[t]) == set(best)
    # Weights: unbiased scores of the chosen experts, normalized, times 2.5.
    chosen = np.take_along_axis(scores, indices, axis=1)
    np.testing.assert_allclose(weights, 2.5 * chosen / chosen.sum(-1, keepdims=True), rtol=1e-5)


def test_bias_update_moves_load_toward_balance(tiny_config):
    router = _router(tiny_config)
    rng = np.random.default_rng(1)
    w = rng.normal(scale=0.02, size=(8, 32)).astype("float32")
    w[0] += 0.05  # a skewed router: every token prefers experts 0 and 1 (group 0)
    w[1] += 0.04
    router.weight.assign(w)
    x = (1.0 + rng.normal(scale=1.0, size=(256, 32))).astype("float32")

    def load():
        indices = router(x)[0]
        return tf.cast(tf.math.bincount(indices, minlength=8, maxlength=8), tf.float32)

    initial = load().numpy()
    assert initial[:2].sum() > 0.9 * 256 * 2  # nearly all of the 512 picks go to 0 and 1
    for _ in range(60):
        router.update_bias(load(), 0.01)
    final = load().numpy()
    # Overloaded experts got a lower bias, underloaded ones a higher one.
    assert router.e_score_correction_bias.numpy()[:2].max() < 0
    assert final.sum() == 512
    assert final.max() / final.mean() < 0.5 * initial.max() / initial.mean()
    assert final.std() < 0.3 * initial.std()


def test_moe_equals_dense_reference_and_reports_load(tiny_config):
    keras.utils.set_random_seed(2)
    moe = DeepSeekMoE(tiny_config, name="mlp")
    moe.build()
    x = np.random.default_rng(3).normal(size=(2, 5, 32)).astype("float32")
    out, load, balance_loss, dropped = moe(x)
    assert out.shape == (2, 5, 32) and load.dtype == tf.float32
    assert dropped.dtype == tf.float32 and dropped.numpy() == 0.0  # dropless by default

    # Reference: run every expert on every token and mix with the gating weights.
    flat = x.reshape(10, 32)
    indices, weights, _ = (t.numpy() for t in moe.gate(flat))
    all_experts = np.stack([e(flat).numpy() for e in moe.experts], axis=1)  # (10, 8, 32)
    expected = (np.take_along_axis(all_experts, indices[:, :, None], axis=1)
                * weights[:, :, None]).sum(1) + moe.shared_experts(flat).numpy()
    np.testing.assert_allclose(out.numpy().reshape(10, 32), expected, atol=1e-5)

    np.testing.assert_array_equal(load.numpy(), np.bincount(indices.ravel(), minlength=8))
    assert load.numpy().sum() == 10 * 2
    assert np.isfinite(balance_loss.numpy()) and balance_loss.numpy() > 0


def test_balance_loss_matches_paper_formula(tiny_config):
    config = tiny_config.replace(aux_loss_alpha=0.5)
    keras.utils.set_random_seed(4)
    moe = DeepSeekMoE(config)
    moe.build()
    x = np.random.default_rng(5).normal(size=(3, 4, 32)).astype("float32")
    _, _, balance_loss, _ = moe(x)
    indices, _, scores = (t.numpy() for t in moe.gate(x.reshape(12, 32)))
    indices, scores = indices.reshape(3, 4, 2), scores.reshape(3, 4, 8)
    total = 0.0
    for b in range(3):  # DeepSeek-V3 eq. 17-20, with N_r = 8, K_r = 2, T = 4
        f = 8 / (2 * 4) * np.bincount(indices[b].ravel(), minlength=8)
        p = (scores[b] / scores[b].sum(-1, keepdims=True)).mean(0)
        total += (f * p).sum()
    np.testing.assert_allclose(balance_loss.numpy(), 0.5 * total / 3, rtol=1e-5)


def test_moe_in_tf_function_with_dynamic_shapes(tiny_config):
    keras.utils.set_random_seed(6)
    moe = DeepSeekMoE(tiny_config)
    moe.build()

    @tf.function(input_signature=[tf.TensorSpec([None, None, 32], tf.float32)])
    def step(x):
        out, load, _, _ = moe(x)
        moe.update_bias(load, 0.001)
        return out

    for shape in [(1, 3, 32), (2, 5, 32)]:
        x = tf.random.normal(shape)
        assert step(x).shape == shape
    assert np.abs(moe.gate.e_score_correction_bias.numpy()).sum() > 0
