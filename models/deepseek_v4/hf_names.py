"""The checkpoint tensor names of a DeepSeekV4CausalLM's weights, in both on-disk forms.

DeepSeek-V4 checkpoints use DeepSeek's own names. transformers 5.24 renames them on load
(`conversion_mapping.py`, "deepseek_v4") and its `save_pretrained` writes them back, with
the `model.` prefix on the base model's tensors whose release name has no leading anchor:

  form "transformers" (save_pretrained)       form "release" (DeepSeek's files)
  model.embed_tokens.weight                   embed.weight
  head.weight                                 head.weight
  model.norm.weight                           norm.weight
  model.hc_head.hc_{fn,base,scale}            hc_head_{fn,base,scale}
  model.layers.N.attn.norm.weight             layers.N.attn.kv_norm.weight
  model.layers.N.<rest>                       layers.N.<rest>

(the attention's KV norm is `attn.kv_norm` in DeepSeek's files, e.g. Megatron-Bridge's
DeepSeek-V4 mapping; transformers' conversion renames `.norm.` to `.kv_norm.` and its
save_pretrained writes the reverse, `attn.norm`; both load into transformers, and a
release-form checkpoint with `attn.norm.weight` loads here too, `release_aliases`)
with, under layers.N (transformers' module in brackets):
  hc_attn_{fn,base,scale} [attn_hc], hc_ffn_{fn,base,scale} [ffn_hc], attn_norm.weight
  [input_layernorm], ffn_norm.weight [post_attention_layernorm],
  attn.{wq_a [q_a_proj], q_norm [q_a_norm], wq_b [q_b_proj], wkv [kv_proj],
  norm / kv_norm [kv_norm], wo_a [o_a_proj], wo_b [o_b_proj]}.weight, attn.attn_sink [sinks],
  attn.compressor.{wkv, wgate, norm}.weight, attn.compressor.ape [position_bias],
  attn.indexer.compressor.{wkv, wgate, norm}.weight + .ape, attn.indexer.wq_b.weight
  [compressor.indexer.q_b_proj], attn.indexer.weights_proj.weight,
  ffn.gate.weight, ffn.gate.bias [e_score_correction_bias] ("moe" layers),
  ffn.gate.tid2eid (int64 (vocab, K), "hash_moe" layers),
  ffn.experts.E.{w1 gate, w3 up, w2 down}.weight, ffn.shared_experts.{w1, w3, w2}.weight.

Linear weights are PyTorch's [out, in]; Keras kernels are [in, out] (transposed both ways).
`wo_a` [g*o_lora_rank, H*D/g] (transformers' `DeepseekV4GroupedLinear` weight, viewed as
(g, o_lora_rank, H*D/g)) is the attention's `o_a_proj` ExpertProjection kernel
(g, H*D/g, o_lora_rank): rows j*R .. (j+1)*R - 1 of the tensor are group j's kernel
transposed; the map gives a `GroupedKernel` view of it, (H*D/g, g*o_lora_rank), the
tensor's transpose.
Routed experts map to `ExpertSlice`s of the stacked kernels (models/deepseek/hf_names.py).
Release files also hold the MTP module (`mtp.*`), which is not built here.
"""

from __future__ import annotations

import re

import tensorflow as tf

from models.deepseek_v4.config import CSA, SLIDING, DeepSeekV4Config
from models.formats.dequantized_kernel import DequantizedKernel
from models.formats.expert_slice import ExpertSlice
from models.formats.quantization import float_kernel, is_quantized, kernel_variable

