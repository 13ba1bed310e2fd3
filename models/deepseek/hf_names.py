"""The Hugging Face tensor names of a DeepSeekCausalLM's weights.

The layout is that of HF transformers `DeepseekV3ForCausalLM` (`model.embed_tokens`,
`model.layers.N.{self_attn,mlp,input_layernorm,post_attention_layernorm}`,
`model.norm`, `lm_head`) and of the released DeepSeek-V3 weights, whose
multi-token-prediction modules sit at layer index `num_hidden_layers + d`
(`enorm`, `hnorm`, `eh_proj`, `shared_head.norm`, `shared_head.head`,
`embed_tokens`, plus a full decoder block). Linear weights are PyTorch's
[out, in]; Keras kernels are [in, out], so they are transposed both ways.

With DeepSeek Sparse Attention (DeepSeek-V3.2) every attention layer, the MTP blocks
included, has `self_attn.indexer.{wq_b,wk,weights_proj}.weight` (linear, transposed)
and `self_attn.indexer.k_norm.{weight,bias}` (LayerNorm gamma and beta), as transformers
5.24's `DeepseekV32ForCausalLM.save_pretrained` writes them and DeepSeek releases them.

Routed experts are one tensor per expert on disk (`mlp.experts.e.gate_proj.weight`,
as DeepSeek releases them and transformers' `save_pretrained` writes them) and
stacked kernels in the model (`RoutedExperts`): each name maps to an `ExpertSlice`,
expert e of a stacked (E, in, out) kernel, read and assigned in place.
"""

from __future__ import annotations

import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.formats.dequantized_kernel import DequantizedKernel
from models.formats.expert_slice import ExpertSlice
from models.formats.quantization import is_quantized, kernel_variable


def stored_variable(entry):
    """The model variable an `hf_weight_map` entry reads: the variable itself, or the
    stacked kernel of an `ExpertSlice`, or the int8 kernel of a `DequantizedKernel`."""
    if isinstance(entry, ExpertSlice):
        return kernel_variable(entry.projection)
    if isinstance(entry, DequantizedKernel):
        return kernel_variable(entry.layer)
    return entry


