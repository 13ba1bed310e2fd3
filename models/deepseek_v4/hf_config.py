"""`config.json` of DeepSeek-V4 checkpoints <-> `DeepSeekV4Config`.

  config_from_hf(dict) / config_to_hf(config) / read_config_json(dir)

Reads what transformers 5.24 `DeepseekV4Config` reads (`configuration_deepseek_v4.py`),
including the legacy keys it folds in at `__post_init__`:
  compress_ratios (per-layer 0 / 4 / 128 -> layer_types), compress_rate_csa /
  compress_rate_hca (-> compress_rates), num_hash_layers (-> mlp_layer_types),
  qk_rope_head_dim (-> partial_rotary_factor when that is absent),
and the rope in either form: nested `rope_parameters` {"main": ..., "compress": ...}
(what save_pretrained writes), or flat (`rope_parameters` / 4.x `rope_scaling` holding the
compress branch's YaRN keys, `rope_theta` the main base, `compress_rope_theta` the
compress base). Writes the 5.24 save_pretrained form (nested rope, `qk_rope_head_dim`
too). DeepSeek-V4.1 (Engram tables, CSA2, vision encoder) is refused: transformers has
no reference for it. Only `read_config_json` touches files.

MTP: a config.json's `num_nextn_predict_layers` (1 in DeepSeek's releases) is read as 0:
transformers does not build MTP either (it drops the `mtp.*` tensors on load) and the
importer (`hf_checkpoint`, `hf_names`) maps no `mtp.*` tensor, so the imported model has
no MTP depth and loads from a checkpoint with or without MTP weights. `config_to_hf`
writes 0 likewise: the exported files hold no `mtp.*` tensor (a model trained with MTP
depths exports its main model only).
"""

from __future__ import annotations

import logging
import os

from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.formats.checkpoint_error import CheckpointError

log = logging.getLogger(__name__)

CONFIG_NAME = "config.json"
MODEL_TYPE = "deepseek_v4"
V41_MESSAGE = ("DeepSeek-V4.1 is not supported: no transformers reference for V4.1's Engram "
               "tables, CSA2 and vision encoder")

# DeepSeekV4Config fields whose config.json name and meaning are the same.
_SHARED_FIELDS = (
    "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
    "num_attention_heads", "head_dim", "q_lora_rank", "n_routed_experts", "n_shared_experts",
    "num_experts_per_tok", "scoring_func", "norm_topk_prob", "routed_scaling_factor",
    "max_position_embeddings", "compress_rope_theta", "hc_mult", "hc_sinkhorn_iters", "hc_eps",
    "swiglu_limit", "sliding_window", "o_groups", "o_lora_rank", "index_n_heads",
    "index_head_dim", "index_topk", "rms_norm_eps",
    "tie_word_embeddings", "initializer_range", "attention_dropout",
    # Training rules transformers does not have; written as extra keys so they round-trip.
    "router_bias_update_speed", "aux_loss_alpha", "mtp_loss_weight",
)
# config.json keys whose value must be this for the model to be the one implemented here.
_REQUIRED_VALUES = {
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "num_key_value_heads": 1,
}
# Keys that do not change the computation, or that are read apart below.
_OTHER_KEYS = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype",
    "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "output_router_logits",
    "router_aux_loss_coef", "router_jitter_noise", "_name_or_path", "return_dict",
    "output_hidden_states", "output_attentions", "quantization_config", "expert_dtype",
    "rope_theta", "rope_parameters", "rope_scaling", "partial_rotary_factor", "layer_types",
    "mlp_layer_types", "compress_rates", "compress_ratios", "compress_rate_csa",
    "compress_rate_hca", "num_hash_layers", "qk_rope_head_dim", "num_nextn_predict_layers",
    "attn_implementation",
}
# transformers `_COMPRESS_RATIO_TO_LAYER_TYPE` (legacy per-layer `compress_ratios`).
_RATIO_TO_LAYER_TYPE = {0: SLIDING, 4: CSA, 128: HCA}
_DEFAULT_PARTIAL_ROTARY_FACTOR = 64 / 512  # transformers `default_partial_rotary_factor`
# Markers of DeepSeek-V4.1 configs (model_type or key fragments).
_V41_KEY_MARKERS = ("engram", "csa2", "vision")


