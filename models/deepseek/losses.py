"""Training losses of a DeepSeek-V3-style causal LM (all in float32).

    loss = L_main + lambda * L_MTP + alpha * L_Bal

L_main is next-token cross-entropy; L_MTP = (1/D) sum_k L_MTP^k is the mean
cross-entropy of the D multi-token-prediction depths (DeepSeek-V3 arXiv
2412.19437 §2.2 eq. 24-25); alpha * L_Bal is the sequence-wise balance loss
summed over MoE layers (§2.1.2 eq. 17), already weighted by the model.
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
    labels = tf.cast(labels, tf.int32)
    valid = labels >= 0  # (B, T)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.where(valid, labels, 0), logits=tf.cast(logits, tf.float32))  # (B, T)
    weights = tf.cast(valid, tf.float32)  # (B, T)
    return tf.reduce_sum(ce * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)


def causal_lm_loss(outputs, labels, mtp_loss_weight):
    """Combines the outputs of `DeepSeekCausalLM.forward_train` into the training loss.

    Args:
      outputs: dict from `forward_train`: `logits` (B, T, V), `mtp_logits`
        (list; entry d has shape (B, T-d-1, V) and its position t predicts
        labels[t+d+1]), `balance_loss` (scalar), `expert_load` (M, E).
      labels: int tensor (B, T), labels[t] = the token after input_ids[t];
        negative labels are ignored.
      mtp_loss_weight: lambda.

    Returns:
      dict of float32 tensors: `loss` = lm_loss + lambda * mtp_loss +
      balance_loss; `lm_loss`; `mtp_loss` (mean over depths, 0.0 without MTP,
      not multiplied by lambda); `balance_loss`; `expert_load` (M, E).
    """
    lm_loss = token_cross_entropy(outputs["logits"], labels)
    mtp_losses = [
        # Depth d+1 at position t predicts labels[t+d+1]; positions t >= T-d-1 have
        # no target and are not in mtp_logits[d] at all.
        token_cross_entropy(mtp_logits, labels[:, d + 1:])
        for d, mtp_logits in enumerate(outputs["mtp_logits"])
    ]
    mtp_loss = tf.add_n(mtp_losses) / len(mtp_losses) if mtp_losses else tf.constant(0.0)
    balance_loss = tf.cast(outputs["balance_loss"], tf.float32)
    loss = lm_loss + mtp_loss_weight * mtp_loss + balance_loss
    return {
        "loss": loss,
        "lm_loss": lm_loss,
        "mtp_loss": mtp_loss,
        "balance_loss": balance_loss,
        "expert_load": outputs["expert_load"],
    }
