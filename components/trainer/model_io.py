"""The models around a training run: the one it trains, the one a checkpoint is read
into, and the copy that leaves training (evaluated and exported by `run_fn`).

A trained model may be in a mixed-precision policy, hold LoRA adapters and have
its variables on a distribution strategy's devices; the copy that leaves is a
plain model of `config.model` (`DeepSeekCausalLM`, or `DeepSeekV4CausalLM` for a V4
config: `models/checkpoints.build_model`) on no strategy, with the adapters merged
into their kernels (W + A B), in `export_weight_dtype`: bfloat16 when the trained
model's variables are bf16 (LoRA on a bf16 base: the export stays bf16), int8 when
its projections are (LoRA on an int8 base: Q / s + A B re-quantized, so the export
stays int8; `quantization.requantized`), else float32. Weights are copied one at a
time (`trainable.assign_streaming`): the memory beyond the two models is one weight.
`to_export_dtype` then applies `train.export_dtype`.
"""

from __future__ import annotations

from components.trainer import trainable
from config import PipelineConfig
from models import checkpoints
from models.deepseek import DeepSeekCausalLM
from models.formats import quantization
from models.layers.initializers import weights_from_checkpoint
from savedmodel.precision import AUTO, INT8, keras_policy, weight_dtype_of


def build_model(config: PipelineConfig, dtype: str = "float32") -> DeepSeekCausalLM:
    """`config.model` with its weights created (the constructor builds them), in the
    Keras dtype policy `dtype` ("float32", "bfloat16", "mixed_bfloat16", "mixed_float16"):
    a `DeepSeekCausalLM`, or a `DeepSeekV4CausalLM` for a `DeepSeekV4Config`."""
    return checkpoints.build_model(config.model, dtype=dtype)


def export_weight_dtype(model: DeepSeekCausalLM) -> str:
    """"int8" for a model with int8 projections, "bfloat16" for one with bf16 variables
    (its frozen base), else "float32" (float32 master weights, mixed policies
    included)."""
    stored = weight_dtype_of(model)
    return stored if stored in (INT8, "bfloat16") else "float32"


def copy_for_export(config: PipelineConfig, model: DeepSeekCausalLM) -> DeepSeekCausalLM:
    """A plain model in `export_weight_dtype(model)`, outside any strategy, with `model`'s
    weights (for eval and export).

    LoRA adapters are merged into their kernels (`trainable.merged_sources`), so the
    copy is a plain model of `config.model`. Call it outside `strategy.scope()`. The
    weights of a distributed model are read from its first local replica (all
    replicas hold the same values).

    Raises:
      ValueError: a weight's shape differs between the two models.
    """
    with weights_from_checkpoint():  # assign_streaming sets every weight (checked)
        fresh = build_model(config, dtype=keras_policy(export_weight_dtype(model)))
        quantization.quantize_like(fresh, model)  # the same int8 projections, if any
    trainable.assign_streaming(fresh, trainable.merged_sources(model))
    return fresh


def to_export_dtype(config: PipelineConfig, model: DeepSeekCausalLM) -> DeepSeekCausalLM:
    """The plain model (`copy_for_export`'s) in `config.train.export_dtype`: itself for
    "auto" or its own precision; quantized in place for "int8"
    (`quantization.quantize_int8`); else copied into a model of that precision, one
    weight at a time.

    Raises:
      ValueError: a float precision asked of an int8 model (LoRA on an int8 base
        exports int8: its base has no float weights to export), naming the field.
    """
    target = config.train.export_dtype
    current = export_weight_dtype(model)
    if target in (AUTO, current):
        return model
    if target == INT8:
        quantization.quantize_int8(model)
        return model
    if current == INT8:
        raise ValueError(f"train.export_dtype={target!r}: the trained model is int8 (LoRA on "
                         "an int8 base), and exports as int8 (set train.export_dtype=auto)")
    with weights_from_checkpoint():  # assign_streaming sets every weight (checked)
        fresh = build_model(config, dtype=keras_policy(target))
    trainable.assign_streaming(fresh, trainable.merged_sources(model))
    return fresh


def copy_to_float32_model(config: PipelineConfig, model: DeepSeekCausalLM) -> DeepSeekCausalLM:
    """A float32 plain model with `model`'s weights (adapters merged), whatever its
    precision: `copy_for_export` into a float32 model.

    Raises:
      ValueError: a weight's shape differs between the two models.
    """
    with weights_from_checkpoint():  # assign_streaming sets every weight (checked)
        fresh = build_model(config, dtype="float32")
    trainable.assign_streaming(fresh, trainable.merged_sources(model))
    return fresh


def build_trained_model(config: PipelineConfig, dtype: str = "float32",
                        int8: bool = False) -> DeepSeekCausalLM:
    """A model shaped as training shapes it (in the run's policy `dtype`, its projections
    int8 when `int8` (an int8 base), LoRA adapters enabled per `config.train`), to read
    a training checkpoint into; `copy_for_export` then merges it."""
    model = build_model(config, dtype=dtype)
    if int8:
        quantization.quantize_int8(model)
    if config.train.lora_rank:
        trainable.prepare(model, config.train)
    return model
