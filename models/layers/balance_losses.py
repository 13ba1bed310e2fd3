"""The MoE balance losses over a batch's routing, shared by DeepSeekMoE (V2/V3) and
DeepSeekV4MoE.

DeepSeek-V3's complementary sequence-wise balance loss (arXiv 2412.19437 §2.1.2
eq. 17-20, `sequence_balance_loss`):

    f_i = N_r / (K_r T) * sum_t 1[expert i in top-K of token t]     eq. 18
    s'_i,t = s_i,t / sum_j s_j,t                                     eq. 19
    P_i = 1/T sum_t s'_i,t                                           eq. 20
    L_Bal = alpha * sum_i f_i P_i     (per sequence, then batch mean) eq. 17

and DeepSeek-V2's expert-level balance loss on softmax scores (arXiv 2405.04434
§2.2.3, L_ExpBal, `expert_balance_loss`).
"""

import tensorflow as tf


def expert_balance_loss(topk_indices, scores, batch, seq, n_routed_experts: int,
                        num_experts_per_tok: int, aux_loss_alpha: float, seq_aux: bool = True):
    """DeepSeek-V2's expert-level balance loss on softmax router scores.

    DeepSeek-V2 (arXiv 2405.04434) §2.2.3, the expert-level balance loss:

        L_ExpBal = alpha_1 * sum_{i=1}^{N'} f_i P_i
        f_i = N' / (K' T) * sum_{t=1}^{T} 1(token t selects expert i)
        P_i = 1/T * sum_{t=1}^{T} s_i,t

    with N' = n_routed_experts, K' = num_experts_per_tok and s the softmax
    scores (they sum to one over the experts: no renormalization, unlike
    DeepSeek-V3's eq. 19), as DeepSeek's `modeling_deepseek.py` `MoEGate`
    computes it: with `seq_aux` the T tokens are those of one sequence and the
    loss is the mean over the B sequences; without, T = B*T tokens of the whole
    batch at once. f counts choices (no gradient); the gradient flows through P.

    Args:
      topk_indices: int tensor (B*T, K), the chosen experts of each token
        (sequence-major: row b*T + t).
      scores: float32 (B*T, E), softmax scores s.
      batch, seq: B and T (ints or int32 scalar tensors).
      n_routed_experts, num_experts_per_tok: N' and K'.
      aux_loss_alpha: alpha_1.
      seq_aux: per sequence (True) or over the batch (False).

    Returns:
      float32 scalar, alpha_1 * L_ExpBal (dimensionless).
    """
    n_experts, top_k = n_routed_experts, num_experts_per_tok
    chosen = tf.reduce_sum(tf.one_hot(topk_indices, n_experts), axis=1)  # (N, E) 0/1
    scores = tf.cast(scores, tf.float32)
    if seq_aux:
        chosen = tf.reshape(chosen, [batch, seq, n_experts])  # (B, T, E)
        probs = tf.reshape(scores, [batch, seq, n_experts])  # (B, T, E)
    else:
        chosen, probs = chosen[None], scores[None]  # (1, B*T, E)
    tokens = tf.cast(tf.shape(chosen)[1], tf.float32)  # T
    f = n_experts / (top_k * tokens) * tf.reduce_sum(chosen, axis=1)  # (B or 1, E)  f_i
    p = tf.reduce_mean(probs, axis=1)  # (B or 1, E)  P_i
    per_group = tf.reduce_sum(tf.stop_gradient(f) * p, axis=-1)  # (B or 1,)  sum_i f_i P_i
    return aux_loss_alpha * tf.reduce_mean(per_group)


def sequence_balance_loss(topk_indices, scores, batch, seq, n_routed_experts: int,
                          num_experts_per_tok: int, aux_loss_alpha: float):
    """alpha * L_Bal, DeepSeek-V3 (arXiv 2412.19437) §2.1.2 eq. 17-20, float32 scalar.

    Args:
      topk_indices: int (B*T, K) chosen experts (sequence-major rows).
      scores: float32 (B*T, E) unbiased affinities s (renormalized here, eq. 19).
      batch, seq: B and T; n_routed_experts, num_experts_per_tok: E and K.
      aux_loss_alpha: alpha.
    """
    n_experts, top_k = n_routed_experts, num_experts_per_tok
    seq_f = tf.cast(seq, tf.float32)
    chosen = tf.reduce_sum(tf.one_hot(topk_indices, n_experts), axis=1)  # (N, E) 0/1
    chosen = tf.reshape(chosen, [batch, seq, n_experts])  # (B, T, E)
    f = n_experts / (top_k * seq_f) * tf.reduce_sum(chosen, axis=1)  # (B, E)  eq. 18
    s_norm = scores / tf.reduce_sum(scores, axis=-1, keepdims=True)  # (N, E)  eq. 19
    p = tf.reduce_mean(tf.reshape(s_norm, [batch, seq, n_experts]), axis=1)  # (B, E) eq. 20
    per_sequence = tf.reduce_sum(tf.stop_gradient(f) * p, axis=-1)  # (B,)  eq. 17
    return aux_loss_alpha * tf.reduce_mean(per_sequence)
