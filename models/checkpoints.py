"""One entry to the two model families' Hugging Face checkpoints and configs.

A config.json's `model_type` picks the family (any "deepseek_v4..." goes to the V4
reader, which refuses DeepSeek-V4.1 by name):

  "deepseek_v2", "deepseek_v3", "deepseek_v32"  `DeepSeekConfig` / `DeepSeekCausalLM`
                                                (models/deepseek: MLA, DeepSeekMoE, MTP;
                                                V3.2's lightning indexer)
  "deepseek_v4"                                 `DeepSeekV4Config` / `DeepSeekV4CausalLM`
                                                (models/deepseek_v4: mHC, SWA/CSA/HCA,
                                                hash MoE)

and a config object picks it by its class. Everything that reads, builds or writes a
model from a config.json (`savedmodel/hf_interop.py`, `savedmodel/layout.py`,
`savedmodel/base_model.py`, `savedmodel/export.py`) goes through here, so neither
family's module has to know the other. DeepSeek-V4.1 is refused by
`models/deepseek_v4/hf_config.config_from_hf` in one line.

TensorFlow is imported only by the functions that build or load a model.
"""

from __future__ import annotations

import collections
import os

from common.json_file import read_json
from models.deepseek import hf_config as v3_config
from models.deepseek.config import DeepSeekConfig
from models.deepseek_v4 import hf_config as v4_config
from models.deepseek_v4.config import DeepSeekV4Config
from models.formats import safetensors_reader
from models.formats.checkpoint_error import CheckpointError

V4_PREFIX = "deepseek_v4"  # "deepseek_v4"; V4.1's model types are refused by the V4 reader
CONFIG_NAME = "config.json"
_PRECISIONS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_QUANTIZED = ("F8_E4M3", "I8", "U8")  # FP8, and MXFP4 packed two values per byte
_MAX_CONFIG_BYTES = 16 * 1024 * 1024  # as the families' readers


def is_v4(config) -> bool:
    """True for a `DeepSeekV4Config`, False for a `DeepSeekConfig`.

    Raises:
      TypeError: anything else.
    """
    if isinstance(config, DeepSeekV4Config):
        return True
    if isinstance(config, DeepSeekConfig):
        return False
    raise TypeError(f"{type(config).__name__} is not a DeepSeekConfig or DeepSeekV4Config")


def config_from_hf(hf: dict):
    """The config of a HF config.json dict: a DeepSeekV4Config for model_type
    "deepseek_v4", else a DeepSeekConfig (`models/deepseek/hf_config.config_from_hf`).

    Raises:
      CheckpointError, ValueError: as the family's `config_from_hf` (naming the key).
    """
    if _is_v4_type(hf):
        return v4_config.config_from_hf(hf)
    return v3_config.config_from_hf(hf)


def config_to_hf(config, form: str = "5.x") -> dict:
    """config.json of a config, in transformers' form (`form` applies to the V2/V3
    family; V4 has only transformers 5.x's)."""
    if is_v4(config):
        return v4_config.config_to_hf(config)
    return v3_config.config_to_hf(config, form=form)


def read_config_json(checkpoint_dir: str):
    """The config of `checkpoint_dir/config.json` (local or any tf.io.gfile path), read by
    its family's `read_config_json`.

    Raises:
      FileNotFoundError: no config.json. CheckpointError, ValueError: a config the
      models cannot take (named).
    """
    if _is_v4_dir(checkpoint_dir):
        return v4_config.read_config_json(checkpoint_dir)
    return v3_config.read_config_json(checkpoint_dir)


def _is_v4_dir(checkpoint_dir: str) -> bool:
    """Whether config.json says "deepseek_v4..."; False when it cannot be read as a small
    regular JSON file (the family's own reader then names what is wrong, as before)."""
    path = os.path.join(checkpoint_dir, CONFIG_NAME)
    if "://" not in path and not (os.path.isfile(path)
                                  and os.path.getsize(path) <= _MAX_CONFIG_BYTES):
        return False  # absent, a FIFO or a device, or far too large
    try:
        hf = read_json(path, "the checkpoint's config.json")
    except (OSError, ValueError):
        return False
    return _is_v4_type(hf)


