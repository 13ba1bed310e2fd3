"""The models around a training run: the one it trains, the one a checkpoint is read
into, and the copy that leaves training (evaluated and exported by `run_fn`).

A trained model may be in a mixed-precision policy, hold LoRA adapters and have
its variables on a distribution strategy's devices; the copy that leaves is a
plain `DeepSeekCausalLM` of `config.model` on no strategy, with the adapters merged
into their kernels (W + A B), in `export_weight_dtype`: bfloat16 when the trained
model's variables are bf16 (LoRA on a bf16 base: the export stays bf16), else
float32. Weights are copied one at a time (`trainable.assign_streaming`): the
memory beyond the two models is one weight.
"""

from __future__ import annotations

from components.trainer import trainable
from config import PipelineConfig
from models.deepseek import DeepSeekCausalLM
from models.deepseek.initializers import weights_from_checkpoint
from savedmodel.precision import keras_policy, weight_dtype_of


def build_model(config: PipelineConfig, dtype: str = "float32") -> DeepSeekCausalLM:
    """`config.model` with its weights created (the constructor builds them), in the
    Keras dtype policy `dtype` ("float32", "bfloat16", "mixed_bfloat16", "mixed_float16")."""
    return DeepSeekCausalLM(config.model, dtype=dtype)


def export_weight_dtype(model: DeepSeekCausalLM) -> str:
    """"bfloat16" for a model with bf16 variables (its frozen base), else "float32"
    (float32 master weights, mixed policies included)."""
    return "bfloat16" if weight_dtype_of(model) == "bfloat16" else "float32"


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


def build_trained_model(config: PipelineConfig, dtype: str = "float32") -> DeepSeekCausalLM:
    """A model shaped as training shapes it (in the run's policy `dtype`, LoRA adapters
    enabled per `config.train`), to read a training checkpoint into; `copy_for_export`
    then merges it."""
    model = build_model(config, dtype=dtype)
    if config.train.lora_rank:
        trainable.prepare(model, config.train)
    return model
