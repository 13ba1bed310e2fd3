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

import json
import logging
import os
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from common.json_file import read_json
from models.deepseek.config import DeepSeekConfig

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # transformers' default max_shard_size ("5GB")

# DeepSeekConfig fields whose HF name and meaning are the same.
_SHARED_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "n_routed_experts",
    "n_shared_experts", "num_experts_per_tok", "n_group", "topk_group",
    "routed_scaling_factor", "norm_topk_prob", "first_k_dense_replace", "rms_norm_eps",
    "max_position_embeddings", "tie_word_embeddings", "num_nextn_predict_layers",
    "rope_interleave", "initializer_range", "attention_dropout", "aux_loss_alpha",
    # Training rules of the DeepSeek-V3 paper that HF does not have; written as
    # extra keys (transformers keeps unknown config keys) so a round trip keeps them.
    "router_bias_update_speed", "mtp_loss_weight",
)
# HF keys whose value must be this for the model to be the one implemented here.
_REQUIRED_VALUES = {
    "hidden_act": "silu",
    "attention_bias": False,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "moe_layer_freq": 1,
}
# HF keys that do not change the computation (ids, bookkeeping, derived sizes).
_IGNORED_KEYS = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "num_key_value_heads",
    "head_dim", "pretraining_tp", "ep_size", "seq_aux", "output_router_logits",
    "router_aux_loss_coef", "rope_theta", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", "_name_or_path", "return_dict", "output_hidden_states",
    "output_attentions", "tie_encoder_decoder", "is_encoder_decoder",
}


class CheckpointError(ValueError):
    """A checkpoint that does not match the model: names the tensor or key and the problem."""


# ----------------------------------------------------------------------------- config.json


def config_from_hf(hf: dict) -> DeepSeekConfig:
    """A DeepSeekConfig from a HF `DeepseekV3Config` dict (4.x or 5.x form).

    Raises:
      CheckpointError: the config describes something else (another activation,
        attention biases, FP8 quantization, another router), naming the key.
      ValueError: a value DeepSeekConfig rejects (named).
    """
    if "quantization_config" in hf:
        q = hf["quantization_config"]
        raise CheckpointError(
            f"config.json has quantization_config {q.get('quant_method', q)!r}: quantized "
            "(FP8) checkpoints are not supported; dequantize to bfloat16/float32 first "
            "(DeepSeek-V3 inference/fp8_cast_bf16.py)")
    for key, expected in _REQUIRED_VALUES.items():
        if key in hf and hf[key] != expected:
            raise CheckpointError(f"config.json {key}={hf[key]!r}: only {expected!r} is supported")
    kwargs = {name: hf[name] for name in _SHARED_FIELDS if name in hf}
    if "rope_parameters" in hf and hf["rope_parameters"] is not None:  # transformers 5.x
        params = dict(hf["rope_parameters"])
        kwargs["rope_theta"] = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        params.pop("partial_rotary_factor", None)
        kwargs["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
    else:  # transformers 4.x and the released checkpoints
        kwargs["rope_theta"] = float(hf.get("rope_theta", 10000.0))
        kwargs["rope_scaling"] = hf.get("rope_scaling")
    if kwargs.get("q_lora_rank") == 0:
        kwargs["q_lora_rank"] = None
    unknown = sorted(set(hf) - set(_SHARED_FIELDS) - set(_REQUIRED_VALUES) - _IGNORED_KEYS
                     - {"quantization_config"})
    if unknown:
        log.info("config.json keys not used by DeepSeekConfig: %s", unknown)
    return DeepSeekConfig(**kwargs)


def config_to_hf(config: DeepSeekConfig, form: str = "5.x") -> dict:
    """The HF `DeepseekV3Config` dict of a DeepSeekConfig.

    Args:
      config: the model config.
      form: "5.x" writes `rope_parameters` (transformers >= 5); "4.x" writes
        `rope_theta` + `rope_scaling` (transformers 4.x, released checkpoints).

    Raises:
      ValueError: unknown form.
    """
    if form not in ("4.x", "5.x"):
        raise ValueError(f"form={form!r} must be '4.x' or '5.x'")
    c = config
    hf = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_act": "silu",
        "attention_bias": False,
        "num_key_value_heads": c.num_attention_heads,
        "head_dim": c.qk_rope_head_dim,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "moe_layer_freq": 1,
        "torch_dtype": "float32",
        **{name: getattr(c, name) for name in _SHARED_FIELDS},
    }
    scaling = None
    if c.rope_scaling is not None:
        scaling = {k: v for k, v in c.rope_scaling.items() if v is not None}
    if form == "5.x":
        hf["rope_parameters"] = {"rope_theta": c.rope_theta, "rope_type": "default",
                                 **(scaling or {})}
    else:
        hf["rope_theta"] = c.rope_theta
        if scaling is not None:
            scaling = {("type" if k == "rope_type" else k): v for k, v in scaling.items()}
        hf["rope_scaling"] = scaling
    return hf