def hf_weight_map(model) -> dict[str, tuple[tf.Variable, bool]]:
    """HF tensor name -> (the model's variable, transpose?) for every weight.

    Args:
      model: a DeepSeekCausalLM.

    Returns:
      A dict over every weight of the model (router biases included);
      `transpose` is True for Dense kernels (Keras [in, out] vs HF [out, in]). An
      int8 projection's entry is a `DequantizedKernel` (read-only: its float32 Q / s),
      not a variable; a routed expert's is an `ExpertSlice` of its stacked kernel.
    """
    c = model.config
    names: dict[str, tuple[tf.Variable, bool]] = {}

    def dense(prefix, layer):
        names[f"{prefix}.weight"] = (DequantizedKernel(layer) if is_quantized(layer)
                                     else layer.kernel, True)

    def norm(prefix, layer):
        names[f"{prefix}.weight"] = (layer.weight, False)

    def mlp(prefix, layer):
        for proj in ("gate_proj", "up_proj", "down_proj"):
            dense(f"{prefix}.{proj}", getattr(layer, proj))

    def block(prefix, b):
        norm(f"{prefix}.input_layernorm", b.input_layernorm)
        norm(f"{prefix}.post_attention_layernorm", b.post_attention_layernorm)
        a = b.self_attn
        if c.q_lora_rank is None:
            dense(f"{prefix}.self_attn.q_proj", a.q_proj)
        else:
            dense(f"{prefix}.self_attn.q_a_proj", a.q_a_proj)
            norm(f"{prefix}.self_attn.q_a_layernorm", a.q_a_layernorm)
            dense(f"{prefix}.self_attn.q_b_proj", a.q_b_proj)
        dense(f"{prefix}.self_attn.kv_a_proj_with_mqa", a.kv_a_proj_with_mqa)
        norm(f"{prefix}.self_attn.kv_a_layernorm", a.kv_a_layernorm)
        dense(f"{prefix}.self_attn.kv_b_proj", a.kv_b_proj)
        dense(f"{prefix}.self_attn.o_proj", a.o_proj)
        if a.indexer is not None:
            ix = a.indexer
            dense(f"{prefix}.self_attn.indexer.wq_b", ix.wq_b)
            dense(f"{prefix}.self_attn.indexer.wk", ix.wk)
            names[f"{prefix}.self_attn.indexer.k_norm.weight"] = (ix.k_norm.gamma, False)
            names[f"{prefix}.self_attn.indexer.k_norm.bias"] = (ix.k_norm.beta, False)
            dense(f"{prefix}.self_attn.indexer.weights_proj", ix.weights_proj)
        if b.is_moe:
            moe = b.mlp
            names[f"{prefix}.mlp.gate.weight"] = (moe.gate.weight, False)  # [E, C] both
            if moe.gate.e_score_correction_bias is not None:  # V3 only; V2 has no bias
                names[f"{prefix}.mlp.gate.e_score_correction_bias"] = (
                    moe.gate.e_score_correction_bias, False)
            for e in range(len(moe.experts)):
                for proj in ("gate_proj", "up_proj", "down_proj"):
                    names[f"{prefix}.mlp.experts.{e}.{proj}.weight"] = (
                        ExpertSlice(getattr(moe.experts, proj), e), True)
            if moe.shared_experts is not None:
                mlp(f"{prefix}.mlp.shared_experts", moe.shared_experts)
        else:
            mlp(f"{prefix}.mlp", b.mlp)

    names["model.embed_tokens.weight"] = (model.embed_tokens.embeddings, False)
    for i, b in enumerate(model.decoder_layers):
        block(f"model.layers.{i}", b)
    norm("model.norm", model.norm)
    if model.lm_head is not None:
        dense("lm_head", model.lm_head)
    for d, mtp in enumerate(model.mtp_layers):
        prefix = f"model.layers.{c.num_hidden_layers + d}"
        norm(f"{prefix}.enorm", mtp.enorm)
        norm(f"{prefix}.hnorm", mtp.hnorm)
        dense(f"{prefix}.eh_proj", mtp.eh_proj)
        norm(f"{prefix}.shared_head.norm", mtp.shared_head_norm)
        block(prefix, mtp.block)
    return names


