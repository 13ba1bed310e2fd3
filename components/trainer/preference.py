"""The losses of preference optimization (DPO) and of group-relative RL (GRPO), issue 29.

Pure TensorFlow functions of log-probabilities, apart from the model and the loop, so
each is checked against a hand or numpy computation (tests/components/test_preference.py).

  sequence_logps   sum over the response tokens of log p(token), per sequence
  dpo_loss         Rafailov et al. 2023, "Direct Preference Optimization", eq. 7
  grpo_advantages  Shao et al. 2024, "DeepSeekMath", section 4.1.2 (outcome supervision)
  k3_kl            Schulman 2020, "Approximating KL divergence" (k3), as DeepSeekMath eq. 4
  grpo_loss        DeepSeekMath eq. 3: the clipped surrogate (PPO, Schulman et al. 2017)
                   with the group-relative advantage and beta * k3 KL to the reference
"""

from __future__ import annotations

import tensorflow as tf

IGNORE_LABEL = -100  # as components.trainer.data.IGNORE_LABEL: a prompt or padding target


def token_logps(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """log p(label) per position, 0 where the label is IGNORE_LABEL.

    Args:
      logits: float [B, T, V]; labels: int32 [B, T] (IGNORE_LABEL: not a target).

    Returns:
      float32 [B, T], in nats.
    """
    mask = tf.not_equal(labels, IGNORE_LABEL)  # (B, T)
    safe = tf.where(mask, labels, tf.zeros_like(labels))  # (B, T)
    logp = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)  # (B, T, V)
    token = tf.gather(logp, safe, batch_dims=2)  # (B, T)
    return tf.where(mask, token, tf.zeros_like(token))


def sequence_logps(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Sum of log p(label) over the targets that are not IGNORE_LABEL, per sequence.

    Args:
      logits: float [B, T, V], the model's next-token logits.
      labels: int32 [B, T], the next tokens; IGNORE_LABEL (-100) for prompt and padding
        positions, which get no gradient.

    Returns:
      float32 [B]: log pi(response | prompt), in nats.
    """
    return tf.reduce_sum(token_logps(logits, labels), axis=-1)  # (B,)


def dpo_loss(policy_chosen: tf.Tensor, policy_rejected: tf.Tensor, ref_chosen: tf.Tensor,
             ref_rejected: tf.Tensor, beta: float) -> tuple[tf.Tensor, dict]:
    """The DPO loss, mean over pairs: -log sigmoid(beta * ((pc - rc) - (pr - rr))).

    Args:
      policy_chosen, policy_rejected: float32 [B], `sequence_logps` of the policy on the
        chosen and the rejected response.
      ref_chosen, ref_rejected: float32 [B], the same for the frozen reference model (no
        gradient flows into them).
      beta: > 0, the strength of the implicit KL constraint.

    Returns:
      (loss: float32 scalar, {"reward_accuracy": share of pairs whose implicit reward
      beta * (policy - ref) ranks chosen above rejected, "chosen_reward", "rejected_reward",
      "margin": means over pairs}).

    Raises:
      ValueError: beta is not > 0.
    """
    if not beta > 0:
        raise ValueError(f"beta={beta!r}: DPO needs beta > 0")
    chosen = beta * (policy_chosen - tf.stop_gradient(ref_chosen))  # (B,)
    rejected = beta * (policy_rejected - tf.stop_gradient(ref_rejected))  # (B,)
    margin = chosen - rejected  # (B,)
    loss = tf.reduce_mean(-tf.math.log_sigmoid(margin))
    figures = {"reward_accuracy": tf.reduce_mean(tf.cast(margin > 0, tf.float32)),
               "chosen_reward": tf.reduce_mean(chosen),
               "rejected_reward": tf.reduce_mean(rejected), "margin": tf.reduce_mean(margin)}
    return loss, figures


def grpo_advantages(rewards: tf.Tensor, eps: float = 1e-4) -> tf.Tensor:
    """Group-relative advantages: (r - mean(group)) / (std(group) + eps).

    Args:
      rewards: float32 [P, G], the rewards of the G completions of each of P prompts.
      eps: added to the standard deviation (population std, as DeepSeekMath and TRL).

    Returns:
      float32 [P, G]; a group whose rewards are all equal gets advantage 0 throughout.
    """
    rewards = tf.cast(rewards, tf.float32)
    mean = tf.reduce_mean(rewards, axis=1, keepdims=True)  # (P, 1)
    std = tf.math.reduce_std(rewards, axis=1, keepdims=True)  # (P, 1)
    return (rewards - mean) / (std + eps)  # (P, G)


def k3_kl(logp: tf.Tensor, ref_logp: tf.Tensor) -> tf.Tensor:
    """Per-token k3 estimate of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0.

    Args:
      logp, ref_logp: float32 [..., T], per-token log-probabilities of the sampled tokens
        under the policy and the reference.
    """
    diff = ref_logp - logp
    return tf.exp(diff) - diff - 1.0


def grpo_loss(logp: tf.Tensor, old_logp: tf.Tensor, ref_logp: tf.Tensor,
              advantages: tf.Tensor, mask: tf.Tensor, clip_eps: float = 0.2,
              beta: float = 0.04) -> tuple[tf.Tensor, dict]:
    """The GRPO objective (DeepSeekMath eq. 3) as a loss to minimize.

    Per token: -[min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A) - beta * k3_kl], with
    ratio = exp(logp - old_logp); averaged over each completion's tokens, then over the
    completions (the paper's 1/G sum_i 1/|o_i| sum_t).

    Args:
      logp: float32 [N, T], per-token log-probs of the sampled completions under the
        policy being trained (N = G * n completions).
      old_logp: float32 [N, T], the same under the policy that sampled them (no gradient).
      ref_logp: float32 [N, T], the same under the frozen reference (no gradient).
      advantages: float32 [N], `grpo_advantages` flattened (one per completion).
      mask: float32 or bool [N, T], 1 on completion tokens, 0 on prompt and padding.
      clip_eps: the PPO clip range.
      beta: the KL coefficient.

    Returns:
      (loss: float32 scalar, {"kl": mean k3 KL per token, "clip_fraction": share of
      tokens whose ratio was clipped, "completion_length": mean tokens per completion}).
    """
    mask = tf.cast(mask, tf.float32)
    old_logp, ref_logp = tf.stop_gradient(old_logp), tf.stop_gradient(ref_logp)
    ratio = tf.exp(logp - old_logp)  # (N, T)
    adv = tf.cast(advantages, tf.float32)[:, None]  # (N, 1)
    unclipped = ratio * adv
    clipped = tf.clip_by_value(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    kl = k3_kl(logp, ref_logp)  # (N, T)
    per_token = -(tf.minimum(unclipped, clipped) - beta * kl)  # (N, T)
    lengths = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)  # (N,)
    per_completion = tf.reduce_sum(per_token * mask, axis=1) / lengths  # (N,)
    loss = tf.reduce_mean(per_completion)
    tokens = tf.maximum(tf.reduce_sum(mask), 1.0)
    was_clipped = tf.cast(tf.abs(ratio - 1.0) > clip_eps, tf.float32)
    figures = {"kl": tf.reduce_sum(kl * mask) / tokens,
               "clip_fraction": tf.reduce_sum(was_clipped * mask) / tokens,
               "completion_length": tf.reduce_mean(tf.reduce_sum(mask, axis=1))}
    return loss, figures
