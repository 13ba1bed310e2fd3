"""int8 weights for a DeepSeekCausalLM, through Keras' own quantization.

`quantize_int8(model)` calls Keras' `Dense.quantize("int8")` on the model's linear
projections (`quantized_layers`): each (in, out) kernel W becomes an int8 kernel Q
and a float32 per-output-channel scale s (`kernel_scale`, (out,)),

    s_j = 127 / max_i |W_ij|        Q = round(W * s)  in [-127, 127]
    W ~ Q / s                       (keras.quantizers.abs_max_quantize, axis 0)

and the layer's call quantizes its input per token the same way (a dynamic
absmax scale over the last axis) and runs an int8 x int8 -> int32 matmul, de-scaled
to the compute dtype (Keras 3.6 `Dense._int8_call`; the LLM.int8()-style
"vector-wise" scheme of Dettmers et al. 2022, arXiv 2208.07339, §3.2, without the
outlier decomposition).

Quantized: the attention projections (q_proj or q_a_proj/q_b_proj, kv_a_proj_with_mqa,
kv_b_proj, o_proj), the dense MLPs, the routed experts (their stacked kernels,
`ExpertProjection.quantize`: the same scheme per expert, scales (E, out)) and the shared
experts, the MTP modules' `eh_proj`, and (`head=True`) an untied `lm_head`. Kept in float: the embedding (and
with it a tied head), every RMSNorm, and the router (`gate.weight`, the bias): the
router picks experts by comparing scores, and an int8 rounding there moves tokens
between experts.

DeepSeek-V4 (`models.deepseek_v4`, recognized by its attention's `kv_proj`, without
importing that package): q_a_proj, q_b_proj, kv_proj, the grouped output projection's
`o_a_proj` when it is a Dense or an `ExpertProjection` (one (in, out) block per group,
scales (g, out)), o_b_proj, the CSA / HCA compressor's `kv_proj` and `gate_proj` (their
outputs are pooled by a softmax over a window, a continuous function of them, as the
attention's kv is), the experts, the shared expert, MTP projections (`eh_proj`, or
`e_proj` / `h_proj`) and the head. Kept in float besides: the mHC weights (`fn`, base,
scale: float32 by design, paper §2.2), the attention sinks, the compressors' position
biases, `tid2eid`, and the CSA lightning indexer whole (its compressor, `q_b_proj`,
`weights_proj`): like the router, the indexer chooses (the top index_topk entries) by
comparing scores, and an int8 rounding there swaps which entries a query attends to;
it is also small (index_n_heads * index_head_dim wide). `unquantized_projections`
lists those Dense layers.

Two places read a projection's weights instead of calling it; they use
`float_kernel` (Q / s, plus A B with LoRA):
  - MLA's absorbed decoding (`mla_attention.py`): W_UK and W_UV are dequantized
    in the graph at each call, not once at load: a float copy kept at load would be
    a second copy of kv_b_proj for the whole life of the model, while the per-call
    dequantization costs one multiply per weight, the same memory traffic as
    reading it. They are not kept int8 because the scale of kv_b_proj's
    output channel (h, d) lies on the axis that the absorbed einsum contracts
    (q_nope . W_UK^T sums over d), so it cannot be taken out of an int8 matmul.
    The expanding path uses the same float kernel (c_kv W, no activation
    quantization for kv_b_proj), so absorbed and expanded decoding agree up to
    float32 rounding, as they do in float.
  - `hf-export` (`hf_names.hf_weight_map`), which writes Q / s as float.
"""

from __future__ import annotations

import gc

import keras
import numpy as np
import tensorflow as tf

from models.layers.expert_projection import ExpertProjection
from models.layers.projection_names import ATTENTION_PROJECTIONS, MLP_PROJECTIONS

INT8 = "int8"
# DeepSeek-V4 attention projections besides q_a_proj / q_b_proj (module docstring).
V4_ATTENTION_PROJECTIONS = ("kv_proj", "o_a_proj", "o_b_proj")
COMPRESSOR_PROJECTIONS = ("kv_proj", "gate_proj")
MTP_PROJECTIONS = ("eh_proj", "e_proj", "h_proj")
INDEXER_PROJECTIONS = ("q_b_proj", "wq_b", "wk", "weights_proj")  # V4 / V3.2 names


