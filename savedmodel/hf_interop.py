"""`deepseek-tfx hf-import` / `hf-export`: HF DeepSeek checkpoints <-> SavedModels.

  hf_import(CHECKPOINT_DIR, OUT_DIR)  config.json + safetensors (+ tokenizer.json,
                                      tokenizer_config.json, generation_config.json
                                      when present) -> SavedModel, its variables in the
                                      checkpoint's precision (or `dtype`).
  hf_export(MODEL_DIR, OUT_DIR)       a SavedModel written by hf-import, by the pipeline's
                                      Trainer/Pusher or by `save_text_model` ->
                                      config.json + safetensors (+ tokenizer.json,
                                      tokenizer_config.json, generation_config.json when
                                      the SavedModel carries a tokenizer).

A checkpoint directory with a `tokenizer.json` (byte-level BPE of the DeepSeek-V3
family, see `tokenization/byte_level_bpe.py`) imports as a text model with the
signatures of a pushed model (`serving_default`, `generate`, `logits`, `tokenize`,
`detokenize`; `savedmodel/export.py`). Without one it imports as a logits-only
SavedModel: `logits` (input_ids int32 [batch, seq] -> logits float32 [batch, seq,
vocab]) and `serving_default` (the same). Either way the HF config.json is kept in
`assets.extra/config.json`; a text model also carries `assets.extra/
generation_config.json` (the defaults of its `serving_default`, in transformers' form).

What hf-export writes is what `transformers.AutoModelForCausalLM` /
`AutoTokenizer.from_pretrained(OUT_DIR)` read (`PreTrainedTokenizerFast` from
tokenizer.json + tokenizer_config.json; `GenerationConfig` from generation_config.json);
`tokenizers.Tokenizer.from_file(OUT_DIR/tokenizer.json)` gives the SavedModel's ids.

Precision (`layout.WEIGHT_DTYPES`, `layout.read_weight_dtype`): a bf16 checkpoint (or
an FP8 one, dequantized to bf16) imports as a SavedModel with bf16 variables unless
`dtype="float32"`; `assets.extra/precision.json` records it, `load_model_from_savedmodel`
builds the model in it, and `hf_export` writes it back unchanged (bit for bit) by
default.

The weights travel through `models/checkpoints.py` (V2/V3/V3.2:
`models/deepseek/hf_checkpoint.py`; V4: `models/deepseek_v4/hf_checkpoint.py`); the SavedModel's
variables are read back into a freshly built model with `tf.train.Checkpoint`
(the exported module keeps the model under the attribute `model`).
Needs only TensorFlow (and safetensors); no torch, no TFX.
"""

from __future__ import annotations

import dataclasses
import os

import tensorflow as tf

from common import memory
from common.json_file import read_json, write_json
from config import GenerationConfig
from models import checkpoints, families
from models.deepseek import hf_checkpoint
from models.formats.quantization import quantize_int8
from savedmodel.hf_generation import (
    SAMPLING_KEYS,
    generation_config_from_hf,
    generation_config_to_hf,
    token_ids,
)
from savedmodel.layout import (
    GENERATION_CONFIG_NAME,
    MODEL_CONFIG_NAME,
    extra_path,
    keras_policy,
    read_hf_generation_config,
    read_model_config,
    read_pipeline_config,
    read_tokenizer,
    read_weight_dtype,
    resolve_weight_dtype,
    warmup_requests,
    weight_dtype_of,
    write_weight_dtype,
)
from savedmodel.precision import HF_DTYPES, INT8
from tokenization.byte_level_bpe import (
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    ByteLevelBpe,
)

TEXT_SIGNATURES = ("serving_default", "generate", "logits", "tokenize", "detokenize")
LOGITS_SIGNATURES = ("logits", "serving_default")


class LogitsModule(tf.Module):
    """A SavedModel root holding the model (`self.model`) and its `logits` signature."""

    def __init__(self, model):
        super().__init__(name="deepseek_logits")
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def logits(self, input_ids):
        return {"logits": tf.cast(self.model(input_ids, training=False), tf.float32)}


# ----------------------------------------------------------------------------- import


