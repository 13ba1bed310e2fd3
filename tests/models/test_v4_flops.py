"""DeepSeek-V4 training FLOPs per token (`models/deepseek_v4/flops.py`): a tiny model counted
by hand, the growth with the sequence length against V3's, and (slow) the parameter part
against the built Keras model. No TensorFlow except the slow test."""

import pytest

from models.deepseek import flops as v3_flops
from models.deepseek.config import DeepSeekConfig
from models.deepseek_v4 import flops
from models.deepseek_v4 import memory_plan as mp
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.deepseek_v4.presets import deepseek_v4_preset

# The hand-counted model of tests/models/test_v4_memory_plan.py: C = 4, H = 2, D = 4, n = 2,
# t_max = 20, nI = 1, DI = 2, CSA m = 2, HCA m' = 4, W = 4, index_topk 2, V = 10, one MTP
# depth; 1207 activated parameters (counted there by hand), 383 in the MTP module.
TINY = DeepSeekV4Config(
    vocab_size=10, hidden_size=4, moe_intermediate_size=3, num_hidden_layers=3,
    num_attention_heads=2, head_dim=4, q_lora_rank=2, qk_rope_head_dim=2, n_routed_experts=2,
    num_experts_per_tok=1, layer_types=(SLIDING, CSA, HCA), compress_rates={CSA: 2, HCA: 4},
    mlp_layer_types=("hash_moe", "moe", "moe"), hc_mult=2, o_groups=2, o_lora_rank=2,
    index_n_heads=1, index_head_dim=2, index_topk=2, sliding_window=4,
    max_position_embeddings=16, num_nextn_predict_layers=1)
ACTIVATED, MTP_ACTIVATED = 1207, 419 - 36


def test_tiny_by_hand():
    assert flops.activated_params(TINY) == ACTIVATED
    # + the MTP module's own 383 and its use of the head, V C = 40.
    assert flops.activated_params(TINY, include_mtp=True) == ACTIVATED + MTP_ACTIVATED + 40
    # T = 9. Keys: sliding min(9, 4) = 4; CSA 4 + min(9 // 2, 2) = 6; HCA 4 + 9 // 4 = 6.
    # A = 4 H D = 32 FLOPs per key x 16 keys = 512; indexer 2 nI (DI + 1) x 4 entries = 24.
    assert [flops.attended_keys(TINY, t, 9) for t in TINY.layer_types] == [4, 6, 6]
    assert flops.attention_forward_flops(TINY, 9) == 512 + 24
    # mHC per sub-block: 2 n (n + 2) C = 64 plus Sinkhorn 4 n^2 t = 320 -> 384, 6 sub-blocks
    # = 2304, hc_head 2 n C = 16; pooling: CSA 2 x 2D + 2 x 2DI = 24, HCA 2D = 8.
    assert flops.mix_forward_flops(TINY) == 2304 + 16 + 24 + 8
    assert flops.flops_per_token(TINY, 9, include_mtp=False) == (
        6 * ACTIVATED + 3 * (512 + 24) + 3 * 2352)  # 15906
    # MTP: a sliding block (4 keys x 32 = 128) and its mixes (2 x 384 + 16 = 784).
    assert flops.flops_per_token(TINY, 9) == (
        6 * (ACTIVATED + MTP_ACTIVATED + 40) + 3 * (512 + 24 + 128) + 3 * (2352 + 784))
    # As executed by the sparse path (the default): 2W = 8 window keys (blocks of W queries
    # against 2W keys), + min(4, 2) gathered CSA picks, + 2 HCA entries.
    assert [flops.attended_keys(TINY, t, 9, "computed") for t in TINY.layer_types] == [8, 10, 10]
    assert flops.flops_per_token(TINY, 9, include_mtp=False, counted="computed") == (
        6 * ACTIVATED + 3 * (28 * 32 + 24) + 3 * 2352)
    # By the dense reference: masked scores over 9 tokens (+ 4 CSA, + 2 HCA entries).
    dense = TINY.replace(attn_implementation="dense")
    assert [flops.attended_keys(dense, t, 9, "computed") for t in TINY.layer_types] == [9, 13, 11]
    assert flops.flops_per_token(dense, 9, include_mtp=False, counted="computed") == (
        6 * ACTIVATED + 3 * (33 * 32 + 24) + 3 * 2352)
    assert flops.decode_flops_per_token(TINY, 9) == 2 * ACTIVATED + 536 + 2352
    # The planner uses the same formula without MTP.
    assert mp.flops_per_token(TINY, 9) == flops.flops_per_token(TINY, 9, include_mtp=False)
    assert mp.decode_flops_per_token(TINY, 9) == flops.decode_flops_per_token(TINY, 9)


