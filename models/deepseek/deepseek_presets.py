"""Named DeepSeek-V3-style architectures, each written as its differences from `DeepSeekConfig()`.

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