def checkpoint_weight_dtype(checkpoint_dir: str) -> str:
    """The precision a HF checkpoint's weights are stored in, read from the safetensors
    headers (`checkpoints.stored_precision`, not config.json's `torch_dtype`): BF16 and
    FP8 (which dequantizes to bf16) -> "bfloat16"; F32 -> "float32"; F16 -> "float32",
    the supported dtype that holds it exactly.

    Raises:
      FileNotFoundError, hf_checkpoint.CheckpointError: see
        `hf_checkpoint.stored_precision`.
    """
    stored = checkpoints.stored_precision(checkpoint_dir)
    return "float32" if stored == "float16" else stored


@dataclasses.dataclass(frozen=True)
class ImportedModel:
    """What `hf_import` wrote.

    Attributes:
      path: the SavedModel directory.
      signatures: its signature names.
      tokenizer: the tokenizer.json it was made with, or None (logits only).
      generation: the defaults of its `serving_default` (text models), else None.
      generation_source: where they came from: the checkpoint's
        generation_config.json, or the pipeline's defaults.
      weight_dtype: the dtype of its variables (`layout.WEIGHT_DTYPES`).
    """

    path: str
    signatures: tuple[str, ...]
    tokenizer: str | None = None
    generation: GenerationConfig | None = None
    generation_source: str | None = None
    weight_dtype: str = "float32"


def hf_import(checkpoint_dir: str, out_dir: str, use_tokenizer: bool = True,
              dtype: str = "auto") -> ImportedModel:
    """Reads a HF DeepSeek checkpoint directory (V2, V3, V3.2 or V4: `models/checkpoints.py`
    picks the family from config.json's model_type) and writes a SavedModel. A V4 text
    model is a chat model in DeepSeek-V4's format (`_v4_chat_prompt`).

    With a `tokenizer.json` in `checkpoint_dir` (and `use_tokenizer`), the SavedModel
    is a text model with the pushed model's signatures (`serving_default`,
    `generate`, `logits`, `tokenize`, `detokenize`; see `savedmodel/export.py`) and
    carries the tokenizer (with `tokenizer_config.json` when present: eos/pad/bos
    tokens, chat_template). The defaults of `serving_default` come from the
    checkpoint's `generation_config.json` when it has one (`generation_config_from_hf`),
    else from the pipeline's `GenerationConfig()`. Without a tokenizer.json it is
    logits only (`logits`, `serving_default`: input_ids int32 [batch, seq] -> logits
    float32 [batch, seq, vocab]).

    Args:
      checkpoint_dir: config.json and safetensors (sharded or not), optionally
        tokenizer.json, tokenizer_config.json and generation_config.json.
      out_dir: where the SavedModel is written.
      use_tokenizer: False imports the weights only (logits), ignoring tokenizer.json.
      dtype: the dtype of the SavedModel's variables: "auto" (the checkpoint's own,
        `checkpoint_weight_dtype`) or one of `layout.WEIGHT_DTYPES`. The model is built
        in it (`layout.keras_policy`) and the tensors are cast to it as they load;
        `assets.extra/precision.json` records it.

    Returns:
      An `ImportedModel` naming the signatures written and the weights' dtype.

    Raises:
      ValueError: `dtype` is not "auto" or one of `layout.WEIGHT_DTYPES`; or "int8" for a
        DeepSeek-V4 checkpoint (V4 has no int8 form yet).
      FileNotFoundError: no config.json or no safetensors files.
      hf_checkpoint.CheckpointError: the weights do not match config.json (see
        `load_hf_checkpoint`), or the tokenizer has ids beyond config.json's
        vocab_size (naming both).
      UnsupportedTokenizerError: a tokenizer.json outside the DeepSeek-V3 family,
        or one without an end-of-sequence token (naming the field).
      JsonFileError (a ValueError): tokenizer.json, tokenizer_config.json or
        generation_config.json is not a JSON object.
    """
    from savedmodel.export import save_text_model

    # Everything about the directory is checked before anything is allocated or written.
    config = checkpoints.open_hf_checkpoint(checkpoint_dir).config
    weight_dtype = resolve_weight_dtype(dtype, checkpoint_weight_dtype(checkpoint_dir))
    family = families.family_of(config)
    if weight_dtype == INT8 and not family.int8:
        raise ValueError("dtype='int8': a DeepSeek-V4 model has no int8 form yet; import it "
                         "as 'auto', 'bfloat16' or 'float32'")
    policy = keras_policy(weight_dtype)  # "int8": float32, quantized once loaded
    tokenizer = _checkpoint_tokenizer(checkpoint_dir, config) if use_tokenizer else None
    if tokenizer is None:
        return _import_logits_model(checkpoint_dir, out_dir, policy, weight_dtype)

    hf_generation_path = os.path.join(checkpoint_dir, GENERATION_CONFIG_NAME)
    hf_generation = None
    if tf.io.gfile.exists(hf_generation_path):
        hf_generation = read_json(hf_generation_path, "the checkpoint's generation config")
        generation, source = generation_config_from_hf(hf_generation), hf_generation_path
    else:
        generation, source = GenerationConfig(), "the pipeline's GenerationConfig() defaults"
    chat_prompt = _v4_chat_prompt(tokenizer) if family.builtin_chat_format else None
    model = _load_checkpoint(checkpoint_dir, policy, weight_dtype)
    save_text_model(model, tokenizer, generation, out_dir,  # also config.json, precision.json
                    chat_prompt=chat_prompt)
    if hf_generation is not None:  # keep the checkpoint's other keys for hf-export
        write_json(extra_path(out_dir, GENERATION_CONFIG_NAME),
                   {**hf_generation, **generation_config_to_hf(generation, tokenizer)})
    return ImportedModel(out_dir, TEXT_SIGNATURES, tokenizer.source, generation, source,
                         weight_dtype_of(model))


