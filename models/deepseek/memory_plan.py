"""What fits: memory per device and time per step of training or serving a DeepSeek model.

  plan(PlanInput(config, mode="lora", devices=8, memory_gib=80, ...)) -> Plan
  weight_tensors(config) / parameter_counts(config, ...) / activation_bytes(config, ...)
  design_cases() -> the design table (`deepseek-tfx plan`, docs/guides/planning.md)

Units: bytes in the API; GiB (2**30 bytes) in printed tables, device memory
included (an "80 GB" A100 or H100 has 80 GiB).

What is counted, per device (`Plan`):

- weights: every parameter (`weight_tensors`, the same paths and shapes as
  `DeepSeekCausalLM.weights`) in its stored dtype. Full training keeps float32
  variables (`weights_dtype="float32"`, as the Trainer does today), or bf16
  weights plus a float32 master copy (`weights_dtype="bfloat16"`: the mixed
  precision layout of Micikevicius et al. 2018 §3.1). LoRA and frozen runs keep
  the frozen base in `weights_dtype` and the trained parameters (adapters, or the
  top blocks) in float32.
- gradients: one per trained parameter, float32 (bf16 for full training with bf16
  weights); with gradient accumulation, a second buffer (the running sum beside
  the micro-batch's gradient, `train_step.accumulate`).
- optimizer states per trained parameter, float32: AdamW 2 (m, v); SGD with
  momentum 1; Adafactor (Shazeer & Stern 2018 §3, no first moment) a row and a
  column vector per matrix, a full vector otherwise.
- activations: the tensors the backward pass keeps, per token, derived from this
  project's layers (`block_activation_items`), after Korthikanti et al. 2022,
  "Reducing Activation Recomputation in Large Transformer Models", §4.1 (which
  counts 34 s b h + 5 a s^2 b bytes per GPT layer in 16-bit); adapted to MLA, MoE
  and this code's dtypes. Full recomputation (`tf.recompute_grad` per block,
  ibid. §4.2) keeps each block's input plus one block's activations.
  LoRA adds one merged kernel W + A B per adapted kernel in the compute dtype,
  which Keras' `Dense.enable_lora` computes in every call and the matmul keeps.
- KV cache (inference): MLA caches kv_lora_rank + qk_rope_head_dim numbers per
  token and layer (DeepSeek-V2 §2.1.4; `flops.kv_cache_bytes_per_token`), plus
  index_head_dim for the lightning indexer's key with DeepSeek Sparse Attention
  (DeepSeek-V3.2): `DeepSeekConfig.cache_width`.
- DeepSeek Sparse Attention's indexer (`lightning_indexer.py`): its weights count
  (frozen: never trained, no gradient or optimizer state); the (B, T, S) top-k mask
  is kept for the backward pass (T bytes per token); its scores are not (they run
  under `tf.stop_gradient`).

Sharding (`sharding`): "none" = plain data parallelism (MirroredStrategy and
MultiWorkerMirroredStrategy, what the Trainer does): every device holds
everything. "optimizer" = optimizer states, master weights and gradients divided
by the number of devices (ZeRO stage 2, Rajbhandari et al. 2020 §5). "full" =
weights too (ZeRO stage 3 / FSDP). Activations are never divided (no tensor,
sequence, pipeline or expert parallelism is modeled); the gathered layer that
ZeRO-3 materializes at a time is not counted. Not counted either: the
framework's runtime (CUDA context, TensorFlow itself), allocator fragmentation,
and the transient copies of one layer (`Plan.assumptions` lists these).

Time: training FLOPs per token from `flops.flops_per_token` (6 N_active +
attention, the FLOPs model of benchmarks/train_throughput.py), times 4/3 with
recomputation (one more forward pass), over devices x peak x MFU. LoRA and
frozen runs are charged the same FLOPs (an upper bound: they skip most weight
gradients, about a third of the work). Inference: `flops.decode_flops_per_token`
at the context length (absorbed MLA), compute-bound at the same MFU.

This module imports neither TensorFlow nor Keras (`deepseek-tfx plan` answers in
about a second).
"""

from __future__ import annotations

