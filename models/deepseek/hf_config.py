"""Hugging Face `config.json` of DeepSeek checkpoints <-> `DeepSeekConfig`.

  config_from_hf(dict) / config_to_hf(config) / read_config_json(dir)

`config.json` is read in both forms transformers writes: 4.x (`rope_theta`,
`rope_scaling`, as the released checkpoints carry) and 5.x (`rope_parameters`).
Three model types: `deepseek_v3` (`DeepseekV3ForCausalLM`: DeepSeek-V3, R1),
`deepseek_v32` (`DeepseekV32ForCausalLM`: DeepSeek-V3.2, V3 plus DeepSeek Sparse
Attention: `index_topk`, `index_n_heads`, `index_head_dim`) and `deepseek_v2`
(`DeepseekV2ForCausalLM`: DeepSeek-V2, V2-Lite, Coder-V2), told apart on export by
the config: `index_topk` set -> deepseek_v32, else its `topk_method`
(hf_config.V2_TOPK_METHODS) -> deepseek_v2, else deepseek_v3.
Only `read_config_json` imports TensorFlow (for tf.io.gfile paths).
"""

from __future__ import annotations

import json
import logging
import os

from models.deepseek.config import DeepSeekConfig
from models.formats.checkpoint_error import CheckpointError

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
_MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "deepseek_v2")
# model_type "deepseek_v32" (transformers 5.24 `DeepseekV32Config`): its DSA fields, with
# the class's defaults for keys a config.json leaves out.
_V32_FIELDS = {"index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128}
# transformers' DeepseekV32Config defaults that differ from DeepSeekConfig's.
_V32_DEFAULTS = {"first_k_dense_replace": 3, "num_nextn_predict_layers": 0}
V32_LAYER_TYPE = "indexed_attention"  # DeepseekV32Config.layer_types: every layer is DSA
V32_MLP_TYPES = ("dense", "sparse")  # DeepseekV32Config.mlp_layer_types values
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
    "layer_types", "mlp_layer_types",  # deepseek_v32: checked by _config_from_hf_v32
}


# ----------------------------------------------------------------------------- config.json


def config_from_hf(hf: dict) -> DeepSeekConfig:
    """A DeepSeekConfig from a HF `DeepseekV3Config`, `DeepseekV32Config` or
    `DeepseekV2Config` dict (model_type "deepseek_v3", the default when absent,
    "deepseek_v32" or "deepseek_v2"; 4.x or 5.x form).

    Raises:
      CheckpointError: the config describes something else (another model_type,
        activation, attention or MLP biases, another router, `moe_layer_freq` != 1;
        for deepseek_v2 also norm_topk_prob true or MTP layers; for deepseek_v32
        see `_config_from_hf_v32`), naming the key and value. `quantization_config`
        is not read here: `fp8.quantization_from_hf` checks it when the weights are
        opened (`hf_checkpoint.open_hf_checkpoint`).
      ValueError: a value DeepSeekConfig rejects (named).
    """
    model_type = hf.get("model_type", "deepseek_v3")
    if model_type not in _MODEL_TYPES:
        raise CheckpointError(f"config.json model_type={model_type!r}: only {list(_MODEL_TYPES)} "
                              "are supported")
    if model_type == "deepseek_v2":
        return _config_from_hf_v2(hf)
    if model_type == "deepseek_v32":
        return _config_from_hf_v32(hf)
    for key, expected in _REQUIRED_VALUES.items():
        if key in hf and hf[key] != expected:
            raise CheckpointError(f"config.json {key}={hf[key]!r}: only {expected!r} is supported")
    kwargs = {name: hf[name] for name in _SHARED_FIELDS if name in hf}
    kwargs.update(_rope_kwargs(hf))
    if kwargs.get("q_lora_rank") == 0:
        kwargs["q_lora_rank"] = None
    _log_unused(hf, _REQUIRED_VALUES)
    return DeepSeekConfig(**kwargs)


