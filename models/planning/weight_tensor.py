"""One weight of a causal LM, as the memory planner counts it."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class WeightTensor:
    """One weight of `DeepSeekCausalLM` or `DeepSeekV4CausalLM`.

    Attributes:
      path: as `trainable.weight_path` writes it, e.g. `layers.1/self_attn/o_proj/kernel`
        (V4: the release's names, e.g. `layers.1.attn_norm.weight`).
      shape: its shape; a Dense kernel is (in, out), the routed experts' stacked
        kernels (E, in, out).
      trainable: False only for the routers' `e_score_correction_bias` (and V4's hash
        tables).
      lora: "attention" or "mlp" when it is a kernel that `train.lora_targets`
        can adapt, else "".
    """

    path: str
    shape: tuple[int, ...]
    trainable: bool = True
    lora: str = ""

    @property
    def size(self) -> int:
        return math.prod(self.shape)