FORMS = ("transformers", "release")
_EXPERT_PROJECTIONS = (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj"))
_TOP_LEVEL_RELEASE = {
    "model.embed_tokens.weight": "embed.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}
_TOP_LEVEL_TRANSFORMERS = {v: k for k, v in _TOP_LEVEL_RELEASE.items()}
_KV_NORM_TRANSFORMERS = re.compile(r"^(layers\.\d+\.attn)\.norm\.weight$")
_KV_NORM_RELEASE = re.compile(r"^(layers\.\d+\.attn)\.kv_norm\.weight$")


class GroupedKernel:
    """The (H*D/g, g*R) transpose of a checkpoint's `wo_a` [g*R, H*D/g], as a view of the
    attention's grouped `o_a_proj` ExpertProjection kernel (g, H*D/g, R) (R = o_lora_rank):

        view[i, j*R + r] = kernel[j, i, r]        (= wo_a[j*R + r, i])

    `shape` and `dtype` as a variable's (float32 when int8); `tf.convert_to_tensor` reads
    the float kernel (W, + A B with LoRA, Q / s when int8); `assign(value)` writes a float
    (H*D/g, g*R) value into the kernel, `assign_group(j, value)` group j's (H*D/g, R)
    block in place (a streaming load writes one group at a time)."""

    def __init__(self, projection):
        self.projection = projection
        variable = kernel_variable(projection)
        groups, width, rank = variable.shape  # (g, H*D/g, R)
        self.groups, self.rank = groups, rank
        self.shape = (width, groups * rank)
        self.dtype = tf.float32 if is_quantized(projection) else variable.dtype

    def __tf_tensor__(self, dtype=None, name=None):
        kernel = float_kernel(self.projection, tf.float32 if dtype is None else dtype)
        value = tf.transpose(kernel, [1, 0, 2])  # (g, H*D/g, R) -> (H*D/g, g, R)
        return tf.reshape(value, self.shape)  # (H*D/g, g*R)

    def _variable(self):
        if is_quantized(self.projection):
            raise ValueError(f"{self.projection.path} is int8: assign float kernels, then "
                             "quantize")
        return kernel_variable(self.projection)

    def assign(self, value) -> None:
        """Raises ValueError for an int8 kernel (quantize after assigning)."""
        variable = self._variable()
        value = tf.reshape(tf.cast(value, variable.dtype),
                           [self.shape[0], self.groups, self.rank])  # (H*D/g, g, R)
        variable.assign(tf.transpose(value, [1, 0, 2]))  # (g, H*D/g, R)

    def assign_group(self, group: int, value) -> None:
        """Group `group`'s (H*D/g, R) kernel, written in place."""
        variable = self._variable()
        variable.value[group].assign(tf.cast(value, variable.dtype))


def to_release_name(name: str) -> str:
    """A save_pretrained ("transformers") name in DeepSeek's release form."""
    if name in _TOP_LEVEL_RELEASE:
        return _TOP_LEVEL_RELEASE[name]
    name = name[len("model."):] if name.startswith("model.") else name
    return _KV_NORM_TRANSFORMERS.sub(r"\1.kv_norm.weight", name)


def to_transformers_name(name: str) -> str:
    """A release name in save_pretrained ("transformers") form."""
    if name in _TOP_LEVEL_TRANSFORMERS:
        return _TOP_LEVEL_TRANSFORMERS[name]
    if name == "head.weight":
        return name
    return "model." + _KV_NORM_RELEASE.sub(r"\1.norm.weight", name)


def release_aliases(name: str) -> tuple[str, ...]:
    """Other release-form spellings transformers also loads for `name`: the attention's
    `attn.kv_norm.weight` may be stored as `attn.norm.weight`."""
    match = _KV_NORM_RELEASE.match(name)
    return (f"{match.group(1)}.norm.weight",) if match else ()


def detect_form(names) -> str:
    """"release" if the names are DeepSeek's (`embed.weight` / `layers.N...`), else
    "transformers"."""
    names = set(names)
    if "embed.weight" in names or any(n.startswith("layers.") for n in names):
        return "release"
    return "transformers"


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"form={form!r} must be one of {list(FORMS)}")


def hf_weight_map(model, form: str = "transformers") -> dict[str, tuple[object, bool]]:
    """Checkpoint tensor name -> (the model's variable, transpose?) for every weight.

    Args:
      model: a DeepSeekV4CausalLM.
      form: "transformers" (save_pretrained names) or "release" (DeepSeek's names).

    Returns:
      A dict over every weight; `transpose` is True for Dense kernels and `wo_a`. A
      routed expert's entry is an `ExpertSlice` of its stacked kernel; `wo_a` a
      `GroupedKernel` view of `o_a_proj`; an int8 Dense's a read-only
      `DequantizedKernel`. `tid2eid` is an int32 variable (int64 on disk).

    Raises:
      ValueError: unknown form.
    """
    _check_form(form)
    names: dict[str, tuple[object, bool]] = {}

    def dense(name, layer):
        names[name] = (DequantizedKernel(layer) if is_quantized(layer) else layer.kernel, True)

    def compressor(prefix, comp):
        dense(f"{prefix}.wkv.weight", comp.kv_proj)
        dense(f"{prefix}.wgate.weight", comp.gate_proj)
        names[f"{prefix}.ape"] = (comp.position_bias, False)
        names[f"{prefix}.norm.weight"] = (comp.kv_norm.weight, False)

    def mlp(prefix, swiglu):
        for disk, proj in _EXPERT_PROJECTIONS:
            dense(f"{prefix}.{disk}.weight", getattr(swiglu, proj))

    for i, block in enumerate(model.decoder_layers):
        p = f"model.layers.{i}"
        for hc_name, hc in (("hc_attn", block.attn_hc), ("hc_ffn", block.ffn_hc)):
            names[f"{p}.{hc_name}_fn"] = (hc.fn, False)
            names[f"{p}.{hc_name}_base"] = (hc.base, False)
            names[f"{p}.{hc_name}_scale"] = (hc.scale, False)
        names[f"{p}.attn_norm.weight"] = (block.input_layernorm.weight, False)
        names[f"{p}.ffn_norm.weight"] = (block.post_attention_layernorm.weight, False)
        a = block.self_attn
        dense(f"{p}.attn.wq_a.weight", a.q_a_proj)
        names[f"{p}.attn.q_norm.weight"] = (a.q_a_norm.weight, False)
        dense(f"{p}.attn.wq_b.weight", a.q_b_proj)
        dense(f"{p}.attn.wkv.weight", a.kv_proj)
        names[f"{p}.attn.norm.weight"] = (a.kv_norm.weight, False)
        names[f"{p}.attn.wo_a.weight"] = (GroupedKernel(a.o_a_proj), True)
        dense(f"{p}.attn.wo_b.weight", a.o_b_proj)
        names[f"{p}.attn.attn_sink"] = (a.sinks, False)
        if a.compressor is not None:
            compressor(f"{p}.attn.compressor", a.compressor)
        if a.indexer is not None:
            compressor(f"{p}.attn.indexer.compressor", a.indexer.compressor)
            dense(f"{p}.attn.indexer.wq_b.weight", a.indexer.q_b_proj)
            dense(f"{p}.attn.indexer.weights_proj.weight", a.indexer.weights_proj)
        moe = block.mlp
        names[f"{p}.ffn.gate.weight"] = (moe.gate.weight, False)  # (E, C) both
        if moe.gate.tid2eid is not None:
            names[f"{p}.ffn.gate.tid2eid"] = (moe.gate.tid2eid, False)
        else:
            names[f"{p}.ffn.gate.bias"] = (moe.gate.e_score_correction_bias, False)
        for e in range(len(moe.experts)):
            for disk, proj in _EXPERT_PROJECTIONS:
                names[f"{p}.ffn.experts.{e}.{disk}.weight"] = (
                    ExpertSlice(getattr(moe.experts, proj), e), True)
        mlp(f"{p}.ffn.shared_experts", moe.shared_experts)

    names["model.embed_tokens.weight"] = (model.embed_tokens.embeddings, False)
    names["model.hc_head.hc_fn"] = (model.hc_head.hc_fn, False)
    names["model.hc_head.hc_base"] = (model.hc_head.hc_base, False)
    names["model.hc_head.hc_scale"] = (model.hc_head.hc_scale, False)
    names["model.norm.weight"] = (model.norm.weight, False)
    if model.lm_head is not None:
        dense("head.weight", model.lm_head)
    if form == "release":
        return {to_release_name(n): v for n, v in names.items()}
    return names


def expected_hf_shapes(config: DeepSeekV4Config,
                       form: str = "transformers") -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> stored shape for the model of `config`, from the config
    alone (no model built). The keys are those of `hf_weight_map(model, form)`.

    Raises:
      ValueError: unknown form.
    """
    _check_form(form)
    c = config
    h, n, heads, dim = c.hidden_size, c.hc_mult, c.num_attention_heads, c.head_dim
    f, experts = c.moe_intermediate_size, c.n_routed_experts
    shapes: dict[str, tuple[int, ...]] = {}

    def compressor(prefix, width, rate, overlap):
        coff = 2 if overlap else 1
        shapes[f"{prefix}.wkv.weight"] = (coff * width, h)
        shapes[f"{prefix}.wgate.weight"] = (coff * width, h)
        shapes[f"{prefix}.ape"] = (rate, coff * width)
        shapes[f"{prefix}.norm.weight"] = (width,)

    def mlp(prefix):
        shapes[f"{prefix}.w1.weight"] = (f, h)
        shapes[f"{prefix}.w3.weight"] = (f, h)
        shapes[f"{prefix}.w2.weight"] = (h, f)

    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}"
        for hc_name in ("hc_attn", "hc_ffn"):
            shapes[f"{p}.{hc_name}_fn"] = ((2 + n) * n, n * h)
            shapes[f"{p}.{hc_name}_base"] = ((2 + n) * n,)
            shapes[f"{p}.{hc_name}_scale"] = (3,)
        shapes[f"{p}.attn_norm.weight"] = (h,)
        shapes[f"{p}.ffn_norm.weight"] = (h,)
        shapes[f"{p}.attn.wq_a.weight"] = (c.q_lora_rank, h)
        shapes[f"{p}.attn.q_norm.weight"] = (c.q_lora_rank,)
        shapes[f"{p}.attn.wq_b.weight"] = (heads * dim, c.q_lora_rank)
        shapes[f"{p}.attn.wkv.weight"] = (dim, h)
        shapes[f"{p}.attn.norm.weight"] = (dim,)
        shapes[f"{p}.attn.wo_a.weight"] = (c.o_groups * c.o_lora_rank, heads * dim // c.o_groups)
        shapes[f"{p}.attn.wo_b.weight"] = (h, c.o_groups * c.o_lora_rank)
        shapes[f"{p}.attn.attn_sink"] = (heads,)
        layer_type = c.layer_types[i]
        if layer_type != SLIDING:
            compressor(f"{p}.attn.compressor", dim, c.compress_rates[layer_type],
                       layer_type == CSA)
        if layer_type == CSA:
            compressor(f"{p}.attn.indexer.compressor", c.index_head_dim, c.compress_rates[CSA],
                       True)
            shapes[f"{p}.attn.indexer.wq_b.weight"] = (c.index_n_heads * c.index_head_dim,
                                                       c.q_lora_rank)
            shapes[f"{p}.attn.indexer.weights_proj.weight"] = (c.index_n_heads, h)
        shapes[f"{p}.ffn.gate.weight"] = (experts, h)
        if c.is_hash_layer(i):
            shapes[f"{p}.ffn.gate.tid2eid"] = (c.vocab_size, c.num_experts_per_tok)
        else:
            shapes[f"{p}.ffn.gate.bias"] = (experts,)
        for e in range(experts):
            mlp(f"{p}.ffn.experts.{e}")
        mlp(f"{p}.ffn.shared_experts")

    shapes["model.embed_tokens.weight"] = (c.vocab_size, h)
    shapes["model.hc_head.hc_fn"] = (n, n * h)
    shapes["model.hc_head.hc_base"] = (n,)
    shapes["model.hc_head.hc_scale"] = (1,)
    shapes["model.norm.weight"] = (h,)
    if not c.tie_word_embeddings:
        shapes["head.weight"] = (c.vocab_size, h)
    if form == "release":
        return {to_release_name(k): v for k, v in shapes.items()}
    return shapes


def tensor_sort_key(name: str):
    """Layer order (layers.2 before layers.10), then name, in either form."""
    parts = name.split(".")
    if parts[0] == "model":
        parts = parts[1:]
    if len(parts) > 1 and parts[0] == "layers" and parts[1].isdigit():
        return (1, int(parts[1]), name)
    return (0 if "embed" in name else 2, 0, name)