def _check_not_v41(hf: dict) -> None:
    model_type = hf.get("model_type")
    if isinstance(model_type, str) and model_type.startswith("deepseek_v4") and (
            model_type != MODEL_TYPE):
        raise CheckpointError(f"config.json model_type={model_type!r}: {V41_MESSAGE}")
    for key in hf:
        if any(marker in key.lower() for marker in _V41_KEY_MARKERS):
            raise CheckpointError(f"config.json key {key!r}: {V41_MESSAGE}")
    for key in ("layer_types", "mlp_layer_types"):
        for value in hf.get(key) or ():
            if isinstance(value, str) and any(m in value.lower() for m in _V41_KEY_MARKERS):
                raise CheckpointError(f"config.json {key} entry {value!r}: {V41_MESSAGE}")


def config_from_hf(hf: dict) -> DeepSeekV4Config:
    """A DeepSeekV4Config from a config.json dict (model_type "deepseek_v4"), with
    num_nextn_predict_layers 0 (module docstring: no MTP module is imported).

    Raises:
      CheckpointError: another model_type; DeepSeek-V4.1 keys; a key whose value this
        model does not implement (hidden_act, biases, num_key_value_heads, a "main" rope
        that is not plain, a compress_ratios entry other than 0/4/128, a rope type other
        than default/yarn), one line naming the key and value.
      ValueError: a value DeepSeekV4Config rejects (names the field).
    """
    _check_not_v41(hf)
    model_type = hf.get("model_type", MODEL_TYPE)
    if model_type != MODEL_TYPE:
        raise CheckpointError(f"config.json model_type={model_type!r}: only {MODEL_TYPE!r} is "
                              "supported here")
    for key, expected in _REQUIRED_VALUES.items():
        if key in hf and hf[key] != expected:
            raise CheckpointError(f"config.json {key}={hf[key]!r}: only {expected!r} is supported")
    kwargs = {name: hf[name] for name in _SHARED_FIELDS if name in hf and hf[name] is not None}
    n_layers = hf.get("num_hidden_layers", DeepSeekV4Config.num_hidden_layers)
    if hf.get("num_nextn_predict_layers"):
        log.info("config.json num_nextn_predict_layers=%s: imported as 0 (transformers builds "
                 "no MTP module; the mtp.* tensors are not read)", hf["num_nextn_predict_layers"])
    kwargs["num_nextn_predict_layers"] = 0

    rates = dict(hf.get("compress_rates") or {CSA: 4, HCA: 128})
    if hf.get("compress_rate_csa") is not None:
        rates[CSA] = hf["compress_rate_csa"]
    if hf.get("compress_rate_hca") is not None:
        rates[HCA] = hf["compress_rate_hca"]
    kwargs["compress_rates"] = rates

    layer_types = hf.get("layer_types")
    if layer_types is None and hf.get("compress_ratios") is not None:
        ratios = hf["compress_ratios"]
        bad = [r for r in ratios if r not in _RATIO_TO_LAYER_TYPE]
        if bad:
            raise CheckpointError(f"config.json compress_ratios has {bad[0]!r}: only "
                                  f"{sorted(_RATIO_TO_LAYER_TYPE)} are known to transformers")
        layer_types = [_RATIO_TO_LAYER_TYPE[r] for r in ratios]
    if layer_types is not None:  # transformers keeps the first num_hidden_layers entries
        kwargs["layer_types"] = tuple(layer_types[:n_layers])
    mlp_layer_types = hf.get("mlp_layer_types")
    if mlp_layer_types is None and hf.get("num_hash_layers") is not None:
        n_hash = hf["num_hash_layers"]
        mlp_layer_types = ["hash_moe"] * min(n_layers, n_hash) + ["moe"] * max(0, n_layers - n_hash)
    if mlp_layer_types is not None:
        kwargs["mlp_layer_types"] = tuple(mlp_layer_types[:n_layers])

    head_dim = hf.get("head_dim", DeepSeekV4Config.head_dim)
    factor = hf.get("partial_rotary_factor")
    if factor is None:
        legacy = hf.get("qk_rope_head_dim")
        factor = legacy / head_dim if legacy is not None else _DEFAULT_PARTIAL_ROTARY_FACTOR
    kwargs["qk_rope_head_dim"] = int(head_dim * factor)
    kwargs.update(_rope_kwargs(hf, kwargs["qk_rope_head_dim"], head_dim))

    unknown = sorted(set(hf) - set(_SHARED_FIELDS) - set(_REQUIRED_VALUES) - _OTHER_KEYS)
    if unknown:
        log.info("config.json keys not used by DeepSeekV4Config: %s", unknown)
    return DeepSeekV4Config(**kwargs)


