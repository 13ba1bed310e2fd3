"""Analytic parameter counts, FLOPs per token and model FLOPs utilization (MFU).

FLOPs per trained token (forward + backward), after nanoGPT's `estimate_mfu`
(itself from the PaLM paper, arXiv 2204.02311, appendix B):

    flops_per_token = 6 * N_active + 6 * L_attn * n_h * T * (d_qk + d_v)

N_active is the number of parameter uses per token (`activated_params`): 2
FLOPs per multiply-add forward, 4 backward. The second term is attention's
score (Q K^T, width d_qk = qk_nope_head_dim + qk_rope_head_dim) and value (A V,
width d_v = v_head_dim) matmuls over the T context positions, 2 FLOPs each
forward, x3 for forward + backward; with d_qk = d_v = Q it is nanoGPT's
12 * L * H * Q * T. Like nanoGPT it counts the full T x T score matrix, not the
causal half. L_attn counts the MTP blocks when they are included.
`decode_flops_per_token` counts the forward FLOPs of one generated token with
the latent cache, with and without MLA's weight absorption.

DeepSeek Sparse Attention (DeepSeek-V3.2, `config.uses_sparse_attention`): the
lightning indexer's weights count as parameters (`_indexer_params`, used by every
token), but they run forward only (no gradient reaches them), so training charges
them 2 FLOPs per use, not 6; scoring a query against T keys costs
2 * T * Hi * (Di + 1) FLOPs per layer (q . k per head, then the weighted sum over
the Hi heads), forward only. The main attention is counted as it runs
(`_gathers`): with `attn_implementation` "sparse" and index_topk < T, each query
attends its k = index_topk gathered latents in the absorbed form (mla_attention.py),
2*H*k*(2R + Dr) per query and layer plus the absorption 2*H*R*(Dn + Dv); else (dense,
masked) over all T keys as without DSA.
This module imports neither TensorFlow nor Keras.
"""

from models.deepseek.config import DeepSeekConfig


def _mlp_params(hidden_size: int, intermediate_size: int) -> int:
    return 3 * hidden_size * intermediate_size  # gate_proj, up_proj, down_proj


def _attention_params(c: DeepSeekConfig) -> int:
    h = c.num_attention_heads
    if c.q_lora_rank is None:
        q = c.hidden_size * h * c.qk_head_dim  # q_proj
    else:
        q = (c.hidden_size * c.q_lora_rank  # q_a_proj
             + c.q_lora_rank  # q_a_layernorm
             + c.q_lora_rank * h * c.qk_head_dim)  # q_b_proj
    kv = (c.hidden_size * (c.kv_lora_rank + c.qk_rope_head_dim)  # kv_a_proj_with_mqa
          + c.kv_lora_rank  # kv_a_layernorm
          + c.kv_lora_rank * h * (c.qk_nope_head_dim + c.v_head_dim))  # kv_b_proj
    o = h * c.v_head_dim * c.hidden_size  # o_proj
    return q + kv + o + _indexer_params(c)


def _indexer_params(c: DeepSeekConfig) -> int:
    """The lightning indexer of one attention layer (0 without DeepSeek Sparse Attention):
    wq_b, wk, k_norm (weight and bias), weights_proj."""
    if not c.uses_sparse_attention:
        return 0
    hi, di = c.index_n_heads, c.index_head_dim
    return c.q_lora_rank * hi * di + c.hidden_size * di + 2 * di + c.hidden_size * hi


def _indexer_score_flops(c: DeepSeekConfig, keys: int) -> int:
    """Forward FLOPs of one query's index scores against `keys` keys, one layer: q . k for
    each of the Hi heads (2 Di per key) and the weighted sum over the heads (2 per key)."""
    if not c.uses_sparse_attention:
        return 0
    return 2 * keys * c.index_n_heads * (c.index_head_dim + 1)