def is_quantized(layer) -> bool:
    """Whether `layer` (a keras Dense) holds an int8 kernel."""
    return layer.quantization_mode == INT8


def _is_projection(layer) -> bool:
    return isinstance(layer, (keras.layers.Dense, ExpertProjection))


def _projections(owner, names) -> list:
    """owner.<name> for each name it has that is a Dense / ExpertProjection, in order."""
    return [p for p in (getattr(owner, n, None) for n in names) if _is_projection(p)]


def _blocks(model) -> list:
    """(block, its MTP module or None): decoder blocks, then the MTP modules' blocks."""
    return ([(b, None) for b in model.decoder_layers]
            + [(m.block, m) for m in getattr(model, "mtp_layers", [])])


def quantized_layers(model, head: bool = True) -> list:
    """The projections `quantize_int8` quantizes, in a fixed order: per decoder
    block then per MTP module, the attention projections then the MLP's (dense MLP,
    or the routed experts' three stacked `ExpertProjection`s then the shared
    experts), the MTP module's projections, and (when `head` and the head is not tied
    to the embedding) `lm_head`. For a DeepSeek-V4 block the attention part is
    q_a_proj, q_b_proj, kv_proj, o_a_proj (if a projection), o_b_proj, then the
    compressor's kv_proj and gate_proj (module docstring). All but the
    `ExpertProjection`s are Keras Dense layers.

    Args:
      model: a DeepSeekCausalLM or a DeepSeekV4CausalLM.
      head: include an untied `lm_head`.
    """
    layers = []
    for block, mtp in _blocks(model):
        attn = block.self_attn
        layers += _projections(attn, ATTENTION_PROJECTIONS)
        if hasattr(attn, "kv_proj"):  # DeepSeek-V4
            layers += _projections(attn, V4_ATTENTION_PROJECTIONS)
            if attn.compressor is not None:
                layers += _projections(attn.compressor, COMPRESSOR_PROJECTIONS)
        mlp = block.mlp
        swiglus = ([mlp.experts] + ([mlp.shared_experts] if mlp.shared_experts else [])
                   if hasattr(mlp, "experts") else [mlp])
        layers += [getattr(s, n) for s in swiglus for n in MLP_PROJECTIONS]
        if mtp is not None:
            layers += _projections(mtp, MTP_PROJECTIONS)
    if head and model.lm_head is not None:
        layers.append(model.lm_head)
    return layers


def unquantized_projections(model) -> list:
    """The Dense projections `quantized_layers` leaves in float: each CSA layer's
    lightning indexer (its compressor's kv_proj / gate_proj, q_b_proj, weights_proj;
    DeepSeek-V4 and V3.2), in block order."""
    layers = []
    for block, _ in _blocks(model):
        indexer = getattr(block.self_attn, "indexer", None)
        if indexer is not None:
            compressor = getattr(indexer, "compressor", None)
            if compressor is not None:
                layers += _projections(compressor, COMPRESSOR_PROJECTIONS)
            layers += _projections(indexer, INDEXER_PROJECTIONS)
    return layers


def quantize_int8(model, head: bool = True) -> int:
    """Quantizes `quantized_layers(model, head)` to int8 in place (Keras
    `Dense.quantize("int8")`); returns how many layers it quantized (layers already
    int8 are left as they are).

    Memory: layer by layer, each float kernel is freed as its int8 kernel is made,
    so the peak is the float model plus one layer's int8 kernel. (Keras runs a full
    `gc.collect()` as each float kernel is deleted, 0.2 s in a process holding
    TensorFlow; the objects that exist before quantizing are frozen out of those
    collections with `gc.freeze()`, so each one scans only what quantizing made.)

    Raises:
      ValueError: a layer has LoRA adapters (merge them first: Keras refuses to
        quantize a kernel that is W + A B), naming it.
    """
    layers = [layer for layer in quantized_layers(model, head) if not is_quantized(layer)]
    _quantize(layers)
    return len(layers)


