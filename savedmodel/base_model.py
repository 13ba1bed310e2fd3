"""A model to start from (warm start) or to learn from (distillation teacher).

Two kinds of directory hold one:

  savedmodel  a SavedModel written by this project: a pushed version directory
              (`<serving_model_dir>/<version>/`), a Trainer Model artifact
              (`.../Trainer/model/<id>/`, whose `Format-Serving/` holds it), or an
              hf-import output. The model's config is the pipeline config
              (`assets.extra/deepseek_tfx_config.json`) when it carries one, else
              `assets.extra/config.json` (`savedmodel/layout.py`); its tokenizer
              `assets/tokenizer.json`.
  hf          a Hugging Face checkpoint directory: `config.json`, safetensors
              (sharded or not) and, for a text model, `tokenizer.json`
              (+ `tokenizer_config.json`, whose `chat_template` is kept).

TFX's Trainer hands `run_fn` a base model as `serving_model_path(artifact.uri)`,
i.e. `<uri>/Format-Serving`; an artifact made by an `Importer` from a plain
directory has no such child, and `model_dir` then falls back to the URI itself.
"""

from __future__ import annotations

import hashlib
import os

import tensorflow as tf

from models.checkpoints import load_hf_checkpoint, read_config_json
from savedmodel import layout
from savedmodel.hf_interop import checkpoint_weight_dtype, load_model_from_savedmodel

SAVEDMODEL = "savedmodel"
HF = "hf"
_SERVING_SUBDIR = "Format-Serving"


class BaseModelError(ValueError):
    """A directory given as a base model or teacher holds no usable model."""


def model_dir(path: str) -> str:
    """The directory that holds the model itself (see the module docstring).

    Raises:
      BaseModelError: `path` (and its parent, for `.../Format-Serving`) holds no
        SavedModel and no HF checkpoint.
    """
    path = path.rstrip("/")
    candidates = [os.path.join(path, _SERVING_SUBDIR), path]
    if os.path.basename(path) == _SERVING_SUBDIR:
        candidates.append(os.path.dirname(path))
    for candidate in candidates:
        if _kind_of(candidate):
            return candidate
    raise BaseModelError(
        f"{path}: neither a SavedModel (saved_model.pb) nor a Hugging Face checkpoint "
        f"directory (config.json and *.safetensors)")


def _kind_of(directory: str) -> str | None:
    if tf.io.gfile.exists(os.path.join(directory, layout.SAVED_MODEL_FILE)):
        return SAVEDMODEL
    if (tf.io.gfile.exists(os.path.join(directory, layout.MODEL_CONFIG_NAME))
            and tf.io.gfile.glob(os.path.join(directory, "*.safetensors"))):
        return HF
    return None


def kind(path: str) -> str:
    """`SAVEDMODEL` or `HF` (raises `BaseModelError` as `model_dir`)."""
    return _kind_of(model_dir(path))


def read_model_config(path: str):
    """The `DeepSeekConfig` of the model at `path`: a HF checkpoint's config.json, or a
    SavedModel's (`layout.read_model_config`: its pipeline config, else config.json).

    Raises:
      BaseModelError: no model at `path`.
      FileNotFoundError: a SavedModel without a config beside it.
    """
    directory = model_dir(path)
    if _kind_of(directory) == HF:
        return read_config_json(directory)
    return layout.read_model_config(directory)


def tokenizer_path(path: str) -> str | None:
    """The directory holding the model's tokenizer.json (and tokenizer_config.json),
    usable as `tokenizer.path`; None when the model carries no tokenizer."""
    directory = model_dir(path)
    if _kind_of(directory) == SAVEDMODEL:
        directory = os.path.join(directory, layout.ASSETS_DIR)
    return directory if tf.io.gfile.exists(os.path.join(directory, layout.TOKENIZER_FILE)) else None


def weight_dtype(path: str) -> str:
    """The precision the model at `path` is stored in (`layout.WEIGHT_DTYPES`): a
    SavedModel's `layout.read_weight_dtype`, a HF checkpoint's
    `hf_interop.checkpoint_weight_dtype` (FP8 counts as bfloat16).

    Raises:
      BaseModelError: no model at `path`.
    """
    directory = model_dir(path)
    if _kind_of(directory) == HF:
        return checkpoint_weight_dtype(directory)
    return layout.read_weight_dtype(directory)


def load_model(path: str, dtype: str | None = None):
    """The `DeepSeekCausalLM` at `path`, every weight from the directory, built in the
    Keras dtype policy `dtype`, or (None) in the precision it is stored in
    (`weight_dtype`: a bf16 model stays bf16). Either way one model is built and the
    stored tensors are cast into its variables as they load (no second copy).

    Raises:
      BaseModelError: no model at `path`.
      hf_checkpoint.CheckpointError, AssertionError: the weights do not match the
        model's config (see `load_hf_checkpoint`, `load_model_from_savedmodel`).
    """
    directory = model_dir(path)
    if _kind_of(directory) == HF:
        policy = layout.keras_policy(weight_dtype(directory)) if dtype is None else dtype
        return load_hf_checkpoint(directory, dtype=policy)
    return load_model_from_savedmodel(directory, dtype=dtype)


def fingerprint(path: str) -> str:
    """16 hex digits identifying the weights at `path`: SHA-256 over the variables'
    index and data files (SavedModel) or the safetensors files (HF), names and bytes."""
    directory = model_dir(path)
    if _kind_of(directory) == HF:
        files = tf.io.gfile.glob(os.path.join(directory, "*.safetensors"))
    else:
        files = tf.io.gfile.glob(os.path.join(directory, "variables", "variables.*"))
    digest = hashlib.sha256()
    for file in sorted(files):
        digest.update(os.path.basename(file).encode() + b"\0")
        with tf.io.gfile.GFile(file, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def check_model_overrides(base_config, overrides: dict, source: str) -> None:
    """Refuses `--set model.KEY=VALUE` overrides that contradict the base model.

    Args:
      base_config: the base model's `DeepSeekConfig`.
      overrides: the run's dotted overrides (only `model.*` keys are checked).
      source: the base model's path, for the message.

    Raises:
      ValueError: naming the key, the value asked for and the base model's value.
    """
    base = base_config.to_dict()
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if section != "model" or field not in base:
            continue
        if base[field] != value:
            raise ValueError(
                f"--set {key}={value!r} contradicts the base model {source}, which has "
                f"{field}={base[field]!r}: a warm start keeps the base model's architecture "
                f"(drop the override)")
