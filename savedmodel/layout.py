"""The files a deepseek-tfx SavedModel carries beside its graph, and one reader for each.

  <model_dir>/saved_model.pb, variables/      the graph and the weights (tf.saved_model)
  <model_dir>/assets/
    tokenizer.json                 the tokenizer (text models only)      TOKENIZER_FILE
    tokenizer_config.json          its eos/pad/bos tokens, chat_template TOKENIZER_CONFIG_FILE
  <model_dir>/assets.extra/
    config.json                    the model, as a HF DeepseekV3Config   MODEL_CONFIG_NAME
    generation_config.json         `serving_default`'s defaults, as a    GENERATION_CONFIG_NAME
                                   transformers GenerationConfig
    chat_prompt.json               a chat model's prompt affixes         CHAT_PROMPT_ASSET
    deepseek_tfx_config.json       a pushed model's PipelineConfig       PIPELINE_CONFIG_ASSET

Who writes them: `export.save_text_model` the assets, config.json, generation_config.json
and (chat models) chat_prompt.json; `export.export_serving_model` (the Trainer) the same
plus the pipeline config; `hf_interop.hf_import` a text model as `save_text_model` does
(generation_config.json keeps the checkpoint's other keys), a logits-only model
config.json alone. A model pushed before SavedModels carried config.json has only the
pipeline config.

The model's config, one rule (`read_model_config`): the pipeline config's `model`
section when the SavedModel carries a pipeline config, else config.json. The Trainer
writes both from the same `DeepSeekConfig` (config.json is `config_to_hf` of it, which
`config_from_hf` reads back unchanged), so they agree; the pipeline config is the run's
own record of every field, hence it wins.

A serving directory (the Pusher's, TF Serving's `--model_base_path`) holds numbered
versions, `<serving_dir>/<version>/`; `latest_version` finds the one to serve.
"""

from __future__ import annotations

import os

from common.json_file import exists, read_json
from config import GenerationConfig, PipelineConfig
from models.deepseek import hf_checkpoint
from models.deepseek.config import DeepSeekConfig
from savedmodel.hf_generation import generation_config_from_hf
from tokenization import byte_level_bpe
from tokenization.byte_level_bpe import ByteLevelBpe

SAVED_MODEL_FILE = "saved_model.pb"
ASSETS_DIR = "assets"  # files the graph reads (tf.saved_model.Asset)
ASSETS_EXTRA_DIR = "assets.extra"  # files beside the graph, for people and tools
TOKENIZER_FILE = byte_level_bpe.TOKENIZER_FILE  # tokenizer.json
TOKENIZER_CONFIG_FILE = byte_level_bpe.TOKENIZER_CONFIG_FILE  # tokenizer_config.json
MODEL_CONFIG_NAME = hf_checkpoint.CONFIG_NAME  # config.json: HF's DeepseekV3Config
GENERATION_CONFIG_NAME = "generation_config.json"  # transformers' GenerationConfig file
CHAT_PROMPT_ASSET = "chat_prompt.json"  # the chat template's (prefix, suffix) of a prompt
PIPELINE_CONFIG_ASSET = "deepseek_tfx_config.json"  # the PipelineConfig beside a pushed model


class NoTokenizerError(ValueError):
    """Text was asked of a SavedModel without a tokenizer (it serves logits only)."""

    def __init__(self, model_dir: str, what: str):
        super().__init__(
            f"{model_dir} has no tokenizer (no {ASSETS_DIR}/{TOKENIZER_FILE}): it serves "
            f"logits only, so it cannot {what}; hf-import a checkpoint directory that holds "
            f"{TOKENIZER_FILE} to get the text signatures")


def asset_path(model_dir: str, name: str) -> str:
    """`<model_dir>/assets/<name>`."""
    return os.path.join(model_dir, ASSETS_DIR, name)


def extra_path(model_dir: str, name: str) -> str:
    """`<model_dir>/assets.extra/<name>`."""
    return os.path.join(model_dir, ASSETS_EXTRA_DIR, name)


# ----------------------------------------------------------------------------- readers


def read_pipeline_config(model_dir: str) -> PipelineConfig | None:
    """The PipelineConfig beside a pushed model (`deepseek_tfx_config.json`), or None
    (a model from `save_text_model` or hf-import).

    Raises:
      JsonFileError: the file is not a JSON object.
      ValueError: a section or key PipelineConfig does not know (named).
    """
    path = extra_path(model_dir, PIPELINE_CONFIG_ASSET)
    if not exists(path):
        return None
    return PipelineConfig.from_dict(read_json(path, "the SavedModel's pipeline config"))


