"""Writes a DeepSeekCausalLM as a Hugging Face checkpoint: config.json + safetensors.

  save_hf_checkpoint(model, dir)   sharded when larger than max_shard_bytes, one shard
                                   in memory at a time
  plan_shards(model, limit, size)  the shards' tensor names, from shapes alone
  model_tensors(model)             every tensor of the HF layout (`hf_names`)
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from models.deepseek.hf_config import CONFIG_NAME, config_to_hf
from models.deepseek.hf_names import hf_weight_map, shared_mtp_names, tensor_sort_key
from models.formats.safetensors_reader import write_safetensors_streaming

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # transformers' default max_shard_size ("5GB")


def _sources(model) -> dict[str, tuple]:
    """HF tensor name -> (variable, transpose), the MTP copies of the shared embedding and
    head included (they name the main model's variable)."""
    sources = dict(hf_weight_map(model))
    embed = sources["model.embed_tokens.weight"]
    head = sources.get("lm_head.weight", embed)
    for name in shared_mtp_names(model.config):
        sources[name] = head if name.endswith("shared_head.head.weight") else embed
    return sources


def _hf_tensor(variable, transpose: bool, dtype: tf.DType | None = None) -> tf.Tensor:
    """One tensor in the HF layout ([out, in] for a Keras kernel), cast to `dtype` if given."""
    value = tf.convert_to_tensor(variable)
    if dtype is not None:
        value = tf.cast(value, dtype)
    return tf.transpose(value) if transpose else value


# Written float32 whatever `dtype`: the router bias (DeepSeek's checkpoints store it so; a
# bf16 bias would move the routing) and DeepSeek-V3.2's indexer weights_proj (float32 in
# the model, as transformers keeps it: `DeepseekV32PreTrainedModel._keep_in_fp32_modules`).
FLOAT32_ON_DISK = ("e_score_correction_bias", "indexer.weights_proj.weight")


def _disk_dtype(name: str, dtype: tf.DType) -> tf.DType:
    """`dtype`, except the tensors of `FLOAT32_ON_DISK`: float32 always."""
    return tf.float32 if name.endswith(FLOAT32_ON_DISK) else dtype


def model_tensors(model) -> dict[str, tf.Tensor]:
    """Every tensor of the HF layout, including the MTP copies of the shared embedding/head,
    in the variables' own dtypes. (Builds them all at once: for a whole model on disk use
    `save_hf_checkpoint`, which holds one shard at a time.)"""
    return {name: _hf_tensor(variable, transpose)
            for name, (variable, transpose) in _sources(model).items()}


def plan_shards(model, max_shard_bytes: int, itemsize: int) -> list[list[str]]:
    """The tensor names of each shard, from the variables' shapes alone (no tensor is
    built): names in `tensor_sort_key` order, a new shard whenever the next tensor
    would take the current one past `max_shard_bytes` (a tensor larger than the
    limit gets a shard of its own), as transformers' `save_pretrained` splits.

    Args:
      model: a DeepSeekCausalLM.
      max_shard_bytes: the shard size limit, bytes.
      itemsize: bytes per element on disk (4 float32, 2 bfloat16).
    """
    sources = _sources(model)
    shards: list[list[str]] = [[]]
    size = 0
    for name in sorted(sources, key=tensor_sort_key):
        nbytes = int(np.prod(sources[name][0].shape)) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


def save_hf_checkpoint(model, out_dir: str, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
                       config_form: str = "5.x", dtype: str = "float32") -> list[str]:
    """Writes `config.json` and the weights as safetensors, in transformers' layout.

    Streams: the shards are planned from the variables' shapes (`plan_shards`), then
    each shard's tensors alone are built (transposed to [out, in], cast to `dtype`),
    written and freed before the next, so the memory beyond the model is one shard.
    A bf16 model written with dtype "bfloat16" writes its variables' bytes unchanged.

    Args:
      model: a DeepSeekCausalLM.
      out_dir: created if needed.
      max_shard_bytes: shard size limit; more than one shard also writes
        `model.safetensors.index.json` (as `save_pretrained(max_shard_size=...)`).
      config_form: "5.x" (rope_parameters) or "4.x" (rope_theta + rope_scaling).
      dtype: tensor dtype on disk: "float32" or "bfloat16" (config.json's torch_dtype).

    Returns:
      The safetensors files written.

    Raises:
      ValueError: `dtype` is neither "float32" nor "bfloat16".
    """
    dtypes = {"float32": tf.float32, "bfloat16": tf.bfloat16}
    if dtype not in dtypes:
        raise ValueError(f"dtype={dtype!r}: a HF checkpoint is written as one of {sorted(dtypes)}")
    tf_dtype = dtypes[dtype]
    sources = _sources(model)
    shards = plan_shards(model, max_shard_bytes, tf_dtype.size)
    tf.io.gfile.makedirs(out_dir)
    hf_config = config_to_hf(model.config, config_form)
    hf_config["torch_dtype"] = dtype
    with tf.io.gfile.GFile(os.path.join(out_dir, CONFIG_NAME), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)

    def write(names: list[str], path: str) -> None:
        entries = []
        for name in names:
            variable, transpose = sources[name]
            shape = tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)
            out = _disk_dtype(name, tf_dtype)
            entries.append((name, shape, out.as_numpy_dtype,
                            lambda v=variable, t=transpose, d=out: _hf_tensor(v, t, d).numpy()))
        write_safetensors_streaming(path, entries)  # one tensor in memory at a time

    if len(shards) == 1:
        path = os.path.join(out_dir, SAFE_WEIGHTS_NAME)
        write(shards[0], path)
        return [path]
    files, weight_map = [], {}
    for i, names in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        files.append(os.path.join(out_dir, name))
        write(names, files[-1])
        weight_map.update({tensor: name for tensor in names})
    total = sum(int(np.prod(variable.shape)) * _disk_dtype(name, tf_dtype).size
                for name, (variable, _) in sources.items())
    with tf.io.gfile.GFile(os.path.join(out_dir, SAFE_WEIGHTS_INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)
    return files