def test_bad_arguments():
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="seq_len"):
            flops.flops_per_token(TINY, bad)
        with pytest.raises(ValueError, match="context_len"):
            flops.decode_flops_per_token(TINY, bad)
    with pytest.raises(ValueError, match="counted='dense'"):
        flops.flops_per_token(TINY, 9, counted="dense")
    with pytest.raises(ValueError, match="layer_type='full'"):
        flops.attended_keys(TINY, "full", 9)


def _attention_growth(per_token, t: int) -> float:
    """Exponent of the per-sequence attention FLOPs T x A(T) between t and 2t (log2 ratio)."""
    import math
    return math.log2(2 * per_token(2 * t) / per_token(t))


def test_growth_with_length_against_v3():
    """Per sequence, V3's attention grows as T^2; V4's sliding and CSA attention as T (the
    window and the top-k are bounded), HCA's and the indexer's quadratically but with 1/m' and
    nI (DI + 1) / (m 4 H D) of V3's slope."""
    width = dict(hidden_size=256, num_attention_heads=4, num_hidden_layers=4)
    v3 = DeepSeekConfig(**width, num_nextn_predict_layers=0, max_position_embeddings=1 << 16)
    v3_attention = lambda t: (v3_flops.flops_per_token(v3, t) - 6 * v3_flops.activated_params(v3))  # noqa: E731
    assert _attention_growth(v3_attention, 8192) == pytest.approx(2.0)
    for layer_type in (SLIDING, CSA):
        v4 = DeepSeekV4Config(**width, head_dim=64, layer_types=(layer_type,) * 4,
                              mlp_layer_types=("moe",) * 4, sliding_window=128, index_topk=64,
                              max_position_embeddings=1 << 16)
        main = lambda t, v4=v4: 4 * v4.num_attention_heads * v4.head_dim * sum(  # noqa: E731
            flops.attended_keys(v4, lt, t) for lt in v4.layer_types)
        assert _attention_growth(main, 8192) == pytest.approx(1.0)  # per token: constant
    # Whole training FLOPs per token at 1K -> 16K: V3 x 4.1, V4-style (SWA/CSA/HCA) x 1.2.
    v4 = DeepSeekV4Config(**width, head_dim=64, layer_types=(SLIDING, CSA, HCA, CSA),
                          mlp_layer_types=("hash_moe",) + ("moe",) * 3, sliding_window=128,
                          compress_rates={CSA: 4, HCA: 128}, index_topk=64,
                          max_position_embeddings=1 << 16, n_routed_experts=8)
    v3_ratio = v3_flops.flops_per_token(v3, 16384) / v3_flops.flops_per_token(v3, 1024)
    v4_ratio = flops.flops_per_token(v4, 16384) / flops.flops_per_token(v4, 1024)
    assert v3_ratio > 4 and v4_ratio < 1.25, (v3_ratio, v4_ratio)


def test_v4_flash_against_the_published_activated_size():
    """6 x 13.3B activated dominates V4-Flash's training FLOPs at 4K; at 1M tokens the
    attention (HCA entries and the indexer over T / 4 keys) adds about as much again."""
    flash = deepseek_v4_preset("deepseek_v4_flash")
    n = flops.activated_params(flash)
    assert round(n / 1e9, 2) == 13.27
    assert flops.flops_per_token(flash, 4096, include_mtp=False) / (6 * n) == pytest.approx(
        1.0, abs=0.1)


@pytest.mark.slow  # imports TensorFlow (~10 s) and builds the Keras V4 model
def test_parameter_part_equals_the_built_model():
    """N_active = the built model's weights minus the embedding, the tid2eid tables and the
    routed experts a token does not use ((E - K) / E of each stacked expert tensor)."""
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM
    config = TINY.replace(num_nextn_predict_layers=0)
    model = DeepSeekV4CausalLM(config)
    E, K = config.n_routed_experts, config.num_experts_per_tok
    used = 0
    for v in model.weights:
        size = int(v.numpy().size)
        if "tid2eid" in v.path or size == config.vocab_size * config.hidden_size and (
                "embed" in v.path):
            continue
        if len(v.shape) == 3 and v.shape[0] == E and "expert" in v.path:
            size = size * K // E  # stacked routed experts (E, in, out)
        used += size
    assert used == flops.activated_params(config) == ACTIVATED
