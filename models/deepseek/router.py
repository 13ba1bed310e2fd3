"""The DeepSeek top-k routers: V3 (`noaux_tc`) and V2 (`greedy`, `group_limited_greedy`).

`config.topk_method` picks the variant (DeepSeek's config.json names).

DeepSeek-V3, topk_method "noaux_tc" (arXiv 2412.19437 §2.1.2), in the layout of
HF transformers `DeepseekV3TopkRouter` and the official `inference/model.py` `Gate`:

    s_i,t   = sigmoid(u_t . e_i)                                   eq. 15
    choose  = s_i,t + b_i           (b: e_score_correction_bias)   eq. 16
    group score = sum of the top-2 `choose` values in the group (DeepSeek-V3 code)
    keep the `topk_group` best groups, then the top-K experts among them
    g_i,t   = s_i,t / sum_{j in top-K} s_j,t  (norm_topk_prob)     eq. 13
            * routed_scaling_factor

The bias only decides which experts are chosen; gating weights use the unbiased
scores. Experts of dropped groups are masked with -inf (as the official code
does; HF masks with 0.0, which differs only if a biased score is negative).
DeepSeek-V2, topk_method "greedy" (V2-Lite) or "group_limited_greedy" (V2)
(arXiv 2405.04434 §2.2; HF transformers `DeepseekV2TopkRouter`, DeepSeek's
`modeling_deepseek.py` `MoEGate`):

    s_i,t   = softmax_i(u_t . e_i)                                 §2.2.1
    greedy: the top-K experts of s
    group_limited_greedy: group score = max of s in the group; keep the
            `topk_group` best groups, then the top-K experts among them
    g_i,t   = s_i,t                (norm_topk_prob: / sum_{j in top-K} s_j,t + 1e-20)
            * routed_scaling_factor

There is no router bias (the variable is not created) and `update_bias` does
nothing. The released V2 checkpoints have norm_topk_prob false, where all
implementations agree; with it true, transformers 5.x ignores it and DeepSeek's
code normalizes but drops routed_scaling_factor, so the HF interop refuses it
(hf_config.py) and here it normalizes then scales, as for V3.

All routing math runs in float32, whatever the layer's compute dtype.
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.layers import initializers
from models.layers.router_bias import update_correction_bias


@keras.saving.register_keras_serializable(package="deepseek")
class DeepSeekTopKRouter(keras.layers.Layer):
    """Chooses `num_experts_per_tok` routed experts per token.

    Weights (HF names): `weight` float32 (n_routed_experts, hidden_size),
    trainable; `e_score_correction_bias` float32 (n_routed_experts,),
    non-trainable, changed only by `update_bias`, for topk_method "noaux_tc"
    only (None for the V2 methods).

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).

    Call args:
      x: float tensor (N, C), one row per token.

    Returns:
      (topk_indices, topk_weights, scores):
        topk_indices int32 (N, K): chosen experts (order unspecified);
        topk_weights float32 (N, K): gating weights g of those experts;
        scores float32 (N, E): the unbiased affinities s (sigmoid for
          "noaux_tc", softmax over the experts for the V2 methods).

    Reference: DeepSeek-V3 arXiv 2412.19437 §2.1.2 eq. 12-16; HF transformers
    `modeling_deepseek_v3.py` (DeepseekV3TopkRouter). DeepSeek-V2 arXiv
    2405.04434 §2.2.1; `modeling_deepseek_v2.py` (DeepseekV2TopkRouter).
    """

    def __init__(self, config, **kwargs):
        kwargs.setdefault("dtype", "float32")  # router stays in float32 under mixed precision
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekConfig.from_dict(config)
        self.config = config
        self.e_score_correction_bias = None

    def build(self, input_shape=None):
        c = self.config
        self.weight = self.add_weight(
            name="weight", shape=(c.n_routed_experts, c.hidden_size),
            initializer=initializers.normal(c.initializer_range))
        if c.uses_router_bias:
            self.e_score_correction_bias = self.add_weight(
                name="e_score_correction_bias", shape=(c.n_routed_experts,),
                initializer="zeros", trainable=False)

    def call(self, x):
        c = self.config
        logits = tf.matmul(tf.cast(x, tf.float32), tf.cast(self.weight, tf.float32),
                           transpose_b=True)  # (N, E)
        if c.topk_method == "noaux_tc":
            scores = tf.sigmoid(logits)  # (N, E)  V3 eq. 15
            choice = scores + tf.cast(self.e_score_correction_bias, tf.float32)  # (N, E)  eq. 16
            # Group score: the sum of the top-2 biased scores of the group (DeepSeek-V3 code).
            choice = self._keep_top_groups(choice, lambda g: tf.reduce_sum(
                tf.math.top_k(g, k=min(2, g.shape[-1])).values, axis=-1))
        else:
            scores = tf.nn.softmax(logits, axis=-1)  # (N, E)  V2 §2.2.1
            choice = scores
            if c.topk_method == "group_limited_greedy":
                # Group score: the best score of the group (DeepSeek-V2 MoEGate).
                choice = self._keep_top_groups(choice, lambda g: tf.reduce_max(g, axis=-1))

        topk_indices = tf.math.top_k(choice, k=c.num_experts_per_tok).indices  # (N, K)
        topk_weights = tf.gather(scores, topk_indices, batch_dims=1)  # (N, K)
        if c.norm_topk_prob:
            topk_weights /= tf.reduce_sum(topk_weights, axis=-1, keepdims=True) + 1e-20
        topk_weights *= c.routed_scaling_factor
        return tf.cast(topk_indices, tf.int32), topk_weights, scores

    def _keep_top_groups(self, choice, group_score):
        """`choice` (N, E) with the experts outside the `topk_group` best groups set
        to -inf; `group_score` maps (N, G, E/G) to the (N, G) group scores."""
        c = self.config
        n_experts, n_group = c.n_routed_experts, c.n_group
        per_group = n_experts // n_group
        grouped = tf.reshape(choice, [-1, n_group, per_group])  # (N, G, E/G)
        group_scores = group_score(grouped)  # (N, G)
        top_groups = tf.math.top_k(group_scores, k=c.topk_group).indices  # (N, topk_group)
        group_mask = tf.reduce_sum(tf.one_hot(top_groups, n_group), axis=1) > 0  # (N, G)
        expert_mask = tf.reshape(
            tf.repeat(group_mask[:, :, None], per_group, axis=2), [-1, n_experts])  # (N, E)
        return tf.where(expert_mask, choice, float("-inf"))  # (N, E)

    def update_bias(self, expert_load, update_speed):
        """Auxiliary-loss-free balancing: b_i -= gamma * sign(load_i - mean(load)).

        DeepSeek-V3 §2.1.2: at the end of each step the bias of overloaded
        experts is decreased by gamma and that of underloaded ones increased.

        Args:
          expert_load: float tensor (n_routed_experts,), tokens routed to each expert.
          update_speed: gamma, a float or float32 scalar tensor.

        Returns:
          The updated bias, float32 (n_routed_experts,); None (and nothing
          changes) for the V2 methods, which have no bias.
        """
        return update_correction_bias(self.e_score_correction_bias, expert_load, update_speed)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}
