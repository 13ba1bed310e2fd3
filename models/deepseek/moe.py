"""DeepSeekMoE: shared experts plus top-k routed experts, three dispatches.

DeepSeek-V3 (arXiv 2412.19437) §2.1.2 eq. 12:

    h'_t = u_t + sum_{i<=N_s} FFN_i^(s)(u_t) + sum_{i<=N_r} g_i,t FFN_i^(r)(u_t)

(the residual u_t is added by the decoder block). The N_s shared experts are
fused into one SwiGLU of width moe_intermediate_size * n_shared_experts, as in
HF. Routed compute scales with num_experts_per_tok, not n_routed_experts. The
N*K (token, expert) pairs of the N tokens of a call are dispatched one of three
ways:

- dropless (the default), with at most `GROUPED_MAX_EXPERTS` float (not int8)
  experts: the pairs are sorted by expert and each expert runs on its own
  contiguous rows, a matmul per expert (`grouped_dispatch`), so no work is
  padded; each output row, times its gating weight, is summed into its token.
  No pair is dropped.
- dropless with more experts, or int8 ones: the pairs are sorted by expert into
  an (E, M, C) buffer padded to the busiest expert's count M = max_e count_e, and the experts
  run on it as one batched SwiGLU over their stacked kernels (`RoutedExperts`);
  each pair then reads its slot back, times its gating weight, and the K pairs
  of a token are summed. No pair is dropped. Memory: the buffer is E*M*C and
  the experts' hidden activations 2*E*M*F; an expert is picked at most once per
  token, so M <= N, and the worst case (every token to one expert) is E*N*C,
  E/K times the N*K*C of the pairs themselves. Balanced routing (what the
  auxiliary-loss-free bias steers towards) gives M ~ N*K/E. Shapes depend on
  the routing: XLA cannot compile it.
- capacity (`capacity_factor` set): every expert gets S slots,

      S = min(ceil(capacity_factor * N * K / E), N)

  (an expert is picked at most once per token, so more than N slots would stay
  empty). Pairs sorted by expert (stable, so by token order within an expert)
  take the slots in order; the pairs of an expert beyond its S are dropped and
  contribute zero (the token keeps its other experts, the shared expert and the
  residual). The same batched SwiGLU then runs on the (E, S, C) buffer, so
  every shape is static when N is (the GShard / Switch Transformer "expert
  capacity", as in MaxText's dense_matmul; there the top-1 choices of all
  tokens take slots before any top-2 choice, here earlier tokens come first).

The padded dispatches are one code path (`dispatch_to_experts`), with S = M for
dropless: the graph has no loop over experts, and its size does not depend on E.
The grouped one holds E matmuls per projection, which is why it serves small E
only. A fresh router is unbalanced, so M is well above the mean count: at 8
experts the padding cost the main job 15% of its speed (issue 49).

Also computed, for training: the per-expert load (tokens routed to each
expert, the input of the auxiliary-loss-free bias update) and the
complementary sequence-wise balance loss (§2.1.2 eq. 17-20):

    f_i = N_r / (K_r T) * sum_t 1[expert i in top-K of token t]     eq. 18
    s'_i,t = s_i,t / sum_j s_j,t                                     eq. 19
    P_i = 1/T sum_t s'_i,t                                           eq. 20
    L_Bal = alpha * sum_i f_i P_i     (per sequence, then batch mean) eq. 17

With a DeepSeek-V2 router (topk_method "greedy" / "group_limited_greedy") there
is no bias to update, and the loss is V2's expert-level balance loss on the
softmax scores (`expert_balance_loss`, DeepSeek-V2 §2.2.3, L_ExpBal).
"""

import fractions

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.deepseek.router import DeepSeekTopKRouter
from models.layers.mlp import SwiGLU
from models.layers.routed_experts import RoutedExperts

# The most routed experts for which the dropless dispatch runs a matmul per expert
# (`grouped_dispatch`) rather than padding every expert to the busiest one's count.
# `benchmarks/moe_scaling.py` (hidden 64, expert width 16, 1,008 pairs): at 8 experts
# grouped 25.8 ms a step against 33.6 padded; at 16 and 32 the two were within the
# noise (29-40 ms), grouped paying ~1.5 s more on the first call; from 64 on, the padded
# graph does not grow with E. Wider experts (gpu_base's 16 of width 512) favour grouped.
GROUPED_MAX_EXPERTS = 16


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


