"""The DeepSeek-V3 top-k router: sigmoid affinities, bias-adjusted group-limited top-k.

DeepSeek-V3 (arXiv 2412.19437) §2.1.2, in the layout of HF transformers
`DeepseekV3TopkRouter` and the official `inference/model.py` `Gate`:

    s_i,t   = sigmoid(u_t . e_i)                                   eq. 15
    choose  = s_i,t + b_i           (b: e_score_correction_bias)   eq. 16
    group score = sum of the top-2 `choose` values in the group (DeepSeek-V3 code)
    keep the `topk_group` best groups, then the top-K experts among them
    g_i,t   = s_i,t / sum_{j in top-K} s_j,t  (norm_topk_prob)     eq. 13
            * routed_scaling_factor

The bias only decides which experts are chosen; gating weights use the unbiased
scores. Experts of dropped groups are masked with -inf (as the official code
does; HF masks with 0.0, which differs only if a biased score is negative).
All routing math runs in float32, whatever the layer's compute dtype.
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig


@keras.saving.register_keras_serializable(package="deepseek")
class DeepSeekTopKRouter(keras.layers.Layer):
    """Chooses `num_experts_per_tok` routed experts per token.

    Weights (HF names): `weight` float32 (n_routed_experts, hidden_size),
    trainable; `e_score_correction_bias` float32 (n_routed_experts,),
    non-trainable, changed only by `update_bias`.

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).

    Call args:
      x: float tensor (N, C), one row per token.

    Returns:
      (topk_indices, topk_weights, scores):
        topk_indices int32 (N, K): chosen experts (order unspecified);
        topk_weights float32 (N, K): gating weights g of those experts;
        scores float32 (N, E): the unbiased sigmoid affinities s.

    Reference: DeepSeek-V3 arXiv 2412.19437 §2.1.2 eq. 12-16; HF transformers
    `modeling_deepseek_v3.py` (DeepseekV3TopkRouter).
    """

    def __init__(self, config, **kwargs):
        kwargs.setdefault("dtype", "float32")  # router stays in float32 under mixed precision
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekConfig.from_dict(config)
        self.config = config

    def build(self, input_shape=None):
        c = self.config
        self.weight = self.add_weight(
            name="weight", shape=(c.n_routed_experts, c.hidden_size),
            initializer=keras.initializers.RandomNormal(stddev=c.initializer_range))
        self.e_score_correction_bias = self.add_weight(
            name="e_score_correction_bias", shape=(c.n_routed_experts,),
            initializer="zeros", trainable=False)

    def call(self, x):
        c = self.config
        n_experts, n_group = c.n_routed_experts, c.n_group
        per_group = n_experts // n_group

        logits = tf.matmul(tf.cast(x, tf.float32), tf.cast(self.weight, tf.float32),
                           transpose_b=True)  # (N, E)
        scores = tf.sigmoid(logits)  # (N, E)  eq. 15
        choice = scores + tf.cast(self.e_score_correction_bias, tf.float32)  # (N, E)  eq. 16

        # Group-limited routing: keep the topk_group groups with the best top-2 sums.
        grouped = tf.reshape(choice, [-1, n_group, per_group])  # (N, G, E/G)
        group_scores = tf.reduce_sum(
            tf.math.top_k(grouped, k=min(2, per_group)).values, axis=-1)  # (N, G)
        top_groups = tf.math.top_k(group_scores, k=c.topk_group).indices  # (N, topk_group)
        group_mask = tf.reduce_sum(tf.one_hot(top_groups, n_group), axis=1) > 0  # (N, G)
        expert_mask = tf.reshape(
            tf.repeat(group_mask[:, :, None], per_group, axis=2), [-1, n_experts])  # (N, E)
        choice = tf.where(expert_mask, choice, float("-inf"))  # (N, E)

        topk_indices = tf.math.top_k(choice, k=c.num_experts_per_tok).indices  # (N, K)
        topk_weights = tf.gather(scores, topk_indices, batch_dims=1)  # (N, K)
        if c.norm_topk_prob:
            topk_weights /= tf.reduce_sum(topk_weights, axis=-1, keepdims=True) + 1e-20
        topk_weights *= c.routed_scaling_factor
        return tf.cast(topk_indices, tf.int32), topk_weights, scores

    def update_bias(self, expert_load, update_speed):
        """Auxiliary-loss-free balancing: b_i -= gamma * sign(load_i - mean(load)).

        DeepSeek-V3 §2.1.2: at the end of each step the bias of overloaded
        experts is decreased by gamma and that of underloaded ones increased.

        Args:
          expert_load: float tensor (n_routed_experts,), tokens routed to each expert.
          update_speed: gamma, a float or float32 scalar tensor.

        Returns:
          The updated bias, float32 (n_routed_experts,).
        """
        load = tf.cast(expert_load, tf.float32)  # (E,)
        delta = tf.cast(update_speed, tf.float32) * tf.sign(load - tf.reduce_mean(load))
        self.e_score_correction_bias.assign_sub(delta)
        return tf.convert_to_tensor(self.e_score_correction_bias)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}
