"""Reading and writing DeepSeek-V4 checkpoints: `config.json` + `*.safetensors`.

  open_v4_checkpoint(dir)            -> every header and the tid2eid tables checked, no model
  load_v4_checkpoint(dir, dtype)     -> DeepSeekV4CausalLM with the checkpoint's weights
  save_hf_checkpoint(model, dir)     -> config.json + safetensors in transformers'
                                        save_pretrained names (`from_pretrained` loads it)

Both name forms load (`hf_names.py`: transformers' save_pretrained names, DeepSeek's
release names; the release's `mtp.*` tensors are skipped, as transformers does).
Tensors stream one at a time (`safetensors_reader`), converted by
`models.formats.fp8.read_dequantized`: BF16 / F16 / F32 as stored, FP8 weights with
their block scales and MXFP4 routed experts dequantized (config.json
`quantization_config` / `expert_dtype`, `fp8.quantization_from_hf`); headers are checked
against the config first with `fp8.check_weight`. `tid2eid` tables (I64) are checked to
hold, per row, num_experts_per_tok distinct experts in [0, n_routed_experts).
"""

from __future__ import annotations

import json
import os
import stat

import ml_dtypes
import numpy as np
import tensorflow as tf

from common import memory
from common.json_file import read_json
from models.deepseek_v4.hf_config import CONFIG_NAME, config_from_hf, config_to_hf
from models.deepseek_v4.hf_names import (
    GroupedKernel,
    detect_form,
    expected_hf_shapes,
    hf_weight_map,
    release_aliases,
    tensor_sort_key,
)
from models.formats import fp8, safetensors_reader
from models.formats.checkpoint_error import CheckpointError
from models.formats.tensor_assign import ASSIGN_BLOCK_BYTES, QUANTIZED_DTYPES, assign_tensor
from models.layers import initializers

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # transformers' default max_shard_size ("5GB")
MAX_CONFIG_BYTES = 16 * 1024 * 1024
# Upper bounds on config.json values, checked before anything is sized from them.
CONFIG_LIMITS = {
    "vocab_size": 1 << 22, "hidden_size": 1 << 16, "moe_intermediate_size": 1 << 18,
    "num_hidden_layers": 1024, "num_attention_heads": 1024, "head_dim": 1 << 14,
    "q_lora_rank": 1 << 16, "n_routed_experts": 4096, "hc_mult": 64, "o_lora_rank": 1 << 16,
    "index_n_heads": 1024, "index_head_dim": 1 << 14, "max_position_embeddings": 1 << 24,
}
# Tensors transformers keeps in float32 (`_keep_in_fp32_modules_strict`): written float32
# even when the rest is bfloat16.
_FLOAT32_MARKERS = ("hc_", "norm.weight", "attn_sink", ".ape", "gate.bias")
_SKIPPED_PREFIXES = ("mtp.", "model.mtp.")  # the release's MTP module (not built)


class CheckedV4Checkpoint:
    """A checkpoint whose headers agree with its config.json (`open_v4_checkpoint`).

    Attributes:
      config: the DeepSeekV4Config of config.json.
      quantization: `fp8.Fp8Quantization` or None.
      files: the `safetensors_reader.Checkpoint` (headers, lazy reads).
      form: "transformers" or "release" (tensor names).
      shapes: {name: logical shape} of every model weight (`expected_hf_shapes`).
      stored: {name: the checkpoint's name for it} (a `hf_names.release_aliases`
        spelling, or the name itself).
    """

    def __init__(self, config, quantization, files, form, shapes, stored):
        self.config = config
        self.quantization = quantization
        self.files = files
        self.form = form
        self.shapes = shapes
        self.stored = stored

    def read(self, name: str, dtype=np.float32) -> np.ndarray:
        """Model weight `name` as an array: `tid2eid` int32, anything else float (`dtype`)
        dequantized as needed (`fp8.read_dequantized`)."""
        name = self.stored[name]
        if name.endswith("tid2eid"):
            return self.files.read(name).astype(np.int32)
        return fp8.read_dequantized(self.files, name, self.quantization, dtype)

    def read_float(self, name: str) -> np.ndarray:
        """`read` in float32 (tid2eid int32): what `tensor_assign.assign_tensor` reads."""
        return self.read(name)


def _read_config_dict(checkpoint_dir: str) -> dict:
    path = os.path.join(checkpoint_dir, CONFIG_NAME)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no config.json (is this a checkpoint directory?)")
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path}: not a regular file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{path}: {st.st_size} bytes, too large for a config.json")
    return read_json(path, "the checkpoint's config.json")


