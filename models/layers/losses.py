"""Training losses of a DeepSeek-V3-style causal LM (all in float32).

    loss = L_main + lambda * L_MTP + alpha * L_Bal

L_main is next-token cross-entropy; L_MTP = (1/D) sum_k L_MTP^k is the mean
cross-entropy of the D multi-token-prediction depths (DeepSeek-V3 arXiv
2412.19437 §2.2 eq. 24-25); alpha * L_Bal is the sequence-wise balance loss
summed over MoE layers (§2.1.2 eq. 17), already weighted by the model.

With a teacher (knowledge distillation, Hinton et al. 2015 §2), L_main becomes

    a * CE + (1 - a) * tau^2 * KL(softmax(z_teacher / tau) || softmax(z_student / tau))

per target token; the tau^2 keeps the soft term's gradients on the scale of
CE's as tau changes (ibid.).

Means over tokens: a training step divides summed per-token terms by the
number of target tokens of the whole global batch (`num_targets`), so
micro-batches and replicas with different numbers of targets (SFT, where
only response tokens are targets) still give the mean over the global batch.
"""

import tensorflow as tf


def token_cross_entropy(logits, labels):
    """Mean next-token cross-entropy over the positions that have a target.

    Args:
      logits: float tensor (B, T, V) (cast to float32).
      labels: int tensor (B, T); a negative label (e.g. -100) marks a position
        without a target, which is left out of the mean.

    Returns:
      float32 scalar; 0.0 if no position has a target.
    """
    total, count = token_cross_entropy_sum(logits, labels)
    return total / tf.maximum(count, 1.0)


def token_cross_entropy_sum(logits, labels):
    """Summed next-token cross-entropy over the positions that have a target.

    Args:
      logits: float tensor (B, T, V) (cast to float32).
      labels: int tensor (B, T); negative labels have no target.

    Returns:
      (sum, count): float32 scalars, nats and target positions.
    """
    labels = tf.cast(labels, tf.int32)
    valid = labels >= 0  # (B, T)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.where(valid, labels, 0), logits=tf.cast(logits, tf.float32))  # (B, T)
    weights = tf.cast(valid, tf.float32)  # (B, T)
    return tf.reduce_sum(ce * weights), tf.reduce_sum(weights)


def num_targets(labels, mtp_depths):
    """Target positions of the main loss and of each MTP depth: float32 (1 + D,).

    Depth d + 1 is scored against labels[:, d + 1:] (see `causal_lm_loss`).
    """
    valid = tf.cast(tf.cast(labels, tf.int32) >= 0, tf.float32)  # (B, T)
    return tf.stack([tf.reduce_sum(valid)]
                    + [tf.reduce_sum(valid[:, d + 1:]) for d in range(mtp_depths)])


def distillation_kl_sum(student_logits, teacher_logits, labels, temperature):
    """tau^2 * KL(softmax(teacher / tau) || softmax(student / tau)), summed over targets.

    Args:
      student_logits, teacher_logits: float tensors (B, T, V) (cast to float32).
      labels: int tensor (B, T); positions with a negative label are left out.
      temperature: tau > 0.

    Returns:
      float32 scalar, nats (times tau^2), summed over the target positions.

    Reference: Hinton, Vinyals, Dean 2015, "Distilling the Knowledge in a
    Neural Network", §2 (the tau^2 factor).
    """
    tau = tf.constant(temperature, tf.float32)
    log_p_teacher = tf.nn.log_softmax(tf.cast(teacher_logits, tf.float32) / tau)  # (B, T, V)
    log_p_student = tf.nn.log_softmax(tf.cast(student_logits, tf.float32) / tau)  # (B, T, V)
    kl = tf.reduce_sum(tf.exp(log_p_teacher) * (log_p_teacher - log_p_student), axis=-1)  # (B, T)
    weights = tf.cast(tf.cast(labels, tf.int32) >= 0, tf.float32)  # (B, T)
    return tau * tau * tf.reduce_sum(kl * weights)


