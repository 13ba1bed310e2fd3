"""The models around a training run: the one it trains, the one a checkpoint is read
into, and the float32 copy that leaves training (evaluated and exported by `run_fn`).

A trained model may be in a mixed-precision policy, hold LoRA adapters and have
its variables on a distribution strategy's devices; the copy that leaves is a
plain float32 `DeepSeekCausalLM` of `config.model` on no strategy, with the
adapters merged into their kernels (W + A B).
"""

from __future__ import annotations

from components.trainer import trainable
from config import PipelineConfig
from models.deepseek import DeepSeekCausalLM


def build_model(config: PipelineConfig, dtype: str = "float32") -> DeepSeekCausalLM:
    """`config.model` with its weights created (the constructor builds them), in the
    Keras dtype policy `dtype` ("float32", "mixed_bfloat16", "mixed_float16")."""
    return DeepSeekCausalLM(config.model, dtype=dtype)


def copy_to_float32_model(config: PipelineConfig, model: DeepSeekCausalLM) -> DeepSeekCausalLM:
    """A float32 model, outside any strategy, with `model`'s weights (for eval and export).

    LoRA adapters are merged into their kernels (`trainable.merged_values`), so the
    copy is a plain model of `config.model`. Call it outside `strategy.scope()`. The
    weights of a distributed model are read from its first local replica (all
    replicas hold the same values).

    Raises:
      ValueError: a weight's shape differs between the two models.
    """
    fresh = build_model(config, dtype="float32")
    trainable.assign_by_path(fresh, trainable.merged_values(model))
    return fresh


def build_trained_model(config: PipelineConfig) -> DeepSeekCausalLM:
    """A float32 model shaped as training shapes it (LoRA adapters enabled per
    `config.train`), to read a training checkpoint into; `copy_to_float32_model`
    then merges it."""
    model = build_model(config, dtype="float32")
    if config.train.lora_rank:
        trainable.prepare(model, config.train)
    return model