def check_tid2eid(name: str, table: np.ndarray, n_routed_experts: int) -> None:
    """Every row of a hash-routing table holds distinct experts in [0, n_routed_experts).

    Raises:
      CheckpointError: naming the tensor, the first bad row and its values.
    """
    bad = np.flatnonzero(((table < 0) | (table >= n_routed_experts)).any(axis=1))
    if bad.size:
        row = int(bad[0])
        raise CheckpointError(f"{name}: row {row} (token id {row}) has experts "
                              f"{table[row].tolist()} outside [0, {n_routed_experts})")
    ordered = np.sort(table, axis=1)
    repeated = np.flatnonzero((ordered[:, 1:] == ordered[:, :-1]).any(axis=1))
    if repeated.size:
        row = int(repeated[0])
        raise CheckpointError(f"{name}: row {row} (token id {row}) repeats an expert: "
                              f"{table[row].tolist()}")


def open_v4_checkpoint(checkpoint_dir: str) -> CheckedV4Checkpoint:
    """Reads config.json and the safetensors headers and checks that they agree; reads no
    tensor but the (small) tid2eid tables, builds no model.

    Raises:
      FileNotFoundError: no config.json or no safetensors files.
      CheckpointError: a config this model does not implement (`config_from_hf`), a value
        above `CONFIG_LIMITS`, a bad quantization_config, a missing, misshapen or
        wrongly typed tensor or scale (`fp8.check_weight`), a bad tid2eid table, or a
        tensor with no place in the model; one line naming the key, file or tensor.
    """
    raw = _read_config_dict(checkpoint_dir)
    config = config_from_hf(raw)
    for key, limit in CONFIG_LIMITS.items():
        if getattr(config, key) > limit:
            raise CheckpointError(f"config.json {key}={getattr(config, key)} is above {limit}, "
                                  "the largest this importer accepts")
    quant = fp8.quantization_from_hf(raw)
    files = safetensors_reader.open_checkpoint(checkpoint_dir)
    tensors = files.tensors
    form = detect_form(tensors)
    shapes = expected_hf_shapes(config, form)
    stored = {}
    for name in shapes:
        found = [n for n in (name, *release_aliases(name)) if n in tensors]
        if len(found) > 1:
            raise CheckpointError(f"{checkpoint_dir}: both {found[0]} and {found[1]} are in the "
                                  "checkpoint; they are the same weight")
        stored[name] = found[0] if found else None
    missing = sorted((n for n, s in stored.items() if s is None), key=tensor_sort_key)
    if missing:
        raise CheckpointError(f"{checkpoint_dir}: {len(missing)} model weights ({form} names) "
                              f"are missing from the checkpoint: {missing[:10]}")
    allowed = set(stored.values())
    for model_name in sorted(shapes, key=tensor_sort_key):
        name = stored[model_name]
        if name.endswith("tid2eid"):
            info = tensors[name]
            if info.dtype != "I64" or info.shape != shapes[model_name]:
                raise CheckpointError(
                    f"{info.file}: tensor {name} is {info.dtype} {info.shape}, expected I64 "
                    f"{shapes[model_name]} (vocab_size, num_experts_per_tok)")
            check_tid2eid(name, files.read(name), config.n_routed_experts)
            continue
        scale = fp8.check_weight(tensors, name, shapes[model_name], quant,
                                 routed_expert=fp8.is_routed_expert(name))
        if scale is not None:
            allowed.add(scale)
    unexpected = [f"{n} ({i.file})" for n, i in sorted(tensors.items())
                  if n not in allowed and not n.startswith(_SKIPPED_PREFIXES)
                  and not n.endswith("inv_freq")]
    if unexpected:
        raise CheckpointError(f"{checkpoint_dir}: {len(unexpected)} tensors have no place in the "
                              f"model (config.json disagrees with the weights?): "
                              f"{unexpected[:10]}")
    return CheckedV4Checkpoint(config, quant, files, form, shapes, stored)


def load_v4_checkpoint(checkpoint_dir: str, dtype: str = "float32"):
    """Builds a DeepSeekV4CausalLM from a DeepSeek-V4 checkpoint directory.

    The directory is checked first (`open_v4_checkpoint`); the model is then built
    without drawing initial values and every weight streamed in, one tensor at a time
    (Dense kernels transposed from [out, in]; quantized weights dequantized to float32).

    Args:
      checkpoint_dir: config.json plus model.safetensors or shards with an index.
      dtype: the Keras dtype policy of the model ("float32", "bfloat16", ...).

    Returns:
      The model, every weight assigned.

    Raises:
      FileNotFoundError, CheckpointError: see `open_v4_checkpoint`.
    """
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM

    checked = open_v4_checkpoint(checkpoint_dir)
    with initializers.weights_from_checkpoint():  # every weight is assigned below
        model = DeepSeekV4CausalLM(checked.config, dtype=dtype)
    weight_map = hf_weight_map(model, checked.form)
    if set(weight_map) != set(checked.shapes):  # expected_hf_shapes out of step with the model
        raise RuntimeError("expected_hf_shapes and hf_weight_map disagree on "
                           f"{sorted(set(weight_map) ^ set(checked.shapes))[:10]}")
    infos = {name: checked.files.tensors[checked.stored[name]] for name in weight_map}
    for name in sorted(weight_map, key=lambda n: (infos[n].path, infos[n].offset)):
        variable, transpose = weight_map[name]
        if isinstance(variable, GroupedKernel):
            _assign_grouped(checked, name, variable)
            continue
        # Unquantized tensors above 64 MiB go in row blocks, in place (as V3's loader).
        assign_tensor(checked, name, variable, transpose, stored=checked.stored[name])
    memory.release_free_memory()  # the loader's freed temporaries (common/memory.py)
    return model


