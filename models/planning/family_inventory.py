"""What a model family plugs into the planner core (`models.planning.plan`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


@dataclasses.dataclass(frozen=True)
class FamilyInventory:
    """A family's memory and FLOPs model, each a function of its config.

    Attributes:
      kv_cache_bytes: (config, context_len, bytes_per_number) -> KV cache bytes of one
        sequence of context_len tokens (V3: MLA's latent cache; V4: its bounded caches).
      activation_bytes: (config, micro_batch, seq_len, compute_dtype, recompute) -> bytes
        the backward pass keeps.
      flops_per_token: (config, seq_len) -> training FLOPs per token.
      decode_flops_per_token: (config, context_len) -> FLOPs of one decoded token.
    """

    kv_cache_bytes: Callable[[Any, int, int], int]
    activation_bytes: Callable[[Any, int, int, str, str], int]
    flops_per_token: Callable[[Any, int], float]
    decode_flops_per_token: Callable[[Any, int], float]
