"""Hugging Face `config.json` of DeepSeek checkpoints <-> `DeepSeekConfig`.

  config_from_hf(dict) / config_to_hf(config) / read_config_json(dir)

`config.json` is read in both forms transformers writes: 4.x (`rope_theta`,
`rope_scaling`, as the released checkpoints carry) and 5.x (`rope_parameters`).
Only `read_config_json` imports TensorFlow (for tf.io.gfile paths).
"""

from __future__ import annotations

import json
import logging
import os

from models.deepseek.config import DeepSeekConfig

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"

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
        attention biases, another router), naming the key. `quantization_config`
        is not read here: `fp8.quantization_from_hf` checks it when the weights are
        opened (`hf_checkpoint.open_hf_checkpoint`).
      ValueError: a value DeepSeekConfig rejects (named).
    """
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
    """The DeepSeekConfig of `checkpoint_dir/config.json` (local or any tf.io.gfile path).

    Raises:
      FileNotFoundError: no config.json.
      CheckpointError: not JSON, or see `config_from_hf`.
    """
    import tensorflow as tf  # only here: building configs needs no TensorFlow

    path = os.path.join(checkpoint_dir, CONFIG_NAME)
    if not tf.io.gfile.exists(path):
        raise FileNotFoundError(f"{path}: no config.json (is this a HF checkpoint directory?)")
    with tf.io.gfile.GFile(path) as f:
        try:
            return config_from_hf(json.load(f))
        except json.JSONDecodeError as e:
            raise CheckpointError(f"{path}: not valid JSON ({e})") from e
