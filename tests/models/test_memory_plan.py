"""The planner's arithmetic (`models/deepseek/memory_plan.py`) on a case counted by hand,
and its parameter counts against built Keras models."""

import pytest

from models.deepseek import flops
from models.deepseek import memory_plan as mp
from models.deepseek.config import DeepSeekConfig
from models.deepseek.deepseek_presets import deepseek_preset

# Small enough to count every parameter and byte by hand: C = 4, one head, dense block 0,
# MoE block 1 with 2 experts (top-1) and 1 shared expert, untied, no MTP.
MICRO = DeepSeekConfig(
    vocab_size=10, hidden_size=4, num_hidden_layers=2, num_attention_heads=1, q_lora_rank=None,
    kv_lora_rank=2, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=2, intermediate_size=6,
    moe_intermediate_size=3, n_routed_experts=2, n_shared_experts=1, num_experts_per_tok=1,
    n_group=1, topk_group=1, first_k_dense_replace=1, tie_word_embeddings=False,
    num_nextn_predict_layers=0, max_position_embeddings=8)

# Parameters by hand:
#   embed 10*4 = 40
#   attention per block: input norm 4, q_proj 4*(1*4) = 16, kv_a 4*(2+2) = 16,
#     kv_a_layernorm 2, kv_b 2*(1*(2+2)) = 8, o_proj (1*2)*4 = 8, post norm 4  -> 58
#   block 0 MLP: 3*4*6 = 72                                                   -> 130
#   block 1 MoE: router 2*4 = 8, bias 2 (not trainable), experts 2*(3*4*3) = 72,
#     shared 3*4*3 = 36                                                      -> 176
#   final norm 4, lm_head 4*10 = 40
TOTAL = 40 + 130 + 176 + 4 + 40  # 390
TRAINABLE = TOTAL - 2  # 388


def test_parameters_counted_by_hand():
    assert sum(t.size for t in mp.weight_tensors(MICRO)) == TOTAL == flops.total_params(MICRO)
    full = mp.parameter_counts(MICRO, "full")
    assert (full.total, full.trained, full.frozen, full.optimizer_numbers) == (
        390, 388, 2, 2 * 388)
    # LoRA r=1: an adapted kernel (in, out) adds in + out.
    #   attention per block: q_proj 4+4, kv_a 4+4, kv_b 2+4, o_proj 2+4 = 28; two blocks = 56
    #   mlp: block 0 (4+6)*2 + (6+4) = 30; block 1: 3 SwiGLUs of (4+3)*2 + (3+4) = 21 -> 63
    assert mp.parameter_counts(MICRO, "lora", lora_rank=1, lora_targets="attention").trained == 56
    lora = mp.parameter_counts(MICRO, "lora", lora_rank=1, lora_targets="attention,mlp")
    assert (lora.trained, lora.adapters, lora.frozen) == (56 + 30 + 63, 149, 390)
    assert mp.parameter_counts(MICRO, "lora", lora_rank=2).trained == 2 * 149
    # top:1 = block 1 without its router bias (174) + final norm 4 + lm_head 40.
    assert mp.parameter_counts(MICRO, "frozen", trainable_blocks=1).trained == 218
    # Adafactor: a matrix (r, c) keeps r + c numbers, a vector its own size; SGD momentum 1.
    assert mp.parameter_counts(MICRO, "full", optimizer="sgd").optimizer_numbers == 388
    ada = mp.parameter_counts(MICRO, "frozen", trainable_blocks=0, optimizer="adafactor")
    assert ada.trained == 4 + 40 and ada.optimizer_numbers == 4 + (4 + 10)