def _assign_grouped(checked, name: str, view: GroupedKernel) -> None:
    """`wo_a` [g*R, H*D/g] into the `o_a_proj` kernel (g, H*D/g, R) behind `view`: an
    unquantized tensor above `ASSIGN_BLOCK_BYTES` one group (R rows) at a time, in place
    (as `assign_tensor`'s row blocks), anything else read whole (FP8 dequantized)."""
    stored = checked.stored[name]
    info = checked.files.info(stored)
    if info.dtype in QUANTIZED_DTYPES or info.nbytes <= ASSIGN_BLOCK_BYTES:
        value = checked.read_float(name).astype(np.float32, copy=False)  # (g*R, H*D/g)
        view.assign(value.T)  # (H*D/g, g*R)
        return
    for group in range(view.groups):
        rows = (group * view.rank, (group + 1) * view.rank)
        block = checked.files.read(stored, rows).astype(np.float32)  # (R, H*D/g)
        view.assign_group(group, block.T)  # (H*D/g, R)


def _disk_dtype(name: str, variable, dtype: str) -> np.dtype:
    """The numpy dtype `name` is written in: int64 for tid2eid, float32 for what transformers
    keeps in float32, else `dtype`."""
    if name.endswith("tid2eid"):
        return np.dtype(np.int64)
    if dtype == "float32" or any(marker in name for marker in _FLOAT32_MARKERS):
        return np.dtype(np.float32)
    return np.dtype(ml_dtypes.bfloat16)


def _disk_value(variable, transpose: bool, np_dtype: np.dtype) -> np.ndarray:
    value = tf.convert_to_tensor(variable)
    value = tf.transpose(value) if transpose else value
    return np.asarray(value.numpy()).astype(np_dtype)


def save_hf_checkpoint(model, out_dir: str, dtype: str = "float32",
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Writes config.json and the weights in transformers' save_pretrained names, so
    `DeepseekV4ForCausalLM.from_pretrained(out_dir)` loads it (and `load_v4_checkpoint`).

    Streams: each shard's tensors are made one at a time while it is written.

    Args:
      model: a DeepSeekV4CausalLM.
      out_dir: created if needed.
      dtype: "float32" or "bfloat16" for the weights (the norms, mHC, sinks, compressor
        position biases and router biases stay float32, as transformers keeps them;
        `tid2eid` is int64).
      max_shard_bytes: shard size limit; more than one shard also writes the index.

    Returns:
      The safetensors files written.

    Raises:
      ValueError: another dtype.
    """
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype={dtype!r}: write 'float32' or 'bfloat16'")
    sources = hf_weight_map(model, "transformers")
    entries = []  # (name, shape, numpy dtype, make)
    for name in sorted(sources, key=tensor_sort_key):
        variable, transpose = sources[name]
        shape = tuple(variable.shape)[::-1] if transpose else tuple(variable.shape)
        np_dtype = _disk_dtype(name, variable, dtype)
        entries.append((name, shape, np_dtype,
                        lambda v=variable, t=transpose, d=np_dtype: _disk_value(v, t, d)))
    shards, size = [[]], 0
    for entry in entries:
        nbytes = int(np.prod(entry[1], dtype=np.int64)) * entry[2].itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards, size = [*shards, []], 0
        shards[-1].append(entry)
        size += nbytes

    os.makedirs(out_dir, exist_ok=True)
    hf_config = config_to_hf(model.config)
    hf_config["dtype"] = dtype
    with open(os.path.join(out_dir, CONFIG_NAME), "w") as f:
        json.dump(hf_config, f, indent=2, sort_keys=True)
    if len(shards) == 1:
        path = os.path.join(out_dir, SAFE_WEIGHTS_NAME)
        safetensors_reader.write_safetensors_streaming(path, shards[0])
        return [path]
    files, weight_map = [], {}
    for i, shard in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        files.append(os.path.join(out_dir, file))
        safetensors_reader.write_safetensors_streaming(files[-1], shard)
        weight_map.update({entry[0]: file for entry in shard})
    total = sum(int(np.prod(e[1], dtype=np.int64)) * e[2].itemsize for e in entries)
    with open(os.path.join(out_dir, SAFE_WEIGHTS_INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2,
                  sort_keys=True)
    return files