def expert_capacity(n_tokens, n_experts: int, top_k: int, capacity_factor: float):
    """Slots per expert, S = min(ceil(capacity_factor * N * K / E), N).

    Exact integer arithmetic on the decimal value of `capacity_factor` (1.1 is
    11/10, so 1.1 * 100 / 10 gives 11, not the 12 of float rounding).

    Args:
      n_tokens: N, a Python int or an int32 scalar tensor.
      n_experts: E.
      top_k: K, experts per token.
      capacity_factor: a float > 0.

    Returns:
      S, a Python int if `n_tokens` is one, else an int32 scalar tensor.

    Raises:
      ValueError: if capacity_factor <= 0.
    """
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be > 0, got {capacity_factor!r}")
    ratio = fractions.Fraction(repr(float(capacity_factor)))  # decimal value, exactly
    num, den = ratio.numerator * top_k, ratio.denominator * n_experts
    if isinstance(n_tokens, int):
        return min(-(-num * n_tokens // den), n_tokens)
    n = tf.cast(n_tokens, tf.int64)
    return tf.cast(tf.minimum((num * n + den - 1) // den, n), tf.int32)


def expert_counts(topk_indices, n_experts: int):
    """(token, expert) pairs per expert: int32 (E,) from int (N, K) choices.

    tf.math.bincount derives its output size from the data, which XLA cannot
    compile; the raw op takes the constant size E."""
    return tf.raw_ops.DenseBincount(input=tf.reshape(topk_indices, [-1]), size=n_experts,
                                    weights=tf.zeros([0], tf.int32))  # (E,) int32


def dispatch_to_experts(experts, x, topk_indices, topk_weights, counts, slots=None):
    """Routed output (N, C) of `experts` with S = `slots` per expert; pairs past S dropped.

    The dispatch of `DeepSeekMoE` (module docstring), shared with DeepSeek-V4's MoE.
    Dropless (`slots` None) with at most `GROUPED_MAX_EXPERTS` float experts, the pairs
    go to `grouped_dispatch` (no padding); else to an (E, S, C) buffer, S = max(counts)
    for dropless.

    Args:
      experts: a RoutedExperts, called on an (E, S, C) buffer.
      x: (N, C) tokens.
      topk_indices: int (N, K) chosen experts; topk_weights: float (N, K) their weights.
      counts: int32 (E,) pairs per expert (`expert_counts`).
      slots: S, a Python int or int32 scalar tensor; None for dropless.

    Returns:
      (N, C) in the experts' output dtype: sum over the K pairs of weight * expert output.
    """
    if slots is None:
        if (len(experts) <= GROUPED_MAX_EXPERTS
                and all(p.quantization_mode is None for p in experts.projections)):
            return grouped_dispatch(experts, x, topk_indices, topk_weights, counts)
        slots = tf.reduce_max(counts)
    top_k = topk_indices.shape[-1]
    hidden_size = x.shape[-1]
    n_pairs = tf.size(topk_indices)  # N*K

    # Rank of each pair within its expert: pairs sorted by expert (stable), minus
    # the expert's first position (exclusive cumsum of the counts).
    flat_expert = tf.reshape(topk_indices, [-1])  # (N*K,) pair p = token p // K
    order = tf.argsort(flat_expert, stable=True)  # (N*K,) sorted position -> pair
    sorted_expert = tf.gather(flat_expert, order)  # (N*K,)
    starts = tf.cumsum(counts, exclusive=True)  # (E,) first sorted position per expert
    sorted_rank = tf.range(n_pairs) - tf.gather(starts, sorted_expert)  # (N*K,)
    # argsort(order) inverts the permutation. tf.math.invert_permutation compiles
    # for this layer alone but not inside forward_train (TF 2.16 XLA: "Dynamic
    # reshape is not implemented"); a second sort of N*K ints compiles in both.
    rank = tf.gather(sorted_rank, tf.argsort(order))  # (N*K,) pair order
    keep = rank < slots  # (N*K,)

    # Dispatch: slot (e, s) holds the pair at sorted position starts[e] + s when
    # s < counts[e] (so the kept pairs, ranks 0..S-1), else zeros. A gather per
    # slot, equivalent to scattering the kept pairs into the buffer.
    s = tf.range(slots)  # (S,)
    filled = s[None, :] < counts[:, None]  # (E, S)
    position = tf.minimum(starts[:, None] + s[None, :], tf.maximum(n_pairs - 1, 0))  # (E, S)
    slot_token = tf.gather(order, position) // top_k  # (E, S)
    buffer = tf.where(filled[:, :, None], tf.gather(x, slot_token),
                      tf.zeros([], x.dtype))  # (E, S, C)

    y = experts(buffer)  # (E, S, C): all experts at once, stacked kernels

    # Combine: each pair reads its slot (dropped pairs read zero), times its
    # gating weight, then the K pairs of a token are summed (pair p = n*K + k).
    slot = flat_expert * slots + tf.minimum(rank, tf.maximum(slots - 1, 0))  # (N*K,)
    y_pairs = tf.gather(tf.reshape(y, [-1, hidden_size]), slot)  # (N*K, C)
    y_pairs = tf.where(keep[:, None], y_pairs, tf.zeros([], y.dtype))  # (N*K, C)
    y_pairs *= tf.cast(tf.reshape(topk_weights, [-1]), y.dtype)[:, None]  # (N*K, C)
    return tf.reduce_sum(tf.reshape(y_pairs, [-1, top_k, hidden_size]),
                         axis=1)  # (N, K, C) -> (N, C)


def grouped_dispatch(experts, x, topk_indices, topk_weights, counts):
    """Dropless routed output (N, C) with no padding: each expert on its own pairs.

    The N*K (token, expert) pairs are sorted by expert (stable), their tokens
    gathered into (N*K, C), and each expert runs on its contiguous rows
    (`RoutedExperts.call_grouped`: a matmul per expert and projection, the "grouped
    GEMM" of MegaBlocks, Gale et al. 2022, arXiv 2211.15841, as E matmuls); each
    output row, times its gating weight, is summed into its token
    (`unsorted_segment_sum`). The work is N*K rows whatever the routing, where the
    padded buffer does E * max(counts); the graph holds E matmuls per projection,
    which is why `dispatch_to_experts` takes it only for small E.

    Args, returns: as `dispatch_to_experts` (dropless).
    """
    top_k = topk_indices.shape[-1]
    flat_expert = tf.reshape(topk_indices, [-1])  # (N*K,) pair p = token p // K
    order = tf.argsort(flat_expert, stable=True)  # (N*K,) sorted position -> pair
    token = order // top_k  # (N*K,) the token of each sorted pair
    y = experts.call_grouped(tf.gather(x, token), counts)  # (N*K, C) sorted by expert
    weight = tf.gather(tf.reshape(topk_weights, [-1]), order)  # (N*K,)
    y *= tf.cast(weight, y.dtype)[:, None]  # (N*K, C)
    return tf.math.unsorted_segment_sum(y, token, tf.shape(x)[0])  # (N, C)


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
