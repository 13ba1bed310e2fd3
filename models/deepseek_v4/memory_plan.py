"""What a DeepSeek-V4 model holds and costs: parameters, weight bytes, KV cache, FLOPs, plan.

  weight_tensors(config) / buffer_tensors(config) -> every tensor, DeepSeek's names
  parameter_summary(config) -> total / activated / MTP / routed experts (published convention)
  kv_cache_items(config, context_len) -> the V4 caches of one sequence, item by item
  flops_per_token(config, seq_len) / decode_flops_per_token(config, context_len)
  plan(PlanInput(v4_config, ...)) -> memory_plan.Plan (the table of `deepseek-tfx plan`)

Arithmetic on `DeepSeekV4Config` fields only: no TensorFlow, Keras or torch import.

Parameters (`weight_tensors`): per tensor, as transformers 5.24's `DeepseekV4ForCausalLM`
holds them (`models/deepseek_v4/modular_deepseek_v4.py`), named as DeepSeek's checkpoints
name them (the names `conversion_mapping.py` "deepseek_v4" renames on load). With
C = hidden_size, H = num_attention_heads, D = head_dim, Rq = q_lora_rank, g = o_groups,
Ro = o_lora_rank, n = hc_mult, E = n_routed_experts, F = moe_intermediate_size,
nI / DI = index_n_heads / index_head_dim, m = a layer's compress rate, V = vocab_size:

  per block      attn_norm C, ffn_norm C; hc_attn_{fn (n(2+n), nC), base n(2+n), scale 3},
                 hc_ffn_{fn, base, scale} likewise (`DeepseekV4HyperConnection`)
  attention      wq_a C Rq, q_norm Rq, wq_b Rq H D, wkv C D, kv_norm D,
                 wo_a g Ro (H D / g) (`DeepseekV4GroupedLinear`: one (H D/g -> Ro) per group),
                 wo_b g Ro C, attn_sink H
  CSA compressor wkv C 2D, wgate C 2D, ape m 2D, norm D (`DeepseekV4CSACompressor`)
  CSA indexer    compressor wkv C 2DI, wgate C 2DI, ape m 2DI, norm DI; wq_b Rq nI DI,
                 weights_proj C nI (`DeepseekV4Indexer`, `DeepseekV4IndexerScorer`)
  HCA compressor wkv C D, wgate C D, ape m' D, norm D (`DeepseekV4HCACompressor`)
  MoE            gate.weight E C; gate.bias E (learned routing only; transformers holds it
                 as the buffer `e_score_correction_bias`, DeepSeek's inference/model.py as an
                 fp32 nn.Parameter: counted here as a non-trainable parameter, as the V3
                 planner counts V3's); experts E x (w1 C F, w3 C F, w2 F C); one shared
                 expert w1, w3, w2 of width F
  model          embed V C, norm C, head C V (unless tied), hc_head_{fn (n, nC), base n,
                 scale 1} (`DeepseekV4HyperHead`)
  MTP depth d    (DeepSeek's inference/model.py `MTPBlock(Block)`, layer_id = L + d; not built
                 by transformers, `_keys_to_ignore_on_load_unexpected = mtp.*`): e_proj C C,
                 h_proj C C, enorm C, hnorm C, norm C, hc_head_{fn, base, scale}, and a whole
                 block; its attention type is the config.json's `compress_ratios[L + d]` (0,
                 a sliding-window block, in both releases) and its gate learned (L + d >=
                 the hash layers); embedding and head are the model's.

Buffers (`buffer_tensors`): `ffn.gate.tid2eid` (V, K) int64 of each hash-routed block, the
frozen token -> expert table: not parameters (transformers: `nn.Buffer`; DeepSeek:
`nn.Parameter(requires_grad=False)`). Its 2.3M numbers (3 x 129,280 x 6) are under 0.001% of
V4-Flash's 284B, so the published totals cannot tell whether DeepSeek counted them; they
are reported apart.

Published convention (`parameter_summary`), the one that reproduces DeepSeek-V3's figures
with the V3 planner (`deepseek_v3` preset: 671.03B without MTP, published 671B; 36.63B
activated without the embedding, published 37B, 37.55B with it): totals exclude the MTP
modules (V3 README: "685B = 671B main model + 14B MTP"); activated = every parameter a
token multiplies by, i.e. all but the routed experts it does not choose ((E - K) of E per
block) and the embedding matrix (a row lookup); the head is counted. The published V4
figures are rounded (284B; 13B, 1.6T and 49B to two digits); this convention gives
V4-Flash 284.33B / 13.27B and V4-Pro 1.573T / 48.85B (`tests/models/test_v4_memory_plan.py`).

KV cache (`kv_cache_items`, inference, per sequence of T tokens; DeepSeek-V4 paper §2.3,
transformers `DeepseekV4HCACache` / `DeepseekV4CSACache`, DeepSeek's inference/model.py
`Attention.kv_cache`, `Compressor.kv_state` / `score_state`):

  sliding window  every block: min(T, sliding_window) entries of D (one K=V head): O(window)
  CSA compressed  each CSA block: floor(T / m) entries of D (1 per m = 4 tokens)
  indexer keys    each CSA block: floor(T / m) entries of DI (its own compressor)
  HCA compressed  each HCA block: floor(T / m') entries of D (1 per m' = 128 tokens)
  compressor state each compressed block: the window being pooled, kv_state and score_state
                  of (coff m, coff d) float32 each, coff = 2 for CSA (overlapping windows) and
                  1 for HCA, d = D (and DI for the indexer's): O(window), not O(T)

Numbers are stored in the compute dtype except the compressor state (float32, as DeepSeek's
inference keeps it). `kv_cache_bytes_per_token` is the growth per token of context (the
compressed entries): the sliding window and the compressor state are fixed per sequence.

FLOPs (`flops_per_token`, `decode_flops_per_token`): `models/deepseek_v4/flops.py` (the
formula and its sources there), without MTP: 6 N_active plus 3 x the attention over the keys a
query attends (min(T, sliding_window) window keys plus min(T/m, index_topk) CSA entries or
T/m' HCA entries, score and value widths D each), the indexer's scores over all T/m
compressed keys, the mHC mixes and the compressors' pooling.

Memory plan (`plan`): the V3 planner's method (`models/deepseek/memory_plan.py`) with V4's
tensors, activations (`block_activation_items`) and caches; the model as transformers builds
it (no MTP modules).
"""

