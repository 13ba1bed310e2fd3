"""DeepSeekMoE: shared experts plus top-k routed experts, three dispatches.

DeepSeek-V3 (arXiv 2412.19437) §2.1.2 eq. 12:

    h'_t = u_t + sum_{i<=N_s} FFN_i^(s)(u_t) + sum_{i<=N_r} g_i,t FFN_i^(r)(u_t)

(the residual u_t is added by the decoder block). The N_s shared experts are
fused into one SwiGLU of width moe_intermediate_size * n_shared_experts, as in
HF. Routed compute scales with num_experts_per_tok, not n_routed_experts. The
N*K (token, expert) pairs of the N tokens of a call are dispatched by
`models.layers.moe_dispatch` (dropless grouped, dropless padded, or with an expert
capacity; its module docstring).

Also computed, for training: the per-expert load (tokens routed to each
expert, the input of the auxiliary-loss-free bias update) and the
complementary sequence-wise balance loss (§2.1.2 eq. 17-20):

    f_i = N_r / (K_r T) * sum_t 1[expert i in top-K of token t]     eq. 18
    s'_i,t = s_i,t / sum_j s_j,t                                     eq. 19
    P_i = 1/T sum_t s'_i,t                                           eq. 20
    L_Bal = alpha * sum_i f_i P_i     (per sequence, then batch mean) eq. 17

With a DeepSeek-V2 router (topk_method "greedy" / "group_limited_greedy") there
is no bias to update, and the loss is V2's expert-level balance loss on the
softmax scores (`expert_balance_loss`, DeepSeek-V2 §2.2.3, L_ExpBal). Both losses are in
`models.layers.balance_losses`.
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.deepseek.router import DeepSeekTopKRouter
from models.layers.balance_losses import expert_balance_loss, sequence_balance_loss
from models.layers.mlp import SwiGLU
from models.layers.moe_dispatch import dispatch_to_experts, expert_capacity, expert_counts
from models.layers.routed_experts import RoutedExperts


@keras.saving.register_keras_serializable(package="deepseek")
class DeepSeekMoE(keras.layers.Layer):
    """Mixture of experts: DeepSeek-V3's sigmoid, group-limited, bias-balanced
    routing, or DeepSeek-V2's softmax routing (config.topk_method).

    Sublayers: `gate` (DeepSeekTopKRouter), `experts` (RoutedExperts: the E
    routed SwiGLUs of width moe_intermediate_size as stacked kernels; HF's
    `mlp.experts.e.*` are its slices), `shared_experts` (SwiGLU of width
    moe_intermediate_size * n_shared_experts; absent when n_shared_experts = 0).

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).

    Call args:
      hidden_states: float tensor (B, T, C).
      training: unused (routing is the same in training and inference).
      capacity_factor: None for the dropless dispatch (inference and serving
        use it), or a float > 0 for the static-shape capacity dispatch (module
        docstring; `expert_capacity`).

    Returns:
      (output, expert_load, balance_loss, dropped):
        output: (B, T, C), dtype of `hidden_states`;
        expert_load: float32 (n_routed_experts,), number of tokens routed to
          each expert in this call (B*T*num_experts_per_tok in total), before
          any dropping;
        balance_loss: float32 scalar, aux_loss_alpha * L_Bal (eq. 17), the
          mean over the B sequences; for the V2 methods, aux_loss_alpha *
          L_ExpBal (`expert_balance_loss`);
        dropped: float32 scalar, the (token, expert) pairs dropped for lack of
          capacity (0.0 on the dropless path).

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
        self.experts = RoutedExperts(c.n_routed_experts, c.hidden_size,
                                     c.moe_intermediate_size, c.initializer_range,
                                     name="experts", dtype=self.dtype_policy)
        self.shared_experts = None
        if c.n_shared_experts > 0:
            self.shared_experts = SwiGLU(
                c.hidden_size, c.moe_intermediate_size * c.n_shared_experts,
                c.initializer_range, name="shared_experts", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.gate.build((None, self.config.hidden_size))
        self.experts.build()
        if self.shared_experts is not None:
            self.shared_experts.build()

    def call(self, hidden_states, training=False, capacity_factor=None):
        c = self.config
        n_experts = c.n_routed_experts
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        x = tf.reshape(hidden_states, [-1, c.hidden_size])  # (N, C), N = B*T

        topk_indices, topk_weights, scores = self.gate(x)  # (N, K), (N, K), (N, E)
        counts = expert_counts(topk_indices, n_experts)  # (E,) int32 pairs per expert

        if capacity_factor is None:
            routed = self._dropless(x, topk_indices, topk_weights, counts)  # (N, C)
            dropped = tf.constant(0.0)
        else:
            routed, dropped = self._with_capacity(x, topk_indices, topk_weights, counts,
                                                  capacity_factor)  # (N, C), scalar

        out = routed
        if self.shared_experts is not None:
            out += self.shared_experts(x)  # (N, C)
        out = tf.reshape(out, [batch, seq, c.hidden_size])  # (B, T, C)

        expert_load = tf.cast(counts, tf.float32)  # (E,)
        if c.uses_router_bias:
            balance_loss = self._sequence_balance_loss(topk_indices, scores, batch, seq)
        else:
            balance_loss = expert_balance_loss(
                topk_indices, scores, batch, seq, n_experts, c.num_experts_per_tok,
                c.aux_loss_alpha, c.seq_aux)
        return out, expert_load, balance_loss, dropped

    def _dropless(self, x, topk_indices, topk_weights, counts):
        """Routed output (N, C), every pair kept (`dispatch_to_experts` with no slots)."""
        return self._dispatch(x, topk_indices, topk_weights, counts, None)

    def _with_capacity(self, x, topk_indices, topk_weights, counts, capacity_factor):
        """Routed output (N, C) and dropped pairs (float32 scalar), S slots per expert.

        Shapes are static when N is. With a dynamic N (e.g. a tf.function with
        input_signature [None, None]) S is an int32 tensor and the buffer is
        (E, S, C) with S known at run time only: a graph runs it as it is; XLA
        (jit_compile) compiles it once per concrete input shape, where S is a
        constant again.
        """
        c = self.config
        n_tokens = x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
        slots = expert_capacity(n_tokens, c.n_routed_experts, c.num_experts_per_tok,
                                capacity_factor)  # S
        dropped = tf.reduce_sum(tf.cast(tf.maximum(counts - slots, 0), tf.float32))
        return self._dispatch(x, topk_indices, topk_weights, counts, slots), dropped

    def _dispatch(self, x, topk_indices, topk_weights, counts, slots):
        """Routed output (N, C) with S = `slots` per expert (`dispatch_to_experts`)."""
        return dispatch_to_experts(self.experts, x, topk_indices, topk_weights, counts, slots)

    def _sequence_balance_loss(self, topk_indices, scores, batch, seq):
        """alpha * L_Bal, DeepSeek-V3 §2.1.2 eq. 17-20 (`sequence_balance_loss`)."""
        c = self.config
        return sequence_balance_loss(topk_indices, scores, batch, seq, c.n_routed_experts,
                                     c.num_experts_per_tok, c.aux_loss_alpha)

    def update_bias(self, expert_load, update_speed=None):
        """Applies b_i -= gamma * sign(load_i - mean load) to `gate.e_score_correction_bias`.

        Args:
          expert_load: float tensor (n_routed_experts,), tokens per expert.
          update_speed: gamma; defaults to config.router_bias_update_speed.

        Returns:
          The updated bias, float32 (n_routed_experts,); None, changing
          nothing, for the V2 methods (no bias).

        Reference: DeepSeek-V3 §2.1.2, "Auxiliary-Loss-Free Load Balancing".
        """
        if update_speed is None:
            update_speed = self.config.router_bias_update_speed
        return self.gate.update_bias(expert_load, update_speed)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}