from models.deepseek import flops
from models.deepseek.config import DeepSeekConfig
from models.deepseek.deepseek_presets import deepseek_preset, deepseek_v3_config
from models.planning import plan as planning_plan
from models.planning.family_inventory import FamilyInventory
from models.planning.parameter_counts import (
    ParameterCounts,
    check_choices,
    check_trainable_blocks,
    count_parameters,
)
from models.planning.plan import Plan
from models.planning.plan_input import DTYPE_BYTES, GIB, PlanInput, check_activation_args
from models.planning.weight_tensor import WeightTensor

# ----------------------------------------------------------------------------- parameters


def _block_tensors(c: DeepSeekConfig, prefix: str, layer_idx: int) -> list[WeightTensor]:
    C, H = c.hidden_size, c.num_attention_heads
    a = f"{prefix}self_attn/"
    t = [WeightTensor(f"{prefix}input_layernorm/weight", (C,))]
    if c.q_lora_rank is None:
        t.append(WeightTensor(f"{a}q_proj/kernel", (C, H * c.qk_head_dim), lora="attention"))
    else:
        t += [WeightTensor(f"{a}q_a_proj/kernel", (C, c.q_lora_rank), lora="attention"),
              WeightTensor(f"{a}q_a_layernorm/weight", (c.q_lora_rank,)),
              WeightTensor(f"{a}q_b_proj/kernel", (c.q_lora_rank, H * c.qk_head_dim),
                           lora="attention")]
    t += [WeightTensor(f"{a}kv_a_proj_with_mqa/kernel", (C, c.kv_lora_rank + c.qk_rope_head_dim),
                       lora="attention"),
          WeightTensor(f"{a}kv_a_layernorm/weight", (c.kv_lora_rank,)),
          WeightTensor(f"{a}kv_b_proj/kernel",
                       (c.kv_lora_rank, H * (c.qk_nope_head_dim + c.v_head_dim)),
                       lora="attention"),
          WeightTensor(f"{a}o_proj/kernel", (H * c.v_head_dim, C), lora="attention")]
    if c.uses_sparse_attention:  # LightningIndexer: trained by its KL only
        hi, di, ix = c.index_n_heads, c.index_head_dim, f"{a}indexer/"
        t += [WeightTensor(f"{ix}wq_b/kernel", (c.q_lora_rank, hi * di)),
              WeightTensor(f"{ix}wk/kernel", (C, di)),
              WeightTensor(f"{ix}k_norm/gamma", (di,)),
              WeightTensor(f"{ix}k_norm/beta", (di,)),
              WeightTensor(f"{ix}weights_proj/kernel", (C, hi))]
    t.append(WeightTensor(f"{prefix}post_attention_layernorm/weight", (C,)))

    def swiglu(p: str, width: int) -> list[WeightTensor]:
        return [WeightTensor(f"{p}gate_proj/kernel", (C, width), lora="mlp"),
                WeightTensor(f"{p}up_proj/kernel", (C, width), lora="mlp"),
                WeightTensor(f"{p}down_proj/kernel", (width, C), lora="mlp")]

    m = f"{prefix}mlp/"
    if not c.is_moe_layer(layer_idx):
        return t + swiglu(m, c.intermediate_size)
    t += [WeightTensor(f"{m}gate/weight", (c.n_routed_experts, C)),
          WeightTensor(f"{m}gate/e_score_correction_bias", (c.n_routed_experts,),
                       trainable=False)]
    e, f = c.n_routed_experts, c.moe_intermediate_size  # stacked kernels (RoutedExperts)
    t += [WeightTensor(f"{m}experts/gate_proj/kernel", (e, C, f), lora="mlp"),
          WeightTensor(f"{m}experts/up_proj/kernel", (e, C, f), lora="mlp"),
          WeightTensor(f"{m}experts/down_proj/kernel", (e, f, C), lora="mlp")]
    if c.n_shared_experts:
        t += swiglu(f"{m}shared_experts/", c.moe_intermediate_size * c.n_shared_experts)
    return t


