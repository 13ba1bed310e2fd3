"""The released DeepSeek-V4 architectures, written as differences (keras-hub `*_presets.py` style).

`tiny_v4`, `cpu_small_v4` and `gpu_base_v4` are the pipeline's V4-style models, trained by
the presets of the same names (`config/presets.py`).

`deepseek_v4_flash` lists the fields of DeepSeek-V4-Flash's `config.json` that differ from
`DeepSeekV4Config()`'s defaults (a small CPU model); `deepseek_v4_pro` lists what
DeepSeek-V4-Pro's `config.json` changes from V4-Flash. For parameter, memory, KV-cache and
FLOP arithmetic (`models/deepseek_v4/memory_plan.py`, `deepseek-tfx plan`); far too large to
build on these machines. Beside `models/deepseek/deepseek_presets.py` (V2/V3), whose
`DeepSeekConfig` cannot hold a V4 model.

Sources (each value below was read in these, and the two agree field by field):
  V4-Flash: https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash/blob/main/config.json, as
    copied verbatim into public repositories' tests (stored copies found with the
    code index: a Rust `OFFICIAL_CONFIG` pinned by sha256, and a C++ test header `kConfig`,
    both with `compress_ratios` of 46 entries (43 layers + MTP + 2 DSpark) ending 4, 0, 0, 0;
    two other copies list 44 entries ending 4, 0); transformers 5.24
    `configuration_deepseek_v4.py` defaults (`@auto_docstring(checkpoint=
    "deepseek-ai/DeepSeek-V4-Flash-Base")`: hidden 4096, 43 layers, 64 heads, head_dim 512,
    q_lora_rank 1024, 256 experts top-6, moe_intermediate_size 2048, o_groups 8,
    o_lora_rank 1024, index 64 x 128 top-512, sliding_window 128, routed_scaling_factor 1.5,
    hc 4 / 20 / 1e-6, swiglu_limit 10, compress_rope_theta 160000, 3 hash layers); NVIDIA
    NeMo AutoModel `deepseek_v4.config.DeepseekV4Config` defaults (the same values,
    https://docs.nvidia.com/nemo/automodel/latest/nemo-automodel/nemo_automodel/components/models/deepseek_v4/config).
  V4-Pro: https://huggingface.co/deepseek-ai/DeepSeek-V4-Pro/blob/main/config.json, as
    copied whole (with `compress_ratios` [128, 128, 4, 128, ..., 4, 0], 62 entries) into a
    public repository's code (index id 60699344711), and cross-checked against
    https://glennklockwood.com/garden/DeepSeek-V4-Pro (61 layers + 1 MTP, layers 0-1 HCA
    then CSA/HCA interleaved, 128 heads x 512, q_lora_rank 1536, o_groups 16 x o_lora_rank
    1024, hidden 7168, 384 experts / 6, sliding window 128, YaRN x16 from 64K,
    compress_rope_theta 160000), https://lzwjava.github.io/deepseek-v4-pro-architecture-and-code-overview-en
    (route_scale 2.5, original_seq_len 65536), transformers 5.24 `DeepseekV4GroupedLinear`
    docstring (V4-Pro: 128 heads, head_dim 512, o_groups 16, o_lora_rank 1024, hidden 7168)
    and NVIDIA aiconfigurator's V4 attention tests (q_lora_rank 1536, o_lora_rank 1024,
    index 64 x 128, index_topk 1024, window 128). No Pro value had to be derived.

Both configs give `compress_ratios` with one more entry than layers (the MTP block, 0 =
sliding window); `layer_types` takes the first num_hidden_layers of them (0 -> sliding,
4 -> CSA, 128 -> HCA, transformers' `_COMPRESS_RATIO_TO_LAYER_TYPE`), `mlp_layer_types` the
first `num_hash_layers` (3) as "hash_moe". transformers' default `layer_types` (HCA, HCA,
then HCA/CSA from layer 2) is not V4-Pro's (CSA/HCA from layer 2), hence explicit lists.

Published sizes (DeepSeek-V4 paper abstract, arXiv 2606.19348; model cards): V4-Flash 284B
total / 13B activated, V4-Pro 1.6T / 49B.

This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

from typing import Any

from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config

_RATIO_TO_LAYER_TYPE = {0: SLIDING, 4: CSA, 128: HCA}


def _layer_types(compress_ratios: list[int], num_hidden_layers: int) -> tuple[str, ...]:
    """config.json `compress_ratios` (one per layer, then MTP entries) -> `layer_types`."""
    return tuple(_RATIO_TO_LAYER_TYPE[r] for r in compress_ratios[:num_hidden_layers])


def _mlp_layer_types(num_hash_layers: int, num_hidden_layers: int) -> tuple[str, ...]:
    """config.json `num_hash_layers` -> `mlp_layer_types` (hash routing first)."""
    return ("hash_moe",) * num_hash_layers + ("moe",) * (num_hidden_layers - num_hash_layers)


# config.json `compress_ratios`, 44 entries (43 layers + the MTP block): 0, 0, then 4 / 128
# alternating from layer 2 (21 CSA, 20 HCA layers), then 0 for MTP.
_FLASH_COMPRESS_RATIOS = [0, 0] + [4, 128] * 20 + [4] + [0]
# config.json `compress_ratios`, 62 entries (61 layers + MTP): 128, 128, then 4 / 128
# alternating from layer 2 (30 CSA, 31 HCA layers), then 0 for MTP.
_PRO_COMPRESS_RATIOS = [128, 128] + [4, 128] * 29 + [4] + [0]

# The YaRN of the compressed branches: config.json `rope_scaling` (both releases).
_ROPE_SCALING = {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                 "beta_fast": 32, "beta_slow": 1}

_FLASH: dict[str, Any] = dict(
    vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43,
    num_attention_heads=64, head_dim=512, q_lora_rank=1024, qk_rope_head_dim=64,
    n_routed_experts=256, num_experts_per_tok=6, max_position_embeddings=1048576,
    rope_scaling=_ROPE_SCALING,
    layer_types=_layer_types(_FLASH_COMPRESS_RATIOS, 43),
    mlp_layer_types=_mlp_layer_types(3, 43),
    sliding_window=128, o_groups=8, o_lora_rank=1024,
    index_n_heads=64, index_head_dim=128, index_topk=512, num_nextn_predict_layers=1)
# Already the defaults and equal to config.json: n_shared_experts 1, scoring_func
# "sqrtsoftplus", norm_topk_prob true, routed_scaling_factor 1.5, rope_theta 10000,
# compress_rope_theta 160000, hc_mult 4, hc_sinkhorn_iters 20, hc_eps 1e-6,
# swiglu_limit 10.0, rms_norm_eps 1e-6, tie_word_embeddings false, initializer_range 0.02.

# The pipeline's `cpu_small_v4` model (below), also the base of `cpu_long_v4`.
_CPU_SMALL_V4: dict[str, Any] = dict(
    vocab_size=8192, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
    head_dim=64, q_lora_rank=128, qk_rope_head_dim=16, moe_intermediate_size=256,
    max_position_embeddings=256, layer_types=(SLIDING, CSA, HCA, CSA),
    compress_rates={CSA: 4, HCA: 32}, sliding_window=32, o_groups=2, o_lora_rank=64,
    index_n_heads=4, index_head_dim=32, index_topk=8,
    mlp_layer_types=_mlp_layer_types(1, 4), tie_word_embeddings=True)

DEEPSEEK_V4_PRESETS: dict[str, dict[str, Any]] = {
    # The pipeline's V4-style models (`config/presets.py` `tiny_v4`, `cpu_small_v4`,
    # `gpu_base_v4`): the width of the V3 preset of the same size, every V4 piece present
    # (a sliding-window layer, CSA with its lightning indexer, HCA; hash routing in the first
    # layer(s), mHC), compress rates scaled to the training sequence length so that each
    # compressed layer holds several entries (HCA's 128 would hold one at 128 tokens).
    "tiny_v4": dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        head_dim=16, q_lora_rank=32, qk_rope_head_dim=8, moe_intermediate_size=32,
        max_position_embeddings=64, layer_types=(CSA, HCA, SLIDING),
        compress_rates={CSA: 4, HCA: 8}, sliding_window=8, hc_mult=2, o_groups=2,
        o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4,
        mlp_layer_types=_mlp_layer_types(1, 3), tie_word_embeddings=True),
    "cpu_small_v4": _CPU_SMALL_V4,
    # `cpu_small_v4` with V4's released attention settings at this width (window 128, CSA
    # rate 4, HCA rate 128) and the release's compress-rope YaRN (x16 from 64K), accepting
    # 131,072 positions; trained at 4,096-token sequences (`config/presets.py`), where the
    # indexer keeps 128 of a sequence's 1,024 CSA entries.
    "cpu_long_v4": dict(
        _CPU_SMALL_V4, sliding_window=128, compress_rates={CSA: 4, HCA: 128}, index_topk=128,
        max_position_embeddings=131072, rope_scaling=_ROPE_SCALING),
    "gpu_base_v4": dict(
        vocab_size=32768, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
        head_dim=128, q_lora_rank=384, qk_rope_head_dim=32, moe_intermediate_size=512,
        n_routed_experts=16, num_experts_per_tok=4, max_position_embeddings=1024,
        layer_types=(SLIDING, SLIDING) + (CSA, HCA) * 5, sliding_window=128, o_groups=4,
        o_lora_rank=256, index_n_heads=8, index_head_dim=64, index_topk=64,
        mlp_layer_types=_mlp_layer_types(2, 12), num_nextn_predict_layers=1),
    # DeepSeek-V4-Flash (284B total, 13B activated; `deepseek-ai/DeepSeek-V4-Flash`).
    "deepseek_v4_flash": _FLASH,
    # DeepSeek-V4-Pro (1.6T total, 49B activated; `deepseek-ai/DeepSeek-V4-Pro`): V4-Flash
    # with these changes.
    "deepseek_v4_pro": dict(
        _FLASH, hidden_size=7168, moe_intermediate_size=3072, num_hidden_layers=61,
        num_attention_heads=128, q_lora_rank=1536, n_routed_experts=384,
        routed_scaling_factor=2.5,
        layer_types=_layer_types(_PRO_COMPRESS_RATIOS, 61),
        mlp_layer_types=_mlp_layer_types(3, 61),
        o_groups=16, index_topk=1024),
}


# DeepSeek's published (total, activated) parameters, for comparison only: the planner
# computes its counts from the fields above (DeepSeek-V4 paper abstract; model cards).
PUBLISHED_SIZES: dict[str, tuple[float, float]] = {
    "deepseek_v4_flash": (284e9, 13e9),
    "deepseek_v4_pro": (1.6e12, 49e9),
}


def deepseek_v4_preset(name: str) -> DeepSeekV4Config:
    """The architecture `name` of `DEEPSEEK_V4_PRESETS`: `DeepSeekV4Config()` with its changes.

    Raises:
      ValueError: `name` is not a preset (the message lists them).
    """
    if name not in DEEPSEEK_V4_PRESETS:
        raise ValueError(f"unknown DeepSeek-V4 preset '{name}'; choose one of "
                         f"{sorted(DEEPSEEK_V4_PRESETS)}")
    return DeepSeekV4Config().replace(**DEEPSEEK_V4_PRESETS[name])
