"""Auxiliary-loss-free load balancing: the routers' bias update, shared by DeepSeek-V3's
top-k router (`models.deepseek.router`) and DeepSeek-V4's (`models.deepseek_v4.router`).

DeepSeek-V3 (arXiv 2412.19437) §2.1.2: at the end of each step the bias of overloaded
experts is decreased by gamma and that of underloaded ones increased,

    b_i -= gamma * sign(load_i - mean(load))

The bias steers the top-k selection only; the gating weights use the unbiased scores.
"""

import tensorflow as tf


def update_correction_bias(bias, expert_load, update_speed):
    """Applies b_i -= gamma * sign(load_i - mean(load)) to a router's bias in place.

    Args:
      bias: the router's `e_score_correction_bias`, a float32 (n_routed_experts,)
        variable, or None (a router without a bias: DeepSeek-V2's methods, V4's hash
        routing).
      expert_load: float tensor (n_routed_experts,), tokens routed to each expert.
      update_speed: gamma, a float or float32 scalar tensor.

    Returns:
      The updated bias, float32 (n_routed_experts,); None (and nothing changes) when
      `bias` is None.
    """
    if bias is None:
        return None
    load = tf.cast(expert_load, tf.float32)  # (E,)
    delta = tf.cast(update_speed, tf.float32) * tf.sign(load - tf.reduce_mean(load))
    bias.assign_sub(delta)
    return tf.convert_to_tensor(bias)