def _is_v4_type(hf: dict) -> bool:
    model_type = hf.get("model_type")
    return isinstance(model_type, str) and model_type.startswith(V4_PREFIX)


def open_hf_checkpoint(checkpoint_dir: str):
    """Checks config.json and the safetensors headers against each other, reading no
    tensor (`hf_checkpoint.open_hf_checkpoint` or `open_v4_checkpoint`); the result has
    `.config`.

    Raises:
      FileNotFoundError, CheckpointError: as the family's function.
    """
    if _is_v4_dir(checkpoint_dir):
        from models.deepseek_v4.hf_checkpoint import open_v4_checkpoint

        return open_v4_checkpoint(checkpoint_dir)
    from models.deepseek import hf_checkpoint

    return hf_checkpoint.open_hf_checkpoint(checkpoint_dir)


def load_hf_checkpoint(checkpoint_dir: str, dtype: str = "float32"):
    """The model of a HF checkpoint directory, built in the Keras dtype policy `dtype`,
    its tensors streamed in one at a time (quantized ones dequantized).

    Raises:
      FileNotFoundError, CheckpointError: as the family's loader.
    """
    if _is_v4_dir(checkpoint_dir):
        from models.deepseek_v4.hf_checkpoint import load_v4_checkpoint

        return load_v4_checkpoint(checkpoint_dir, dtype=dtype)
    from models.deepseek import hf_checkpoint

    return hf_checkpoint.load_hf_checkpoint(checkpoint_dir, dtype=dtype)


def save_hf_checkpoint(model, out_dir: str, max_shard_bytes: int = 5 * 1024**3,
                       config_form: str = "5.x", dtype: str = "float32") -> list[str]:
    """Writes `model` as config.json + safetensors in transformers' names; returns the
    safetensors files written (the family's `save_hf_checkpoint`)."""
    if is_v4(model.config):
        from models.deepseek_v4.hf_checkpoint import save_hf_checkpoint as save_v4

        return save_v4(model, out_dir, dtype=dtype, max_shard_bytes=max_shard_bytes)
    from models.deepseek import hf_checkpoint

    return hf_checkpoint.save_hf_checkpoint(model, out_dir, max_shard_bytes=max_shard_bytes,
                                            config_form=config_form, dtype=dtype)


def stored_precision(checkpoint_dir: str) -> str:
    """The precision a checkpoint's linear weights are stored in, from the headers alone:
    "bfloat16" when any 2-D weight is quantized (FP8 or MXFP4, which dequantize to
    bfloat16), else the most common dtype of the 2-D weights ("bfloat16", "float16" or
    "float32").

    Raises:
      FileNotFoundError, CheckpointError: see `safetensors_reader.open_checkpoint`; a
        checkpoint without 2-D weights, or one in another dtype (named).
    """
    if not _is_v4_dir(checkpoint_dir):
        from models.deepseek import hf_checkpoint

        return hf_checkpoint.stored_precision(checkpoint_dir)
    tensors = safetensors_reader.open_checkpoint(checkpoint_dir).tensors
    dtypes = [i.dtype for i in tensors.values() if len(i.shape) == 2]
    if not dtypes:
        raise CheckpointError(f"{checkpoint_dir}: no 2-D weights in the checkpoint")
    if any(d in _QUANTIZED for d in dtypes):
        return "bfloat16"
    stored = collections.Counter(d for d in dtypes if d in _PRECISIONS).most_common(1)
    if not stored:
        raise CheckpointError(f"{checkpoint_dir}: 2-D weights in {sorted(set(dtypes))}, none "
                              f"in {sorted(_PRECISIONS)}")
    return _PRECISIONS[stored[0][0]]


def build_model(config, dtype: str = "float32"):
    """A freshly built model of `config` (`DeepSeekCausalLM` or `DeepSeekV4CausalLM`) in
    the Keras dtype policy `dtype`."""
    if is_v4(config):
        from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM

        return DeepSeekV4CausalLM(config, dtype=dtype)
    from models.deepseek.causal_lm import DeepSeekCausalLM

    return DeepSeekCausalLM(config, dtype=dtype)
