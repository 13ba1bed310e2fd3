"""The plan of one case: bytes per device by part, whether it fits, the fewest devices
that fit, and time per step; the method is in `models/deepseek/memory_plan.py`'s module
docstring (mixed precision after Micikevicius et al. 2018 §3.1, ZeRO sharding after
Rajbhandari et al. 2020 §5, recomputation after Korthikanti et al. 2022 §4.2).
"""

from __future__ import annotations

import dataclasses

from models.planning.family_inventory import FamilyInventory
from models.planning.parameter_counts import ParameterCounts
from models.planning.plan_input import DTYPE_BYTES, GIB, PlanInput


@dataclasses.dataclass(frozen=True)
class Plan:
    """Bytes per device and time of one `PlanInput` (see the module docstring).

    Attributes:
      case: the input.
      counts: `ParameterCounts`.
      weights, master_weights, gradients, optimizer_states, activations,
        kv_cache, total: bytes per device.
      fits: total <= memory_gib GiB.
      min_devices: the fewest devices of this memory on which the case fits with
        this sharding (None: none does, e.g. replicated weights that never fit,
        or activations alone too large).
      tokens_per_step: global tokens per optimizer step (inference: tokens
        generated per decoding step over all devices).
      step_time_s: seconds per optimizer step (inference: per decoding step).
      token_time_s: seconds per token (step_time_s / tokens_per_step).
    """

    case: PlanInput
    counts: ParameterCounts
    weights: int
    master_weights: int
    gradients: int
    optimizer_states: int
    activations: int
    kv_cache: int
    total: int
    fits: bool
    min_devices: int | None
    tokens_per_step: int
    step_time_s: float
    token_time_s: float


def memory(p: PlanInput, counts: ParameterCounts, devices: int,
           family: FamilyInventory) -> dict[str, int]:
    """Bytes per device, by part (and "total"), of case `p` on `devices` devices."""
    w = DTYPE_BYTES[p.weights_dtype]
    c = p.config
    weights = master = grads = states = acts = kv = 0
    if p.mode == "inference":
        weights = counts.total * w
        kv = p.batch_per_device * family.kv_cache_bytes(c, p.seq_len,
                                                        DTYPE_BYTES[p.compute_dtype])
    else:
        if p.mode == "full":
            weights = counts.total * w
            master = counts.trained * 4 if w < 4 else 0
            grads = counts.trained * w
        else:  # frozen base in the stored dtype, trained parameters (or adapters) in float32
            weights = counts.frozen * w + counts.trained * 4
            grads = counts.trained * 4
        if p.grad_accum_steps > 1:
            grads *= 2  # the running sum beside the micro-batch's gradient
        states = counts.optimizer_numbers * 4
        acts = family.activation_bytes(c, p.batch_per_device, p.seq_len, p.compute_dtype,
                                       p.recompute)
        # Keras' LoRA (`Dense.enable_lora`) computes the kernel W + A B in every call and
        # the matmul keeps it for the backward pass: one merged copy per adapted kernel
        # (one block's with recomputation).
        merged = (counts.adapted_kernels if p.recompute == "none" else
                  counts.adapted_kernels_block)
        acts += merged * DTYPE_BYTES[p.compute_dtype]
    if p.sharding in ("optimizer", "full"):
        master, grads, states = (-(-x // devices) for x in (master, grads, states))
    if p.sharding == "full":
        weights = -(-weights // devices)
    parts = dict(weights=weights, master_weights=master, gradients=grads,
                 optimizer_states=states, activations=acts, kv_cache=kv)
    parts["total"] = sum(parts.values())
    return parts


def min_devices(p: PlanInput, counts: ParameterCounts, limit: float,
                family: FamilyInventory) -> int | None:
    """The fewest devices on which case `p` takes at most `limit` bytes per device
    (doubling, then bisection), or None when no number of devices does."""
    if memory(p, counts, 1, family)["total"] <= limit:
        return 1
    if p.sharding == "none":
        return None  # nothing is divided: more devices hold the same
    hi = 1
    while memory(p, counts, hi, family)["total"] > limit:
        hi *= 2
        if hi > 2**24:
            return None  # what is never divided (activations, replicated parts) is too large
    lo = hi // 2  # does not fit at lo, fits at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if memory(p, counts, mid, family)["total"] <= limit:
            hi = mid
        else:
            lo = mid
    return hi


def plan(p: PlanInput, counts: ParameterCounts, family: FamilyInventory) -> Plan:
    """Memory per device, whether it fits, the fewest devices that fit, and time.

    Time: training FLOPs per token times 4/3 with recomputation (one more forward pass),
    over devices x peak x MFU; inference: decode FLOPs per token at the context length.

    Args:
      p: the case.
      counts: its parameters (the family's `parameter_counts`).
      family: the family's memory and FLOPs model.
    """
    parts = memory(p, counts, p.devices, family)
    limit = p.memory_gib * GIB
    c = p.config
    if p.mode == "inference":
        tokens = p.batch_per_device * p.devices
        step_flops = tokens * family.decode_flops_per_token(c, p.seq_len)
    else:
        tokens = p.batch_per_device * p.seq_len * p.grad_accum_steps * p.devices
        step_flops = tokens * family.flops_per_token(c, p.seq_len) * (
            4 / 3 if p.recompute == "full" else 1)
    step = step_flops / (p.devices * p.peak_flops * p.mfu)
    return Plan(p, counts, fits=parts["total"] <= limit,
                min_devices=min_devices(p, counts, limit, family), tokens_per_step=tokens,
                step_time_s=step, token_time_s=step / tokens, **parts)