def _gathers(c: DeepSeekConfig, keys: int) -> bool:
    """True when DSA's attention gathers its picks (`MultiHeadLatentAttention._gathers`)."""
    return (c.uses_sparse_attention and c.attn_implementation == "sparse"
            and c.index_topk < keys)


def _moe_params(c: DeepSeekConfig, experts: int) -> int:
    """Router weight and bias (V3 only: the V2 routers have none), `experts` routed
    experts, the fused shared expert."""
    router = c.n_routed_experts * c.hidden_size + (c.n_routed_experts if c.uses_router_bias
                                                   else 0)
    shared = _mlp_params(c.hidden_size, c.moe_intermediate_size * c.n_shared_experts)
    return router + experts * _mlp_params(c.hidden_size, c.moe_intermediate_size) + shared


def _block_params(c: DeepSeekConfig, layer_idx: int, active: bool) -> int:
    if c.is_moe_layer(layer_idx):
        experts = c.num_experts_per_tok if active else c.n_routed_experts
        mlp = _moe_params(c, experts)
    else:
        mlp = _mlp_params(c.hidden_size, c.intermediate_size)
    return 2 * c.hidden_size + _attention_params(c) + mlp  # two RMSNorms + attn + mlp


def _mtp_params(c: DeepSeekConfig, depth: int, active: bool) -> int:
    """enorm + hnorm + eh_proj + block + shared_head.norm of MTP depth `depth` (0-based)."""
    block = _block_params(c, c.num_hidden_layers + depth, active)
    return 2 * c.hidden_size + 2 * c.hidden_size * c.hidden_size + block + c.hidden_size


def total_params(config: DeepSeekConfig) -> int:
    """All parameters, as `DeepSeekCausalLM(config).count_params()`.

    Includes the embedding (once when tied), the lm_head when untied, every
    routed expert, the non-trainable router biases and the MTP modules.
    """
    c = config
    n = c.vocab_size * c.hidden_size  # embed_tokens
    n += sum(_block_params(c, i, active=False) for i in range(c.num_hidden_layers))
    n += c.hidden_size  # final norm
    if not c.tie_word_embeddings:
        n += c.vocab_size * c.hidden_size  # lm_head
    n += sum(_mtp_params(c, d, active=False) for d in range(c.num_nextn_predict_layers))
    return n


def activated_params(config: DeepSeekConfig, include_mtp: bool = False) -> int:
    """Parameters used per token: what a token's forward pass multiplies by.

    Counts attention, norms, dense MLPs, the router (weight and bias), shared
    experts, num_experts_per_tok routed experts per MoE layer and the output
    head (vocab_size * hidden_size, tied or not); the embedding lookup is
    excluded (no matmul). With include_mtp, adds each MTP module with its own
    use of the shared output head (as in training).
    """
    c = config
    n = sum(_block_params(c, i, active=True) for i in range(c.num_hidden_layers))
    n += c.hidden_size + c.vocab_size * c.hidden_size  # final norm + lm_head
    if include_mtp:
        for d in range(c.num_nextn_predict_layers):
            n += _mtp_params(c, d, active=True) + c.vocab_size * c.hidden_size
    return n


def flops_per_token(config: DeepSeekConfig, seq_len: int, include_mtp: bool = True) -> int:
    """Training FLOPs per token: 6 * N_active + 6 * L_attn * n_h * T * (d_qk + d_v).

    See the module docstring for the formula's source (nanoGPT estimate_mfu /
    PaLM appendix B) and meaning. include_mtp (default True, since MTP modules
    run in training) adds the MTP modules' parameters and attention layers.
    With DeepSeek Sparse Attention each attention layer's indexer adds its forward
    only: 2 * its parameters (instead of the 6 that N_active charges) plus
    2 * T * Hi * (Di + 1) for its scores (module docstring).

    Raises:
      ValueError: if seq_len < 1.
    """
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be >= 1")
    c = config
    layers = c.num_hidden_layers + (c.num_nextn_predict_layers if include_mtp else 0)
    attention = 6 * layers * c.num_attention_heads * seq_len * (c.qk_head_dim + c.v_head_dim)
    if _gathers(c, seq_len):  # (module docstring): k latents per query, absorbed form
        h, r = c.num_attention_heads, c.kv_lora_rank
        attention = 6 * layers * h * (c.index_topk * (2 * r + c.qk_rope_head_dim)
                                      + r * (c.qk_nope_head_dim + c.v_head_dim))
    indexer = layers * (_indexer_score_flops(c, seq_len) - 4 * _indexer_params(c))
    return 6 * activated_params(c, include_mtp=include_mtp) + attention + indexer