def test_bytes_per_device_by_hand():
    case = mp.PlanInput(MICRO, weights_dtype="float32", compute_dtype="float32",
                        batch_per_device=1, seq_len=3, memory_gib=1.0, peak_flops=1000.0,
                        mfu=0.5)
    p = mp.plan(case)
    assert (p.weights, p.master_weights, p.gradients, p.optimizer_states) == (
        390 * 4, 0, 388 * 4, 388 * 8)
    # Activations per token, float32 (a = 4), C = 4, H = 1, Dr = Dv = 2, Dqk = 4, R = 2, T = 3:
    #   norms 4C + 2aC = 48 (input and post: 96), RoPE 2a*H*Dr + 2a*Dr = 32,
    #   q, k 8*H*Dqk = 32, kv_a_layernorm 4R + 2aR = 24, values a*H*Dv = 8,
    #   softmax 4*H*T = 12, attention output 8                      -> attention 212
    #   block 0 MLP 4a*F = 96                                        -> 308
    #   block 1: router 12*E = 24, routed a(2KC + 4K*Fm) = 80, shared 4a*Fm = 48 -> 364
    #   head: 4C + 2aC + 8V = 128
    assert p.activations == 3 * (308 + 364 + 128) == 2400
    assert p.total == 1560 + 1552 + 3104 + 2400 and p.kv_cache == 0
    # FLOPs per token 6 N_active + 6 L H T (Dqk + Dv): N_active = block 0 130 + block 1
    # (58 + router 10 + one expert 36 + shared 36 = 140) + norm 4 + head 40 = 314,
    # so 6*314 + 6*2*1*3*6 = 2100; 3 tokens at 1000 FLOP/s x 0.5 MFU.
    assert p.step_time_s == pytest.approx(3 * 2100 / 500)
    assert p.token_time_s == pytest.approx(2100 / 500)

    # Recomputation: each block keeps its input (aC = 16), plus the larger of the head
    # (128, end of the forward pass) and the largest block (364, recomputed in backward).
    recompute = mp.plan(dataclass_replace(case, recompute="full"))
    assert recompute.activations == 3 * 2 * 16 + 3 * 364
    assert recompute.step_time_s == pytest.approx(3 * 2100 / 500 * 4 / 3)

    # bf16 weights, full training: bf16 weights + float32 master + bf16 gradients + AdamW.
    mixed = mp.plan(dataclass_replace(case, weights_dtype="bfloat16"))
    assert (mixed.weights, mixed.master_weights, mixed.gradients) == (780, 388 * 4, 388 * 2)
    # LoRA on attention, bf16 base: adapters and their gradients and states in float32;
    # gradient accumulation adds a second gradient buffer.
    lora = mp.plan(dataclass_replace(case, weights_dtype="bfloat16", mode="lora", lora_rank=1,
                                     lora_targets="attention", grad_accum_steps=2))
    assert (lora.weights, lora.gradients, lora.optimizer_states) == (780 + 56 * 4, 2 * 56 * 4,
                                                                    56 * 8)
    assert lora.tokens_per_step == 6
    # Keras' LoRA keeps one merged kernel W + A B per adapted kernel for the backward pass:
    # q_proj 16 + kv_a 16 + kv_b 8 + o_proj 8 = 48 per block, float32.
    assert lora.activations == 2400 + 2 * 48 * 4
    # ZeRO-3 on 2 devices divides weights, gradients and states (rounded up), not activations.
    z3 = mp.plan(dataclass_replace(case, devices=2, sharding="full"))
    assert (z3.weights, z3.gradients, z3.optimizer_states, z3.activations) == (
        780, 776, 1552, 2400)
    z2 = mp.plan(dataclass_replace(case, devices=2, sharding="optimizer"))
    assert (z2.weights, z2.gradients, z2.optimizer_states) == (1560, 776, 1552)


def test_fits_and_fewest_devices():
    limit = 5000 / mp.GIB  # GiB
    case = mp.PlanInput(MICRO, weights_dtype="float32", compute_dtype="float32", seq_len=3,
                        memory_gib=limit, sharding="full")
    # n devices: ceil(1560/n) + ceil(1552/n) + ceil(3104/n) + 2400 <= 5000:
    # n = 2 gives 5508, n = 3 gives 520 + 518 + 1035 + 2400 = 4473.
    p = mp.plan(case)
    assert not p.fits and p.min_devices == 3
    assert mp.plan(dataclass_replace(case, devices=3)).fits
    # Replicated, more devices hold the same: no number fits.
    assert mp.plan(dataclass_replace(case, sharding="none")).min_devices is None
    # Activations alone above the limit: no number fits either.
    assert mp.plan(dataclass_replace(case, memory_gib=2000 / mp.GIB)).min_devices is None


