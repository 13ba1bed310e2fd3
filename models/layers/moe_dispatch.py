"""The routed experts' dispatch of a MoE layer, shared by DeepSeekMoE (V2/V3) and
DeepSeekV4MoE.

The N*K (token, expert) pairs of the N tokens of a call are dispatched one of three ways:

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

Reference: DeepSeek-V3 (arXiv 2412.19437) §2.1.2; GShard (Lepikhin et al. 2020) and
Switch Transformer (Fedus et al. 2021) for the expert capacity; MegaBlocks (Gale et al.
2022, arXiv 2211.15841) for the grouped dispatch.
"""

import fractions

import tensorflow as tf

# The most routed experts for which the dropless dispatch runs a matmul per expert
# (`grouped_dispatch`) rather than padding every expert to the busiest one's count.
# `benchmarks/moe_scaling.py` (hidden 64, expert width 16, 1,008 pairs): at 8 experts
# grouped 25.8 ms a step against 33.6 padded; at 16 and 32 the two were within the
# noise (29-40 ms), grouped paying ~1.5 s more on the first call; from 64 on, the padded
# graph does not grow with E. Wider experts (gpu_base's 16 of width 512) favour grouped.
GROUPED_MAX_EXPERTS = 16


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

    The dispatch of `DeepSeekMoE` and `DeepSeekV4MoE` (module docstring).
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
