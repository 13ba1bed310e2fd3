"""Expert pruning for DeepSeek-V4: keep the `keep` most-routed experts of every MoE layer.

The V4 counterpart of `models.deepseek.expert_pruning` (same functions, same signatures,
so `components/trainer/pruning.py` can dispatch on the model family); the criterion is
the router's own load on calibration tokens (Lu et al. 2024, "Not All Experts are Equal",
arXiv 2402.14800, the frequency baseline):

  expert_load(model, token_batches)   float64 (M, E): (token, expert) routings per MoE
                                      layer, counted by the model's own routers (V3's
                                      `models/layers/expert_load.expert_load`: the
                                      same measurement; hash layers count their tid2eid)
  select_experts(config, keep, load)  the kept expert indices of each MoE layer
  pruned_config(config, keep)         config.n_routed_experts = keep
  prune_experts(model, keep, load)    a new, smaller DeepSeekV4CausalLM

V4 routers have no expert groups, so a layer keeps its `keep` most-routed experts, kept
in their original order (new id = rank among the kept). Per layer kind:

  "moe" (learned top-k): the router's `weight` rows and `e_score_correction_bias`
    entries of the kept experts are gathered. Scores are elementwise (sqrtsoftplus or
    sigmoid of one logit per expert), so the pruned router chooses exactly what the
    original chooses when the dropped experts are masked out of the top-k, with the same
    weights (normalized over the chosen experts, times routed_scaling_factor).
  "hash_moe" (tid2eid): the table must keep naming k distinct experts < keep. Each entry
    is re-indexed to its expert's new id; an entry naming a dropped expert is replaced by
    the most-routed kept expert of that layer (largest `load`, ties: lower id) that is not
    already in the row, the dropped entries of a row taking the candidates in that order.
    A token whose experts were all kept routes to the same experts (re-indexed) with the
    same weights, so the layer's output for it is unchanged. The router still computes a
    score for every kept expert, so the weights of a row with a replacement are those of
    its new experts.

Memory: as V3's pruning, the pruned model is built with zero weights and filled one
variable at a time from the old model (by weight path); the peak is the old model, the
pruned one and one tensor (a gathered stacked expert kernel). int8 projections are copied
as int8 (Q and s, the kept experts' rows of the experts' (E, out) scales): no dequantize and
requantize. LoRA adapters are merged into the pruned model's kernels (W + A B; int8: the
merge quantized again, `quantization.requantized`), as V3's pruning does.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from models.deepseek_v4.config import DeepSeekV4Config
from models.formats.quantization import (
    is_quantized,
    quantize_like,
    quantized_layers,
    requantized,
    unquantized_projections,
)
from models.layers import initializers
from models.layers.expert_load import expert_load  # noqa: F401  (this module's API: V4's measurement)


def _checked_load(config: DeepSeekV4Config, load) -> np.ndarray:
    load = np.asarray(load, np.float64)
    if load.ndim != 2 or load.shape[1] != config.n_routed_experts:
        raise ValueError(f"load has shape {load.shape}, expected (num_moe_layers, "
                         f"n_routed_experts={config.n_routed_experts})")
    if not np.all(np.isfinite(load)) or np.any(load < 0):
        raise ValueError("load must be finite and >= 0")
    return load


def _ranked(row: np.ndarray) -> np.ndarray:
    """Expert indices, most routed first, ties by lower index (lexsort: last key primary)."""
    return np.lexsort((np.arange(row.size), -row))


def select_experts(config: DeepSeekV4Config, keep: int, load) -> list[np.ndarray]:
    """The experts each MoE layer keeps: its `keep` most-routed (ties: lower index).

    Args:
      config: the unpruned model's DeepSeekV4Config.
      keep: routed experts to keep per layer (`DeepSeekV4Config.check_keep_experts`).
      load: float (num_moe_layers, n_routed_experts), e.g. `expert_load(...)`.

    Returns:
      One int64 (keep,) array per MoE layer, the kept original expert indices in
      ascending order (the new id of an expert is its position here).

    Raises:
      ValueError: naming the value: `keep` out of [num_experts_per_tok,
        n_routed_experts] or not an integer; `load` not (M, n_routed_experts), not
        finite, or negative.
    """
    keep = config.check_keep_experts(keep)
    load = _checked_load(config, load)
    return [np.sort(_ranked(row)[:keep]).astype(np.int64) for row in load]


def pruned_config(config: DeepSeekV4Config, keep: int) -> DeepSeekV4Config:
    """`config` with n_routed_experts = keep (validated; V4 routers have no groups)."""
    return config.replace(n_routed_experts=config.check_keep_experts(keep))


def prune_tid2eid(table, kept: np.ndarray, load_row) -> np.ndarray:
    """A hash layer's table after pruning (module docstring).

    Args:
      table: int (V, k) tid2eid over the original experts, distinct experts per row.
      kept: int (keep,) the kept original experts, ascending (`select_experts`).
      load_row: float (E,) the layer's measured load (ranks the replacements).

    Returns:
      int32 (V, k): distinct new ids in [0, keep) per row; entries of kept experts keep
      their slot (re-indexed).

    Raises:
      ValueError: keep < k (a row could not stay distinct).
    """
    table = np.asarray(table, np.int64)
    kept = np.asarray(kept, np.int64)
    n_experts = np.asarray(load_row).size
    k = table.shape[1]
    if kept.size < k:
        raise ValueError(f"keep={kept.size} must be >= num_experts_per_tok={k}")
    new_id = np.full(n_experts, -1, np.int64)
    new_id[kept] = np.arange(kept.size)  # original -> new id, -1 if dropped
    out = new_id[table]  # (V, k)
    dropped = out < 0  # (V, k)
    if not dropped.any():
        return out.astype(np.int32)
    # Candidates: kept experts, most routed first; a row needs at most k of them beyond
    # the <= k - 1 kept ones it already holds.
    load_row = np.asarray(load_row, np.float64)
    ranked_kept = new_id[kept[_ranked(load_row[kept])]][: 2 * k]  # (M,) new ids
    rows = np.flatnonzero(dropped.any(axis=1))  # (R,)
    sub = out[rows]  # (R, k)
    in_row = (ranked_kept[None, :, None] == sub[:, None, :]).any(axis=-1)  # (R, M)
    free = ~in_row
    free_rank = np.cumsum(free, axis=1) - 1  # (R, M) rank among the free candidates
    need = np.cumsum(dropped[rows], axis=1) - 1  # (R, k) which free candidate each slot takes
    for slot in range(k):
        todo = dropped[rows, slot]  # (R,)
        pick = free & (free_rank == need[:, slot][:, None])  # (R, M) one True per row
        sub[todo, slot] = ranked_kept[np.argmax(pick[todo], axis=1)]
    out[rows] = sub
    return out.astype(np.int32)


def _weight_path(variable) -> str:
    """A weight's path without the model's own instance-numbered name."""
    return variable.path.split("/", 1)[1]


def _merged_sources(model) -> dict:
    """Weight path -> zero-argument function giving its value, LoRA adapters merged into
    their kernels (W + A B, or Q', s' for int8) and left out themselves."""
    adapted = {}
    for layer in quantized_layers(model) + unquantized_projections(model):
        if layer.lora_enabled:
            (kernel,) = [w for w in layer.weights if w.path.endswith("/kernel")]
            adapted[_weight_path(kernel)] = layer
    sources = {}
    for v in model.weights:
        path = _weight_path(v)
        if path.endswith(("lora_kernel_a", "lora_kernel_b")):
            if path.rsplit("/", 1)[0] + "/kernel" not in adapted:
                raise ValueError(f"prune_experts: {path} belongs to no projection this "
                                 "module knows: merge the adapters first")
            continue
        layer = adapted.get(path)
        if layer is None:
            sources[path] = lambda v=v: v.value
        elif is_quantized(layer):
            sources[path] = lambda layer=layer: requantized(layer)[0]
            sources[path + "_scale"] = lambda layer=layer: requantized(layer)[1]
        else:
            sources[path] = lambda layer=layer: keras.ops.convert_to_numpy(layer.kernel)
    return sources


def prune_experts(model, keep: int, load):
    """A new DeepSeekV4CausalLM keeping the `keep` most-routed experts of each MoE layer.

    Per MoE layer (rows of `load` in `model.moe_layers` order) the kept experts are
    `select_experts(model.config, keep, load)`; their rows of the stacked expert kernels
    (and int8 scales) are copied, the router's `weight` rows and `e_score_correction_bias`
    entries gathered, a hash layer's `tid2eid` rewritten (`prune_tid2eid`), and every
    other weight copied unchanged. The new model has the old one's dtype policy, the same
    int8 projections (`quantization.quantize_like`) and `pruned_config(model.config, keep)`.

    Args:
      model: a DeepSeekV4CausalLM (unchanged by this call).
      keep: routed experts to keep per MoE layer.
      load: float (num_moe_layers, n_routed_experts) routing counts, e.g.
        `expert_load(model, batches)`.

    Returns:
      The pruned DeepSeekV4CausalLM.

    Raises:
      ValueError: naming the value: see `select_experts`; `load` with another number of
        rows than `model.moe_layers`; LoRA adapters on a layer this module does not know.
    """
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM

    load = np.asarray(load, np.float64)
    if load.ndim != 2 or load.shape[0] != len(model.moe_layers):
        raise ValueError(f"load has shape {load.shape}, expected (num_moe_layers="
                         f"{len(model.moe_layers)}, n_routed_experts)")
    kept = select_experts(model.config, keep, load)
    sources = _merged_sources(model)  # checks LoRA before anything is built
    with initializers.weights_from_checkpoint():  # every weight is assigned below
        pruned = DeepSeekV4CausalLM(pruned_config(model.config, keep),
                                    dtype=model.dtype_policy.name)
    quantize_like(pruned, model)  # int8 where the model is: Q and s are copied below

    edits = {}  # id(new variable) -> value -> value
    for moe, rows, load_row in zip(pruned.moe_layers, kept, load, strict=True):
        def gather(value, rows=rows):
            return tf.gather(tf.convert_to_tensor(value), rows)  # (keep, ...) along experts

        for v in moe.experts.weights + [moe.gate.weight]:  # (E, ...) kernels, scales, rows
            edits[id(v)] = gather
        if moe.gate.tid2eid is not None:
            edits[id(moe.gate.tid2eid)] = (
                lambda value, rows=rows, row=load_row: prune_tid2eid(value, rows, row))
        else:
            edits[id(moe.gate.e_score_correction_bias)] = gather
    for v in pruned.weights:
        path = _weight_path(v)
        if path not in sources:
            raise ValueError(f"prune_experts: weight {path} of the pruned model has no "
                             "counterpart in the model")
        value = sources[path]()
        if id(v) in edits:
            value = edits[id(v)](value)
        if tuple(value.shape) != tuple(v.shape):
            raise ValueError(f"prune_experts: weight {path}: shape {tuple(v.shape)} in the "
                             f"pruned model, {tuple(value.shape)} from the model")
        v.assign(tf.cast(value, v.dtype))
        del value
    return pruned