def _rope_kwargs(hf: dict, rope_dim: int, head_dim: int) -> dict:
    """rope_theta (main), compress_rope_theta and rope_scaling (compress YaRN or None)."""
    params = hf.get("rope_parameters")
    if params is None:
        params = hf.get("rope_scaling")  # transformers 4.x / DeepSeek's own config.json
    params = dict(params or {})
    out = {"rope_theta": float(hf.get("rope_theta", DeepSeekV4Config.rope_theta))}
    if "compress_rope_theta" in hf:
        out["compress_rope_theta"] = float(hf["compress_rope_theta"])
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main, compress = dict(params["main"]), dict(params["compress"])
        main_type = main.get("rope_type", main.get("type", "default"))
        if main_type != "default":
            raise CheckpointError(f"config.json rope_parameters.main.rope_type={main_type!r}: "
                                  "only 'default' is supported (transformers V4)")
        out["rope_theta"] = float(main.get("rope_theta", out["rope_theta"]))
        if "rope_theta" in compress:
            out["compress_rope_theta"] = float(compress["rope_theta"])
        for branch, sub in (("main", main), ("compress", compress)):
            factor = sub.get("partial_rotary_factor")
            if factor is not None and int(head_dim * factor) != rope_dim:
                raise CheckpointError(
                    f"config.json rope_parameters.{branch}.partial_rotary_factor={factor!r} "
                    f"disagrees with partial_rotary_factor ({rope_dim} of head_dim {head_dim})")
    else:  # flat: the compress branch's scaling keys (transformers folds them likewise)
        compress = {k: v for k, v in params.items() if k not in ("main", "compress")}
    compress_type = compress.get("rope_type", compress.get("type", "default"))
    if compress_type not in ("default", "yarn"):
        raise CheckpointError(f"config.json compress rope_type={compress_type!r}: only "
                              "'default' and 'yarn' are supported")
    if compress_type == "yarn":
        out["rope_scaling"] = {k: v for k, v in compress.items()
                               if k not in ("rope_theta", "partial_rotary_factor")}
    else:
        out["rope_scaling"] = None
    return out


def config_to_hf(config: DeepSeekV4Config) -> dict:
    """The transformers 5.24 config.json dict (save_pretrained form) of a DeepSeekV4Config
    (num_nextn_predict_layers 0: the exported files hold no MTP module)."""
    c = config
    factor = c.partial_rotary_factor
    compress = {"rope_type": "default"}
    if c.rope_scaling is not None:
        compress = {k: v for k, v in c.rope_scaling.items() if v is not None}
    compress.update(rope_theta=c.compress_rope_theta, partial_rotary_factor=factor)
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": MODEL_TYPE,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "num_key_value_heads": 1,
        "dtype": "float32",
        **{name: getattr(c, name) for name in _SHARED_FIELDS},
        "num_nextn_predict_layers": 0,
        "layer_types": list(c.layer_types),
        "mlp_layer_types": list(c.mlp_layer_types),
        "compress_rates": dict(c.compress_rates),
        "partial_rotary_factor": factor,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "rope_theta": c.rope_theta,
        "rope_parameters": {
            "main": {"rope_type": "default", "rope_theta": c.rope_theta,
                     "partial_rotary_factor": factor},
            "compress": compress,
        },
    }


def read_config_json(checkpoint_dir: str) -> DeepSeekV4Config:
    """The DeepSeekV4Config of `checkpoint_dir/config.json` (local or any tf.io.gfile path).

    Raises:
      FileNotFoundError: no config.json.
      JsonFileError (a ValueError): not a JSON object; CheckpointError: see `config_from_hf`.
    """
    from common.json_file import read_json

    path = os.path.join(checkpoint_dir, CONFIG_NAME)
    try:
        raw = read_json(path, "the checkpoint's config.json")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: no config.json (is this a checkpoint directory?)") from None
    return config_from_hf(raw)