def test_inference_is_weights_plus_the_latent_kv_cache():
    # MLA caches kv_lora_rank + qk_rope_head_dim = 4 numbers per token and layer:
    # 2 layers x 4 x 2 bytes (bf16) x 2 sequences x 3 tokens = 96.
    p = mp.plan(mp.PlanInput(MICRO, mode="inference", batch_per_device=2, seq_len=3))
    assert (p.weights, p.kv_cache, p.gradients, p.activations, p.total) == (
        780, 96, 0, 0, 876)
    assert p.tokens_per_step == 2


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="mode='half'"):
        mp.PlanInput(MICRO, mode="half")
    with pytest.raises(ValueError, match="batch_per_device=0"):
        mp.PlanInput(MICRO, batch_per_device=0)
    with pytest.raises(ValueError, match="mfu=1.5"):
        mp.PlanInput(MICRO, mfu=1.5)
    with pytest.raises(ValueError, match="trainable_blocks"):
        mp.plan(mp.PlanInput(MICRO, mode="frozen"))
    with pytest.raises(ValueError, match="trainable_blocks=3"):
        mp.plan(mp.PlanInput(MICRO, mode="frozen", trainable_blocks=3))
    with pytest.raises(ValueError, match="lora_targets='experts'"):
        mp.parameter_counts(MICRO, "lora", lora_targets="experts")


def test_design_cases_and_v2_lite_sizes():
    # DeepSeek-V2-Lite: 15.7B parameters, 2.4B activated (arXiv 2405.04434, Appendix B).
    v2_lite = deepseek_preset("deepseek_v2_lite")
    assert round(flops.total_params(v2_lite) / 1e9, 1) == 15.7
    assert round(flops.activated_params(v2_lite) / 1e9, 1) == 2.5  # 2.4 without the lm_head
    sizes = {k: flops.total_params(c) / 1e9 for k, c in mp.DESIGN_CONFIGS.items()}
    assert 6.5 < sizes["dense_7b"] < 7.5 and 64 < sizes["dense_65b"] < 66
    assert 174 < sizes["dense_175b"] < 177
    plans = {(p.case.name, p.case.mode, p.case.sharding): p
             for p in (mp.plan(c) for _, c in mp.design_cases())}
    # 7B: full fine-tuning needs 16 bytes a parameter (> 80 GiB), LoRA fits one A100.
    assert not plans["7B dense", "full", "none"].fits
    assert plans["7B dense", "lora", "none"].fits
    assert plans["175B dense", "full", "full"].min_devices > 8
    table = mp.format_table(list(plans.values()))
    assert "V3 671B" in table and "V2-Lite 16B" in table and "GiB" not in table.splitlines()[0]


@pytest.mark.slow  # imports TensorFlow and builds three models of each preset (~20 s)
@pytest.mark.parametrize("name", ["tiny", "cpu_small"])
def test_counts_equal_the_built_model(name):
    """Paths, shapes and counts equal the Keras model's; LoRA and top:N equal the Trainer's
    selection (components/trainer/trainable.prepare)."""
    from components.trainer import trainable
    from config import TrainConfig
    from models.deepseek.causal_lm import DeepSeekCausalLM

    config = deepseek_preset(name)
    model = DeepSeekCausalLM(config)
    tensors = mp.weight_tensors(config)
    assert [(trainable.weight_path(v), tuple(v.shape), v.trainable) for v in model.weights] == [
        (t.path, t.shape, t.trainable) for t in tensors]
    assert model.count_params() == sum(t.size for t in tensors)
    top = trainable.prepare(model, TrainConfig(trainable="top:1"))
    assert top.trainable_params == mp.parameter_counts(config, "frozen",
                                                       trainable_blocks=1).trained
    for targets in ("attention", "attention,mlp"):
        fresh = DeepSeekCausalLM(config)
        selection = trainable.prepare(fresh, TrainConfig(lora_rank=4, lora_targets=targets))
        assert selection.trainable_params == mp.parameter_counts(
            config, "lora", lora_rank=4, lora_targets=targets).trained


def dataclass_replace(case, **changes):
    import dataclasses

    return dataclasses.replace(case, **changes)