def weight_tensors(config: DeepSeekConfig) -> list[WeightTensor]:
    """Every weight of `DeepSeekCausalLM(config)`, in its order, with Keras' paths and shapes.

    Sizes sum to `flops.total_params(config)` (= `count_params()` of the built model).
    For DeepSeek-V3 this is a list of 1,046 entries (the routed experts are three
    stacked tensors per MoE layer).
    """
    c = config
    C = c.hidden_size
    t = [WeightTensor("embed_tokens/embeddings", (c.vocab_size, C))]
    for i in range(c.num_hidden_layers):
        t += _block_tensors(c, f"layers.{i}/", i)
    t.append(WeightTensor("norm/weight", (C,)))
    if not c.tie_word_embeddings:
        t.append(WeightTensor("lm_head/kernel", (C, c.vocab_size)))
    for d in range(c.num_nextn_predict_layers):
        p = f"mtp.{d}/"
        t += [WeightTensor(f"{p}enorm/weight", (C,)), WeightTensor(f"{p}hnorm/weight", (C,)),
              WeightTensor(f"{p}eh_proj/kernel", (2 * C, C))]
        t += _block_tensors(c, f"{p}block/", c.num_hidden_layers + d)
        t.append(WeightTensor(f"{p}shared_head.norm/weight", (C,)))
    return t


def _top_prefixes(c: DeepSeekConfig, n: int) -> tuple[str, ...]:
    """As `components/trainer/trainable._top_prefixes`: the last n blocks, norm, head, MTP."""
    check_trainable_blocks(n, c.num_hidden_layers)
    head = "embed_tokens/" if c.tie_word_embeddings else "lm_head/"
    return (*(f"layers.{i}/" for i in range(c.num_hidden_layers - n, c.num_hidden_layers)),
            "norm/", head, "mtp.")


def parameter_counts(config: DeepSeekConfig, mode: str = "full", lora_rank: int = 16,
                     lora_targets: str = "attention,mlp", trainable_blocks: int | None = None,
                     optimizer: str = "adamw") -> ParameterCounts:
    """Trained, frozen and adapter parameters, as the Trainer selects them
    (`models.planning.count_parameters` over `weight_tensors(config)`).

    Args:
      config: the model.
      mode: "full" (every trainable weight; `train.trainable=all`), "lora"
        (Keras `enable_lora` adapters of rank `lora_rank` on the `lora_targets`
        kernels, within the top `trainable_blocks` blocks if given), "frozen"
        (`train.trainable=top:N`, N = `trainable_blocks`), or "inference" (nothing trains).
      lora_rank: r; an adapted kernel (in, out) adds A (in, r) and B (r, out).
      lora_targets: comma-separated "attention" and/or "mlp" (as `train.lora_targets`).
      trainable_blocks: N of `top:N` (frozen; optional for lora).
      optimizer: "adamw", "sgd" (momentum) or "adafactor".

    Raises:
      ValueError: unknown mode, optimizer or target; lora_rank < 1; trainable_blocks
        missing for frozen or out of range.
    """
    check_choices(mode, optimizer)
    return count_parameters(weight_tensors(config), lambda n: _top_prefixes(config, n),
                            lambda path: path.split("/", 1)[0],  # layers.i or mtp.d
                            mode, lora_rank, lora_targets, trainable_blocks, optimizer)


# ----------------------------------------------------------------------------- activations


