"""`tid2eid` tables for the hash-routed MoE layers of a DeepSeek-V4 model trained from scratch.

A "hash_moe" layer routes token id t to the fixed experts `tid2eid[t]` (int32 (vocab_size,
num_experts_per_tok), distinct experts per row; `router.DeepSeekV4Router`), frozen during
training. Hash routing is Roller et al. 2021, "Hash Layers For Large Sparse Models"
(arXiv 2106.04426); DeepSeek-V4 uses it in its first 3 MoE layers (paper §2.1) but does
not say how its table was built (J. Su, "How is DeepSeek V4's tid2eid generated?",
kexue.fm/archives/11750, reaches the same conclusion). What is implemented here is
Roller et al.'s "Balanced assignment" (§3: a lookup table built before training from the
training distribution, "greedily assigning the most frequent tokens to the emptiest
buckets"), extended to k experts per token:

    order the token ids by count c_t, largest first (ties: lower id first)
    load_e = 0 for every expert e
    for t in that order:
        tid2eid[t] = the k experts of smallest load_e (ties: a seeded random permutation
                     of the experts ranks them), so the row is k distinct experts
        load_e += c_t for each of them

so `load_e`, the expected number of (token, expert) routings of expert e on text with
those counts, is balanced: every expert ends within about one token's count of the mean
k * sum(c) / E (the longest-processing-time greedy of scheduling; exact balance is
impossible when the most frequent token alone exceeds the mean). Token ids that never
occur (c_t = 0) add no load; greedy would give them all the same k experts, so they get
distinct experts round-robin over the same permutation instead (token i of them: the
permuted experts i*k .. i*k + k - 1 mod E), which spreads them should they occur later.

  count_tokens(token_batches, vocab_size)          int64 (V,) counts of each id
  balanced_tid2eid(counts, E, k, seed)             int32 (V, k) table
  expected_expert_load(table, counts)              float64 (E,) load_e
  hash_routers(model)                              the hash layers' routers
  assign_tid2eid(model, table)                     writes the table into every hash layer
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import numpy as np


def _check_count(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"hash_routing: {name}={value!r} must be an integer >= 1")
    return int(value)


def count_tokens(token_batches: Iterable, vocab_size: int) -> np.ndarray:
    """How often each token id occurs in `token_batches`.

    Args:
      token_batches: an iterable of int arrays (numpy or tensors) of any shape, ids in
        [0, vocab_size).
      vocab_size: V.

    Returns:
      int64 (V,).

    Raises:
      ValueError: vocab_size not an integer >= 1; an id outside [0, V) (naming it).
    """
    vocab_size = _check_count("vocab_size", vocab_size)
    counts = np.zeros(vocab_size, np.int64)
    for batch in token_batches:
        ids = np.asarray(batch).reshape(-1)  # (N,)
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            bad = ids[(ids < 0) | (ids >= vocab_size)][0]
            raise ValueError(f"hash_routing.count_tokens: token id {int(bad)} is outside "
                             f"[0, vocab_size={vocab_size})")
        counts += np.bincount(ids.astype(np.int64), minlength=vocab_size)
    return counts


def balanced_tid2eid(token_counts, n_routed_experts: int, num_experts_per_tok: int,
                     seed: int = 0) -> np.ndarray:
    """A balanced token id -> experts table (module docstring; Roller et al. 2021 §3).

    Args:
      token_counts: (V,) counts (or frequencies) of each token id on the training
        distribution, finite and >= 0, e.g. `count_tokens(...)`.
      n_routed_experts: E.
      num_experts_per_tok: k <= E experts per token.
      seed: seeds the permutation that breaks ties between equally loaded experts (and
        orders the round-robin of unseen tokens); the table is a function of
        (counts, E, k, seed).

    Returns:
      int32 (V, k): row t holds k distinct experts in [0, E).

    Raises:
      ValueError: naming the argument: token_counts not 1-D and non-empty, not finite,
        or negative; E or k not an integer >= 1; k > E.

    Cost: O(V (E log E)) numpy work, one sort of E loads per seen token (~1 s for
    V = 129,280, E = 384, k = 6: 4 s here).
    """
    counts = np.asarray(token_counts)
    if counts.ndim != 1 or counts.size == 0:
        raise ValueError(f"hash_routing: token_counts must be a non-empty (vocab_size,) "
                         f"vector, got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.number) or np.issubdtype(counts.dtype,
                                                                    np.complexfloating):
        raise ValueError(f"hash_routing: token_counts must be real numbers, got {counts.dtype}")
    counts = counts.astype(np.float64)
    if not np.all(np.isfinite(counts)):
        raise ValueError("hash_routing: token_counts must be finite")
    if np.any(counts < 0):
        bad = int(np.flatnonzero(counts < 0)[0])
        raise ValueError(f"hash_routing: token_counts[{bad}]={counts[bad]} is negative")
    experts = _check_count("n_routed_experts", n_routed_experts)
    k = _check_count("num_experts_per_tok", num_experts_per_tok)
    if k > experts:
        raise ValueError(f"hash_routing: num_experts_per_tok={k} must be <= "
                         f"n_routed_experts={experts}: a row holds k distinct experts")

    permutation = np.random.default_rng(seed).permutation(experts)  # (E,)
    tie_rank = np.empty(experts, np.int64)
    tie_rank[permutation] = np.arange(experts)  # expert -> its rank among equals
    table = np.empty((counts.size, k), np.int32)
    load = np.zeros(experts, np.float64)  # (E,) expected routings so far

    seen = np.flatnonzero(counts > 0)
    seen = seen[np.argsort(-counts[seen], kind="stable")]  # largest first, ties: lower id
    for token in seen:
        chosen = np.lexsort((tie_rank, load))[:k]  # (k,) least loaded (last key is primary)
        table[token] = chosen
        load[chosen] += counts[token]

    unseen = np.flatnonzero(counts == 0)  # (U,) round-robin over the permutation
    slots = np.arange(unseen.size)[:, None] * k + np.arange(k)[None, :]  # (U, k)
    table[unseen] = permutation[slots % experts]  # k <= E consecutive slots: distinct
    return table


def expected_expert_load(table, token_counts) -> np.ndarray:
    """load_e = sum of c_t over the tokens t whose row holds e: the (token, expert)
    routings expert e gets on text with these counts.

    Args:
      table: int (V, k) tid2eid.
      token_counts: (V,) counts.

    Returns:
      float64 (E_max + 1,), E_max the largest expert id in the table.

    Raises:
      ValueError: the shapes disagree.
    """
    table = np.asarray(table)
    counts = np.asarray(token_counts, np.float64)
    if table.ndim != 2 or counts.shape != (table.shape[0],):
        raise ValueError(f"hash_routing: table {table.shape} and token_counts "
                         f"{counts.shape} must be (V, k) and (V,)")
    weights = np.repeat(counts, table.shape[1])  # (V*k,) each routing weighs its token's count
    return np.bincount(table.reshape(-1), weights=weights)


def hash_routers(model) -> list:
    """The `DeepSeekV4Router`s of every hash-routed MoE layer of `model` (a
    DeepSeekV4CausalLM), in `model.moe_layers` order (main blocks, then MTP blocks)."""
    return [moe.gate for moe in model.moe_layers if moe.gate.tid2eid is not None]


def assign_tid2eid(model, table) -> int:
    """Writes `table` into the (non-trainable) `tid2eid` of every hash layer of `model`.

    Args:
      model: a DeepSeekV4CausalLM.
      table: int (vocab_size, num_experts_per_tok), one table for every hash layer, or
        (n_hash_layers, vocab_size, num_experts_per_tok), one per hash layer in
        `hash_routers(model)` order. Rows must hold distinct experts in
        [0, n_routed_experts).

    Returns:
      The number of layers written (0 if the model has no hash layer).

    Raises:
      ValueError: a wrong shape (naming it and the expected one), a non-integer table,
        or a bad row (naming the layer, the row and its experts).
    """
    from models.deepseek_v4.hf_checkpoint import check_tid2eid

    c = model.config
    routers = hash_routers(model)
    table = np.asarray(table)
    if not np.issubdtype(table.dtype, np.integer):
        raise ValueError(f"hash_routing.assign_tid2eid: table must be integers, got {table.dtype}")
    row_shape = (c.vocab_size, c.num_experts_per_tok)
    if table.shape == row_shape:
        tables = [table] * len(routers)
    elif table.shape == (len(routers), *row_shape):
        tables = list(table)
    else:
        raise ValueError(f"hash_routing.assign_tid2eid: table has shape {table.shape}, expected "
                         f"{row_shape} (vocab_size, num_experts_per_tok) or "
                         f"{(len(routers), *row_shape)} (one per hash layer)")
    for router, layer_table in zip(routers, tables, strict=True):
        check_tid2eid(f"tid2eid of {router.path}", layer_table, c.n_routed_experts)
        router.tid2eid.assign(layer_table.astype(np.int32))
    return len(routers)
