"""Analytic parameter counts, FLOPs per token and MFU (no TensorFlow needed)."""

import pytest

from models.deepseek.config import DeepSeekConfig
from models.deepseek.flops import activated_params, flops_per_token, mfu, total_params


def test_counts_for_tiny_config(tiny_config):
    # Hand derivations in test_deepseek_causal_lm.py.
    assert total_params(tiny_config) == 52784
    assert activated_params(tiny_config) == 21224
    # + MTP: enorm/hnorm 64 + eh_proj 2048 + active MoE block 8936 + norm 32 + head 2048
    assert activated_params(tiny_config, include_mtp=True) == 21224 + 13128


def test_flops_formula_by_hand(tiny_config):
    # 6 * N_active + 6 * L * n_h * T * (d_qk + d_v), T = 16:
    #   no MTP:  6*21224 + 6*2*4*16*(12+8) = 127344 + 15360 = 142704
    assert flops_per_token(tiny_config, 16, include_mtp=False) == 142704
    #   MTP:     6*34352 + 6*3*4*16*20     = 206112 + 23040 = 229152
    assert flops_per_token(tiny_config, 16) == 229152
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(tiny_config, 0)


def test_dense_equivalent_matches_nanogpt_formula():
    # Without MoE layers the formula reduces to nanoGPT's 6N + 12*L*H*Q*T (d_qk = d_v = Q).
    config = DeepSeekConfig(num_hidden_layers=2, first_k_dense_replace=2,
                            num_nextn_predict_layers=0, qk_nope_head_dim=16,
                            qk_rope_head_dim=16, v_head_dim=32)
    n = activated_params(config)
    assert flops_per_token(config, 128) == 6 * n + 12 * 2 * 4 * 32 * 128
    # Untied model: all parameters except the embedding are used per token.
    assert n == total_params(config) - config.vocab_size * config.hidden_size


def test_mfu():
    assert mfu(1000.0, 2.4e8, 2.4e11) == pytest.approx(1.0)
    assert mfu(500.0, 1e6, 1e9) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="peak_flops"):
        mfu(1.0, 1.0, 0.0)


def test_kv_cache_bytes_by_hand(tiny_config):
    from models.deepseek.config import deepseek_v3_config
    from models.deepseek.flops import kv_cache_bytes_per_token

    # Tiny: L=2, latent 16 + rope 4 = 20 numbers/layer, float32 -> 2*20*4 = 160 bytes;
    # MHA: 2 * 4 heads * (12 + 8) = 160 numbers -> 640 bytes.
    assert kv_cache_bytes_per_token(tiny_config) == 160
    assert kv_cache_bytes_per_token(tiny_config, layout="mha") == 640
    # DeepSeek-V3 in bf16: 61 * (512 + 64) * 2 = 70,272 bytes (~69 KiB) per token,
    # against 61 * 128 * (192 + 128) * 2 = 4,997,120 (~4.8 MiB) for MHA: 71x smaller.
    v3 = deepseek_v3_config()
    assert kv_cache_bytes_per_token(v3, 2) == 70_272
    assert kv_cache_bytes_per_token(v3, 2, layout="mha") == 4_997_120
    with pytest.raises(ValueError, match="layout"):
        kv_cache_bytes_per_token(v3, layout="gqa")