def read_config_json(checkpoint_dir: str) -> DeepSeekConfig:
    path = os.path.join(checkpoint_dir, CONFIG_NAME)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path}: no config.json (is this a HF checkpoint directory?)")
    with tf.io.gfile.GFile(path) as f:
        try:
            return config_from_hf(json.load(f))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not valid JSON ({e})") from e


# ----------------------------------------------------------------------------- names


def hf_weight_map(model) -> dict[str, tuple[tf.Variable, bool]]:
    """HF tensor name -> (the model's variable, transpose?) for every weight.

    Args:
      model: a DeepSeekCausalLM.

    Returns:
      A dict over every variable of the model (router biases included);
      `transpose` is True for Dense kernels (Keras [in, out] vs HF [out, in]).
    """
    c = model.config
    names: dict[str, tuple[tf.Variable, bool]] = {}

    def dense(prefix, layer):
        names[f"{prefix}.weight"] = (layer.kernel, True)

    def norm(prefix, layer):
        names[f"{prefix}.weight"] = (layer.weight, False)

    def mlp(prefix, layer):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            dense(f"{prefix}.{proj}", getattr(layer, proj))

    def block(prefix, b):
        norm(f"{prefix}.input_layernorm", b.input_layernorm)
        norm(f"{prefix}.post_attention_layernorm", b.post_attention_layernorm)
        a = b.self_attn
        if c.q_lora_rank is None:
            dense(f"{prefix}.self_attn.q_proj", a.q_proj)
        else:
            dense(f"{prefix}.self_attn.q_a_proj", a.q_a_proj)
            norm(f"{prefix}.self_attn.q_a_layernorm", a.q_a_layernorm)
            dense(f"{prefix}.self_attn.q_b_proj", a.q_b_proj)
        dense(f"{prefix}.self_attn.kv_a_proj_with_mqa", a.kv_a_proj_with_mqa)
        norm(f"{prefix}.self_attn.kv_a_layernorm", a.kv_a_layernorm)
        dense(f"{prefix}.self_attn.kv_b_proj", a.kv_b_proj)
        dense(f"{prefix}.self_attn.o_proj", a.o_proj)
        if b.is_moe:
            moe = b.mlp
            names[f"{prefix}.mlp.gate.weight"] = (moe.gate.weight, False)  # [E, C] both
            names[f"{prefix}.mlp.gate.e_score_correction_bias"] = (
                moe.gate.e_score_correction_bias, False)
            for e, expert in enumerate(moe.experts):
                mlp(f"{prefix}.mlp.experts.{e}", expert)
            if moe.shared_experts is not None:
                mlp(f"{prefix}.mlp.shared_experts", moe.shared_experts)
        else:
            mlp(f"{prefix}.mlp", b.mlp)

    names["model.embed_tokens.weight"] = (model.embed_tokens.embeddings, False)
    for i, b in enumerate(model.decoder_layers):
        block(f"model.layers.{i}", b)
    norm("model.norm", model.norm)
    if model.lm_head is not None:
        dense("lm_head", model.lm_head)
    for d, mtp in enumerate(model.mtp_layers):
        prefix = f"model.layers.{c.num_hidden_layers + d}"
        norm(f"{prefix}.enorm", mtp.enorm)
        norm(f"{prefix}.hnorm", mtp.hnorm)
        dense(f"{prefix}.eh_proj", mtp.eh_proj)
        norm(f"{prefix}.shared_head.norm", mtp.shared_head_norm)
        block(prefix, mtp.block)
    return names


def _shared_mtp_names(config: DeepSeekConfig) -> list[str]:
    """MTP tensors of released checkpoints that are copies of the main model's
    embedding and output head (DeepSeek-V3 §2.2: shared, not per-module)."""
    out = []
    for d in range(config.num_nextn_predict_layers):
        prefix = f"model.layers.{config.num_hidden_layers + d}"
        out += [f"{prefix}.embed_tokens.weight", f"{prefix}.shared_head.head.weight"]
    return out


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
    shared_copies = set(_shared_mtp_names(config))
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


# ----------------------------------------------------------------------------- writing


def model_tensors(model) -> dict[str, tf.Tensor]:
    """Every tensor of the HF layout, including the MTP copies of the shared embedding/head."""
    tensors = {}
    for name, (variable, transpose) in hf_weight_map(model).items():
        value = tf.convert_to_tensor(variable)
        tensors[name] = tf.transpose(value) if transpose else value
    head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    for name in _shared_mtp_names(model.config):
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
    for name in sorted(tensors, key=_tensor_sort_key):
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


def _tensor_sort_key(name: str):
    """Layer order (layers.2 before layers.10), then name: keeps a layer in one shard."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers" and parts[2].isdigit():
        return (1, int(parts[2]), name)
    return (0 if "embed_tokens" in name else 2, 0, name)