def decode_flops_per_token(config: DeepSeekConfig, context_len: int,
                           absorbed: bool = True) -> int:
    """Forward FLOPs to generate one token with MLA's latent cache at context length S.

    S = context_len, the cached positions the new token attends (itself
    included). Matmuls count 2 FLOPs per multiply-add (as `flops_per_token`).
    With H heads, R = kv_lora_rank, Dn/Dr/Dv = qk_nope/qk_rope/v head dims,
    per layer:

      absorbed (DeepSeek-V2 §2.1.2, W_UK absorbed into the query, W_UV into
      the output; `MultiHeadLatentAttention` with absorb=True):
          2*H*Dn*R            q_lat = q_nope W_UK^T
        + 2*S*H*(R + Dr)      scores of [q_lat | q_pe] against the cache [c_kv | k_pe]
        + 2*S*H*R             o_lat = probs c_kv
        + 2*H*R*Dv            o = o_lat W_UV
      expanded (absorb=False: the S cached latents re-expanded every step):
          2*S*R*H*(Dn + Dv)   kv_b_proj on the S latents
        + 2*S*H*(Dn + Dr)     scores
        + 2*S*H*Dv            probs v

    plus, either way, 2 * (N_active - L*R*H*(Dn + Dv)): every other per-token
    matmul as `activated_params` counts it (projections, MLP or routed and
    shared experts, router, lm_head, the DSA indexer's projections; no MTP),
    kv_b_proj being counted above; and with DeepSeek Sparse Attention the index
    scores against the S cached indexer keys, 2*S*Hi*(Di + 1) per layer, and, gathered
    (`attn_implementation` "sparse", S > index_topk), the absorbed attention over the
    index_topk picked latents instead of S (whatever `absorbed` says).
    So absorbed = 2*N_active + L * 2*S*H*(2R + Dr), linear in S with a small
    slope, while expanded grows by 2*R*H*(Dn + Dv) per layer and cached token.

    Note: `generate` attends over its whole cache buffer (S = the longest
    prompt + max_new_tokens of the batch, masked beyond each row's position),
    so its work per step is this formula at that S.

    Raises:
      ValueError: if context_len < 1.
    """
    if context_len < 1:
        raise ValueError(f"context_len={context_len} must be >= 1")
    c, s = config, context_len
    h, r, dn, dr, dv = (c.num_attention_heads, c.kv_lora_rank, c.qk_nope_head_dim,
                        c.qk_rope_head_dim, c.v_head_dim)
    kv_b = r * h * (dn + dv)  # kv_b_proj parameters of one layer
    rest = 2 * (activated_params(c) - c.num_hidden_layers * kv_b)
    if absorbed or _gathers(c, s):  # gathered DSA attends min(S, index_topk) latents
        keys = min(s, c.index_topk) if _gathers(c, s) else s
        attention = 2 * h * dn * r + 2 * keys * h * (r + dr) + 2 * keys * h * r + 2 * h * r * dv
    else:
        attention = 2 * s * kv_b + 2 * s * h * (dn + dr) + 2 * s * h * dv
    attention += _indexer_score_flops(c, s)
    return rest + c.num_hidden_layers * attention