from __future__ import annotations

import dataclasses
import math

from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.planning import plan as planning_plan
from models.planning.family_inventory import FamilyInventory
from models.planning.parameter_counts import (
    ParameterCounts,
    check_choices,
    check_trainable_blocks,
    count_parameters,
)
from models.planning.plan import Plan
from models.planning.plan_input import DTYPE_BYTES, PlanInput, check_activation_args
from models.planning.weight_tensor import WeightTensor

STATE_BYTES = 4  # the compressor's carried kv_state / score_state are float32

# DeepSeek-V4's config.json `compress_ratios` ends with one entry per MTP depth: 0 (a
# sliding-window block) in both V4-Flash and V4-Pro.
MTP_LAYER_TYPE = SLIDING


# ----------------------------------------------------------------------------- tensors


def _block_tensors(c: DeepSeekV4Config, prefix: str, layer_type: str,
                   hash_routing: bool) -> list[WeightTensor]:
    """The parameters of one decoder block (see the module docstring), kernels (in, out)."""
    C, H, D, n = c.hidden_size, c.num_attention_heads, c.head_dim, c.hc_mult
    mix = n * (2 + n)  # pre (n) + post (n) + comb (n x n) per token
    t = [WeightTensor(f"{prefix}attn_norm.weight", (C,)),
         WeightTensor(f"{prefix}ffn_norm.weight", (C,))]
    for site in ("attn", "ffn"):
        t += [WeightTensor(f"{prefix}hc_{site}_fn", (mix, n * C)),
              WeightTensor(f"{prefix}hc_{site}_base", (mix,)),
              WeightTensor(f"{prefix}hc_{site}_scale", (3,))]
    a = f"{prefix}attn."
    g, ro = c.o_groups, c.o_lora_rank
    t += [WeightTensor(f"{a}wq_a.weight", (C, c.q_lora_rank), lora="attention"),
          WeightTensor(f"{a}q_norm.weight", (c.q_lora_rank,)),
          WeightTensor(f"{a}wq_b.weight", (c.q_lora_rank, H * D), lora="attention"),
          WeightTensor(f"{a}wkv.weight", (C, D), lora="attention"),
          WeightTensor(f"{a}kv_norm.weight", (D,)),
          # grouped: g blocks (H D / g -> Ro); on disk one [g Ro, H D / g] matrix
          WeightTensor(f"{a}wo_a.weight", (g, H * D // g, ro), lora="attention"),
          WeightTensor(f"{a}wo_b.weight", (g * ro, C), lora="attention"),
          WeightTensor(f"{a}attn_sink", (H,))]

    def compressor(p: str, width: int, rate: int, overlap: bool) -> list[WeightTensor]:
        coff = 2 if overlap else 1  # CSA pools overlapping windows: two series Ca, Cb
        return [WeightTensor(f"{p}wkv.weight", (C, coff * width)),
                WeightTensor(f"{p}wgate.weight", (C, coff * width)),
                WeightTensor(f"{p}ape", (rate, coff * width)),
                WeightTensor(f"{p}norm.weight", (width,))]

    if layer_type == CSA:
        m = c.compress_rates[CSA]
        t += compressor(f"{a}compressor.", D, m, overlap=True)
        t += compressor(f"{a}indexer.compressor.", c.index_head_dim, m, overlap=True)
        t += [WeightTensor(f"{a}indexer.wq_b.weight",
                           (c.q_lora_rank, c.index_n_heads * c.index_head_dim)),
              WeightTensor(f"{a}indexer.weights_proj.weight", (C, c.index_n_heads))]
    elif layer_type == HCA:
        t += compressor(f"{a}compressor.", D, c.compress_rates[HCA], overlap=False)
    f = f"{prefix}ffn."
    E, F = c.n_routed_experts, c.moe_intermediate_size
    t.append(WeightTensor(f"{f}gate.weight", (E, C)))
    if not hash_routing:
        t.append(WeightTensor(f"{f}gate.bias", (E,), trainable=False))
    # routed experts stacked (E, in, out); on disk ffn.experts.e.w{1,2,3}.weight [out, in]
    t += [WeightTensor(f"{f}experts.w1.weight", (E, C, F), lora="mlp"),
          WeightTensor(f"{f}experts.w3.weight", (E, C, F), lora="mlp"),
          WeightTensor(f"{f}experts.w2.weight", (E, F, C), lora="mlp")]
    Fs = F * c.n_shared_experts
    t += [WeightTensor(f"{f}shared_experts.w1.weight", (C, Fs), lora="mlp"),
          WeightTensor(f"{f}shared_experts.w3.weight", (C, Fs), lora="mlp"),
          WeightTensor(f"{f}shared_experts.w2.weight", (Fs, C), lora="mlp")]
    return t


def _hc_head(c: DeepSeekV4Config, prefix: str) -> list[WeightTensor]:
    n = c.hc_mult
    return [WeightTensor(f"{prefix}hc_head_fn", (n, n * c.hidden_size)),
            WeightTensor(f"{prefix}hc_head_base", (n,)),
            WeightTensor(f"{prefix}hc_head_scale", (1,))]


def weight_tensors(config: DeepSeekV4Config, include_mtp: bool = False) -> list[WeightTensor]:
    """Every parameter of the model, in order, with DeepSeek's checkpoint names.

    Shapes are (in, out) for kernels (the checkpoint stores [out, in]); the routed
    experts of a block are one stacked (E, in, out) entry per projection, the grouped
    `wo_a` one (g, H D / g, Ro) entry. Without MTP, the sizes sum to transformers'
    `sum(p.numel() for p in DeepseekV4ForCausalLM(cfg).parameters())` plus the learned
    routers' `gate.bias` (a buffer there).

    Args:
      config: the model.
      include_mtp: add the `num_nextn_predict_layers` MTP modules (`mtp.d.*`), which the
        released checkpoints carry and transformers does not build.
    """
    c = config
    C = c.hidden_size
    t = [WeightTensor("embed.weight", (c.vocab_size, C))]
    for i in range(c.num_hidden_layers):
        t += _block_tensors(c, f"layers.{i}.", c.layer_types[i], c.is_hash_layer(i))
    t += [WeightTensor("norm.weight", (C,))]
    if not c.tie_word_embeddings:
        t.append(WeightTensor("head.weight", (C, c.vocab_size)))
    t += _hc_head(c, "")
    if include_mtp:
        for d in range(c.num_nextn_predict_layers):
            p = f"mtp.{d}."
            t += [WeightTensor(f"{p}e_proj.weight", (C, C)),
                  WeightTensor(f"{p}h_proj.weight", (C, C)),
                  WeightTensor(f"{p}enorm.weight", (C,)),
                  WeightTensor(f"{p}hnorm.weight", (C,)),
                  WeightTensor(f"{p}norm.weight", (C,))]
            t += _hc_head(c, p)
            t += _block_tensors(c, p, MTP_LAYER_TYPE, hash_routing=False)
    return t


def buffer_tensors(config: DeepSeekV4Config) -> list[WeightTensor]:
    """The hash-routed blocks' `ffn.gate.tid2eid` tables, (vocab_size, num_experts_per_tok)
    int64 each (transformers `DeepseekV4HashRouter.tid2eid`): state, not parameters."""
    c = config
    return [WeightTensor(f"layers.{i}.ffn.gate.tid2eid", (c.vocab_size, c.num_experts_per_tok),
                         trainable=False)
            for i in range(c.num_hidden_layers) if c.is_hash_layer(i)]


def _is_routed_expert(t: WeightTensor) -> bool:
    return ".ffn.experts." in f".{t.path}"


@dataclasses.dataclass(frozen=True)
class V4ParameterSummary:
    """Parameter counts of a DeepSeek-V4 model in DeepSeek's published convention.

    Attributes:
      total: every parameter of the main model (embedding, blocks, norm, head, hc_head),
        MTP modules excluded; the learned routers' fp32 `gate.bias` included.
      activated: parameters one token multiplies by: `total` minus the routed experts it
        does not choose ((E - K) of E per block) and minus the embedding matrix (a row
        lookup); the N of 6 N FLOPs per token.
      activated_with_embedding: `activated` plus the embedding matrix.
      mtp: the MTP modules' own parameters (embedding and head are the model's).
      mtp_activated: of those, what one token multiplies by.
      routed_experts: the routed experts' parameters of the main model.
      embedding: vocab_size x hidden_size.
      tid2eid: int64 numbers of the hash routers' tables (buffers, in no count above).
    """

    total: int
    activated: int
    activated_with_embedding: int
    mtp: int
    mtp_activated: int
    routed_experts: int
    embedding: int
    tid2eid: int


def _used(tensors: list[WeightTensor], c: DeepSeekV4Config) -> int:
    """Parameters a token uses: K of E routed experts, every other tensor whole."""
    K, E = c.num_experts_per_tok, c.n_routed_experts
    return sum(t.size * K // E if _is_routed_expert(t) else t.size for t in tensors)


def parameter_summary(config: DeepSeekV4Config) -> V4ParameterSummary:
    """Total, activated, MTP and expert parameters (see `V4ParameterSummary` and the
    module docstring for the convention)."""
    c = config
    main = weight_tensors(c)
    mtp = weight_tensors(c, include_mtp=True)[len(main):]
    embedding = c.vocab_size * c.hidden_size
    used = _used(main, c)
    return V4ParameterSummary(
        total=sum(t.size for t in main), activated=used - embedding,
        activated_with_embedding=used, mtp=sum(t.size for t in mtp),
        mtp_activated=_used(mtp, c),
        routed_experts=sum(t.size for t in main if _is_routed_expert(t)),
        embedding=embedding, tid2eid=sum(t.size for t in buffer_tensors(c)))


# ----------------------------------------------------------------------------- weight bytes

# DeepSeek's released formats (NOTES: vLLM `DeepseekV4FP8Config`; the checkpoints' shard
# listings): routed experts MXFP4 (e2m1, 4 bits, one ue8m0 scale byte per 32 inputs);
# the other 2-D projections FP8 e4m3 with one ue8m0 scale byte per 128 x 128 block; the
# embedding, head, router and the compressors' / indexer's wkv, wgate, weights_proj bf16
# (transformers `DeepseekV4PreTrainedModel._keep_in_fp32_modules` lists them as shipped
# without scales); vectors (norms, hc_*, attn_sink, ape, gate.bias) float32.
_BF16_SUFFIXES = ("compressor.wkv.weight", "compressor.wgate.weight",
                  "weights_proj.weight", "gate.weight")


def released_weight_bytes(t: WeightTensor) -> float:
    """Bytes of tensor `t` in DeepSeek's released V4 checkpoint format (an estimate: see
    the comment above; the scale tensors included)."""
    name = t.path
    if _is_routed_expert(t):
        return t.size * (0.5 + 1 / 32)
    if name in ("embed.weight", "head.weight") or name.endswith(_BF16_SUFFIXES):
        return 2 * t.size
    if len(t.shape) == 1 or name.endswith(("_fn", "_base", "_scale", "ape")):
        return 4 * t.size
    *groups, n_in, n_out = t.shape  # an FP8 matrix with a 128 x 128-block scale grid
    return t.size + math.prod(groups) * math.ceil(n_in / 128) * math.ceil(n_out / 128)


def weight_bytes(config: DeepSeekV4Config, include_mtp: bool = False) -> dict[str, float]:
    """Bytes of every parameter stored as float32, bfloat16 and in the released format.

    Returns:
      {"float32": ..., "bfloat16": ..., "released": ...}; "released" also counts the
      `tid2eid` tables (int64) and, with include_mtp, the MTP modules, as the checkpoint does.
    """
    tensors = weight_tensors(config, include_mtp)
    n = sum(t.size for t in tensors)
    released = sum(released_weight_bytes(t) for t in tensors)
    released += 8 * sum(t.size for t in buffer_tensors(config))
    return {"float32": 4.0 * n, "bfloat16": 2.0 * n, "released": released}


# ----------------------------------------------------------------------------- KV cache


def _compressed_entries(c: DeepSeekV4Config, layer_type: str, context_len: int) -> int:
    """Compressed entries of a block after `context_len` tokens (one per closed window)."""
    return 0 if layer_type == SLIDING else context_len // c.compress_rates[layer_type]


def kv_cache_items(config: DeepSeekV4Config, context_len: int,
                   bytes_per_number: int = 2) -> dict[str, int]:
    """Bytes of inference cache of one sequence of `context_len` tokens, by item.

    See the module docstring for each item and its source. Entries are
    `bytes_per_number` each; the compressor state is float32 (STATE_BYTES).

    Returns:
      {"sliding window", "CSA compressed", "indexer keys", "HCA compressed",
       "compressor state"}: bytes per sequence, over all blocks (no MTP).

    Raises:
      ValueError: if context_len < 1 or bytes_per_number < 1.
    """
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"context_len={context_len!r} must be an integer >= 1")
    if bytes_per_number < 1:
        raise ValueError(f"bytes_per_number={bytes_per_number!r} must be >= 1")
    c, b, T = config, bytes_per_number, context_len
    D, DI = c.head_dim, c.index_head_dim
    items = dict.fromkeys(("sliding window", "CSA compressed", "indexer keys",
                           "HCA compressed", "compressor state"), 0)
    for layer_type in c.layer_types:
        items["sliding window"] += min(T, c.sliding_window) * D * b  # one K=V head
        entries = _compressed_entries(c, layer_type, T)
        if layer_type == CSA:
            m = c.compress_rates[CSA]
            items["CSA compressed"] += entries * D * b
            items["indexer keys"] += entries * DI * b
            # kv_state + score_state, (2m, 2d) each, for the compressor and the indexer's
            items["compressor state"] += 2 * (2 * m) * (2 * D + 2 * DI) * STATE_BYTES
        elif layer_type == HCA:
            items["HCA compressed"] += entries * D * b
            items["compressor state"] += 2 * c.compress_rates[HCA] * D * STATE_BYTES
    return items


def kv_cache_bytes(config: DeepSeekV4Config, context_len: int, bytes_per_number: int = 2) -> int:
    """Bytes of inference cache of one sequence of `context_len` tokens (`kv_cache_items`)."""
    return sum(kv_cache_items(config, context_len, bytes_per_number).values())


def kv_cache_bytes_per_token(config: DeepSeekV4Config, bytes_per_number: int = 2) -> float:
    """Growth of the cache per token of context: the compressed entries, D/m + DI/m per
    CSA block and D/m' per HCA block, times `bytes_per_number` (the sliding window and the
    compressor state are bounded and do not grow)."""
    c = config
    per = 0.0
    for layer_type in c.layer_types:
        if layer_type == CSA:
            per += (c.head_dim + c.index_head_dim) / c.compress_rates[CSA]
        elif layer_type == HCA:
            per += c.head_dim / c.compress_rates[HCA]
    return per * bytes_per_number


def allocated_cache_items(config: DeepSeekV4Config, max_length: int,
                          bytes_per_number: int = 4) -> dict[str, int]:
    """Bytes of the buffers this implementation's `DeepSeekV4CausalLM.init_cache(1, S)`
    allocates for one sequence of capacity S = max_length, by item
    (`models/deepseek_v4/kv_cache.py` for the buffers): the entries and the window ring in
    `bytes_per_number` (the compute dtype), the compressors' rings in float32:

      sliding window   every block "kv": a ring of sliding_window x D
      CSA compressed   each CSA block "entries": (S // m + 1) x D (one slot for the open window)
      indexer keys     each CSA block "index_entries": (S // m + 1) x DI
      HCA compressed   each HCA block "entries": (S // m' + 1) x D
      compressor state "comp_kv" + "comp_gate": 2 x coff m x coff D per CSA / HCA block,
                       plus "index_kv" + "index_gate": 2 x 2m x 2 DI per CSA block

    Against `kv_cache_items` (DeepSeek's inference cache) at S >= sliding_window: the same
    items, each compressed item one slot (one entry) more per block.

    Raises:
      ValueError: if max_length < 1 or bytes_per_number < 1.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length={max_length!r} must be an integer >= 1")
    if bytes_per_number < 1:
        raise ValueError(f"bytes_per_number={bytes_per_number!r} must be >= 1")
    c, b, S = config, bytes_per_number, max_length
    D, DI = c.head_dim, c.index_head_dim
    items = kv_cache_items(c, max(S, c.sliding_window), b)  # the rings: S-independent
    for item in ("CSA compressed", "indexer keys", "HCA compressed"):
        items[item] = 0
    for layer_type in c.layer_types:
        if layer_type == SLIDING:
            continue
        slots = S // c.compress_rates[layer_type] + 1
        if layer_type == CSA:
            items["CSA compressed"] += slots * D * b
            items["indexer keys"] += slots * DI * b
        else:
            items["HCA compressed"] += slots * D * b
    return items


# ----------------------------------------------------------------------------- FLOPs


COUNTED = ("attended", "computed")


def attended_keys(config: DeepSeekV4Config, layer_type: str, context_len: int,
                  counted: str = "attended") -> int:
    """Keys (tokens and compressed entries) one query at position T = `context_len` attends.

    "attended" (the model's): the sliding window's min(T, sliding_window), plus
    min(T // m, index_topk) CSA entries (the indexer's top-k) or T // m' HCA entries (all
    of them); "computed" (what this implementation's stateless path scores, by
    `attn_implementation`): "sparse" (`sparse_attention.py`) scores 2 * sliding_window
    window keys (blocks of W queries against 2W keys), plus min(T // m, index_topk)
    gathered CSA picks or all T // m' HCA entries; "dense" (`attention.py`, a score
    matrix under masks) T, plus T // m in CSA / HCA layers.

    Raises:
      ValueError: unknown `counted` or `layer_type`.
    """
    c = config
    if counted not in COUNTED:
        raise ValueError(f"counted={counted!r} must be one of {COUNTED}")
    if layer_type not in (SLIDING, CSA, HCA):
        raise ValueError(f"layer_type={layer_type!r} is not a V4 attention type")
    entries = _compressed_entries(c, layer_type, context_len)
    if counted == "computed" and c.attn_implementation == "dense":
        return context_len + entries
    if counted == "computed":
        keys = 2 * c.sliding_window
        return keys + (min(entries, c.index_topk) if layer_type == CSA else entries)
    keys = min(context_len, c.sliding_window)
    return keys + (min(entries, c.index_topk) if layer_type == CSA else entries)


def _flop_layer_types(c: DeepSeekV4Config, include_mtp: bool) -> list[str]:
    return list(c.layer_types) + ([MTP_LAYER_TYPE] * c.num_nextn_predict_layers
                                  if include_mtp else [])


def attention_forward_flops(config: DeepSeekV4Config, seq_len: int, counted: str = "attended",
                            include_mtp: bool = False) -> int:
    """A(T) + I(T) of `models/deepseek_v4/flops.py`: forward FLOPs per token of every
    block's attention scores and values, 4 H D per `attended_keys` key, plus each CSA
    indexer's scores, 2 nI (DI + 1) per compressed key (all T // m of them)."""
    c = config
    flops = 0
    for layer_type in _flop_layer_types(c, include_mtp):
        flops += 4 * c.num_attention_heads * c.head_dim * attended_keys(c, layer_type, seq_len,
                                                                        counted)
        if layer_type == CSA:
            flops += (2 * c.index_n_heads * (c.index_head_dim + 1)
                      * _compressed_entries(c, CSA, seq_len))
    return flops


def mix_forward_flops(config: DeepSeekV4Config, include_mtp: bool = False) -> int:
    """M + P of `models/deepseek_v4/flops.py`: forward FLOPs per token of the mHC mixes,
    2 n (n + 2) C + 4 n^2 t_max per sub-block (two per block) and 2 n C per hc_head, and of
    the compressors' pooling, 2 coff w per compressor (CSA: 2 x 2D + 2 x 2DI, HCA: 2D)."""
    c = config
    n, C = c.hc_mult, c.hidden_size
    sub_block = 2 * n * (n + 2) * C + 4 * n * n * c.hc_sinkhorn_iters
    head = 2 * n * C
    types = _flop_layer_types(c, include_mtp)
    flops = 2 * len(types) * sub_block + head
    if include_mtp:
        flops += c.num_nextn_predict_layers * head
    for layer_type in types:
        if layer_type == CSA:
            flops += 2 * 2 * c.head_dim + 2 * 2 * c.index_head_dim
        elif layer_type == HCA:
            flops += 2 * c.head_dim
    return flops


def flops_per_token(config: DeepSeekV4Config, seq_len: int) -> int:
    """Training FLOPs per token of the model without MTP (as transformers builds it):
    6 N_active + 3 (`attention_forward_flops` + `mix_forward_flops`), N_active =
    `parameter_summary(config).activated`. The formula and its sources:
    `models/deepseek_v4/flops.py` (whose `flops_per_token(..., include_mtp=False)` equals it).

    Raises:
      ValueError: if seq_len < 1.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be an integer >= 1")
    return (6 * parameter_summary(config).activated
            + 3 * (attention_forward_flops(config, seq_len) + mix_forward_flops(config)))


def decode_flops_per_token(config: DeepSeekV4Config, context_len: int) -> int:
    """Forward FLOPs to generate one token at context length S (no MTP): 2 N_active +
    `attention_forward_flops` at S + `mix_forward_flops`.

    Raises:
      ValueError: if context_len < 1.
    """
    if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
        raise ValueError(f"context_len={context_len!r} must be an integer >= 1")
    return (2 * parameter_summary(config).activated
            + attention_forward_flops(config, context_len) + mix_forward_flops(config))


# ----------------------------------------------------------------------------- training


def _top_prefixes(c: DeepSeekV4Config, n: int) -> tuple[str, ...]:
    """`train.trainable=top:N`: the last n blocks, the final norm, hc_head and the head."""
    check_trainable_blocks(n, c.num_hidden_layers)
    head = "embed." if c.tie_word_embeddings else "head."
    return (*(f"layers.{i}." for i in range(c.num_hidden_layers - n, c.num_hidden_layers)),
            "norm.", "hc_head_", head)


def parameter_counts(config: DeepSeekV4Config, mode: str = "full", lora_rank: int = 16,
                     lora_targets: str = "attention,mlp", trainable_blocks: int | None = None,
                     optimizer: str = "adamw") -> ParameterCounts:
    """Trained, frozen and adapter parameters of a run, as `memory_plan.parameter_counts`
    selects them for V3 (same modes, arguments and errors), over `weight_tensors(config)`
    (no MTP). LoRA targets: "attention" = wq_a, wq_b, wkv, wo_a (per group), wo_b;
    "mlp" = the routed (per expert) and shared experts' w1, w3, w2.

    Raises:
      ValueError: unknown mode, optimizer or target; lora_rank < 1; trainable_blocks
        missing for frozen or out of range.
    """
    check_choices(mode, optimizer)
    return count_parameters(weight_tensors(config), lambda n: _top_prefixes(config, n),
                            lambda path: ".".join(path.split(".")[:2]),  # layers.i
                            mode, lora_rank, lora_targets, trainable_blocks, optimizer)


def block_activation_items(config: DeepSeekV4Config, layer_idx: int, seq_len: int,
                           compute_dtype: str = "bfloat16") -> list[tuple[str, int]]:
    """Bytes per token that one V4 block keeps for its backward pass, item by item.

    Listed from transformers' `DeepseekV4DecoderLayer` forward (matmul inputs, RMSNorm
    float32 inputs and normalized values, softmax outputs, the inputs of elementwise
    products), by the rules of the V3 planner (`memory_plan.block_activation_items`,
    after Korthikanti et al. 2022 §4.1). With a = bytes of the compute dtype, n = hc_mult,
    t = hc_sinkhorn_iters, k = `attended_keys` at T = seq_len, w = the compressor's width
    (2D for CSA, D for HCA), m its rate:

      mHC (attn_hc, ffn_hc)  each: streams a nC, flattened float32 input and normalized
                             8 nC, mixes 4 n(2+n), Sinkhorn 8 n^2 t, post and comb 4(n + n^2)
      attn_norm, ffn_norm    each 4C + 2aC; q_norm 4Rq + 2aRq; kv_norm 4D + 2aD
      queries                q_b output a H D, RoPE 2a H Dr, scaled q a H D; key a D, RoPE 2a Dr
      softmax                4 H k (+ a H k cast when a < 4)
      attention output       a H D + 2a H Dr (inverse RoPE), wo_b input a g Ro
      compressor (CSA/HCA)   projections a w x 2, gate softmax 4w, pooled norm (4D + 2aD)/m
      indexer (CSA)          its compressor as above at 2 DI, queries a nI DI + 2a nI Dr,
                             weights a nI, scores 4 nI (T // m) (ReLU input, kept for its loss)
      MoE                    router 4C (if a < 4) + 12E; routed a(2KC + 4KF); shared 4aF
    """
    c = config
    a = DTYPE_BYTES[compute_dtype]
    cast32 = 4 if a < 4 else 0
    C, H, D, Dr, n = c.hidden_size, c.num_attention_heads, c.head_dim, c.qk_rope_head_dim, c.hc_mult
    layer_type = c.layer_types[layer_idx]
    k = attended_keys(c, layer_type, seq_len)

    def norm(width: int) -> int:
        return 4 * width + 2 * a * width

    def hc() -> int:
        return (a * n * C + 8 * n * C + 4 * n * (2 + n) + 8 * n * n * c.hc_sinkhorn_iters
                + 4 * (n + n * n))

    def compressor(width: int, pooled: int, rate: int) -> int:  # kv, gate; softmax; pooled norm
        return 2 * a * width + 4 * width + norm(pooled) // rate

    items = [("attn_hc", hc()), ("attn_norm", norm(C)), ("q_norm", norm(c.q_lora_rank)),
             ("queries", 2 * a * H * D + 2 * a * H * Dr), ("kv_norm", norm(D)),
             ("key", a * D + 2 * a * Dr),
             ("softmax", 4 * H * k + (a * H * k if a < 4 else 0)),
             ("attention output", a * H * D + 2 * a * H * Dr + a * c.o_groups * c.o_lora_rank)]
    if layer_type == CSA:
        m, nI, DI = c.compress_rates[CSA], c.index_n_heads, c.index_head_dim
        items += [("compressor", compressor(2 * D, D, m)),
                  ("indexer", compressor(2 * DI, DI, m) + a * nI * DI + 2 * a * nI * Dr + a * nI
                   + 4 * nI * (seq_len // m))]
    elif layer_type == HCA:
        items.append(("compressor", compressor(D, D, c.compress_rates[HCA])))
    K, F = c.num_experts_per_tok, c.moe_intermediate_size
    items += [("ffn_hc", hc()), ("ffn_norm", norm(C)),
              ("router", cast32 * C + 12 * c.n_routed_experts),
              ("routed experts", a * (2 * K * C + 4 * K * F)),
              ("shared experts", 4 * a * F * c.n_shared_experts)]
    return items


def head_activation_bytes_per_token(config: DeepSeekV4Config, compute_dtype: str) -> int:
    """hc_head (streams a nC, float32 flattened and normalized 8 nC), the final norm
    4C + 2aC, float32 logits and their softmax gradient 8V (+ aV before the cast)."""
    c, a = config, DTYPE_BYTES[compute_dtype]
    n, C = c.hc_mult, c.hidden_size
    return (a * n * C + 8 * n * C + 4 * C + 2 * a * C + 8 * c.vocab_size
            + (a * c.vocab_size if a < 4 else 0))


def activation_bytes(config: DeepSeekV4Config, micro_batch: int, seq_len: int,
                     compute_dtype: str = "bfloat16", recompute: str = "none") -> int:
    """Activation bytes of one micro-batch, as `memory_plan.activation_bytes` for V3 but
    with V4's blocks and head and no MTP. With recompute="full" each block keeps its
    input, the n = hc_mult residual streams (a n C per token), plus the larger of the head
    and one block.

    Raises:
      ValueError: unknown compute_dtype or recompute; micro_batch or seq_len < 1.
    """
    check_activation_args(micro_batch, seq_len, compute_dtype, recompute)
    c = config
    head = head_activation_bytes_per_token(c, compute_dtype)
    blocks = [sum(b for _, b in block_activation_items(c, i, seq_len, compute_dtype))
              for i in range(c.num_hidden_layers)]
    tokens = micro_batch * seq_len
    if recompute == "none":
        return tokens * (sum(blocks) + head)
    kept = DTYPE_BYTES[compute_dtype] * c.hc_mult * c.hidden_size
    return tokens * (len(blocks) * kept + max([head] + blocks))


# ----------------------------------------------------------------------------- the plan


INVENTORY = FamilyInventory(kv_cache_bytes=kv_cache_bytes, activation_bytes=activation_bytes,
                            flops_per_token=flops_per_token,
                            decode_flops_per_token=decode_flops_per_token)


def plan(p: PlanInput) -> Plan:
    """Memory per device, whether it fits, the fewest devices that fit, and time, of a
    `PlanInput` whose `config` is a `DeepSeekV4Config` (`models.planning.plan`, the V3
    planner's method, with this family's `INVENTORY`).

    Raises:
      ValueError: `p.config` is not a DeepSeekV4Config; see `PlanInput`, `parameter_counts`.
    """
    c = p.config
    if not isinstance(c, DeepSeekV4Config):
        raise ValueError(f"PlanInput.config is a {type(c).__name__}; the V4 planner needs a "
                         "DeepSeekV4Config (V3 configs: models/deepseek/memory_plan.plan)")
    counts = parameter_counts(c, p.mode, p.lora_rank, p.lora_targets, p.trainable_blocks,
                              p.optimizer)
    return planning_plan.plan(p, counts, INVENTORY)
