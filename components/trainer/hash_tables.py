"""The `tid2eid` tables of a V4 model trained from scratch, built before its first step.

A hash-routed MoE layer ("hash_moe") sends token id t to the fixed experts `tid2eid[t]`;
the table is a non-trainable weight, frozen for the whole run (no gradient, no optimizer
slot) and checkpointed with the model, so a resumed run, every worker of a cluster and the
exported model hold the same table. A warm start keeps its base model's tables.

The table is Roller et al.'s balanced assignment (`models/deepseek_v4/hash_routing.py`:
the most frequent tokens first, each to the least-loaded experts) of the token counts of
the first `COUNTED_BATCHES` global batches of the run's own training stream: the
Transform output as the Trainer reads it, sources mixed by their weights, the same
stream on every worker. Hash layer i gets the table of seed `train.seed + i`, so two
hash layers do not route alike.
"""

from __future__ import annotations

import logging

import numpy as np

from models import families
from models.deepseek_v4 import hash_routing

log = logging.getLogger(__name__)

# Global batches counted: 64 x the batch's tokens (131K tokens for cpu_small_v4, ~40% of
# Tiny Shakespeare's training split), seconds of input pipeline.
COUNTED_BATCHES = 64


def build_tid2eid(model, dataset_fn, seed: int, batches: int = COUNTED_BATCHES) -> dict | None:
    """Writes balanced `tid2eid` tables into every hash layer of `model`.

    Args:
      model: a DeepSeekV4CausalLM (any other model: nothing is done).
      dataset_fn: the run's `() -> dataset` of global batches {"input_ids": int32
        (B, T), ...} (`train_loop.train`); a fresh pipeline of it is read.
      seed: the run's `train.seed`; layer i's table uses seed + i.
      batches: global batches counted (fewer if the data ends first).

    Returns:
      None for a model without hash layers; else {"tokens_counted", "distinct_tokens",
      "max_load_over_mean"}: the tokens counted, the ids among them, and the largest
      expected expert load of the first table over the mean (1.0 = perfect balance).

    Raises:
      ValueError: a token id outside [0, vocab_size) in the data (naming it).
    """
    routers = families.family_of(model.config).hash_routers(model)
    if not routers:
        return None
    c = model.config
    ids = (batch["input_ids"].numpy() for batch in dataset_fn().take(batches))
    counts = hash_routing.count_tokens(ids, c.vocab_size)  # int64 (V,)
    tables = np.stack([hash_routing.balanced_tid2eid(counts, c.n_routed_experts,
                                                     c.num_experts_per_tok, seed + i)
                       for i in range(len(routers))])  # (layers, V, k)
    hash_routing.assign_tid2eid(model, tables)
    load = hash_routing.expected_expert_load(tables[0], counts)  # (E,)
    figures = {"tokens_counted": int(counts.sum()), "distinct_tokens": int((counts > 0).sum()),
               "max_load_over_mean": float(load.max() / max(load.mean(), 1e-12))}
    log.info("tid2eid of %d hash layer(s): balanced over %d tokens (%d distinct ids) of the "
             "first %d batches; largest expected expert load %.3f x the mean", len(routers),
             figures["tokens_counted"], figures["distinct_tokens"], batches,
             figures["max_load_over_mean"])
    return figures
