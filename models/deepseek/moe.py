"""DeepSeekMoE: shared experts plus top-k routed experts, sparse dispatch.

DeepSeek-V3 (arXiv 2412.19437) §2.1.2 eq. 12:

    h'_t = u_t + sum_{i<=N_s} FFN_i^(s)(u_t) + sum_{i<=N_r} g_i,t FFN_i^(r)(u_t)

(the residual u_t is added by the decoder block). The N_s shared experts are
fused into one SwiGLU of width moe_intermediate_size * n_shared_experts, as in
HF. Routed compute scales with num_experts_per_tok, not n_routed_experts: the
(token, expert) pairs are sorted by expert, each expert runs only on its own
tokens (tf.split by per-expert counts), and the weighted outputs are summed
back per token (unsorted_segment_sum).

Also computed, for training: the per-expert load (tokens routed to each
expert, the input of the auxiliary-loss-free bias update) and the
complementary sequence-wise balance loss (§2.1.2 eq. 17-20):

    f_i = N_r / (K_r T) * sum_t 1[expert i in top-K of token t]     eq. 18
    s'_i,t = s_i,t / sum_j s_j,t                                     eq. 19
    P_i = 1/T sum_t s'_i,t                                           eq. 20
    L_Bal = alpha * sum_i f_i P_i     (per sequence, then batch mean) eq. 17
"""

import keras
import tensorflow as tf

from models.deepseek._tracking import with_layer_lists
from models.deepseek.config import DeepSeekConfig
from models.deepseek.mlp import SwiGLU
from models.deepseek.router import DeepSeekTopKRouter


@keras.saving.register_keras_serializable(package="deepseek")
class DeepSeekMoE(keras.layers.Layer):
    """Mixture of experts with sigmoid, group-limited, bias-balanced routing.

    Sublayers (HF names): `gate` (DeepSeekTopKRouter), `experts.0..E-1`
    (SwiGLU of width moe_intermediate_size), `shared_experts` (SwiGLU of width
    moe_intermediate_size * n_shared_experts; absent when n_shared_experts = 0).

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).

    Call args:
      hidden_states: float tensor (B, T, C).
      training: unused (routing is the same in training and inference).

    Returns:
      (output, expert_load, balance_loss):
        output: (B, T, C), dtype of `hidden_states`;
        expert_load: float32 (n_routed_experts,), number of tokens routed to
          each expert in this call (B*T*num_experts_per_tok in total);
        balance_loss: float32 scalar, aux_loss_alpha * L_Bal (eq. 17), the
          mean over the B sequences.

    Reference: DeepSeek-V3 arXiv 2412.19437 §2.1.2; HF transformers
    `modeling_deepseek_v3.py` (DeepseekV3MoE).
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekConfig.from_dict(config)
        self.config = config
        c = config
        self.gate = DeepSeekTopKRouter(c, name="gate")
        self.experts = [
            SwiGLU(c.hidden_size, c.moe_intermediate_size, c.initializer_range,
                   name=f"experts.{i}", dtype=self.dtype_policy)
            for i in range(c.n_routed_experts)
        ]
        self.shared_experts = None
        if c.n_shared_experts > 0:
            self.shared_experts = SwiGLU(
                c.hidden_size, c.moe_intermediate_size * c.n_shared_experts,
                c.initializer_range, name="shared_experts", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.gate.build((None, self.config.hidden_size))
        for expert in self.experts:
            expert.build()
        if self.shared_experts is not None:
            self.shared_experts.build()

    def call(self, hidden_states, training=False):
        c = self.config
        n_experts, top_k = c.n_routed_experts, c.num_experts_per_tok
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        x = tf.reshape(hidden_states, [-1, c.hidden_size])  # (N, C), N = B*T
        n_tokens = tf.shape(x)[0]

        topk_indices, topk_weights, scores = self.gate(x)  # (N, K), (N, K), (N, E)

        # Dispatch: sort the N*K (token, expert) pairs by expert.
        flat_expert = tf.reshape(topk_indices, [-1])  # (N*K,)
        flat_token = tf.repeat(tf.range(n_tokens), top_k)  # (N*K,) token of each pair
        flat_weight = tf.reshape(topk_weights, [-1])  # (N*K,)
        order = tf.argsort(flat_expert, stable=True)  # (N*K,)
        sorted_token = tf.gather(flat_token, order)  # (N*K,)
        sorted_weight = tf.gather(flat_weight, order)  # (N*K,)
        counts = tf.math.bincount(flat_expert, minlength=n_experts, maxlength=n_experts,
                                  dtype=tf.int32)  # (E,)

        # Each expert runs on its own tokens only.
        expert_inputs = tf.split(tf.gather(x, sorted_token), counts, num=n_experts,
                                 axis=0)  # E x (count_e, C)
        expert_outputs = tf.concat(
            [expert(xe) for expert, xe in zip(self.experts, expert_inputs, strict=True)], axis=0)  # (N*K, C)
        expert_outputs *= tf.cast(sorted_weight, expert_outputs.dtype)[:, None]  # (N*K, C)
        routed = tf.math.unsorted_segment_sum(expert_outputs, sorted_token, n_tokens)  # (N, C)

        out = routed
        if self.shared_experts is not None:
            out += self.shared_experts(x)  # (N, C)
        out = tf.reshape(out, [batch, seq, c.hidden_size])  # (B, T, C)

        expert_load = tf.cast(counts, tf.float32)  # (E,)
        balance_loss = self._sequence_balance_loss(topk_indices, scores, batch, seq)
        return out, expert_load, balance_loss

    def _sequence_balance_loss(self, topk_indices, scores, batch, seq):
        """alpha * L_Bal, DeepSeek-V3 §2.1.2 eq. 17-20, float32 scalar."""
        c = self.config
        n_experts, top_k = c.n_routed_experts, c.num_experts_per_tok
        seq_f = tf.cast(seq, tf.float32)
        chosen = tf.reduce_sum(tf.one_hot(topk_indices, n_experts), axis=1)  # (N, E) 0/1
        chosen = tf.reshape(chosen, [batch, seq, n_experts])  # (B, T, E)
        f = n_experts / (top_k * seq_f) * tf.reduce_sum(chosen, axis=1)  # (B, E)  eq. 18
        s_norm = scores / tf.reduce_sum(scores, axis=-1, keepdims=True)  # (N, E)  eq. 19
        p = tf.reduce_mean(tf.reshape(s_norm, [batch, seq, n_experts]), axis=1)  # (B, E) eq. 20
        per_sequence = tf.reduce_sum(tf.stop_gradient(f) * p, axis=-1)  # (B,)  eq. 17
        return c.aux_loss_alpha * tf.reduce_mean(per_sequence)

    def update_bias(self, expert_load, update_speed=None):
        """Applies b_i -= gamma * sign(load_i - mean load) to `gate.e_score_correction_bias`.

        Args:
          expert_load: float tensor (n_routed_experts,), tokens per expert.
          update_speed: gamma; defaults to config.router_bias_update_speed.

        Returns:
          The updated bias, float32 (n_routed_experts,).

        Reference: DeepSeek-V3 §2.1.2, "Auxiliary-Loss-Free Load Balancing".
        """
        if update_speed is None:
            update_speed = self.config.router_bias_update_speed
        return self.gate.update_bias(expert_load, update_speed)

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # Let tf.train.Checkpoint see the layers held in lists (see _tracking.py).
        children = super()._trackable_children(save_type, **kwargs)
        return with_layer_lists(self, children, save_type)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}