def causal_lm_loss(outputs, labels, mtp_loss_weight, targets=None, teacher_logits=None,
                   distill_alpha=0.5, distill_temperature=1.0, balance_weight=1.0):
    """Combines the outputs of `DeepSeekCausalLM.forward_train` into the training loss.

    Args:
      outputs: dict from `forward_train`: `logits` (B, T, V), `mtp_logits`
        (list; entry d has shape (B, T-d-1, V) and its position t predicts
        labels[t+d+1]), `balance_loss` (scalar), `expert_load` (M, E), and
        optionally `moe_dropped` (M,) (zeros when absent) and `indexer_loss` (scalar,
        the lightning indexers' KL training signal, a mean over this batch's queries
        summed over layers; V3.2 and V4 models, 0.0 when absent).
      labels: int tensor (B, T), labels[t] = the token after input_ids[t];
        negative labels are ignored.
      mtp_loss_weight: lambda.
      targets: float32 (1 + D,), the numbers of target positions to divide the
        summed cross-entropies by (main loss, then each MTP depth), e.g. those of
        the whole global batch (`num_targets`); None: this batch's own.
      teacher_logits: float tensor (B, T, V), or None for no distillation.
      distill_alpha, distill_temperature: a and tau of the distillation loss
        (module docstring); used only with `teacher_logits`.
      balance_weight: multiplies the balance and indexer losses, means over this batch
        (a training step averaging them over k micro-batches and R replicas gives
        1 / (k R)).

    Returns:
      dict of float32 tensors: `loss` = main + lambda * mtp_loss + balance_loss +
      indexer_loss (the indexer's KL reaches only the indexers' weights: its target and
      inputs are stop-gradient, and the LM loss does not reach the indexers, whose
      top-k selection has no gradient; DeepSeek-V3.2 report §2.1),
      where main = lm_loss, or with a teacher a * lm_loss + (1 - a) * distill_loss;
      `lm_loss` (cross-entropy); `mtp_loss` (mean over depths, 0.0 without MTP,
      not multiplied by lambda); `balance_loss`; `distill_loss` (tau^2 KL per
      target token, 0.0 without a teacher); `expert_load` (M, E); `moe_dropped`
      (M,), dropped (token, expert) pairs per MoE layer, passed through; `indexer_loss`.
    """
    mtp = outputs["mtp_logits"]
    if targets is None:
        targets = num_targets(labels, len(mtp))
    denominators = tf.maximum(targets, 1.0)  # (1 + D,)  no target: the sums are 0
    lm_sum, _ = token_cross_entropy_sum(outputs["logits"], labels)
    lm_loss = lm_sum / denominators[0]
    mtp_losses = [
        # Depth d+1 at position t predicts labels[t+d+1]; positions t >= T-d-1 have
        # no target and are not in mtp_logits[d] at all.
        token_cross_entropy_sum(mtp_logits, labels[:, d + 1:])[0] / denominators[d + 1]
        for d, mtp_logits in enumerate(mtp)
    ]
    mtp_loss = tf.add_n(mtp_losses) / len(mtp_losses) if mtp_losses else tf.constant(0.0)
    balance_loss = tf.cast(outputs["balance_loss"], tf.float32) * balance_weight
    if teacher_logits is None:
        distill_loss = tf.constant(0.0)
        main = lm_loss
    else:
        distill_loss = distillation_kl_sum(outputs["logits"], teacher_logits, labels,
                                           distill_temperature) / denominators[0]
        main = distill_alpha * lm_loss + (1.0 - distill_alpha) * distill_loss
    indexer_loss = tf.cast(outputs.get("indexer_loss", 0.0), tf.float32) * balance_weight
    loss = main + mtp_loss_weight * mtp_loss + balance_loss + indexer_loss
    return {
        "loss": loss,
        "lm_loss": lm_loss,
        "mtp_loss": mtp_loss,
        "balance_loss": balance_loss,
        "distill_loss": distill_loss,
        "indexer_loss": indexer_loss,
        "expert_load": outputs["expert_load"],
        "moe_dropped": outputs.get("moe_dropped",
                                   tf.zeros(tf.shape(outputs["expert_load"])[:1])),
    }
