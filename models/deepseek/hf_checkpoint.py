"""Hugging Face DeepSeek-V3 checkpoints: `config.json` + `*.safetensors`, both ways.

  load_hf_checkpoint(dir)            -> DeepSeekCausalLM with the checkpoint's weights
  save_hf_checkpoint(model, dir)     writes config.json + safetensors (sharded when large)
  config_from_hf(dict) / config_to_hf(config)

The layout is that of HF transformers `DeepseekV3ForCausalLM` (`model.embed_tokens`,
`model.layers.N.{self_attn,mlp,input_layernorm,post_attention_layernorm}`,
`model.norm`, `lm_head`) and of the released DeepSeek-V3 weights, whose
multi-token-prediction modules sit at layer index `num_hidden_layers + d`
(`enorm`, `hnorm`, `eh_proj`, `shared_head.norm`, `shared_head.head`,
`embed_tokens`, plus a full decoder block). Linear weights are PyTorch's
[out, in]; Keras kernels are [in, out], so they are transposed both ways.

`config.json` is read in both forms transformers writes: 4.x (`rope_theta`,
`rope_scaling`, as the released checkpoints carry) and 5.x (`rope_parameters`).

Tensors are read and written with the `safetensors` library's TensorFlow
backend (no torch): float32, bfloat16 and float16 checkpoints load; FP8
checkpoints (`quantization_config`) must be dequantized first.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from common.json_file import read_json
from models.deepseek.hf_config import (
    CONFIG_NAME,
    CheckpointError,
    config_from_hf,
    config_to_hf,
    read_config_json,
)
from models.deepseek.hf_names import hf_weight_map, shared_mtp_names
from models.deepseek.hf_save import (
    DEFAULT_MAX_SHARD_BYTES,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    model_tensors,
    save_hf_checkpoint,
)

__all__ = [
    "CONFIG_NAME", "CheckpointError", "config_from_hf", "config_to_hf", "read_config_json",
    "hf_weight_map", "checkpoint_files", "iter_tensors", "load_hf_checkpoint",
    "model_tensors", "save_hf_checkpoint", "DEFAULT_MAX_SHARD_BYTES",
]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- reading


def checkpoint_files(checkpoint_dir: str) -> list[str]:
    """The safetensors files of a checkpoint (the index's shards, or the one file).

    Raises:
      FileNotFoundError: neither `model.safetensors.index.json` nor
        `model.safetensors` (nor any `*.safetensors`) is there.
    """
    index = os.path.join(checkpoint_dir, SAFE_WEIGHTS_INDEX_NAME)
    if tf.io.gfile.exists(index):
        weight_map = read_json(index, "the safetensors index")["weight_map"]
        return [os.path.join(checkpoint_dir, name) for name in sorted(set(weight_map.values()))]
    single = os.path.join(checkpoint_dir, SAFE_WEIGHTS_NAME)
    if tf.io.gfile.exists(single):
        return [single]
    files = sorted(tf.io.gfile.glob(os.path.join(checkpoint_dir, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"{checkpoint_dir}: no *.safetensors files")
    return files


def iter_tensors(checkpoint_dir: str) -> Iterator[tuple[str, str, tf.Tensor]]:
    """Yields (file, tensor name, tf.Tensor) for every tensor, one at a time."""
    from safetensors import safe_open

    for path in checkpoint_files(checkpoint_dir):
        with safe_open(path, framework="tf") as f:
            for name in f.keys():
                yield path, name, f.get_tensor(name)


def load_hf_checkpoint(checkpoint_dir: str, dtype: str = "float32"):
    """Builds a DeepSeekCausalLM from a HF DeepSeek-V3 checkpoint directory.

    Args:
      checkpoint_dir: holds `config.json` and `model.safetensors` or sharded
        `model-XXXXX-of-YYYYY.safetensors` with `model.safetensors.index.json`.
        MTP weights (layer index num_hidden_layers + d) load into the MTP modules.
      dtype: the Keras dtype policy of the model ("float32", "mixed_bfloat16", ...).

    Returns:
      The model, every weight assigned from the checkpoint.

    Raises:
      FileNotFoundError: no config.json or no safetensors files.
      CheckpointError: a model weight is missing from the checkpoint, a tensor's
        shape is wrong, or the checkpoint has tensors the model has no place for
        (each names the tensors and files).
    """
    from models.deepseek.causal_lm import DeepSeekCausalLM

    config = read_config_json(checkpoint_dir)
    model = DeepSeekCausalLM(config, dtype=dtype)
    weight_map = hf_weight_map(model)
    shared_copies = set(shared_mtp_names(config))
    ignored_suffixes = ("rotary_emb.inv_freq",)
    assigned, unexpected, head_copies = set(), [], {}
    for path, name, tensor in iter_tensors(checkpoint_dir):
        if name in shared_copies:
            head_copies[name] = tensor
            continue
        if name.endswith(ignored_suffixes):
            continue
        if name not in weight_map:
            unexpected.append(f"{name} ({os.path.basename(path)})")
            continue
        variable, transpose = weight_map[name]
        value = tf.cast(tensor, variable.dtype)
        if transpose:
            value = tf.transpose(value)
        if tuple(value.shape) != tuple(variable.shape):
            shape = tuple(tensor.shape)
            raise CheckpointError(
                f"{os.path.basename(path)}: tensor {name} has shape {shape}, expected "
                f"{tuple(variable.shape[::-1]) if transpose else tuple(variable.shape)}")
        variable.assign(value)
        assigned.add(name)
    if unexpected:
        raise CheckpointError(
            f"{checkpoint_dir}: {len(unexpected)} tensors have no place in the model "
            f"(config.json disagrees with the weights?): {unexpected[:10]}")
    missing = sorted(set(weight_map) - assigned)
    if missing:
        raise CheckpointError(
            f"{checkpoint_dir}: {len(missing)} model weights are missing from the checkpoint: "
            f"{missing[:10]}")
    _check_shared_copies(model, head_copies)
    return model


def _check_shared_copies(model, copies: dict[str, tf.Tensor]) -> None:
    """MTP embed/head copies are not loaded (the main model's are shared); say so if they differ."""
    main_head = model.embed_tokens.embeddings if model.lm_head is None else tf.transpose(
        model.lm_head.kernel)
    for name, tensor in copies.items():
        main = model.embed_tokens.embeddings if name.endswith("embed_tokens.weight") else main_head
        if tuple(tensor.shape) != tuple(main.shape) or not np.allclose(
                tf.cast(tensor, tf.float32).numpy(), tf.cast(main, tf.float32).numpy()):
            log.warning("%s differs from the main model's tensor; the MTP module uses the "
                        "shared main-model weights (DeepSeek-V3 §2.2)", name)