def mfu(tokens_per_second: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilization: achieved FLOP/s over the hardware peak, in [0, 1].

    Args:
      tokens_per_second: trained tokens per second.
      flops_per_token: from `flops_per_token`.
      peak_flops: peak FLOP/s of the hardware (e.g. ~2.4e11 for float32 on
        these 2-core CPUs, see the project notes).

    Raises:
      ValueError: if peak_flops <= 0.
    """
    if peak_flops <= 0:
        raise ValueError(f"peak_flops={peak_flops} must be > 0")
    return tokens_per_second * flops_per_token / peak_flops


def kv_cache_bytes_per_token(config: DeepSeekConfig, bytes_per_number: int = 4,
                             layout: str = "mla") -> int:
    """Bytes of inference cache per token of context, over all layers.

    layout "mla": the latent cache of Multi-head Latent Attention,
        L * (kv_lora_rank + qk_rope_head_dim) numbers (DeepSeek-V2 §2.1.4, Table 1),
        plus L * index_head_dim for the lightning indexer's keys with DeepSeek Sparse
        Attention (V3.2): L * `config.cache_width`, what `init_cache` allocates;
    layout "mha": an equivalent multi-head attention cache of full keys and values,
        L * n_h * (qk_head_dim + v_head_dim) numbers.
    MTP modules are not counted (they do not run at inference).

    Raises:
      ValueError: unknown layout.
    """
    c = config
    if layout == "mla":
        per_layer = c.cache_width
    elif layout == "mha":
        per_layer = c.num_attention_heads * (c.qk_head_dim + c.v_head_dim)
    else:
        raise ValueError(f"layout={layout!r} must be 'mla' or 'mha'")
    return c.num_hidden_layers * per_layer * bytes_per_number


# Dense peak FLOP/s per device (one replica) of accelerators whose peak is
# published, by compute dtype: "bfloat16"/"float16" (tensor/matrix units),
# "tfloat32" (float32 matmuls on Ampere and later, which TensorFlow runs as
# TF32 by default), "float32" (CUDA cores). Vendor data sheets, without
# structured sparsity. The first key that is a substring of the device name
# wins, so more specific names come first. TPU v2/v3 replicas are TensorCores
# (two per chip); v4 and later run one replica per chip (megacore).
# CPUs are not listed: their peak is measured (a matmul probe).
PEAK_FLOPS_TABLE: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bfloat16": 756e12, "float16": 756e12, "tfloat32": 378e12, "float32": 51e12},
    "H100": {"bfloat16": 989e12, "float16": 989e12, "tfloat32": 495e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float16": 312e12, "tfloat32": 156e12, "float32": 19.5e12},
    "L4": {"bfloat16": 121e12, "float16": 121e12, "tfloat32": 60e12, "float32": 30.3e12},
    "A10": {"bfloat16": 125e12, "float16": 125e12, "tfloat32": 62.5e12, "float32": 31.2e12},
    "V100": {"float16": 125e12, "float32": 15.7e12},
    "T4": {"float16": 65e12, "float32": 8.1e12},
    "TPU v6": {"bfloat16": 918e12},
    "TPU v5p": {"bfloat16": 459e12},
    "TPU v5": {"bfloat16": 197e12},  # v5e ("v5 lite")
    "TPU v4": {"bfloat16": 275e12},
    "TPU v3": {"bfloat16": 61.5e12},
    "TPU v2": {"bfloat16": 22.5e12},
}


def table_peak_flops(device_name: str, compute_dtype: str, tf32: bool = True) -> float | None:
    """Peak FLOP/s of one known GPU/TPU for `compute_dtype`, or None if not listed.

    Args:
      device_name: e.g. "NVIDIA A100-SXM4-40GB" or "TPU v4".
      compute_dtype: "float32", "bfloat16" or "float16".
      tf32: float32 matmuls run as TF32 (TensorFlow's default on Ampere+).
    """
    for key, peaks in PEAK_FLOPS_TABLE.items():
        if key.lower() in device_name.lower():
            if compute_dtype == "float32" and tf32 and "tfloat32" in peaks:
                return peaks["tfloat32"]
            return peaks.get(compute_dtype)
    return None