def block_activation_items(config: DeepSeekConfig, layer_idx: int, seq_len: int,
                           compute_dtype: str = "bfloat16") -> list[tuple[str, int]]:
    """Bytes per token that one decoder block keeps for its backward pass, item by item.

    Derived from this project's layers (mla_attention.py, moe.py, mlp.py,
    rms_norm.py) by listing the tensors whose gradient needs them: matmul and
    einsum inputs, RMSNorm's float32 input and normalized value, SiLU's input,
    the inputs of elementwise products, softmax's output (Korthikanti et al. 2022
    §4.1, adapted). With a = bytes of `compute_dtype`, C = hidden_size, H heads,
    Dn/Dr/Dv head dims, Dqk = Dn + Dr, R = kv_lora_rank, Rq = q_lora_rank,
    T = seq_len:

      input_layernorm         4C (float32 input) + aC (normed) + aC (output: q/kv input)
      q_a_layernorm (Rq)      4Rq + aRq + aRq (q_b_proj input)
      RoPE of q_pe, k_pe      2a H Dr + 2a Dr (x and rotate_half(x) of x cos + rot(x) sin)
      scaled float32 q, k     4 H Dqk + 4 H Dqk (the score einsum's inputs)
      kv_a_layernorm          4R + aR + aR (kv_b_proj input)
      values                  a H Dv
      softmax output          4 H T (float32; + a H T cast to the compute dtype if a < 4)
      DSA top-k mask          T (bool (B, T, S), with DeepSeek Sparse Attention only)
      attention output        a H Dv (o_proj input)
      post_attention_layernorm 4C + aC + aC
      dense MLP (width F)     4aF: gate out (SiLU input), SiLU out, up out, product
      MoE (K of E experts, width Fm, shared width Fs = Fm N_s)
                              router: 4C (float32 input, if a < 4) + 3 x 4E (scores,
                              biased choice, balance-loss shares);
                              routed: a(2KC + 4K Fm) (gathered inputs, experts'
                              intermediates, outputs before weighting);
                              shared: 4a Fs

    Dropout is not counted (attention_dropout = 0 in every preset).

    Returns:
      [(item, bytes per token)], summing to the block's bytes per token.
    """
    c = config
    a = DTYPE_BYTES[compute_dtype]
    cast32 = 4 if a < 4 else 0  # a float32 copy that exists only when computing in 16 bits
    C, H, T = c.hidden_size, c.num_attention_heads, seq_len
    dr, dv, dqk, r = c.qk_rope_head_dim, c.v_head_dim, c.qk_head_dim, c.kv_lora_rank

    def norm(n: int) -> int:  # float32 input, normalized value, output (the consumer's input)
        return 4 * n + 2 * a * n

    items = [("input_layernorm", norm(C))]
    if c.q_lora_rank is not None:
        items.append(("q_a_layernorm", norm(c.q_lora_rank)))
    items += [("rope", 2 * a * H * dr + 2 * a * dr),
              ("q, k (float32)", 8 * H * dqk),
              ("kv_a_layernorm", norm(r)),
              ("values", a * H * dv),
              ("softmax", 4 * H * T + (a * H * T if a < 4 else 0)),
              *([("indexer top-k mask", T)] if c.uses_sparse_attention else []),
              ("attention output", a * H * dv),
              ("post_attention_layernorm", norm(C))]
    if not c.is_moe_layer(layer_idx):
        items.append(("mlp", 4 * a * c.intermediate_size))
        return items
    k, fm = c.num_experts_per_tok, c.moe_intermediate_size
    items += [("router", cast32 * C + 12 * c.n_routed_experts),
              ("routed experts", a * (2 * k * C + 4 * k * fm)),
              ("shared experts", 4 * a * fm * c.n_shared_experts)]
    return items


def head_activation_bytes_per_token(config: DeepSeekConfig, compute_dtype: str) -> int:
    """Bytes per token at the output: final norm + lm_head input, the float32
    logits and the cross-entropy's softmax-gradient buffer (8V), plus the
    logits in the compute dtype before the cast when a < 4."""
    a = DTYPE_BYTES[compute_dtype]
    c = config
    return 4 * c.hidden_size + 2 * a * c.hidden_size + 8 * c.vocab_size + (
        a * c.vocab_size if a < 4 else 0)


