"""Analytic parameter counts, FLOPs per token and MFU (no TensorFlow needed)."""

import pytest

from models.deepseek.config import DeepSeekConfig
from models.deepseek.flops import (
    activated_params,
    decode_flops_per_token,
    flops_per_token,
    mfu,
    total_params,
)


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
    from models.deepseek.deepseek_presets import deepseek_v3_config
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


def test_decode_flops_by_hand(tiny_config):
    # L=2, H=4, R=16, Dn=8, Dr=4, Dv=8, N_active=21224, S=10.
    # kv_b_proj per layer: R*H*(Dn+Dv) = 16*4*16 = 1024; the rest 2*(21224 - 2*1024) = 38352.
    # Absorbed per layer: q 2*4*8*16 = 1024, scores 2*10*4*(16+4) = 1600,
    #   values 2*10*4*16 = 1280, output 2*4*16*8 = 1024 -> 4928; x2 layers = 9856.
    assert decode_flops_per_token(tiny_config, 10) == 38352 + 9856
    # Expanded per layer: kv_b_proj 2*10*1024 = 20480, scores 2*10*4*(8+4) = 960,
    #   values 2*10*4*8 = 640 -> 22080; x2 layers = 44160.
    assert decode_flops_per_token(tiny_config, 10, absorbed=False) == 38352 + 44160
    # Absorbed = 2*N_active + L*2*S*H*(2R + Dr) = 42448 + 2*2*10*4*36 = 48208.
    assert decode_flops_per_token(tiny_config, 10) == 2 * 21224 + 2 * 2 * 10 * 4 * 36
    with pytest.raises(ValueError, match="context_len"):
        decode_flops_per_token(tiny_config, 0)


def test_decode_flops_of_deepseek_v3_at_4k():
    from models.deepseek.deepseek_presets import deepseek_v3_config

    v3 = deepseek_v3_config()
    # Per layer and cached token, expanding costs 2*512*128*(128+128) = 33.6 MFLOPs
    # against 2*128*(2*512+64) = 0.28 MFLOPs absorbed.
    absorbed, expanded = (decode_flops_per_token(v3, 4096, a) for a in (True, False))
    slope_absorbed = decode_flops_per_token(v3, 4097) - absorbed
    slope_expanded = decode_flops_per_token(v3, 4097, absorbed=False) - expanded
    assert slope_absorbed == 61 * 2 * 128 * (2 * 512 + 64)
    assert slope_expanded == 61 * (2 * 512 * 128 * 256 + 2 * 128 * (128 + 64) + 2 * 128 * 128)
    assert expanded > 4 * absorbed
