"""Hugging Face `config.json` of DeepSeek checkpoints <-> `DeepSeekConfig`.

  config_from_hf(dict) / config_to_hf(config) / read_config_json(dir)

`config.json` is read in both forms transformers writes: 4.x (`rope_theta`,
`rope_scaling`, as the released checkpoints carry) and 5.x (`rope_parameters`).
Two model types: `deepseek_v3` (`DeepseekV3ForCausalLM`: DeepSeek-V3, R1) and
`deepseek_v2` (`DeepseekV2ForCausalLM`: DeepSeek-V2, V2-Lite, Coder-V2), told
apart on export by the config's `topk_method` (hf_config.V2_TOPK_METHODS).
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
    "mlp_bias": False,
}
# The same for model_type "deepseek_v2" (transformers `DeepseekV2Config`, DeepSeek-V2's
# config.json); `topk_method` is one of V2_TOPK_METHODS, checked apart.
_REQUIRED_VALUES_V2 = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "scoring_func": "softmax",
    "moe_layer_freq": 1,
    "norm_topk_prob": False,  # transformers 5.x ignores it; DeepSeek's code drops the scaling
    "rope_interleave": True,  # DeepseekV2 always rotates interleaved pairs (no such key)
    "num_nextn_predict_layers": 0,  # DeepSeek-V2 has no MTP module
}
V2_TOPK_METHODS = ("greedy", "group_limited_greedy")
_MODEL_TYPES = ("deepseek_v3", "deepseek_v2")
# DeepSeekConfig fields a deepseek_v2 config.json does not carry (fixed by _REQUIRED_VALUES_V2).
_V3_ONLY_FIELDS = ("rope_interleave", "num_nextn_predict_layers")
# HF keys that do not change the computation (ids, bookkeeping, derived sizes).
_IGNORED_KEYS = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "num_key_value_heads",
    "head_dim", "pretraining_tp", "ep_size", "seq_aux", "output_router_logits",
    "router_aux_loss_coef", "rope_theta", "rope_scaling", "rope_parameters",
    "partial_rotary_factor", "_name_or_path", "return_dict", "output_hidden_states",
    "output_attentions", "tie_encoder_decoder", "is_encoder_decoder", "qk_head_dim",
}


class CheckpointError(ValueError):
    """A checkpoint that does not match the model: names the tensor or key and the problem."""


# ----------------------------------------------------------------------------- config.json


def config_from_hf(hf: dict) -> DeepSeekConfig:
    """A DeepSeekConfig from a HF `DeepseekV3Config` or `DeepseekV2Config` dict
    (model_type "deepseek_v3", the default when absent, or "deepseek_v2"; 4.x or
    5.x form).

    Raises:
      CheckpointError: the config describes something else (another model_type,
        activation, attention or MLP biases, another router, `moe_layer_freq` != 1;
        for deepseek_v2 also norm_topk_prob true or MTP layers), naming the key and
        value. `quantization_config` is not read here: `fp8.quantization_from_hf`
        checks it when the weights are opened (`hf_checkpoint.open_hf_checkpoint`).
      ValueError: a value DeepSeekConfig rejects (named).
    """
    model_type = hf.get("model_type", "deepseek_v3")
    if model_type not in _MODEL_TYPES:
        raise CheckpointError(f"config.json model_type={model_type!r}: only {list(_MODEL_TYPES)} "
                              "are supported")
    if model_type == "deepseek_v2":
        return _config_from_hf_v2(hf)
    for key, expected in _REQUIRED_VALUES.items():
        if key in hf and hf[key] != expected:
            raise CheckpointError(f"config.json {key}={hf[key]!r}: only {expected!r} is supported")
    kwargs = {name: hf[name] for name in _SHARED_FIELDS if name in hf}
    kwargs.update(_rope_kwargs(hf))
    if kwargs.get("q_lora_rank") == 0:
        kwargs["q_lora_rank"] = None
    _log_unused(hf, _REQUIRED_VALUES)
    return DeepSeekConfig(**kwargs)


def _config_from_hf_v2(hf: dict) -> DeepSeekConfig:
    """A DeepSeekConfig from a HF `DeepseekV2Config` dict (model_type "deepseek_v2").

    Keys as in DeepSeek-V2(-Lite)'s config.json and transformers 5.x's
    `DeepseekV2Config`: `topk_method` "greedy" (its default) or
    "group_limited_greedy", `scoring_func` "softmax", `n_group`/`topk_group`
    (null with "greedy" = 1), `seq_aux`, `aux_loss_alpha`; no MTP, no router bias.
    """
    method = hf.get("topk_method", "greedy")
    if method not in V2_TOPK_METHODS:
        raise CheckpointError(f"config.json topk_method={method!r} with model_type "
                              f"'deepseek_v2': only {list(V2_TOPK_METHODS)} are supported")
    for key, expected in _REQUIRED_VALUES_V2.items():
        if key in hf and hf[key] != expected:
            raise CheckpointError(f"config.json {key}={hf[key]!r} with model_type "
                                  f"'deepseek_v2': only {expected!r} is supported")
    kwargs = {name: hf[name] for name in _SHARED_FIELDS
              if name in hf and name not in _V3_ONLY_FIELDS}
    for key in ("n_group", "topk_group"):
        if kwargs.get(key) is None:
            if method == "group_limited_greedy":
                raise CheckpointError(f"config.json {key}={hf.get(key)!r}: "
                                      "topk_method 'group_limited_greedy' needs it")
            kwargs[key] = 1
    if kwargs.get("num_experts_per_tok") is None:
        raise CheckpointError(f"config.json num_experts_per_tok={hf.get('num_experts_per_tok')!r}:"
                              " a MoE model needs it")
    kwargs.update(_rope_kwargs(hf))
    if kwargs.get("q_lora_rank") == 0:
        kwargs["q_lora_rank"] = None
    kwargs.update(
        topk_method=method, scoring_func="softmax", seq_aux=hf.get("seq_aux", True),
        norm_topk_prob=False, rope_interleave=True, num_nextn_predict_layers=0,
        # transformers' DeepseekV2Config defaults (its keys may be absent from 5.x files)
        first_k_dense_replace=hf.get("first_k_dense_replace", 0),
        n_routed_experts=hf.get("n_routed_experts", 64),
        n_shared_experts=hf.get("n_shared_experts", 2),
        routed_scaling_factor=hf.get("routed_scaling_factor", 1.0))
    _log_unused(hf, _REQUIRED_VALUES_V2)
    return DeepSeekConfig(**kwargs)


def _rope_kwargs(hf: dict) -> dict:
    """`rope_theta` and `rope_scaling` from either config.json form."""
    kwargs = {}
    if "rope_parameters" in hf and hf["rope_parameters"] is not None:  # transformers 5.x
        params = dict(hf["rope_parameters"])
        kwargs["rope_theta"] = float(params.pop("rope_theta", hf.get("rope_theta", 10000.0)))
        params.pop("partial_rotary_factor", None)
        kwargs["rope_scaling"] = params if params.get("rope_type", "default") != "default" else None
    else:  # transformers 4.x and the released checkpoints
        kwargs["rope_theta"] = float(hf.get("rope_theta", 10000.0))
        kwargs["rope_scaling"] = hf.get("rope_scaling")
    return kwargs


def _log_unused(hf: dict, required: dict) -> None:
    unknown = sorted(set(hf) - set(_SHARED_FIELDS) - set(required) - _IGNORED_KEYS
                     - {"quantization_config", "topk_method", "seq_aux"})
    if unknown:
        log.info("config.json keys not used by DeepSeekConfig: %s", unknown)


def config_to_hf(config: DeepSeekConfig, form: str = "5.x") -> dict:
    """The HF config dict of a DeepSeekConfig: `DeepseekV3Config` (model_type
    "deepseek_v3") for topk_method "noaux_tc", `DeepseekV2Config` ("deepseek_v2")
    for the V2 methods.

    Args:
      config: the model config.
      form: "5.x" writes `rope_parameters` (transformers >= 5); "4.x" writes
        `rope_theta` + `rope_scaling` (transformers 4.x, released checkpoints).

    Raises:
      ValueError: unknown form, or a V2-routed config that "deepseek_v2" cannot
        express (see `_config_to_hf_v2`), naming the field.
    """
    if form not in ("4.x", "5.x"):
        raise ValueError(f"form={form!r} must be '4.x' or '5.x'")
    c = config
    hf = _config_to_hf_v2(c) if c.topk_method in V2_TOPK_METHODS else _config_to_hf_v3(c)
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


def _config_to_hf_v3(c: DeepSeekConfig) -> dict:
    """The model_type "deepseek_v3" keys of a V3-routed config (rope keys apart)."""
    return {
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


def _config_to_hf_v2(c: DeepSeekConfig) -> dict:
    """The model_type "deepseek_v2" keys of a V2-routed config (rope keys apart).

    Raises:
      ValueError: the config has something `DeepseekV2ForCausalLM` would compute
        differently (norm_topk_prob True, rope_interleave False, MTP), naming it.
    """
    for key, expected in _REQUIRED_VALUES_V2.items():
        if hasattr(c, key) and getattr(c, key) != expected:
            raise ValueError(f"{key}={getattr(c, key)!r} with topk_method={c.topk_method!r}: "
                             f"model_type 'deepseek_v2' needs {expected!r}")
    return {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "num_key_value_heads": c.num_attention_heads,
        "head_dim": c.qk_rope_head_dim,
        "topk_method": c.topk_method,
        "scoring_func": c.scoring_func,
        "seq_aux": c.seq_aux,
        "moe_layer_freq": 1,
        "torch_dtype": "float32",
        **{name: getattr(c, name) for name in _SHARED_FIELDS if name not in _V3_ONLY_FIELDS},
    }


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