def activation_bytes(config: DeepSeekConfig, micro_batch: int, seq_len: int,
                     compute_dtype: str = "bfloat16", recompute: str = "none",
                     include_mtp: bool = True) -> int:
    """Activation bytes of one micro-batch of `micro_batch` sequences of `seq_len` tokens.

    Without recomputation: every block's `block_activation_items` plus the head
    (`head_activation_bytes_per_token`), per token; each MTP depth k adds its
    enorm, hnorm, eh_proj input (2 x (4C + aC) + 2aC), a block, and a head, over
    T - k tokens. With recompute="full": each block and MTP module keeps its
    input (aC per token; Korthikanti et al. 2022 §4.2, 2 s b h L in 16 bit), plus
    the larger of the head (at the end of the forward pass) and one block's
    activations (recomputed one at a time in the backward pass); each MTP depth
    keeps its input and its head.

    Raises:
      ValueError: unknown compute_dtype or recompute; micro_batch or seq_len < 1.
    """
    check_activation_args(micro_batch, seq_len, compute_dtype, recompute)
    c = config
    a = DTYPE_BYTES[compute_dtype]
    head = head_activation_bytes_per_token(c, compute_dtype)
    blocks = [(i, sum(b for _, b in block_activation_items(c, i, seq_len, compute_dtype)))
              for i in range(c.num_hidden_layers)]
    depths = c.num_nextn_predict_layers if include_mtp else 0
    mtp_blocks = [sum(b for _, b in block_activation_items(c, c.num_hidden_layers + d,
                                                            seq_len, compute_dtype))
                  for d in range(depths)]
    mtp_extra = 2 * (4 * c.hidden_size + a * c.hidden_size) + 2 * a * c.hidden_size
    tokens = micro_batch * seq_len
    mtp_tokens = [micro_batch * max(seq_len - k, 0) for k in range(1, depths + 1)]
    if recompute == "none":
        total = tokens * (sum(b for _, b in blocks) + head)
        total += sum(n * (blk + mtp_extra + head) for n, blk in zip(mtp_tokens, mtp_blocks, strict=True))
        return total
    # The peak is at the end of the forward pass (inputs kept + the head) or while the
    # backward pass recomputes a block (inputs kept + one block), whichever is larger.
    kept = a * c.hidden_size
    largest = max([b for _, b in blocks] + mtp_blocks)
    total = tokens * (len(blocks) * kept + max(head, largest))
    total += sum(n * (kept + head) for n in mtp_tokens)
    return total


# ----------------------------------------------------------------------------- the plan


def _kv_cache_bytes(config: DeepSeekConfig, context_len: int, bytes_per_number: int) -> int:
    """MLA's latent KV cache of one sequence (`flops.kv_cache_bytes_per_token`)."""
    return flops.kv_cache_bytes_per_token(config, bytes_per_number) * context_len


INVENTORY = FamilyInventory(kv_cache_bytes=_kv_cache_bytes, activation_bytes=activation_bytes,
                            flops_per_token=flops.flops_per_token,
                            decode_flops_per_token=flops.decode_flops_per_token)


def plan(p: PlanInput) -> Plan:
    """Memory per device, whether it fits, the fewest devices that fit, and time
    (`models.planning.plan` with this family's `INVENTORY`).

    Raises:
      ValueError: see `PlanInput` and `parameter_counts`.
    """
    counts = parameter_counts(p.config, p.mode, p.lora_rank, p.lora_targets,
                              p.trainable_blocks, p.optimizer)
    return planning_plan.plan(p, counts, INVENTORY)


# ----------------------------------------------------------------------------- design cases


def _dense(**kw) -> DeepSeekConfig:
    """A dense DeepSeek-architecture model (MLA, a SwiGLU MLP in every block, no MTP) with
    DeepSeek-V2's attention dims and its 102,400-token vocabulary."""
    base = dict(vocab_size=102400, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                qk_rope_head_dim=64, v_head_dim=128, num_nextn_predict_layers=0,
                max_position_embeddings=4096)
    base.update(kw)
    return DeepSeekConfig().replace(first_k_dense_replace=base["num_hidden_layers"], **base)


# The design documents' three sizes as dense DeepSeek-architecture models: LLaMA-7B's and
# LLaMA-65B's widths and depths (Touvron et al. 2023, Table 2) and GPT-3 175B's (Brown et
# al. 2020, Table 2.1), with MLA attention; the SwiGLU widths are chosen so the totals come
# to ~6.9B, ~65.0B and ~175.7B parameters.
DESIGN_CONFIGS: dict[str, DeepSeekConfig] = {
    "dense_7b": _dense(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                       intermediate_size=12288),
    "dense_65b": _dense(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                        intermediate_size=27648),
    "dense_175b": _dense(hidden_size=12288, num_hidden_layers=96, num_attention_heads=96,
                         intermediate_size=43008),
}


