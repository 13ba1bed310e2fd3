"""One case for the memory planner, and the choices it validates against."""

from __future__ import annotations

import dataclasses
from typing import Any

GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
MODES = ("full", "lora", "frozen", "inference")
OPTIMIZERS = ("adamw", "sgd", "adafactor")
SHARDINGS = ("none", "optimizer", "full")
RECOMPUTE = ("none", "full")


@dataclasses.dataclass(frozen=True)
class PlanInput:
    """One case to plan.

    Attributes:
      config: the model: a `DeepSeekConfig` (`models.deepseek.memory_plan.plan`) or a
        `DeepSeekV4Config` (`models.deepseek_v4.memory_plan.plan`).
      name: a label for tables.
      mode: "full", "lora", "frozen" or "inference" (weights + KV cache: the
        memory of an imported checkpoint being served or exported).
      weights_dtype: "bfloat16" or "float32": how the (frozen) weights are stored.
      compute_dtype: "bfloat16" (mixed precision) or "float32": activations.
      optimizer: "adamw", "sgd" or "adafactor".
      lora_rank, lora_targets: LoRA (mode "lora").
      trainable_blocks: N of `top:N` (mode "frozen"; optional for "lora").
      batch_per_device: sequences per device per micro-batch (what activations
        scale with); the global batch is batch_per_device x grad_accum_steps x devices.
        Inference: sequences decoded together per device.
      seq_len: tokens per sequence (inference: the context the KV cache holds).
      grad_accum_steps: micro-batches per optimizer step.
      recompute: "none" or "full" (activation recomputation per block).
      devices: number of devices.
      memory_gib: memory per device, GiB.
      sharding: "none", "optimizer" or "full" (`models/deepseek/memory_plan.py`'s
        module docstring).
      peak_flops: dense peak FLOP/s of one device in the compute dtype.
      mfu: the model FLOPs utilization assumed for the time estimates.

    Raises:
      ValueError: naming the field and the value: a choice not among MODES,
        OPTIMIZERS, SHARDINGS, RECOMPUTE or DTYPE_BYTES; a count < 1; memory_gib or
        peak_flops <= 0; mfu outside (0, 1].
    """

    config: Any
    name: str = ""
    mode: str = "full"
    weights_dtype: str = "bfloat16"
    compute_dtype: str = "bfloat16"
    optimizer: str = "adamw"
    lora_rank: int = 16
    lora_targets: str = "attention,mlp"
    trainable_blocks: int | None = None
    batch_per_device: int = 1
    seq_len: int = 4096
    grad_accum_steps: int = 1
    recompute: str = "none"
    devices: int = 1
    memory_gib: float = 80.0
    sharding: str = "none"
    peak_flops: float = 312e12
    mfu: float = 0.4

    def __post_init__(self) -> None:
        for name, choices in (("mode", MODES), ("optimizer", OPTIMIZERS),
                              ("sharding", SHARDINGS), ("recompute", RECOMPUTE),
                              ("weights_dtype", tuple(DTYPE_BYTES)),
                              ("compute_dtype", tuple(DTYPE_BYTES))):
            if getattr(self, name) not in choices:
                raise ValueError(f"{name}={getattr(self, name)!r} must be one of {choices}")
        for name in ("batch_per_device", "seq_len", "grad_accum_steps", "devices"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer >= 1")
        for name in ("memory_gib", "peak_flops"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")
        if not 0 < self.mfu <= 1:
            raise ValueError(f"mfu={self.mfu!r} must be in (0, 1]")


def check_activation_args(micro_batch: int, seq_len: int, compute_dtype: str,
                          recompute: str) -> None:
    """Checks the arguments of a family's `activation_bytes`.

    Raises:
      ValueError: unknown compute_dtype or recompute; micro_batch or seq_len < 1.
    """
    if compute_dtype not in DTYPE_BYTES:
        raise ValueError(f"compute_dtype={compute_dtype!r} must be one of {sorted(DTYPE_BYTES)}")
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute={recompute!r} must be one of {RECOMPUTE}")
    for name, value in (("micro_batch", micro_batch), ("seq_len", seq_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