def _quantize(layers) -> None:
    """`layer.quantize("int8")` for each (see `quantize_int8`)."""
    for layer in layers:
        if layer.lora_enabled:
            raise ValueError(f"{layer.path} has LoRA adapters: merge them into the kernel "
                             "before quantizing it")
    gc.freeze()
    try:
        for layer in layers:
            layer.quantize(INT8)
    finally:
        gc.unfreeze()


def quantize_like(model, reference) -> int:
    """Quantizes the projections of `model` whose counterparts in `reference` (a model
    of the same config) are int8; returns how many (0 for a float `reference`)."""
    pairs = zip(quantized_layers(model), quantized_layers(reference), strict=True)
    chosen = [layer for layer, ref in pairs if is_quantized(ref) and not is_quantized(layer)]
    if chosen:
        _quantize(chosen)
    return len(chosen)


def is_quantized_model(model) -> bool:
    """Whether any projection of `model` (a DeepSeekCausalLM) is int8."""
    return any(is_quantized(layer) for layer in quantized_layers(model))


def kernel_variable(layer):
    """The variable a Dense (or ExpertProjection) stores its kernel in: float (in, out)
    ((E, in, out) stacked), or int8 when quantized (the public `kernel` property adds
    LoRA's A B to it, which an int8 kernel cannot take)."""
    (kernel,) = [w for w in layer.weights if w.path.endswith("/kernel")]
    return kernel


def float_kernel(layer, dtype=None) -> tf.Tensor:
    """The float kernel a Dense (in, out) or ExpertProjection (E, in, out) computes
    with: W, or Q / s for an int8 layer (Q int8, s = `kernel_scale` float32 (out,) or
    (E, out)), plus A B when LoRA is enabled; cast to `dtype` (default: the layer's
    compute dtype). A graph op, so it is recomputed at each call of a tf.function (no
    copy is kept)."""
    dtype = dtype or layer.compute_dtype
    if not is_quantized(layer):
        return tf.cast(layer.kernel, dtype)  # W (+ A B)
    w = (tf.cast(kernel_variable(layer), tf.float32)
         / layer.kernel_scale[..., None, :])  # (..., in, out)
    if layer.lora_enabled:
        w += tf.matmul(tf.cast(layer.lora_kernel_a, tf.float32),
                       tf.cast(layer.lora_kernel_b, tf.float32))  # + A B
    return tf.cast(w, dtype)


def requantized(layer) -> tuple[np.ndarray, np.ndarray]:
    """(Q int8 (..., in, out), s float32 (..., out)) of `float_kernel(layer)`: an int8
    layer's own kernel and scale, or, with LoRA adapters, W' = Q / s + A B quantized
    again the same way (`keras.quantizers.abs_max_quantize` over the `in` axis): the
    merge of QLoRA-style training into an int8 export (one more rounding of every
    weight, to 1/254 of its column's absmax). `...` is E for an ExpertProjection."""
    if is_quantized(layer) and not layer.lora_enabled:
        return (keras.ops.convert_to_numpy(kernel_variable(layer)),
                keras.ops.convert_to_numpy(layer.kernel_scale))
    q, scale = keras.quantizers.abs_max_quantize(
        float_kernel(layer, tf.float32), axis=-2, to_numpy=True)  # (..., in, out), (..., 1, out)
    return keras.ops.convert_to_numpy(q), keras.ops.convert_to_numpy(scale)[..., 0, :]


def weight_bytes(model, head: bool = True) -> dict[str, int]:
    """Bytes of `model`'s weights (variables, LoRA adapters excluded):
    {"quantized_layers": the projections of `quantized_layers(model, head)` (kernel,
    and kernel_scale when int8), "other": everything else, "total"}."""
    chosen = {id(w) for layer in quantized_layers(model, head) for w in layer.weights
              if not w.path.endswith(("lora_kernel_a", "lora_kernel_b"))}
    sizes = {"quantized_layers": 0, "other": 0}
    for w in model.weights:
        if w.path.endswith(("lora_kernel_a", "lora_kernel_b")):
            continue
        nbytes = int(np.prod(w.shape)) * tf.as_dtype(w.dtype).size
        sizes["quantized_layers" if id(w) in chosen else "other"] += nbytes
    sizes["total"] = sizes["quantized_layers"] + sizes["other"]
    return sizes