def design_cases() -> list[tuple[str, PlanInput]]:
    """The table of `deepseek-tfx plan`: the design documents' three cases (7B on one
    A100 80 GB, 65B on 8 x A100 80 GB, 175B on as many 80 GB GPUs as it takes),
    DeepSeek-V2-Lite on one A100 and DeepSeek-V3 on 8 x H100 80 GB; each full
    fine-tuning (bf16 weights + float32 master + AdamW) and LoRA (rank 16,
    attention and MLP, bf16 base), each replicated (plain data parallel, as the
    Trainer runs today) and fully sharded (ZeRO-3 / FSDP); batch 1 x 4096 tokens
    per device, full recomputation, 40% MFU.

    Returns:
      [(a short label, PlanInput)].
    """
    h100 = flops.PEAK_FLOPS_TABLE["H100"]["bfloat16"]
    a100 = flops.PEAK_FLOPS_TABLE["A100"]["bfloat16"]
    models = [("7B dense", DESIGN_CONFIGS["dense_7b"], 1, a100),
              ("65B dense", DESIGN_CONFIGS["dense_65b"], 8, a100),
              ("175B dense", DESIGN_CONFIGS["dense_175b"], 64, a100),
              ("V2-Lite 16B", deepseek_preset("deepseek_v2_lite"), 1, a100),
              ("V3 671B", deepseek_v3_config(), 8, h100)]
    cases = []
    for label, config, devices, peak in models:
        for mode in ("full", "lora"):
            for sharding in ("none", "full"):
                cases.append((label, PlanInput(
                    config, name=label, mode=mode, devices=devices, sharding=sharding,
                    peak_flops=peak, seq_len=4096, batch_per_device=1, recompute="full")))
        cases.append((label, PlanInput(config, name=label, mode="inference", devices=devices,
                                       sharding="full", peak_flops=peak, seq_len=4096,
                                       batch_per_device=1)))
    return cases


# ----------------------------------------------------------------------------- tables


def _gib(n: int) -> str:
    return f"{n / GIB:8.1f}"


def _time(s: float) -> str:
    if s >= 1:
        return f"{s:7.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:6.1f} ms"
    return f"{s * 1e6:6.1f} us"


TABLE_HEADER = (f"{'case':<12} {'mode':<9} {'shard':<5} {'devices':>9} {'params':>7} "
                f"{'trained':>8} {'weights':>8} {'master':>8} {'grads':>8} {'optim':>8} "
                f"{'activ':>8} {'KV':>8} {'total':>8}  {'fits':<4} {'min dev':>7} "
                f"{'step':>10} {'per token':>10}")


def table_row(pl: Plan) -> str:
    """One fixed-width line of `format_table` (sizes in GiB per device)."""
    p = pl.case
    shard = {"none": "DP", "optimizer": "ZeRO2", "full": "ZeRO3"}[p.sharding]
    devices = f"{p.devices}x{p.memory_gib:g}"
    mode = p.mode if p.mode != "frozen" else f"top:{p.trainable_blocks}"
    mode = mode if p.mode != "lora" else f"lora r{p.lora_rank}"
    md = "-" if pl.min_devices is None else str(pl.min_devices)
    return (f"{p.name[:12]:<12} {mode[:9]:<9} {shard:<5} {devices:>9} "
            f"{_count(pl.counts.total):>7} {_count(pl.counts.trained):>8} "
            f"{_gib(pl.weights)} {_gib(pl.master_weights)} {_gib(pl.gradients)} "
            f"{_gib(pl.optimizer_states)} {_gib(pl.activations)} {_gib(pl.kv_cache)} "
            f"{_gib(pl.total)}  {'yes' if pl.fits else 'NO':<4} {md:>7} "
            f"{_time(pl.step_time_s):>10} {_time(pl.token_time_s):>10}")


def _count(n: int) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(n)


def format_table(plans: list[Plan]) -> str:
    """A fixed-width table: one line per plan, sizes in GiB per device."""
    return "\n".join([TABLE_HEADER, "-" * len(TABLE_HEADER)] + [table_row(p) for p in plans])
