"""How often each routed expert is chosen on some tokens: the measurement expert
pruning selects by (Lu et al. 2024, arXiv 2402.14800), for either family's model."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import tensorflow as tf


def expert_load(model, token_batches: Iterable) -> np.ndarray:
    """Counts the (token, expert) routings of every MoE layer on `token_batches`.

    Uses the model's own router through `forward_train(training=False)` (dropless
    dispatch, MTP modules included, as in training), summed over the batches.

    Args:
      model: a DeepSeekCausalLM or a DeepSeekV4CausalLM (anything with
        `forward_train(ids)["expert_load"]` and `num_moe_layers`).
      token_batches: an iterable of int token ids, each (B, T) (numpy or tensor), ids
        in [0, vocab_size).

    Returns:
      float64 (num_moe_layers, n_routed_experts), rows in `model.moe_layers` order
      (main blocks, then MTP blocks). Each row of the main blocks sums to
      B*T*num_experts_per_tok over the batches (MTP depth k sees T - k positions).

    Raises:
      ValueError: if `token_batches` is empty or a batch is not 2-D.
    """
    c = model.config
    total = np.zeros((model.num_moe_layers, c.n_routed_experts), np.float64)
    seen = 0
    for batch in token_batches:
        ids = tf.convert_to_tensor(batch, tf.int32)  # (B, T)
        if ids.shape.rank != 2:
            raise ValueError(f"a token batch must be (B, T), got shape {ids.shape}")
        load = model.forward_train(ids, training=False)["expert_load"]  # (M, E) float32
        total += load.numpy().astype(np.float64)  # counts < 2**24 per batch: exact
        seen += 1
    if not seen:
        raise ValueError("token_batches is empty: no tokens to measure the expert load on")
    return total
