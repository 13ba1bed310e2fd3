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

INT8 = "int8"


def is_quantized(layer) -> bool:
    """Whether `layer` (a keras Dense) holds an int8 kernel."""
    return layer.quantization_mode == INT8


def quantized_layers(model, head: bool = True) -> list:
    """The projections `quantize_int8` quantizes, in a fixed order: per decoder
    block then per MTP module, the attention projections then the MLP's (dense MLP,
    or the routed experts' three stacked `ExpertProjection`s then the shared
    experts), `eh_proj` of MTP modules, and (when `head` and the head is not tied to
    the embedding) `lm_head`. All but the `ExpertProjection`s are Keras Dense layers.

    Args:
      model: a DeepSeekCausalLM.
      head: include an untied `lm_head`.
    """
    from models.deepseek.memory_plan import ATTENTION_PROJECTIONS, MLP_PROJECTIONS

    layers = []
    blocks = [(b, None) for b in model.decoder_layers] + [(m.block, m) for m in model.mtp_layers]
    for block, mtp in blocks:
        attn = block.self_attn
        layers += [getattr(attn, n) for n in ATTENTION_PROJECTIONS if hasattr(attn, n)]
        mlp = block.mlp
        swiglus = ([mlp] if not block.is_moe else
                   [mlp.experts] + ([mlp.shared_experts] if mlp.shared_experts else []))
        layers += [getattr(s, n) for s in swiglus for n in MLP_PROJECTIONS]
        if mtp is not None:
            layers.append(mtp.eh_proj)
    if head and model.lm_head is not None:
        layers.append(model.lm_head)
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