def _checkpoint_tokenizer(checkpoint_dir: str, config) -> ByteLevelBpe | None:
    """The checkpoint's tokenizer.json, checked against its config (a model config with
    `vocab_size`) before the weights load; None when it has none.

    Raises:
      hf_checkpoint.CheckpointError: the tokenizer has ids beyond config.json's
        vocab_size (naming both).
      UnsupportedTokenizerError: a tokenizer.json outside the DeepSeek-V3 family, or
        one without an end-of-sequence token (naming the field).
      JsonFileError (a ValueError): tokenizer.json or tokenizer_config.json is not a
        JSON object.
    """
    if not tf.io.gfile.exists(os.path.join(checkpoint_dir, TOKENIZER_FILE)):
        return None
    tokenizer = ByteLevelBpe.from_file(checkpoint_dir)
    if tokenizer.vocab_size > config.vocab_size:
        raise hf_checkpoint.CheckpointError(
            f"{tokenizer.source} has ids up to {tokenizer.vocab_size - 1} "
            f"({tokenizer.vocab_size} ids), but config.json's vocab_size is "
            f"{config.vocab_size}: the model's vocabulary must cover the tokenizer's ids")
    _ = tokenizer.eos_id  # raises now, before the weights load, if it has none
    return tokenizer


def _import_logits_model(checkpoint_dir: str, out_dir: str, policy: str,
                         weight_dtype: str) -> ImportedModel:
    """`hf_import` without a tokenizer: a logits-only SavedModel (`LOGITS_SIGNATURES`:
    input_ids int32 [batch, seq] -> logits float32 [batch, seq, vocab]) with the HF
    config.json, its precision and warmup requests in `assets.extra/`.

    Raises:
      FileNotFoundError, hf_checkpoint.CheckpointError: see `_load_checkpoint`.
    """
    from savedmodel.export import SAVE_OPTIONS, write_warmup_requests

    model = _load_checkpoint(checkpoint_dir, policy, weight_dtype)
    module = LogitsModule(model)
    tf.saved_model.save(module, out_dir, options=SAVE_OPTIONS,
                        signatures={"serving_default": module.logits, "logits": module.logits})
    write_json(extra_path(out_dir, MODEL_CONFIG_NAME), checkpoints.config_to_hf(model.config))
    write_weight_dtype(out_dir, weight_dtype_of(model))
    write_warmup_requests(out_dir, warmup_requests(
        {name: {spec.name: spec for spec in module.logits.input_signature}
         for name in LOGITS_SIGNATURES},
        model.config.max_position_embeddings, model.config.vocab_size))
    return ImportedModel(out_dir, LOGITS_SIGNATURES, weight_dtype=weight_dtype_of(model))


