"""The Keras dtype policy of a training run, chosen per device.

  TPU                                  mixed_bfloat16
  GPU, compute capability >= 8.0       mixed_bfloat16 (Ampere and later: bf16 tensor cores)
  GPU, compute capability 7.x          mixed_float16, with dynamic loss scaling
  CPU, with or without AMX            float32 (`train.precision=mixed_bfloat16` opts in)

On CPUs without AMX bf16 matmuls are slower than float32 (see the project notes and
benchmarks/train_throughput.py). On a Xeon with AMX (2 cores) bf16 gains little in a
training step: cpu_small 3,931 tokens/s in mixed_bfloat16 against 3,446 in float32
(+14%), tiny +10%, for numerics that differ from every other CPU's. And TensorFlow 2.16's
XLA CPU backend cannot compile the step's bf16 dots there: it keeps a bf16 dot in bf16
when its oneDNN rewrite would take it, and some of the step's dots (two contracting
dimensions, batch dimensions not leading) then reach its emitter, which refuses them
("unsupported operand type BF16 in op dot"), although a plain bf16 matmul compiles. So
CPUs train in float32 unless the config says otherwise, and a bf16 policy with the XLA
step on an AMX CPU is refused before anything is built (`check_xla`).

`train.precision` overrides the choice. Under a mixed policy variables stay
float32 and layers compute in the low precision; the model keeps router scores,
attention softmax, RMSNorm statistics, logits and the loss in float32 (the
router layer is float32 whatever the policy). The policy is passed to the model
(`DeepSeekCausalLM(config, dtype=policy)`), never set globally, so training in
one process does not change the dtype of models built later in it.

A base model stored in bfloat16 (`savedmodel.base_model.weight_dtype`), fine-tuned with
LoRA (`train.lora_rank` > 0), is trained in the policy "bfloat16" (`model_policy`): the
frozen base keeps its bf16 variables, the adapters are float32 variables computed in
bf16 (`trainable.prepare`), and so are their optimizer states. Unless `train.precision`
is "float32": then, as for full fine-tuning and frozen layers without LoRA, the base is
up-cast once as it loads and every weight trains in float32 (master weights).
"""

from __future__ import annotations

from components.trainer.hardware import Accelerator

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def auto_policy(accelerator: Accelerator) -> tuple[str, str]:
    """(policy, reason) for `accelerator`, by the table in the module docstring."""
    if accelerator.kind == "tpu":
        return "mixed_bfloat16", "TPU"
    if accelerator.kind == "gpu":
        cc = accelerator.compute_capability or (0, 0)
        if cc >= (8, 0):
            return "mixed_bfloat16", f"GPU compute capability {cc[0]}.{cc[1]} >= 8.0"
        if cc >= (7, 0):
            return "mixed_float16", f"GPU compute capability {cc[0]}.{cc[1]} (no bf16)"
        return "float32", f"GPU compute capability {cc[0]}.{cc[1]} < 7.0"
    if accelerator.cpu_has_amx:
        return "float32", ("CPU with AMX (bf16 measured +14% tokens/s only; "
                           "train.precision=mixed_bfloat16 opts in)")
    return "float32", "CPU without AMX (bf16 is slower than float32 there)"


def choose_policy(requested: str, accelerator: Accelerator) -> tuple[str, str]:
    """The policy to train with: `requested`, or the automatic choice for "auto".

    Returns:
      (policy, reason).

    Raises:
      ValueError: unknown policy.
    """
    if requested == "auto":
        return auto_policy(accelerator)
    if requested not in POLICIES:
        raise ValueError(f"train.precision={requested!r} must be 'auto' or one of {POLICIES}")
    return requested, "set in the config (train.precision)"


def model_policy(policy: str, reason: str, base_weight_dtype: str | None,
                 train) -> tuple[str, str]:
    """The policy the model is built in, given the device's `policy` (`choose_policy`)
    and the base model's stored precision (None: no base model).

    Args:
      policy, reason: from `choose_policy`.
      base_weight_dtype: "bfloat16" / "float32" (`base_model.weight_dtype`), or None.
      train: the run's TrainConfig (`lora_rank`, `precision`).

    Returns:
      (policy, reason): "bfloat16" for LoRA on a bf16 base (unless train.precision is
      "float32"), else `policy` unchanged.
    """
    if (base_weight_dtype == "bfloat16" and train.lora_rank > 0
            and train.precision != "float32"):
        return "bfloat16", ("LoRA on a bfloat16 base: the frozen base stays bfloat16, the "
                            "adapters and their optimizer states float32")
    return policy, reason


def check_xla(policy: str, accelerator: Accelerator, xla: bool) -> None:
    """Refuses a bf16 policy (`mixed_bfloat16`, or `bfloat16` for LoRA on a bf16 base)
    for an XLA-compiled step on a CPU with AMX, which TF 2.16's XLA cannot compile
    (module docstring).

    Raises:
      ValueError: naming the policy, the device and the two settings that avoid it.
    """
    if xla and accelerator.kind == "cpu" and accelerator.cpu_has_amx and compute_dtype(
            policy) == "bfloat16":
        raise ValueError(
            f"precision {policy} with train.jit_compile=true on this CPU "
            f"({accelerator.name}, AMX): TensorFlow 2.16's XLA CPU backend cannot compile "
            "the training step's bf16 dots ('unsupported operand type BF16 in op dot'). "
            "Set train.jit_compile=false (bf16 on AMX without XLA) or "
            "train.precision=float32.")


def compute_dtype(policy: str) -> str:
    """"float32", "bfloat16" or "float16": the dtype matmuls run in."""
    return {"float32": "float32", "mixed_bfloat16": "bfloat16", "bfloat16": "bfloat16",
            "mixed_float16": "float16"}[policy]


def dtype_breakdown(variables) -> str:
    """The dtypes of `variables` by share of their elements: "bfloat16", or
    "bfloat16 99.6%, float32 0.4%" when mixed; "none" for no variables."""
    counts: dict[str, int] = {}
    for v in variables:
        n = 1
        for d in v.shape:
            n *= int(d)
        dtype = getattr(v.dtype, "name", str(v.dtype))
        counts[dtype] = counts.get(dtype, 0) + n
    total = sum(counts.values())
    if not counts or total == 0:
        return "none"
    if len(counts) == 1:
        return next(iter(counts))
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{dtype} {100 * n / total:.1f}%" for dtype, n in ordered)
