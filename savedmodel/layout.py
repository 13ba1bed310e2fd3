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
    precision.json                 the dtype of the weights,             PRECISION_ASSET
                                   {"weight_dtype": "bfloat16"}
    expert_pruning.json            a pruned model's kept experts and     EXPERT_PRUNING_ASSET
                                   the router load they were chosen by
                                   (`train.prune_keep_experts`)
    tf_serving_warmup_requests     TF Serving's SavedModel warm-up file: WARMUP_REQUESTS_ASSET
                                   a TFRecord of PredictionLog (one
                                   PredictRequest per signature), which
                                   TF Serving replays at load and `serve`
                                   before it reports ready

Who writes them: `export.save_text_model` the assets, config.json, generation_config.json,
precision.json, the warm-up requests and (chat models) chat_prompt.json;
`export.export_serving_model` (the Trainer) the same plus the pipeline config (TFX's
Pusher copies the whole directory), and the Trainer's `pruning.py` expert_pruning.json; `hf_interop.hf_import` a text model as
`save_text_model` does (generation_config.json keeps the checkpoint's other keys), a
logits-only model config.json, precision.json and the warm-up requests (`logits`,
`serving_default`). A model pushed before SavedModels carried config.json has only the
pipeline config, and one pushed before the warm-up file has none (the server then warms
nothing). The warm-up file's reader is `serving.warmup.read_warmup_requests` (it needs
TF Serving's protos, which only the server and the export use).

The model's config, one rule (`read_model_config`): the pipeline config's `model`
section when the SavedModel carries a pipeline config, else config.json. The Trainer
writes both from the same `DeepSeekConfig` (config.json is `config_to_hf` of it, which
`config_from_hf` reads back unchanged), so they agree; the pipeline config is the run's
own record of every field, hence it wins. Its `model` section is the exported model's
own config, which differs from the run's when the Trainer pruned experts after training
(`train.prune_keep_experts`: n_routed_experts is the kept count).

The weights' precision, one knob (`precision.WEIGHT_DTYPES`; `hf-import --dtype`):
a SavedModel's variables are in `read_weight_dtype(model_dir)` (precision.json; a
SavedModel without one was written in float32), and every reader builds the model in
that dtype (`keras_policy`), so a bf16 import stays bf16 through export, serving and
fine-tuning. The `logits` signature returns float32 whatever the weights' dtype.
New weight formats (int8, ...) are added in `savedmodel/precision.py`.

A serving directory (the Pusher's, TF Serving's `--model_base_path`) holds numbered
versions, `<serving_dir>/<version>/`; `latest_version` finds the one to serve.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import numpy as np

from common.json_file import exists, read_json, write_json
from config import GenerationConfig, PipelineConfig
from config.sections import MODEL_TYPE_KEY, model_section
from models import checkpoints
from models.deepseek import hf_checkpoint
from models.deepseek.config import DeepSeekConfig
from models.deepseek_v4.config import DeepSeekV4Config
from savedmodel.hf_generation import generation_config_from_hf
from savedmodel.precision import (  # noqa: F401  (re-exported: the SavedModel's precision)
    AUTO,
    LEGACY_WEIGHT_DTYPE,
    WEIGHT_DTYPES,
    check_weight_dtype,
    keras_policy,
    resolve_weight_dtype,
    weight_dtype_of,
)
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
PRECISION_ASSET = "precision.json"  # {"weight_dtype": one of WEIGHT_DTYPES}
EXPERT_PRUNING_ASSET = "expert_pruning.json"  # kept experts and router load per MoE layer
# TF Serving's SavedModel warm-up file (tensorflow_serving/servables/tensorflow/
# saved_model_warmup_util: WarmupConsts::kRequestsFileName) and its record limit
# (kMaxNumRecords: a file with more records fails the model's load).
WARMUP_REQUESTS_ASSET = "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000
# What the warm-up requests send (`warmup_requests`; why: savedmodel/export.py, Warm-up):
# real text, one Chinese.
WARMUP_PROMPTS = ("ROMEO:\nBut soft, what light through yonder window breaks?",
                  "床前明月光，疑是地上霜。")
WARMUP_MAX_NEW_TOKENS = 2  # the prompt's prefill and the decoding loop's body run
WARMUP_LOGITS_LENGTH = 8  # input_ids [1, 8] (or the context) for a model without tokenizer
# Row b's sampling inputs (a signature taking one value per call gets row 0's):
# a greedy row and one sampled with top-k and nucleus filters.
_WARMUP_SAMPLING = {"max_new_tokens": (np.int32, [WARMUP_MAX_NEW_TOKENS] * 2),
                    "temperature": (np.float32, [0.0, 0.8]), "top_k": (np.int32, [0, 50]),
                    "top_p": (np.float32, [1.0, 0.95]), "seed": (np.int32, [0, 1])}
# The order a server first calls them in (tokenize: its validation, before generating).
_WARMUP_ORDER = ("tokenize", "generate", "generate_raw", "serving_default", "logits",
                 "detokenize")

