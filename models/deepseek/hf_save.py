"""Writes a DeepSeekCausalLM as a Hugging Face checkpoint: config.json + safetensors.

  save_hf_checkpoint(model, dir)   sharded when larger than max_shard_bytes
  model_tensors(model)             every tensor of the HF layout (`hf_names`)
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from models.deepseek.hf_config import CONFIG_NAME, config_to_hf
from models.deepseek.hf_names import hf_weight_map, shared_mtp_names, tensor_sort_key

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # transformers' default max_shard_size ("5GB")


def model_tensors(model) -> dict[str, tf.Tensor]:
    """Every tensor of the HF layout, including the MTP copies of the shared embedding/head."""
    tensors = {}
    for name, (variable, transpose) in hf_weight_map(model).items():
        value = tf.convert_to_tensor(variable)
        tensors[name] = tf.transpose(value) if transpose else value
    head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    for name in shared_mtp_names(model.config):
        tensors[name] = head if name.endswith("shared_head.head.weight") else tensors[
            "model.embed_tokens.weight"]
    return tensors


def save_hf_checkpoint(model, out_dir: str, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                       config_form: str = "5.x", dtype: str = "float32") -> list[str]:
    """Writes `config.json` and the weights as safetensors, in transformers' layout.

    Args:
      model: a DeepSeekCausalLM.
      out_dir: created if needed.
      max_shard_bytes: shard size limit; more than one shard also writes
        `model.safetensors.index.json` (as `save_pretrained(max_shard_size=...)`).
      config_form: "5.x" (rope_parameters) or "4.x" (rope_theta + rope_scaling).
      dtype: tensor dtype on disk: "float32" or "bfloat16".

    Returns:
      The safetensors files written.
    """
    from safetensors.tensorflow import save_file

    tf_dtype = {"float32": tf.float32, "bfloat16": tf.bfloat16}[dtype]
    tensors = {k: tf.cast(v, tf_dtype) for k, v in model_tensors(model).items()}
    shards: list[dict[str, tf.Tensor]] = [{}]
    size = 0
    for name in sorted(tensors, key=tensor_sort_key):
        nbytes = int(np.prod(tensors[name].shape)) * tf_dtype.size
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensors[name]
        size += nbytes
    tf.io.gfile.makedirs(out_dir)
    hf_config = config_to_hf(model.config, config_form)
    hf_config["torch_dtype"] = dtype
    with tf.io.gfile.GFile(os.path.join(out_dir, CONFIG_NAME), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    files = []
    if len(shards) == 1:
        files.append(os.path.join(out_dir, SAFE_WEIGHTS_NAME))
        save_file(shards[0], files[0], metadata={"format": "pt"})
        return files
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        files.append(os.path.join(out_dir, name))
        save_file(shard, files[-1], metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in shard})
    total = sum(int(np.prod(t.shape)) * tf_dtype.size for t in tensors.values())
    with tf.io.gfile.GFile(os.path.join(out_dir, SAFE_WEIGHTS_INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)
    return files
