"""DeepSeek-V4's MoE block: one shared expert plus top-k routed experts, learned or hash routed.

transformers 5.24 `DeepseekV4SparseMoeBlock` (paper §2.1):

    y_t = sum_{i in I_t} g_t,i FFN_i(u_t) + FFN_shared(u_t)

with `DeepSeekV4Router` choosing I_t and g_t (sqrtsoftplus scores; learned top-k with a
selection bias, or the frozen `tid2eid` table on the token ids) and every FFN a SwiGLU
whose pre-activations are clamped by swiglu_limit L: silu(min(gate, L)) * clip(up, -L, L)
(`DeepseekV4Experts._apply_gate` and `DeepseekV4MLP`, both clamp). The routed experts
are the stacked `RoutedExperts` of models.deepseek and the (token, expert) pairs are
dispatched by `models.layers.moe_dispatch.dispatch_to_experts`: dropless by default, or with a
static per-expert capacity (see that module).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.config import DeepSeekV4Config
from models.deepseek_v4.router import DeepSeekV4Router
from models.layers.balance_losses import sequence_balance_loss
from models.layers.mlp import SwiGLU
from models.layers.moe_dispatch import dispatch_to_experts, expert_capacity, expert_counts
from models.layers.routed_experts import RoutedExperts


@keras.saving.register_keras_serializable(package="deepseek_v4")
class DeepSeekV4MoE(keras.layers.Layer):
    """Shared expert + routed experts of one V4 block.

    Sublayers (release names under `layers.N.ffn.`): `gate` DeepSeekV4Router [`gate`],
    `experts` RoutedExperts, (E, C, F) / (E, F, C) stacked kernels [`experts.e.w1` gate,
    `w3` up, `w2` down], `shared_experts` SwiGLU of width moe_intermediate_size
    [`shared_experts.w1/w3/w2`].

    Args:
      config: a DeepSeekV4Config (or its `to_dict()`).
      layer_idx: block index (config.mlp_layer_types[layer_idx] picks hash routing).

    Call args:
      hidden_states: float (B, T, C).
      input_ids: int (B, T) token ids; required by hash layers.
      training: unused.
      capacity_factor: None (dropless) or a float > 0 (static capacity dispatch).

    Returns:
      (output (B, T, C), expert_load float32 (E,), balance_loss float32 scalar
      (aux_loss_alpha * L_Bal, DeepSeek-V3 eq. 17-20, 0 for hash layers whose routing
      has nothing to balance), dropped float32 scalar).
    """

    def __init__(self, config, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekV4Config.from_dict(config)
        self.config = c = config
        self.layer_idx = layer_idx
        self.is_hash = c.is_hash_layer(layer_idx)
        self.gate = DeepSeekV4Router(c, self.is_hash, name="gate")
        self.experts = RoutedExperts(c.n_routed_experts, c.hidden_size, c.moe_intermediate_size,
                                     c.initializer_range, swiglu_limit=c.swiglu_limit,
                                     name="experts", dtype=self.dtype_policy)
        self.shared_experts = SwiGLU(c.hidden_size, c.moe_intermediate_size,
                                     c.initializer_range, swiglu_limit=c.swiglu_limit,
                                     name="shared_experts", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        self.gate.build()
        self.experts.build()
        self.shared_experts.build()

    def call(self, hidden_states, input_ids=None, training=False, capacity_factor=None):
        c = self.config
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        x = tf.reshape(hidden_states, [-1, c.hidden_size])  # (N, C), N = B*T
        topk_indices, topk_weights, scores = self.gate(x, input_ids)  # (N,K), (N,K), (N,E)
        counts = expert_counts(topk_indices, c.n_routed_experts)  # (E,)
        if capacity_factor is None:
            slots, dropped = None, tf.constant(0.0)  # dropless
        else:
            n_tokens = x.shape[0] if x.shape[0] is not None else tf.shape(x)[0]
            slots = expert_capacity(n_tokens, c.n_routed_experts, c.num_experts_per_tok,
                                    capacity_factor)
            dropped = tf.reduce_sum(tf.cast(tf.maximum(counts - slots, 0), tf.float32))
        routed = dispatch_to_experts(self.experts, x, topk_indices, topk_weights, counts,
                                     slots)  # (N, C)
        out = routed + self.shared_experts(x)  # (N, C)
        out = tf.reshape(out, [batch, seq, c.hidden_size])  # (B, T, C)
        if self.is_hash:
            balance_loss = tf.constant(0.0)
        else:
            balance_loss = sequence_balance_loss(topk_indices, scores, batch, seq,
                                                 c.n_routed_experts, c.num_experts_per_tok,
                                                 c.aux_loss_alpha)
        return out, tf.cast(counts, tf.float32), balance_loss, dropped

    def update_bias(self, expert_load, update_speed=None):
        """Auxiliary-loss-free bias update of `gate` (no-op, None, for hash layers)."""
        if update_speed is None:
            update_speed = self.config.router_bias_update_speed
        return self.gate.update_bias(expert_load, update_speed)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "layer_idx": self.layer_idx}