def _v4_chat_prompt(tokenizer: ByteLevelBpe) -> tuple[str, str]:
    """A DeepSeek-V4 import is a chat model: its tokenizer's own `chat_template` if the
    checkpoint carries one, else DeepSeek-V4's format (`tokenization/deepseek_v4_chat.py`,
    DeepSeek's `encoding_dsv4.py`), which the tokenizer then carries; returns the
    single-turn (prefix, suffix) of chat mode (non-thinking), which `generate` wraps a
    prompt in.

    Raises:
      chat_template.ChatTemplateError: the checkpoint's template has no single-turn
        affixes.
    """
    from tokenization import chat_template
    from tokenization.deepseek_v4_chat import DEEPSEEK_V4_CHAT_TEMPLATE

    if not tokenizer.chat_template:
        tokenizer.tokenizer_config["chat_template"] = DEEPSEEK_V4_CHAT_TEMPLATE
    return chat_template.prompt_affixes(tokenizer.chat_template,
                                        *chat_template.special_tokens(tokenizer))


def _load_checkpoint(checkpoint_dir: str, policy: str, weight_dtype: str):
    """`load_hf_checkpoint` in `policy`, then quantized when `weight_dtype` is "int8"
    (layer by layer: the peak is the float32 model plus one int8 kernel)."""
    model = checkpoints.load_hf_checkpoint(checkpoint_dir, dtype=policy)
    if weight_dtype == INT8:
        quantize_int8(model)
    return model


# ----------------------------------------------------------------------------- export


def load_model_from_savedmodel(model_dir: str, dtype: str | None = None):
    """Rebuilds the DeepSeekCausalLM of a SavedModel with its trained weights.

    Its architecture is `layout.read_model_config`'s (the pipeline config, else
    config.json); its precision the SavedModel's own (`layout.read_weight_dtype`)
    unless `dtype` asks for another.

    Args:
      model_dir: the SavedModel directory.
      dtype: the Keras dtype policy to build the model in ("float32", "bfloat16",
        "mixed_bfloat16", ...), or None for `keras_policy(read_weight_dtype(model_dir))`.
        Each variable is read, cast if the policy's variable dtype differs from the
        stored one, and assigned one at a time (`restore_cast`): one model in memory.
        An int8 SavedModel loads int8 whatever `dtype` (its projections' int8 kernels
        and scales; the policy applies to the rest).

    Raises:
      FileNotFoundError: no config beside the SavedModel.
      AssertionError: the SavedModel's variables do not cover the model.
      ValueError: precision.json names a dtype that is not supported.
    """
    from models.layers.initializers import weights_from_checkpoint

    stored = read_weight_dtype(model_dir)
    with weights_from_checkpoint():  # every weight is restored below (checked)
        model = checkpoints.build_model(read_model_config(model_dir),
                                        dtype=keras_policy(stored) if dtype is None else dtype)
        if stored == INT8:  # the same int8 variables as were saved, restored below
            quantize_int8(model)
    # One variable at a time, cast if asked: `tf.train.Checkpoint.read` restores every
    # tensor in one RestoreV2 op, a second full copy of the model in memory.
    restore_cast(model, os.path.join(model_dir, "variables", "variables"), model_dir)
    memory.release_free_memory()  # the restore's freed temporaries (common/memory.py)
    return model


