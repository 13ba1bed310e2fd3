"""DPO and GRPO losses (`components/trainer/preference.py`) against hand and numpy
computations (issue 29's unit lines)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import preference
from components.trainer.preference import IGNORE_LABEL


def _logsoftmax(z):
    z = np.asarray(z, np.float64)
    return z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(
        -1, keepdims=True)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def test_dpo_loss_and_gradient_equal_a_hand_computation_on_a_two_token_vocabulary():
    """One pair, one response token each, vocabulary {0, 1}: chosen answers 0, rejected 1."""
    beta = 0.5
    z_chosen, z_rejected = np.array([1.0, -0.5]), np.array([0.3, 0.2])  # policy logits
    ref_chosen, ref_rejected = math.log(0.6), math.log(0.5)  # reference log-probs
    logits_c = tf.Variable(z_chosen[None, None, :], dtype=tf.float32)  # (1, 1, 2)
    logits_r = tf.Variable(z_rejected[None, None, :], dtype=tf.float32)
    with tf.GradientTape() as tape:
        pc = preference.sequence_logps(logits_c, tf.constant([[0]]))
        pr = preference.sequence_logps(logits_r, tf.constant([[1]]))
        loss, figures = preference.dpo_loss(pc, pr, tf.constant([ref_chosen]),
                                            tf.constant([ref_rejected]), beta)
    grad_c, grad_r = tape.gradient(loss, [logits_c, logits_r])

    # By hand: pc = log softmax(z_c)[0], pr = log softmax(z_r)[1];
    # m = beta ((pc - rc) - (pr - rr)); L = -log sigmoid(m); dL/dm = sigmoid(m) - 1;
    # d pc / d z_c = onehot(0) - softmax(z_c); d pr / d z_r = onehot(1) - softmax(z_r).
    pc_hand, pr_hand = _logsoftmax(z_chosen)[0], _logsoftmax(z_rejected)[1]
    m = beta * ((pc_hand - ref_chosen) - (pr_hand - ref_rejected))
    np.testing.assert_allclose(loss.numpy(), -math.log(_sigmoid(m)), rtol=1e-6)
    d_m = _sigmoid(m) - 1.0
    softmax_c, softmax_r = np.exp(_logsoftmax(z_chosen)), np.exp(_logsoftmax(z_rejected))
    np.testing.assert_allclose(grad_c.numpy()[0, 0], d_m * beta * (np.array([1, 0]) - softmax_c),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(grad_r.numpy()[0, 0],
                               -d_m * beta * (np.array([0, 1]) - softmax_r), rtol=1e-5,
                               atol=1e-7)
    assert figures["reward_accuracy"].numpy() == (1.0 if m > 0 else 0.0)


def test_dpo_loss_tends_to_log_2_as_beta_tends_to_0():
    rng = np.random.default_rng(0)
    logps = [tf.constant(rng.normal(size=8) * 5.0, tf.float32) for _ in range(4)]
    loss, _ = preference.dpo_loss(*logps, beta=1e-7)
    np.testing.assert_allclose(loss.numpy(), math.log(2.0), rtol=1e-6)
    with pytest.raises(ValueError, match="beta"):
        preference.dpo_loss(*logps, beta=0.0)


def test_prompt_tokens_get_no_gradient():
    """Targets marked IGNORE_LABEL (the prompt, the padding) contribute nothing."""
    rng = np.random.default_rng(1)
    logits = tf.Variable(rng.normal(size=(2, 5, 7)), dtype=tf.float32)  # (B, T, V)
    labels = tf.constant([[IGNORE_LABEL, IGNORE_LABEL, 3, 4, 1],
                          [IGNORE_LABEL, 2, 2, IGNORE_LABEL, IGNORE_LABEL]])
    with tf.GradientTape() as tape:
        chosen = preference.sequence_logps(logits, labels)
        loss, _ = preference.dpo_loss(chosen, chosen[::-1] - 1.0, tf.zeros(2), tf.zeros(2), 0.1)
    grad = tape.gradient(loss, logits).numpy()  # (B, T, V)
    ignored = (labels.numpy() == IGNORE_LABEL)
    assert np.all(grad[ignored] == 0.0)
    assert np.all(np.abs(grad[~ignored]).sum(-1) > 0)


def _grpo_numpy(logp, old, ref, rewards, mask, clip_eps, beta, eps=1e-4):
    adv = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + eps)
    adv = adv.reshape(-1)[:, None]
    ratio = np.exp(logp - old)
    surrogate = np.minimum(ratio * adv, np.clip(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    kl = np.exp(ref - logp) - (ref - logp) - 1
    per_token = -(surrogate - beta * kl)
    loss = ((per_token * mask).sum(1) / mask.sum(1)).mean()
    return adv.reshape(-1), kl, loss


def test_grpo_advantages_objective_and_k3_kl_equal_a_numpy_reference():
    rng = np.random.default_rng(2)
    groups, n, t = 3, 4, 6
    rewards = rng.integers(0, 2, size=(groups, n)).astype(np.float64)
    rewards[0] = [0, 1, 1, 0]
    logp = rng.normal(-2.0, 0.5, size=(groups * n, t))
    old = logp + rng.normal(0.0, 0.3, size=logp.shape)  # some ratios beyond the clip range
    ref = logp + rng.normal(0.0, 0.2, size=logp.shape)
    mask = (rng.random(size=logp.shape) > 0.3).astype(np.float64)
    mask[:, 0] = 1.0
    adv_np, kl_np, loss_np = _grpo_numpy(logp, old, ref, rewards, mask, 0.2, 0.04)

    adv = preference.grpo_advantages(tf.constant(rewards, tf.float32))
    np.testing.assert_allclose(adv.numpy().reshape(-1), adv_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(preference.k3_kl(tf.constant(logp), tf.constant(ref)).numpy(),
                               kl_np, rtol=1e-6)
    loss, figures = preference.grpo_loss(
        tf.constant(logp, tf.float32), tf.constant(old, tf.float32), tf.constant(ref, tf.float32),
        tf.reshape(adv, [-1]), tf.constant(mask, tf.float32), clip_eps=0.2, beta=0.04)
    np.testing.assert_allclose(loss.numpy(), loss_np, rtol=1e-5)
    clipped = (np.abs(np.exp(logp - old) - 1) > 0.2) * mask
    np.testing.assert_allclose(figures["clip_fraction"].numpy(), clipped.sum() / mask.sum(),
                               rtol=1e-6)
    assert 0 < figures["clip_fraction"].numpy() < 1


def test_a_group_with_equal_rewards_contributes_no_policy_gradient():
    rng = np.random.default_rng(3)
    rewards = tf.constant([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    adv = tf.reshape(preference.grpo_advantages(rewards), [-1])  # (8,)
    np.testing.assert_array_equal(adv.numpy()[:4], 0.0)
    logp = tf.Variable(rng.normal(-2.0, 0.5, size=(8, 5)), dtype=tf.float32)
    old = logp + rng.normal(0.0, 0.1, size=(8, 5)).astype(np.float32)
    with tf.GradientTape() as tape:
        loss, _ = preference.grpo_loss(logp, old, tf.identity(logp), adv, tf.ones([8, 5]),
                                       beta=0.0)  # the KL term aside: the policy gradient
    grad = tape.gradient(loss, logp).numpy()
    np.testing.assert_array_equal(grad[:4], 0.0)  # the equal-reward group
    assert np.abs(grad[4:]).sum() > 0
