"""Reading Hugging Face DeepSeek-V3 / V3.2 / V2 checkpoints: `config.json` + `*.safetensors`.

  open_hf_checkpoint(dir)            -> everything checked, nothing allocated
  load_hf_checkpoint(dir, dtype)     -> DeepSeekCausalLM with the checkpoint's weights
  stored_precision(dir)              -> "bfloat16" | "float16" | "float32", from the headers

The tensor names and layouts are `hf_names.py`'s; config.json is read by `hf_config.py`;
writing is `hf_save.py` (`save_hf_checkpoint`, re-exported here with the config helpers).
Tensors are read by `safetensors_reader` (headers parsed and checked, bytes read into
numpy arrays with `ml_dtypes` types): float32, float16, bfloat16 and block-quantized
FP8 checkpoints (`quantization_config`, `fp8.py`) load, the directory checked against
config.json before the model is built.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import re
import stat

import numpy as np

from common import memory
from common.json_file import read_json
from models.deepseek.hf_config import (
    CONFIG_NAME,
    CheckpointError,
    config_from_hf,
    config_to_hf,
    read_config_json,
)
from models.deepseek.hf_names import (
    expected_hf_shapes,
    hf_weight_map,
    shared_mtp_names,
    stored_variable,
)
from models.deepseek.hf_save import (
    DEFAULT_MAX_SHARD_BYTES,
    model_tensors,
    save_hf_checkpoint,
)
from models.formats import fp8, safetensors_reader
from models.formats.tensor_assign import assign_tensor
from models.layers import initializers

__all__ = [
    "CONFIG_NAME", "CheckpointError", "config_from_hf", "config_to_hf", "read_config_json",
    "hf_weight_map", "stored_variable", "checkpoint_files", "load_hf_checkpoint",
    "open_hf_checkpoint", "stored_precision", "CheckedCheckpoint",
    "model_tensors", "save_hf_checkpoint", "DEFAULT_MAX_SHARD_BYTES",
]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- reading

# Upper bounds on config.json values, checked before anything is sized from them.
# Far above every released DeepSeek model (V3: vocab 129280, hidden 7168, 61 layers,
# 256 experts, 128 heads, 163840 positions); a value above is refused by name.
CONFIG_LIMITS = {
    "vocab_size": 1 << 22, "hidden_size": 1 << 16, "intermediate_size": 1 << 18,
    "moe_intermediate_size": 1 << 18, "num_hidden_layers": 1024, "num_attention_heads": 1024,
    "q_lora_rank": 1 << 16, "kv_lora_rank": 1 << 16, "qk_nope_head_dim": 4096,
    "qk_rope_head_dim": 4096, "v_head_dim": 4096, "n_routed_experts": 4096,
    "n_shared_experts": 256, "num_nextn_predict_layers": 16,
    "max_position_embeddings": 1 << 24,
    # DeepSeek Sparse Attention (V3.2: 2048, 64, 128)
    "index_topk": 1 << 24, "index_n_heads": 1024, "index_head_dim": 4096,
}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# The dtypes a V2/V3/V3.2 weight may be stored in (FP8 with its float32 scale).
WEIGHT_DTYPES = ("F32", "F16", "BF16", "F8_E4M3")
_PRECISIONS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "bfloat16"}


@dataclasses.dataclass
class CheckedCheckpoint:
    """A checkpoint whose headers agree with its config.json (`open_hf_checkpoint`).

    Attributes:
      config: the DeepSeekConfig of config.json.
      quantization: the FP8 quantization_config, or None.
      files: the Checkpoint (headers, lazy reads).
      shapes: {HF name: stored shape} of every model weight (`expected_hf_shapes`).
      shared_copies: MTP embed/head copies present in the checkpoint (not loaded).
    """

    config: object
    quantization: fp8.Fp8Quantization | None
    files: safetensors_reader.Checkpoint
    shapes: dict[str, tuple[int, ...]]
    shared_copies: list[str]

    def read_float(self, name: str) -> np.ndarray:
        """One tensor as stored, FP8 weights dequantized to float32 (scale found through
        the index, in whatever shard). Raises CheckpointError on bad scales."""
        info = self.files.info(name)
        value = self.files.read(name)
        if info.dtype == "F8_E4M3":
            scale = self.files.read(fp8.scale_name(name))
            value = fp8.dequantize(value, scale, self.quantization, name)
        return value


def _read_config_dict(checkpoint_dir: str) -> dict:
    path = os.path.join(checkpoint_dir, CONFIG_NAME)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no config.json (is this a HF checkpoint directory?)")
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise CheckpointError(f"{path}: not a regular file")
    if st.st_size > 16 * 1024 * 1024:
        raise CheckpointError(f"{path}: {st.st_size} bytes, too large for a config.json")
    return read_json(path, "the checkpoint's config.json")


def check_config_limits(config) -> None:
    """Refuses config values above `CONFIG_LIMITS` (naming the key, value and limit).

    Raises:
      CheckpointError.
    """
    for key, limit in CONFIG_LIMITS.items():
        value = getattr(config, key, None)
        if isinstance(value, int) and value > limit:
            raise CheckpointError(
                f"config.json {key}={value} is above {limit}, the largest this importer accepts")


def _indices(names, pattern: re.Pattern) -> set[int]:
    return {int(m.group(1)) for n in names if (m := pattern.match(n))}


def _check_counts(config, names) -> None:
    """Layer and expert counts of config.json against the tensor names: a config that
    wants more than the checkpoint has is refused here, before the per-tensor check
    builds a name for each of them (more tensors than the config wants are named by
    `open_hf_checkpoint` as having no place)."""
    layers = _indices(names, re.compile(r"model\.layers\.(\d+)\."))
    want = config.num_hidden_layers + config.num_nextn_predict_layers
    have = max(layers) + 1 if layers else 0
    if want > have:
        raise CheckpointError(
            f"config.json num_hidden_layers={config.num_hidden_layers} + "
            f"num_nextn_predict_layers={config.num_nextn_predict_layers} = {want} layers, but "
            f"the checkpoint's tensors have {have} (model.layers.0..{have - 1})")
    experts = _indices(names, re.compile(r"model\.layers\.\d+\.mlp\.experts\.(\d+)\."))
    have = max(experts) + 1 if experts else 0
    if experts and config.n_routed_experts > have:
        raise CheckpointError(
            f"config.json n_routed_experts={config.n_routed_experts}, but the checkpoint has "
            f"experts 0..{have - 1}")


def _shape_hint(name: str, config) -> str:
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        return f" (config.json vocab_size={config.vocab_size}, hidden_size={config.hidden_size})"
    return " (from config.json)"


def open_hf_checkpoint(checkpoint_dir: str) -> CheckedCheckpoint:
    """Reads config.json and the safetensors headers and checks that they agree, reading
    no tensor and building no model.

    Checks, in order: config.json (a regular file; `quantization_config`,
    `CONFIG_LIMITS`); the files (`safetensors_reader.open_checkpoint`: paths inside
    the directory, regular files, headers within their files, index = headers); the
    layer and expert counts; every expected tensor present with its shape
    (`expected_hf_shapes`); FP8 weights each with a float32 `weight_scale_inv` of
    the block grid's shape, and a quantization_config; no tensor without a place.

    Raises:
      FileNotFoundError: no config.json, no safetensors, or a shard named by the
        index is absent.
      CheckpointError: any other disagreement, one line naming the file, key or
        tensor (and both shapes for a wrong shape).
    """
    raw = _read_config_dict(checkpoint_dir)
    quant = fp8.quantization_from_hf(raw)
    config = config_from_hf(raw)
    check_config_limits(config)
    files = safetensors_reader.open_checkpoint(checkpoint_dir)
    names = files.tensors
    _check_counts(config, names)
    shapes = expected_hf_shapes(config)
    shared = [n for n in shared_mtp_names(config) if n in names]
    allowed = set(shapes) | set(shared)
    for name in [*shapes, *shared]:
        if name not in names:
            continue
        info = names[name]
        expected = shapes.get(name, (config.vocab_size, config.hidden_size))
        if info.shape != expected:
            raise CheckpointError(
                f"{info.file}: tensor {name} has shape {info.shape}, expected {expected}"
                f"{_shape_hint(name, config)}")
        if info.dtype not in WEIGHT_DTYPES:  # the reader also knows I8, I64, F8_E8M0 (V4)
            raise CheckpointError(
                f"{info.file}: tensor {name} has dtype {info.dtype}, expected one of "
                f"{list(WEIGHT_DTYPES)}")
        if info.dtype == "F8_E4M3":
            if quant is None:
                raise CheckpointError(
                    f"{info.file}: tensor {name} is float8_e4m3fn, but config.json has no "
                    "quantization_config")
            scale = fp8.scale_name(name)
            if scale not in names:
                raise CheckpointError(
                    f"{info.file}: FP8 tensor {name} has no scale {scale} in the checkpoint")
            s = names[scale]
            fp8.check_scale_header(name, info.shape, s.dtype, s.shape, quant, s.file)
            allowed.add(scale)
    missing = sorted(set(shapes) - set(names))
    if missing:
        raise CheckpointError(
            f"{checkpoint_dir}: {len(missing)} model weights are missing from the checkpoint: "
            f"{missing[:10]}")
    unexpected = [f"{n} ({i.file})" for n, i in sorted(names.items())
                  if n not in allowed and not n.endswith(_IGNORED_SUFFIXES)]
    if unexpected:
        raise CheckpointError(
            f"{checkpoint_dir}: {len(unexpected)} tensors have no place in the model "
            f"(config.json disagrees with the weights?): {unexpected[:10]}")
    return CheckedCheckpoint(config, quant, files, shapes, shared)


def checkpoint_files(checkpoint_dir: str) -> list[str]:
    """The safetensors files of a checkpoint (the index's shards, or the one file), checked
    as `safetensors_reader.open_checkpoint` does.

    Raises:
      FileNotFoundError: no safetensors files, or a shard named by the index is absent.
      CheckpointError: see `safetensors_reader.open_checkpoint`.
    """
    return safetensors_reader.open_checkpoint(checkpoint_dir).files


def stored_precision(checkpoint_dir: str) -> str:
    """The precision the checkpoint's linear weights are stored in, from the headers alone.

    Returns:
      "bfloat16" (BF16, and FP8 checkpoints, which dequantize to bfloat16), "float16"
      or "float32": that of the 2-D `*_proj.weight` tensors (the most common dtype
      among them; FP8 wins if any is FP8), else of all 2-D weights.

    Raises:
      FileNotFoundError, CheckpointError: see `safetensors_reader.open_checkpoint`.
    """
    tensors = safetensors_reader.open_checkpoint(checkpoint_dir).tensors
    dtypes = [i.dtype for n, i in tensors.items() if n.endswith("_proj.weight")
              and len(i.shape) == 2] or [i.dtype for i in tensors.values() if len(i.shape) == 2]
    if not dtypes:
        raise CheckpointError(f"{checkpoint_dir}: no 2-D weights in the checkpoint")
    if "F8_E4M3" in dtypes:
        return "bfloat16"
    return _PRECISIONS[collections.Counter(dtypes).most_common(1)[0][0]]


def load_hf_checkpoint(checkpoint_dir: str, dtype: str = "float32"):
    """Builds a DeepSeekCausalLM from a HF DeepSeek-V3 checkpoint directory.

    The directory is checked before the model is built (`open_hf_checkpoint`):
    a config far larger than its weights, a path outside the directory, a FIFO
    or a short file fails in seconds, having allocated nothing. Tensors then
    stream one at a time from their files into the model's variables (Dense
    kernels transposed from [out, in] to [in, out]; FP8 weights dequantized
    block by block to float32, then cast to the variables' dtype): peak memory
    is the model in its variables' dtype plus about one tensor.

    Args:
      checkpoint_dir: holds `config.json` and `model.safetensors` or sharded
        `model-XXXXX-of-YYYYY.safetensors` with `model.safetensors.index.json`;
        float32, float16, bfloat16 or block-quantized FP8 (`quantization_config`,
        see `models/formats/fp8.py`). MTP weights (layer index num_hidden_layers
        + d) load into the MTP modules; their `embed_tokens` / `shared_head.head`
        copies are not loaded (the main model's are shared, DeepSeek-V3 §2.2), with
        a warning if they differ from the main tensors.
      dtype: the Keras dtype policy of the model ("float32", "bfloat16",
        "mixed_bfloat16", ...).

    Returns:
      The model, every weight assigned from the checkpoint.

    Raises:
      FileNotFoundError: no config.json, no safetensors files, or an absent shard.
      CheckpointError: see `open_hf_checkpoint`; or a bad FP8 scale value (not finite
        and positive, or not a power of two with scale_fmt "ue8m0"), naming it.
    """
    from models.deepseek.causal_lm import DeepSeekCausalLM

    checked = open_hf_checkpoint(checkpoint_dir)
    with initializers.weights_from_checkpoint():  # every weight is assigned below
        model = DeepSeekCausalLM(checked.config, dtype=dtype)
    weight_map = hf_weight_map(model)
    if set(weight_map) != set(checked.shapes):  # expected_hf_shapes out of step with the model
        raise RuntimeError(
            "expected_hf_shapes and hf_weight_map disagree on "
            f"{sorted(set(weight_map) ^ set(checked.shapes))[:10]}")
    infos = checked.files.tensors
    for name in sorted(weight_map, key=lambda n: (infos[n].path, infos[n].offset)):
        assign_tensor(checked, name, *weight_map[name])
    _check_shared_copies(checked)
    memory.release_free_memory()  # the loader's freed temporaries (common/memory.py)
    return model


def _check_shared_copies(checked: CheckedCheckpoint, rows: int = 4096) -> None:
    """MTP embed/head copies are not loaded (the main model's are shared); say so if they
    differ from the main tensors. Compared `rows` rows at a time from the files, so no
    full copy is held (FP8 copies are dequantized whole, one at a time)."""
    files, c = checked.files, checked.config
    head = "model.embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"
    for name in checked.shared_copies:
        main = "model.embed_tokens.weight" if name.endswith("embed_tokens.weight") else head
        a, b = files.info(name), files.info(main)
        same = a.shape == b.shape
        if same and "F8_E4M3" in (a.dtype, b.dtype):
            same = np.allclose(checked.read_float(name).astype(np.float32),
                               checked.read_float(main).astype(np.float32))
        elif same:
            for r0 in range(0, a.shape[0], rows):
                r1 = min(r0 + rows, a.shape[0])
                if not np.allclose(files.read(name, (r0, r1)).astype(np.float32),
                                   files.read(main, (r0, r1)).astype(np.float32)):
                    same = False
                    break
        if not same:
            log.warning("%s differs from the main model's tensor; the MTP module uses the "
                        "shared main-model weights (DeepSeek-V3 §2.2)", name)