def read_model_config(model_dir: str) -> DeepSeekConfig:
    """The DeepSeekConfig of a SavedModel: the pipeline config's `model` section when it
    carries one, else `config.json` (the rule of the module docstring).

    Raises:
      FileNotFoundError: neither file.
      JsonFileError: the file read is not a JSON object.
      hf_checkpoint.CheckpointError, ValueError: a config the model cannot take (named).
    """
    pipeline_path = extra_path(model_dir, PIPELINE_CONFIG_ASSET)
    hf_path = extra_path(model_dir, MODEL_CONFIG_NAME)
    if exists(pipeline_path):
        return DeepSeekConfig.from_dict(
            read_json(pipeline_path, "the SavedModel's pipeline config")["model"])
    if exists(hf_path):
        return hf_checkpoint.config_from_hf(read_json(hf_path, "the SavedModel's model config"))
    raise FileNotFoundError(
        f"{model_dir}: no {ASSETS_EXTRA_DIR}/{MODEL_CONFIG_NAME} or "
        f"{ASSETS_EXTRA_DIR}/{PIPELINE_CONFIG_ASSET}; not a deepseek-tfx SavedModel")


def read_hf_generation_config(model_dir: str) -> dict | None:
    """`generation_config.json` as transformers wrote or reads it (every key), or None.

    Raises:
      JsonFileError: the file is not a JSON object.
    """
    path = extra_path(model_dir, GENERATION_CONFIG_NAME)
    if not exists(path):
        return None
    return read_json(path, "the SavedModel's generation config")


def read_generation_config(model_dir: str) -> GenerationConfig | None:
    """The defaults of the SavedModel's `serving_default` (`generation_config.json`, read
    by `hf_generation.generation_config_from_hf`), or None without that file.

    Raises:
      JsonFileError: the file is not a JSON object.
    """
    hf = read_hf_generation_config(model_dir)
    return None if hf is None else generation_config_from_hf(hf)


def read_chat_prompt(model_dir: str) -> tuple[str, str] | None:
    """The (prefix, suffix) `save_text_model` wrote to `assets.extra/chat_prompt.json`, or
    None for a model without a chat template.

    Raises:
      JsonFileError: the file is not a JSON object.
      KeyError: it lacks "prefix" or "suffix".
    """
    path = extra_path(model_dir, CHAT_PROMPT_ASSET)
    if not exists(path):
        return None
    affixes = read_json(path, "the SavedModel's chat prompt")
    return affixes["prefix"], affixes["suffix"]


def has_tokenizer(model_dir: str) -> bool:
    """Whether a SavedModel carries a tokenizer (`assets/tokenizer.json`): text signatures."""
    return exists(asset_path(model_dir, TOKENIZER_FILE))


def read_tokenizer(model_dir: str) -> ByteLevelBpe | None:
    """The tokenizer a SavedModel carries (`assets/tokenizer.json` and
    `assets/tokenizer_config.json`), or None (logits only).

    Raises:
      JsonFileError, UnsupportedTokenizerError: see `ByteLevelBpe.from_file`.
    """
    if not has_tokenizer(model_dir):
        return None
    return ByteLevelBpe.from_file(asset_path(model_dir, TOKENIZER_FILE))


# ----------------------------------------------------------------------------- versions


def latest_version(serving_dir: str) -> tuple[str, int]:
    """(path, version) of the highest numbered SavedModel under `serving_dir` (TF Serving's
    default version policy). A directory that is itself a SavedModel is version 1.

    Raises:
      FileNotFoundError: no saved_model.pb in it and no numbered version with one.
    """
    if os.path.isfile(os.path.join(serving_dir, SAVED_MODEL_FILE)):
        return serving_dir, 1
    versions = [int(d) for d in os.listdir(serving_dir) if d.isdigit()
                and os.path.isfile(os.path.join(serving_dir, d, SAVED_MODEL_FILE))]
    if not versions:
        raise FileNotFoundError(f"{serving_dir}: no {SAVED_MODEL_FILE} and no numbered "
                                "SavedModel versions")
    version = max(versions)
    return os.path.join(serving_dir, str(version)), version
