"""Named DeepSeek-V3- and V2-style architectures, each written as its differences from `DeepSeekConfig()`.

As keras-hub's `*_presets.py` files sit beside their backbones, these sit beside
`config.py`: every entry lists only the fields it changes from the dataclass
defaults, so what sets one architecture apart is what is written. The pipeline's
presets (`config/presets.py`) take their model from here by the same name.

This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

from typing import Any

from models.deepseek.config import DeepSeekConfig

DEEPSEEK_PRESETS: dict[str, dict[str, Any]] = {
    # Tests: 2 blocks, 64 wide, tied embeddings; trains in seconds.
    "tiny": dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, max_position_embeddings=64,
        q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        intermediate_size=128, moe_intermediate_size=32, tie_word_embeddings=True),
    # The default main job on a 2-core CPU: the defaults, tied, without MTP (8.5M parameters,
    # 4.9M activated per token).
    "cpu_small": dict(tie_word_embeddings=True, num_nextn_predict_layers=0),
    # A ~100M-class MoE for one GPU.
    "gpu_base": dict(
        vocab_size=32768, hidden_size=768, num_hidden_layers=12, max_position_embeddings=1024,
        num_attention_heads=12, q_lora_rank=384, kv_lora_rank=256,
        qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
        intermediate_size=2048, moe_intermediate_size=512, n_routed_experts=16,
        num_experts_per_tok=4),
    # The released DeepSeek-V3 (671B total, 37B activated): the `config.json` of
    # deepseek-ai/DeepSeek-V3 (also arXiv 2412.19437 §4.2). For FLOP, parameter and memory
    # arithmetic; far too large to build on these machines.
    "deepseek_v3": dict(
        vocab_size=129280, hidden_size=7168, num_hidden_layers=61, max_position_embeddings=163840,
        num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        intermediate_size=18432, moe_intermediate_size=2048, first_k_dense_replace=3,
        n_routed_experts=256, num_experts_per_tok=8, n_group=8, topk_group=4,
        routed_scaling_factor=2.5,
        rope_scaling={
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
        }),
    # The released DeepSeek-V2-Lite (15.7B total, 2.4B activated): the `config.json` of
    # deepseek-ai/DeepSeek-V2-Lite (sizes also in arXiv 2405.04434 appendix B and MaxText's
    # configs/models/deepseek2-16b.yml): softmax "greedy" routing, no q compression, no
    # router bias, no MTP. Not in its config.json: rope_interleave (DeepseekV2 always
    # interleaves) and MTP, hence the two V3-only fields below.
    "deepseek_v2_lite": dict(
        vocab_size=102400, hidden_size=2048, num_hidden_layers=27, max_position_embeddings=163840,
        num_attention_heads=16, q_lora_rank=None, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        intermediate_size=10944, moe_intermediate_size=1408, first_k_dense_replace=1,
        n_routed_experts=64, n_shared_experts=2, num_experts_per_tok=6, n_group=1, topk_group=1,
        topk_method="greedy", scoring_func="softmax", seq_aux=True, norm_topk_prob=False,
        routed_scaling_factor=1.0, aux_loss_alpha=0.001, num_nextn_predict_layers=0,
        rope_scaling={
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
        }),
    # The released DeepSeek-V2 (236B total, 21B activated): the `config.json` of
    # deepseek-ai/DeepSeek-V2 (also MaxText's configs/models/deepseek2-236b.yml):
    # "group_limited_greedy" over 8 groups of 20 experts keeping 3 (the paper's
    # device-limited routing, arXiv 2405.04434 §2.2.2), routed_scaling_factor 16.
    "deepseek_v2": dict(
        vocab_size=102400, hidden_size=5120, num_hidden_layers=60, max_position_embeddings=163840,
        num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512,
        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
        intermediate_size=12288, moe_intermediate_size=1536, first_k_dense_replace=1,
        n_routed_experts=160, n_shared_experts=2, num_experts_per_tok=6, n_group=8, topk_group=3,
        topk_method="group_limited_greedy", scoring_func="softmax", seq_aux=True,
        norm_topk_prob=False, routed_scaling_factor=16.0, aux_loss_alpha=0.003,
        num_nextn_predict_layers=0,
        rope_scaling={
            "type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
            "beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707,
        }),
}


def deepseek_preset(name: str) -> DeepSeekConfig:
    """The architecture `name` of `DEEPSEEK_PRESETS`: `DeepSeekConfig()` with its changes.

    Raises:
      ValueError: `name` is not a preset (the message lists them).
    """
    if name not in DEEPSEEK_PRESETS:
        raise ValueError(f"unknown DeepSeek preset '{name}'; choose one of "
                         f"{sorted(DEEPSEEK_PRESETS)}")
    return DeepSeekConfig().replace(**DEEPSEEK_PRESETS[name])


def deepseek_v3_config() -> DeepSeekConfig:
    """The released DeepSeek-V3 (671B total, 37B activated) architecture."""
    return deepseek_preset("deepseek_v3")