def restore_cast(model, checkpoint_prefix: str, source: str) -> None:
    """Assigns every variable of `model` from a checkpoint whose root holds a model of
    the same architecture under `model` (a SavedModel's `variables/variables`, a
    training checkpoint), casting each to the variable's dtype; one tensor in memory
    at a time. (TensorFlow's own restore refuses another dtype, and restores every
    tensor at once: a second full copy of the model.)

    The variables are matched to the checkpoint's objects by `tf.train.CheckpointView.
    match`, and read through the keys of the checkpoint's object graph (the
    `TrackableObjectGraph` proto stored under "_CHECKPOINTABLE_OBJECT_GRAPH").

    Raises:
      AssertionError: some variable of `model` has no value in the checkpoint (naming
        the first few), as `assert_existing_objects_matched` would.
      ValueError: a stored tensor's shape differs from its variable's (naming both).
    """
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(checkpoint_prefix)
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    matched = tf.train.CheckpointView(checkpoint_prefix).match(tf.train.Checkpoint(model=model))
    keys = {}
    for node_id, obj in matched.items():
        for attribute in graph.nodes[node_id].attributes:
            if attribute.name == "VARIABLE_VALUE":
                keys[id(obj)] = attribute.checkpoint_key
    per_expert = _per_expert_keys(matched, graph)
    missing = [v.path for v in model.weights if id(v) not in keys and id(v) not in per_expert]
    if missing:
        raise AssertionError(f"{source}: {len(missing)} variables of the model have no value "
                             f"in its checkpoint: {missing[:5]}")
    for variable in model.weights:
        if id(variable) in per_expert:  # one tensor per expert, into slices in place
            _restore_stacked(variable, per_expert[id(variable)], reader, source)
            continue
        value = reader.get_tensor(keys[id(variable)])  # numpy, the stored dtype
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"{source}: {variable.path} has shape {tuple(value.shape)} in the "
                             f"checkpoint, {tuple(variable.shape)} in the model")
        variable.assign(tf.cast(value, variable.dtype))
        del value


def _per_expert_keys(matched: dict, graph) -> dict[int, list[str]]:
    """Checkpoint keys of the routed experts of a model saved before they were stacked.

    Such a checkpoint (main at b9aaa7c and before) holds `mlp/experts` as a list of
    SwiGLU layers, `experts/<e>/<gate|up|down>_proj/<_kernel|kernel_scale>`; the model
    now holds `experts/<proj>/<kernel|kernel_scale>` stacked, (E, in, out) and (E, out).
    `CheckpointView.match` pairs the model's `RoutedExperts` with the list's node by
    name; this follows that node's children "0".."E-1".

    Returns:
      {id(stacked variable): [checkpoint key of expert 0, 1, ...]} for every stacked
      variable a per-expert checkpoint holds (empty for a checkpoint of stacked experts).
    """
    from models.layers.routed_experts import RoutedExperts

    def child(node_id, name):
        return next((c.node_id for c in graph.nodes[node_id].children if c.local_name == name),
                    None)

    def key(node_id):
        return next((a.checkpoint_key for a in graph.nodes[node_id].attributes
                     if a.name == "VARIABLE_VALUE"), None) if node_id is not None else None

    found = {}
    for node_id, obj in matched.items():
        if not isinstance(obj, RoutedExperts) or child(node_id, "0") is None:
            continue
        experts = [child(node_id, str(e)) for e in range(obj.num_experts)]
        for projection in obj.projections:
            for variable in projection.weights:
                # The object graph names a Dense's kernel by its attribute, `_kernel`.
                name = {"kernel": "_kernel", "kernel_scale": "kernel_scale"}.get(
                    variable.path.rsplit("/", 1)[1])
                if name is None:  # LoRA adapters: never in a per-expert SavedModel
                    continue
                nodes = [child(p, projection.name) if p is not None else None for p in experts]
                per = [key(child(n, name)) if n is not None else None for n in nodes]
                if all(per):
                    found[id(variable)] = per
    return found


def _restore_stacked(variable, keys: list[str], reader, source: str) -> None:
    """Assigns stacked `variable` (E, ...) from one checkpoint tensor per expert, each
    into its slice in place, cast to the variable's dtype."""
    target = variable.value  # the backend's tf.Variable: its slices assign in place
    for e, key in enumerate(keys):
        value = reader.get_tensor(key)
        if tuple(value.shape) != tuple(variable.shape)[1:]:
            raise ValueError(f"{source}: expert {e} of {variable.path} has shape "
                             f"{tuple(value.shape)} in the checkpoint, "
                             f"{tuple(variable.shape)[1:]} in the model")
        target[e].assign(tf.cast(value, variable.dtype))