def _config_from_hf_v32(hf: dict) -> DeepSeekConfig:
    """A DeepSeekConfig from a HF `DeepseekV32Config` dict (model_type "deepseek_v32").

    As deepseek_v3 (the same router, MoE, MLA and checks), plus: `index_topk`,
    `index_n_heads`, `index_head_dim` (transformers' defaults 2048 / 64 / 128 when
    absent); `q_lora_rank` required (the indexer's queries come from c_q);
    MLA always rotates interleaved pairs (DeepseekV32Attention has no
    `rope_interleave`); `mlp_layer_types`, when given, must be `first_k_dense_replace`
    "dense" entries then "sparse" ones (it then decides first_k_dense_replace);
    `layer_types`, when given, all "indexed_attention"; `first_k_dense_replace`
    defaults to 3 and `num_nextn_predict_layers` to 0 (transformers' V3.2 loads no
    MTP module; DeepSeek's released config.json says 1), as transformers reads them.

    Raises:
      CheckpointError: as `config_from_hf`, or q_lora_rank null, rope_interleave false,
        or a layer_types / mlp_layer_types / first_k_dense_replace this model does not
        implement, naming the key and value.
    """
    for key, expected in _REQUIRED_VALUES.items():
        if key in hf and hf[key] != expected:
            raise CheckpointError(f"config.json {key}={hf[key]!r} with model_type "
                                  f"'deepseek_v32': only {expected!r} is supported")
    if hf.get("rope_interleave", True) is not True:
        raise CheckpointError(f"config.json rope_interleave={hf['rope_interleave']!r} with "
                              "model_type 'deepseek_v32': DeepseekV32Attention always rotates "
                              "interleaved pairs")
    if not hf.get("q_lora_rank"):
        raise CheckpointError(f"config.json q_lora_rank={hf.get('q_lora_rank')!r} with "
                              "model_type 'deepseek_v32': the indexer projects its queries "
                              "from the query latent, so q_lora_rank is required")
    kwargs = {name: hf[name] for name in _SHARED_FIELDS if name in hf}
    kwargs.update({name: hf.get(name, default) for name, default in _V32_FIELDS.items()})
    for name, default in _V32_DEFAULTS.items():
        kwargs.setdefault(name, default)
    layers = kwargs.get("num_hidden_layers", DeepSeekConfig.num_hidden_layers)
    if not isinstance(layers, int) or isinstance(layers, bool):
        return DeepSeekConfig(**kwargs)  # refuses num_hidden_layers by name
    if "first_k_dense_replace" not in hf:
        kwargs["first_k_dense_replace"] = min(kwargs["first_k_dense_replace"], layers)
    layer_types = hf.get("layer_types")
    if layer_types is not None and layer_types != [V32_LAYER_TYPE] * layers:
        raise CheckpointError(f"config.json layer_types={layer_types!r}: only "
                              f"{layers} x {V32_LAYER_TYPE!r} is supported")
    mlp_types = hf.get("mlp_layer_types")
    if mlp_types is not None:
        dense = mlp_types.count("dense") if isinstance(mlp_types, list) else 0
        if mlp_types != ["dense"] * dense + ["sparse"] * (layers - dense):
            raise CheckpointError(f"config.json mlp_layer_types={mlp_types!r}: only "
                                  f"{list(V32_MLP_TYPES)} as a run of 'dense' then a run of "
                                  f"'sparse', {layers} in all, is supported")
        if "first_k_dense_replace" in hf and hf["first_k_dense_replace"] != dense:
            raise CheckpointError(f"config.json first_k_dense_replace="
                                  f"{hf['first_k_dense_replace']!r} disagrees with "
                                  f"mlp_layer_types ({dense} 'dense' layers)")
        kwargs["first_k_dense_replace"] = dense
    kwargs.update(_rope_kwargs(hf))
    kwargs["rope_interleave"] = True
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
                     - set(_V32_FIELDS) - {"quantization_config", "topk_method", "seq_aux"})
    if unknown:
        log.info("config.json keys not used by DeepSeekConfig: %s", unknown)


def config_to_hf(config: DeepSeekConfig, form: str = "5.x") -> dict:
    """The HF config dict of a DeepSeekConfig: `DeepseekV32Config` (model_type
    "deepseek_v32") with DeepSeek Sparse Attention, else `DeepseekV3Config`
    ("deepseek_v3") for topk_method "noaux_tc", `DeepseekV2Config` ("deepseek_v2")
    for the V2 methods.

    Args:
      config: the model config.
      form: "5.x" writes `rope_parameters` (transformers >= 5); "4.x" writes
        `rope_theta` + `rope_scaling` (transformers 4.x, released checkpoints).

    Raises:
      ValueError: unknown form, or a config that its model type cannot express
        (`_config_to_hf_v2`, `_config_to_hf_v32`), naming the field.
    """
    if form not in ("4.x", "5.x"):
        raise ValueError(f"form={form!r} must be '4.x' or '5.x'")
    c = config
    if c.uses_sparse_attention:
        hf = _config_to_hf_v32(c, form)
    elif c.topk_method in V2_TOPK_METHODS:
        hf = _config_to_hf_v2(c)
    else:
        hf = _config_to_hf_v3(c)
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


def _config_to_hf_v32(c: DeepSeekConfig, form: str) -> dict:
    """The model_type "deepseek_v32" keys of a config with DeepSeek Sparse Attention
    (rope keys apart): the deepseek_v3 keys (`num_nextn_predict_layers` kept as the
    extra key DeepSeek's config.json carries; no `rope_interleave`), the three index
    fields, and in the 5.x form `mlp_layer_types` / `layer_types` as transformers
    writes them.

    Raises:
      ValueError: a V2 router (topk_method) or rope_interleave False, which
        `DeepseekV32ForCausalLM` would compute differently, naming it.
    """
    if c.topk_method != "noaux_tc":
        raise ValueError(f"topk_method={c.topk_method!r} with index_topk={c.index_topk}: model_type"
                         " 'deepseek_v32' routes with 'noaux_tc' only")
    if not c.rope_interleave:
        raise ValueError(f"rope_interleave={c.rope_interleave!r} with index_topk={c.index_topk}: "
                         "model_type 'deepseek_v32' always rotates interleaved pairs")
    hf = _config_to_hf_v3(c)
    del hf["rope_interleave"]
    dense = c.first_k_dense_replace
    hf.update({
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "mlp_bias": False,
        **{name: getattr(c, name) for name in _V32_FIELDS},
    })
    if form == "5.x":
        hf["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (c.num_hidden_layers - dense)
        hf["layer_types"] = [V32_LAYER_TYPE] * c.num_hidden_layers
    return hf


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