def expected_hf_shapes(config: DeepSeekConfig) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> stored shape of every tensor the model of `config` has,
    computed from the config alone (no model is built, nothing is allocated).

    Shapes are as a HF checkpoint stores them: linear weights [out, in] (PyTorch),
    embeddings [vocab_size, hidden_size], RMSNorm weights [width], the router
    `mlp.gate.weight` [n_routed_experts, hidden_size] and, for the DeepSeek-V3
    router (`topk_method` "noaux_tc"), `mlp.gate.e_score_correction_bias`
    [n_routed_experts]. With DeepSeek Sparse Attention each attention layer adds
    `self_attn.indexer.wq_b.weight` [index_n_heads * index_head_dim, q_lora_rank],
    `indexer.wk.weight` [index_head_dim, hidden_size], `indexer.k_norm.weight` and
    `.bias` [index_head_dim], `indexer.weights_proj.weight` [index_n_heads,
    hidden_size]. MTP modules sit at layer index num_hidden_layers + d;
    their `embed_tokens` / `shared_head.head` copies are not included (see
    `shared_mtp_names`). The keys are those of `hf_weight_map(model)`.
    """
    c = config
    h = c.hidden_size
    heads = c.num_attention_heads
    qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim
    router_bias = getattr(c, "topk_method", "noaux_tc") == "noaux_tc"
    shapes: dict[str, tuple[int, ...]] = {}

    def mlp(prefix, width):
        shapes[f"{prefix}.gate_proj.weight"] = (width, h)
        shapes[f"{prefix}.up_proj.weight"] = (width, h)
        shapes[f"{prefix}.down_proj.weight"] = (h, width)

    def block(prefix, layer_idx):
        shapes[f"{prefix}.input_layernorm.weight"] = (h,)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (h,)
        a = f"{prefix}.self_attn"
        if c.q_lora_rank is None:
            shapes[f"{a}.q_proj.weight"] = (heads * qk_head, h)
        else:
            shapes[f"{a}.q_a_proj.weight"] = (c.q_lora_rank, h)
            shapes[f"{a}.q_a_layernorm.weight"] = (c.q_lora_rank,)
            shapes[f"{a}.q_b_proj.weight"] = (heads * qk_head, c.q_lora_rank)
        shapes[f"{a}.kv_a_proj_with_mqa.weight"] = (c.kv_lora_rank + c.qk_rope_head_dim, h)
        shapes[f"{a}.kv_a_layernorm.weight"] = (c.kv_lora_rank,)
        shapes[f"{a}.kv_b_proj.weight"] = (
            heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank)
        shapes[f"{a}.o_proj.weight"] = (h, heads * c.v_head_dim)
        if getattr(c, "index_topk", None) is not None:
            di = c.index_head_dim
            shapes[f"{a}.indexer.wq_b.weight"] = (c.index_n_heads * di, c.q_lora_rank)
            shapes[f"{a}.indexer.wk.weight"] = (di, h)
            shapes[f"{a}.indexer.k_norm.weight"] = (di,)
            shapes[f"{a}.indexer.k_norm.bias"] = (di,)
            shapes[f"{a}.indexer.weights_proj.weight"] = (c.index_n_heads, h)
        if c.is_moe_layer(layer_idx):
            shapes[f"{prefix}.mlp.gate.weight"] = (c.n_routed_experts, h)
            if router_bias:
                shapes[f"{prefix}.mlp.gate.e_score_correction_bias"] = (c.n_routed_experts,)
            for e in range(c.n_routed_experts):
                mlp(f"{prefix}.mlp.experts.{e}", c.moe_intermediate_size)
            if c.n_shared_experts > 0:
                mlp(f"{prefix}.mlp.shared_experts", c.moe_intermediate_size * c.n_shared_experts)
        else:
            mlp(f"{prefix}.mlp", c.intermediate_size)

    shapes["model.embed_tokens.weight"] = (c.vocab_size, h)
    for i in range(c.num_hidden_layers):
        block(f"model.layers.{i}", i)
    shapes["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, h)
    for d in range(c.num_nextn_predict_layers):
        idx = c.num_hidden_layers + d
        prefix = f"model.layers.{idx}"
        shapes[f"{prefix}.enorm.weight"] = (h,)
        shapes[f"{prefix}.hnorm.weight"] = (h,)
        shapes[f"{prefix}.eh_proj.weight"] = (h, 2 * h)
        shapes[f"{prefix}.shared_head.norm.weight"] = (h,)
        block(prefix, idx)
    return shapes


def shared_mtp_names(config: DeepSeekConfig) -> list[str]:
    """MTP tensors of released checkpoints that are copies of the main model's
    embedding and output head (DeepSeek-V3 §2.2: shared, not per-module)."""
    out = []
    for d in range(config.num_nextn_predict_layers):
        prefix = f"model.layers.{config.num_hidden_layers + d}"
        out += [f"{prefix}.embed_tokens.weight", f"{prefix}.shared_head.head.weight"]
    return out


def tensor_sort_key(name: str):
    """Layer order (layers.2 before layers.10), then name: keeps a layer in one shard."""
    parts = name.split(".")
    if len(parts) > 2 and parts[1] == "layers" and parts[2].isdigit():
        return (1, int(parts[2]), name)
    return (0 if "embed_tokens" in name else 2, 0, name)