# One warm-up request: (signature name, {input name: numpy array of the signature's
# dtype}; strings as bytes in object arrays).
WarmupRequest = tuple[str, dict[str, np.ndarray]]



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


# ----------------------------------------------------------------------------- precision


def write_weight_dtype(model_dir: str, dtype: str) -> None:
    """Writes `assets.extra/precision.json` = {"weight_dtype": dtype}.

    Raises:
      ValueError: `dtype` is not one of `WEIGHT_DTYPES`.
    """
    write_json(extra_path(model_dir, PRECISION_ASSET),
               {"weight_dtype": check_weight_dtype(dtype, "weight_dtype")})


def read_weight_dtype(model_dir: str) -> str:
    """The dtype of a SavedModel's variables: `assets.extra/precision.json`, else
    "float32" (SavedModels written before it was recorded were float32).

    Raises:
      JsonFileError: the file is not a JSON object.
      ValueError: its weight_dtype is missing or not one of `WEIGHT_DTYPES` (named).
    """
    path = extra_path(model_dir, PRECISION_ASSET)
    if not exists(path):
        return LEGACY_WEIGHT_DTYPE
    record = read_json(path, "the SavedModel's precision")
    return check_weight_dtype(record.get("weight_dtype"), f"{path}: weight_dtype")


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


def read_model_config(model_dir: str) -> DeepSeekConfig | DeepSeekV4Config:
    """The DeepSeekConfig (or DeepSeekV4Config) of a SavedModel: the pipeline config's
    `model` section when it carries one, else `config.json` (the rule of the module docstring).

    Raises:
      FileNotFoundError: neither file.
      JsonFileError: the file read is not a JSON object.
      hf_checkpoint.CheckpointError, ValueError: a config the model cannot take (named).
    """
    pipeline_path = extra_path(model_dir, PIPELINE_CONFIG_ASSET)
    hf_path = extra_path(model_dir, MODEL_CONFIG_NAME)
    if exists(pipeline_path):
        section = read_json(pipeline_path, "the SavedModel's pipeline config")["model"]
        model_cls = model_section(section)["model"]  # DeepSeekConfig or DeepSeekV4Config
        return model_cls.from_dict({k: v for k, v in section.items() if k != MODEL_TYPE_KEY})
    if exists(hf_path):
        return checkpoints.config_from_hf(read_json(hf_path, "the SavedModel's model config"))
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


# ----------------------------------------------------------------------------- warm-up


def warmup_requests(signatures: Mapping[str, Mapping], max_context: int, vocab_size: int,
                    tokenize: Callable[[np.ndarray], np.ndarray] | None = None,
                    ) -> list[WarmupRequest]:
    """One warm-up request per signature whose inputs it knows (savedmodel/export.py,
    Warm-up), in the order a server first calls them (`tokenize`, `generate`,
    `generate_raw`, `serving_default`, `logits`, `detokenize`, then any other).

    Inputs by name: `prompt`/`text` = `WARMUP_PROMPTS` (tf.string [2]; one row for
    `serving_default`); the sampling inputs of `generate` = one greedy row and one
    sampled (top_k 50, top_p 0.95), max_new_tokens 2, a scalar input row 0's value;
    `input_ids` int32 [2, T] = the prompts' ids from `tokenize` (padded as it pads,
    T cropped to max_context), or without a tokenizer [1, min(8, max_context)] =
    0, 1, 2, ... mod vocab_size. A signature with another input gets no request.

    Args:
      signatures: {signature name: {input name: tf.TensorSpec}} (a loaded signature's
        `structured_input_signature[1]`, or the saved functions' input signatures).
      max_context: the model's max_position_embeddings.
      vocab_size: the model's vocabulary size.
      tokenize: text (object array of bytes [B]) -> ids (int32 [B, T], padded), or
        None for a model without tokenizer.
    """
    prompts = np.array([p.encode("utf-8") for p in WARMUP_PROMPTS], dtype=object)  # [2]
    if tokenize is not None:
        input_ids = np.asarray(tokenize(prompts), np.int32)[:, :max_context]  # [2, T]
    else:
        length = min(WARMUP_LOGITS_LENGTH, max_context)
        input_ids = (np.arange(length, dtype=np.int32) % vocab_size)[None, :]  # [1, length]
    order = [n for n in _WARMUP_ORDER if n in signatures]
    requests = []
    for name in order + sorted(set(signatures) - set(order)):
        rows = 1 if name == "serving_default" else len(prompts)
        inputs = {}
        for key, spec in signatures[name].items():
            if key in ("prompt", "text"):
                value = prompts[:rows]
            elif key == "input_ids":
                value = input_ids
            elif key in _WARMUP_SAMPLING:
                dtype, values = _WARMUP_SAMPLING[key]
                value = np.array(values[:rows] if spec.shape.rank else values[0], dtype)
            else:
                break  # an input of which nothing is known: no request for it
            inputs[key] = value
        else:
            requests.append((name, inputs))
    return requests


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
