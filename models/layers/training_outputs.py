"""The dict `forward_train` returns, shared by the V2/V3 and V4 causal LMs."""

import tensorflow as tf


def training_outputs(logits, mtp_logits, moe_stats, indexer_losses, n_routed_experts: int) -> dict:
    """`forward_train`'s outputs from what its layers returned.

    Args:
      logits: float32 (B, T, V), the main head's.
      mtp_logits: list of float32 (B, T - k, V), one per MTP depth k.
      moe_stats: one (expert_load float32 (E,), balance_loss float32 scalar, dropped
        float32 scalar) per MoE layer, in `moe_layers` order (MTP blocks last); may be empty.
      indexer_losses: scalars, one per layer with a lightning indexer; may be empty.
      n_routed_experts: E, the width of an empty `expert_load`.

    Returns:
      dict of `logits`, `mtp_logits`, `balance_loss` (float32 scalar, the sum),
      `expert_load` (float32 (M, E)), `moe_dropped` (float32 (M,)), `moe_pairs`
      (float32 (M,), the (token, expert) pairs routed, N*K per layer) and
      `indexer_loss` (float32 scalar, the sum; 0.0 without an indexer), as
      `DeepSeekCausalLM.forward_train` documents them.
    """
    if moe_stats:
        loads, balance_losses, dropped = (list(t) for t in zip(*moe_stats, strict=True))
        expert_load = tf.stack(loads)  # (M, E)
        balance_loss = tf.add_n(balance_losses)
        moe_dropped = tf.stack(dropped)  # (M,)
    else:
        expert_load = tf.zeros([0, n_routed_experts])
        balance_loss = tf.constant(0.0)
        moe_dropped = tf.zeros([0])
    return {
        "logits": logits,
        "mtp_logits": mtp_logits,
        "balance_loss": balance_loss,
        "expert_load": expert_load,
        "moe_dropped": moe_dropped,
        "moe_pairs": tf.reduce_sum(expert_load, axis=-1),  # (M,) N*K per layer
        "indexer_loss": (tf.add_n([tf.cast(x, tf.float32) for x in indexer_losses])
                         if indexer_losses else tf.constant(0.0, tf.float32)),
    }