def hf_export(model_dir: str, out_dir: str,
              max_shard_bytes: int = hf_checkpoint.DEFAULT_MAX_SHARD_BYTES,
              config_form: str = "5.x", dtype: str = "auto", model=None) -> list[str]:
    """Writes the model of a SavedModel as a HF checkpoint; returns the files written.

    `model`, if given, is written instead of the SavedModel's own weights (e.g. the
    SavedModel's model with experts pruned, `deepseek-tfx prune`); the tokenizer,
    generation defaults and "auto" precision still come from `model_dir`.

    Always config.json and the safetensors (see `save_hf_checkpoint`, which writes one
    shard at a time), in `dtype`: "auto" = the SavedModel's own precision
    (`layout.read_weight_dtype`), so a bf16 import exports the bytes it was imported
    from, and an int8 SavedModel exports float32 kernels Q / s (transformers'
    DeepSeek-V3 has no int8 format; `quantization.float_kernel`); or one of
    `precision.HF_DTYPES`. The model is loaded in its stored precision
    whatever `dtype` (tensors are cast shard by shard). When the
    SavedModel carries a tokenizer (`assets/tokenizer.json`), also:
      - tokenizer.json, as the SavedModel tokenizes (`tokenizers.Tokenizer.from_file`
        gives the same ids as its `tokenize` signature);
      - tokenizer_config.json: `PreTrainedTokenizerFast`, eos/pad/bos tokens, the
        chat_template if the tokenizer has one, and `model_max_length` (the model's
        max_position_embeddings) unless the tokenizer names one;
      - generation_config.json: bos/eos/pad token ids and the sampling defaults of
        the SavedModel's `serving_default` (do_sample, temperature, top_k, top_p,
        max_new_tokens), from the pipeline config's `generation` section when the
        SavedModel carries `assets.extra/deepseek_tfx_config.json`, else from its
        `assets.extra/generation_config.json` (models written by `save_text_model`
        and hf-import), else token ids only;
      - config.json gets the same bos/eos/pad token ids.

    Raises:
      FileNotFoundError: no config beside the SavedModel.
      AssertionError: the SavedModel's variables do not cover the model.
      ValueError: `dtype` is not "auto" or one of `precision.HF_DTYPES`.
    """
    if dtype != "auto" and dtype not in HF_DTYPES:
        raise ValueError(f"dtype={dtype!r}: a HF checkpoint is written in one of {HF_DTYPES}")
    weight_dtype = resolve_weight_dtype(dtype, read_weight_dtype(model_dir))
    if weight_dtype not in HF_DTYPES:  # "int8": the kernels are written dequantized
        weight_dtype = "float32"
    if model is None:
        model = load_model_from_savedmodel(model_dir)
    files = checkpoints.save_hf_checkpoint(model, out_dir, max_shard_bytes=max_shard_bytes,
                                             config_form=config_form, dtype=weight_dtype)
    tokenizer = read_tokenizer(model_dir)
    if tokenizer is None:
        return files
    extra_config = {}
    if "model_max_length" not in tokenizer.tokenizer_config:
        extra_config["model_max_length"] = model.config.max_position_embeddings
    tokenizer.write(out_dir, extra_config=extra_config)

    generation = read_hf_generation_config(model_dir) or {}
    pipeline = read_pipeline_config(model_dir)
    if pipeline is not None:
        generation = {k: v for k, v in generation.items() if k not in SAMPLING_KEYS}
        generation.update(generation_config_to_hf(pipeline.generation))
    generation.update(token_ids(tokenizer))
    write_json(os.path.join(out_dir, GENERATION_CONFIG_NAME), generation)

    config_path = os.path.join(out_dir, MODEL_CONFIG_NAME)
    write_json(config_path, {**read_json(config_path, "the checkpoint's config.json"),
                             **token_ids(tokenizer)})
    names = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, GENERATION_CONFIG_NAME)
    return files + [os.path.join(out_dir, name) for name in names]
