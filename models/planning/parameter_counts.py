"""Trained, frozen and adapter parameters and optimizer state of a run, over any
family's list of weights (`WeightTensor`s).

Optimizer states per trained parameter, float32: AdamW 2 (m, v); SGD with momentum 1;
Adafactor (Shazeer & Stern 2018 §3, no first moment) a row and a column vector per
matrix, a full vector otherwise. LoRA (Hu et al. 2021): an adapted kernel (in, out) adds
A (in, r) and B (r, out).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from models.planning.plan_input import MODES, OPTIMIZERS
from models.planning.weight_tensor import WeightTensor


@dataclasses.dataclass(frozen=True)
class ParameterCounts:
    """Parameters of a run.

    Attributes:
      total: the model's weights (adapters excluded; what is exported).
      trained: parameters that get gradients and optimizer states (the adapters
        under LoRA; the `Selection.trainable_params` of components/trainer/trainable.py).
      frozen: total minus the trained base weights (all of `total` under LoRA).
      adapters: LoRA parameters, rank x (in + out) per adapted kernel.
      optimizer_numbers: float32 numbers of optimizer state (see `plan`).
      adapted_kernels: parameters of the kernels that carry LoRA adapters (0 without);
        adapted_kernels_block: the most of them in one block (or MTP module).
    """

    total: int
    trained: int
    frozen: int
    adapters: int
    optimizer_numbers: int
    adapted_kernels: int = 0
    adapted_kernels_block: int = 0


def optimizer_numbers(shape: tuple[int, ...], optimizer: str) -> int:
    """float32 numbers of optimizer state of one tensor of `shape` (module docstring)."""
    if optimizer == "adamw":
        return 2 * math.prod(shape)
    if optimizer == "sgd":
        return math.prod(shape)
    if len(shape) >= 2:  # adafactor: factored second moment over the last two axes
        return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    return math.prod(shape)


def check_trainable_blocks(n: int, num_hidden_layers: int) -> None:
    """Checks N of `train.trainable=top:N` against the model's depth.

    Raises:
      ValueError: n outside [0, num_hidden_layers].
    """
    if not 0 <= n <= num_hidden_layers:
        raise ValueError(f"trainable_blocks={n} must be in [0, num_hidden_layers="
                         f"{num_hidden_layers}]")


def check_choices(mode: str, optimizer: str) -> None:
    """Checks a run's mode and optimizer.

    Raises:
      ValueError: mode not in MODES or optimizer not in OPTIMIZERS.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r} must be one of {MODES}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} must be one of {OPTIMIZERS}")


def count_parameters(tensors: list[WeightTensor], top_prefixes: Callable[[int], tuple[str, ...]],
                     block_of: Callable[[str], str], mode: str = "full", lora_rank: int = 16,
                     lora_targets: str = "attention,mlp", trainable_blocks: int | None = None,
                     optimizer: str = "adamw") -> ParameterCounts:
    """Trained, frozen and adapter parameters of a run over a family's weights.

    Args:
      tensors: every weight of the model (the family's `weight_tensors(config)`).
      top_prefixes: N -> the path prefixes of `train.trainable=top:N` (raises for N out
        of range).
      block_of: a path -> its block (`layers.i`, or an MTP module), for the most adapted
        parameters in one block.
      mode, lora_rank, lora_targets, trainable_blocks, optimizer: as the families'
        `memory_plan.parameter_counts`.

    Raises:
      ValueError: unknown mode, optimizer or target; lora_rank < 1; trainable_blocks
        missing for frozen or out of range.
    """
    check_choices(mode, optimizer)
    total = sum(t.size for t in tensors)
    if mode == "frozen" and trainable_blocks is None:
        raise ValueError("mode='frozen' needs trainable_blocks (N of train.trainable=top:N)")
    prefixes = None
    if trainable_blocks is not None and mode in ("frozen", "lora"):
        prefixes = top_prefixes(trainable_blocks)

    def picked(t: WeightTensor) -> bool:
        return prefixes is None or t.path.startswith(prefixes)

    if mode == "lora":
        return _lora_counts([t for t in tensors if picked(t)], total, lora_rank, lora_targets,
                            optimizer, block_of)
    trained = ([t for t in tensors if t.trainable and picked(t)]
               if mode in ("full", "frozen") else [])
    n_trained = sum(t.size for t in trained)
    states = sum(optimizer_numbers(t.shape, optimizer) for t in trained)
    return ParameterCounts(total, n_trained, total - n_trained, 0, states)


def _lora_counts(tensors: list[WeightTensor], total: int, lora_rank: int, lora_targets: str,
                 optimizer: str, block_of: Callable[[str], str]) -> ParameterCounts:
    """`count_parameters` under LoRA, over the picked tensors."""
    if isinstance(lora_rank, bool) or not isinstance(lora_rank, int) or lora_rank < 1:
        raise ValueError(f"lora_rank={lora_rank!r} must be an integer >= 1")
    wanted = {x.strip() for x in lora_targets.split(",") if x.strip()}
    if not wanted or wanted - {"attention", "mlp"}:
        raise ValueError(f"lora_targets={lora_targets!r} must name 'attention' and/or 'mlp'")
    adapters = states = 0
    per_block: dict[str, int] = {}
    for t in tensors:
        if t.lora in wanted:
            # (in, out) -> A (in, r), B (r, out); stacked experts (E, in, out) ->
            # A (E, in, r), B (E, r, out) (`ExpertProjection.enable_lora`).
            *e, n_in, n_out = t.shape
            a, b = (*e, n_in, lora_rank), (*e, lora_rank, n_out)
            adapters += math.prod(a) + math.prod(b)
            states += optimizer_numbers(a, optimizer) + optimizer_numbers(b, optimizer)
            block = block_of(t.path)
            per_block[block] = per_block.get(block, 0) + t.size
    return ParameterCounts(total, adapters, total, adapters, states,
                           sum(per_block.values()), max(per_block.values(), default=0))
