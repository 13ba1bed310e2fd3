"""Expert pruning: drop the least-routed routed experts of every MoE layer.

Lu et al. 2024, "Not All Experts are Equal: Efficient Expert Pruning and Skipping
for Mixture-of-Experts Large Language Models" (arXiv 2402.14800): routed experts
are unevenly used, and dropping the rarely routed ones costs little quality. Their
§3 searches expert subsets by reconstruction loss; here the criterion is the simpler
one they compare against, the router's own load (how often each expert is chosen)
on calibration tokens:

  expert_load(model, token_batches)   (M, E) float64: (token, expert) routings per
                                      MoE layer, counted by the model's own router
  select_experts(config, keep, load)  the kept expert indices of each MoE layer
  prune_experts(model, keep, load)    a new, smaller model: the kept experts, the
                                      router's rows (weight, e_score_correction_bias)
                                      sliced, config.n_routed_experts = keep

The pruned router routes each token among the kept experts exactly as the original
router does when the dropped experts are masked out before the top-k (their biased
scores, or for softmax routers their logits, set to -inf): the sigmoid scores of
the kept experts are unchanged, softmax scores are renormalized over the kept
experts, and `norm_topk_prob` / `routed_scaling_factor` apply as before.

Group-limited routing (topk_method "noaux_tc" or "group_limited_greedy" with
n_group > 1). The router reshapes the E experts into n_group contiguous groups of
E / n_group, so the pruned layer must keep the same number of experts in every
group: `keep` must be a multiple of n_group, and each group keeps its own
keep / n_group most-routed experts (not the `keep` most-routed overall). Kept
experts stay in their group and in their order, so a token's group scores are
those of the original groups restricted to the kept experts (DeepSeek-V3's group
score is the sum of the group's top-2 biased scores: with one kept expert per
group it is that expert's score), and the choice of groups and experts is the
masked original's. With one kept expert per group (keep == n_group) that choice is
the plain top-k, and the pruned config says n_group = topk_group = 1
(`pruned_config`): transformers cannot run groups of one. Choosing the global top
`keep` and re-grouping them would move experts between groups and change which
experts a token can reach; it is not done. With topk_method "greedy" the groups
are unused: the `keep` most-routed experts are kept, and if `keep` is not a
multiple of n_group the pruned config sets n_group = topk_group = 1.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.deepseek.hf_names import hf_weight_map
from models.formats.quantization import is_quantized, is_quantized_model, quantize_int8
from models.layers import initializers

_EXPERT_NAME = ".mlp.experts."
_GATE_NAMES = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")


def select_experts(config: DeepSeekConfig, keep: int, load) -> list[np.ndarray]:
    """The experts each MoE layer keeps: its `keep` most-routed (ties: lower index).

    Per group for group-limited routing (module docstring).

    Args:
      config: the unpruned model's DeepSeekConfig.
      keep: routed experts to keep per layer, 1 <= keep <= n_routed_experts.
      load: float (num_moe_layers, n_routed_experts), e.g. `expert_load(...)`.

    Returns:
      One int64 (keep,) array per MoE layer, the kept original expert indices in
      ascending order (the new index of an expert is its position here).

    Raises:
      ValueError: naming the value: `keep` not an integer in [num_experts_per_tok,
        n_routed_experts]; not a multiple of n_group under group-limited routing, or
        leaving fewer than num_experts_per_tok experts in the topk_group groups;
        `load` not 2-D with n_routed_experts columns, or not finite and >= 0.
    """
    c = config
    n_experts = c.n_routed_experts
    keep = c.check_keep_experts(keep)
    grouped = c.topk_method != "greedy" and c.n_group > 1
    load = np.asarray(load, np.float64)
    if load.ndim != 2 or load.shape[1] != n_experts:
        raise ValueError(f"load has shape {load.shape}, expected (num_moe_layers, "
                         f"n_routed_experts={n_experts})")
    if not np.all(np.isfinite(load)) or np.any(load < 0):
        raise ValueError("load must be finite and >= 0")

    groups = c.n_group if grouped else 1
    per_group, keep_per_group = n_experts // groups, keep // groups
    kept = []
    for row in load:
        layer = []
        for g in range(groups):
            experts = np.arange(g * per_group, (g + 1) * per_group)  # (E/G,)
            # Most routed first, ties by lower index (lexsort: last key is primary).
            order = np.lexsort((experts, -row[experts]))
            layer.append(experts[order[:keep_per_group]])
        kept.append(np.sort(np.concatenate(layer)))
    return kept


def pruned_config(config: DeepSeekConfig, keep: int) -> DeepSeekConfig:
    """`config` with n_routed_experts = keep; validated by DeepSeekConfig.

    n_group = topk_group = 1 where the groups no longer do anything: a greedy router
    whose groups do not divide `keep`, and group-limited routing left with one expert
    per group (keep == n_group). There the group limit keeps the topk_group best
    experts and the top-k is taken among them; select_experts has checked
    topk_group >= num_experts_per_tok, so that is the plain top-k, the same choice.
    transformers (DeepseekV3TopkRouter) and DeepSeek's inference code score a group
    with `topk(2)` and raise on groups of one ("selected index k out of range",
    tests/fixtures/hf_deepseek_v3_pruned/), so a pruned checkpoint must not keep them.
    """
    changes = {"n_routed_experts": int(keep)}
    grouped = config.topk_method != "greedy" and config.n_group > 1
    if (config.topk_method == "greedy" and keep % config.n_group) or (
            grouped and keep == config.n_group):
        changes.update(n_group=1, topk_group=1)
    return config.replace(**changes)


def prune_experts(model, keep: int, load):
    """A new DeepSeekCausalLM keeping the `keep` most-routed experts of each MoE layer.

    Per MoE layer (main blocks and MTP blocks, rows of `load` in `model.moe_layers`
    order) the kept experts are `select_experts(model.config, keep, load)`; their
    SwiGLU weights are copied, the router's `weight` (E, C) rows and
    `e_score_correction_bias` (E,) entries are gathered to (keep, C) and (keep,),
    and every other weight is copied unchanged. An int8 model's projections are read
    dequantized (Q / s) and quantized again, which gives back the same Q. The new model
    has the old one's dtype policy and `pruned_config(model.config, keep)`; num_experts_per_tok, topk_group,
    norm_topk_prob and routed_scaling_factor are unchanged.

    Memory: the new model is built with its weights zero-initialized and filled one
    variable at a time from the old model (by HF tensor name, `hf_weight_map`), so the
    peak is the old model plus the pruned one plus one tensor; no other copy of the
    weights is made. Drop the old model afterwards to free it.

    Args:
      model: a DeepSeekCausalLM (unchanged by this call).
      keep: routed experts to keep per MoE layer.
      load: float (num_moe_layers, n_routed_experts) routing counts, e.g.
        `expert_load(model, batches)`.

    Returns:
      The pruned DeepSeekCausalLM.

    Raises:
      ValueError: see `select_experts` (the value and the reason, in one line).

    Reference: Lu et al. 2024, arXiv 2402.14800 (expert pruning of MoE LLMs).
    """
    from models.deepseek.causal_lm import DeepSeekCausalLM

    load = np.asarray(load, np.float64)
    if load.ndim != 2 or load.shape[0] != model.num_moe_layers:
        raise ValueError(f"load has shape {load.shape}, expected (num_moe_layers="
                         f"{model.num_moe_layers}, n_routed_experts)")
    kept = select_experts(model.config, keep, load)
    config = pruned_config(model.config, keep)
    with initializers.weights_from_checkpoint():  # every weight is assigned below
        pruned = DeepSeekCausalLM(config, dtype=model.dtype_policy.name)

    old = hf_weight_map(model)
    new = hf_weight_map(pruned)
    # HF prefix of each MoE layer ("model.layers.N") -> its kept experts, in moe_layers order.
    prefixes = _moe_prefixes(model)
    kept_by_prefix = dict(zip(prefixes, kept, strict=True))
    for name, (variable, _) in new.items():
        source, rows = _source(name, kept_by_prefix)
        value = old[source][0]
        if rows is not None:
            value = tf.gather(tf.convert_to_tensor(value), rows)  # (keep, ...) router rows
        variable.assign(value)
    if is_quantized_model(model):  # int8 in, int8 out: Q / s quantizes back to Q
        quantize_int8(pruned, head=model.lm_head is not None and is_quantized(model.lm_head))
    return pruned


def _moe_prefixes(model) -> list[str]:
    """The HF prefix of each MoE layer, in `model.moe_layers` order."""
    c = model.config
    blocks = [(f"model.layers.{i}", b) for i, b in enumerate(model.decoder_layers)]
    blocks += [(f"model.layers.{c.num_hidden_layers + d}", mtp.block)
               for d, mtp in enumerate(model.mtp_layers)]
    prefixes = [prefix for prefix, block in blocks if block.is_moe]
    assert len(prefixes) == model.num_moe_layers
    return prefixes


def _source(name: str, kept_by_prefix: dict[str, np.ndarray]):
    """(old tensor name, router rows to gather or None) for new tensor `name`."""
    if _EXPERT_NAME in name:
        prefix, rest = name.split(_EXPERT_NAME)
        new_index, tail = rest.split(".", 1)
        old_index = int(kept_by_prefix[prefix][int(new_index)])
        return f"{prefix}{_EXPERT_NAME}{old_index}.{tail}", None
    for gate in _GATE_NAMES:
        if name.endswith(gate):
            return name, kept_by_prefix[name[: -len(gate)]]
    return name, None
