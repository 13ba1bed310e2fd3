"""Which weights a run trains: all, the top blocks, a regex, or LoRA adapters.

`train.trainable` picks weights by path (`top:N`, a regex, or `all`). With
`train.lora_rank` = r > 0, the picked projections of `train.lora_targets` get
Keras 3's own low-rank adapters (`keras.layers.Dense.enable_lora`: the kernel
used is W + A B, A (in, r) he-uniform, B (r, out) zeros, so training starts at
the base model exactly; Hu et al. 2021, "LoRA", §4.1) and only A and B train.

Everything not trained keeps its value bit for bit: it gets no gradient, no
optimizer slot (the optimizer is built on the trained variables only) and,
for a frozen MoE layer, no router-bias update.

On a model with bfloat16 variables (a bf16 base, `precision.model_policy`), the
adapters are float32 all the same: each adapted layer gets the Keras policy
"mixed_bfloat16" (the public `Layer.dtype_policy` setter) before `enable_lora`, so
A and B are created float32 while the frozen kernel W stays bf16, and inside the
layer's call Keras autocasts A and B to bf16 (W + A B and the matmul in bf16; the
gradients reach A and B in float32, and so do their optimizer slots).

`merged_sources` / `merged_value` give the weights of the model that is exported:
W + A B written into plain kernels, so serving a LoRA-trained model costs nothing
extra.
"""

from __future__ import annotations

import dataclasses
import re

import keras
import numpy as np
import tensorflow as tf

from config import TrainConfig
from models.formats.quantization import is_quantized, is_quantized_model, requantized
from models.layers.projection_names import ATTENTION_PROJECTIONS, MLP_PROJECTIONS

# DeepSeek-V4's attention projections (transformers' names): wq_a, wq_b, wkv, the grouped
# output projection wo_a (an `ExpertProjection`: one adapter pair per group) and wo_b.
V4_ATTENTION_PROJECTIONS = ("q_a_proj", "q_b_proj", "kv_proj", "o_a_proj", "o_b_proj")


def weight_path(variable) -> str:
    """A weight's path without the model's own (instance-numbered) name:
    `layers.1/self_attn/o_proj/kernel`, the same in every instance of a config."""
    return variable.path.split("/", 1)[1]


def _blocks(model) -> list:
    """Decoder blocks then the MTP modules' blocks."""
    return list(model.decoder_layers) + [m.block for m in model.mtp_layers]


def lora_layers(model, targets: str) -> list[keras.layers.Layer]:
    """The projections that `targets` ("attention", "mlp", comma-separated) name: Dense
    layers, and each MoE layer's three stacked `ExpertProjection`s (per-expert adapters);
    on a V4 model also the grouped output projection `o_a_proj` (per-group adapters). The
    compressors, the lightning indexer, mHC and the routers are never adapted."""
    wanted = {t.strip() for t in targets.split(",") if t.strip()}
    layers = []
    for block in _blocks(model):
        if "attention" in wanted:
            attn = block.self_attn
            names = V4_ATTENTION_PROJECTIONS if hasattr(attn, "o_a_proj") else ATTENTION_PROJECTIONS
            layers += [getattr(attn, n) for n in names if hasattr(attn, n)]
        if "mlp" in wanted:
            mlp = block.mlp
            swiglus = ([mlp] if not block.is_moe else
                       [mlp.experts] + ([mlp.shared_experts] if mlp.shared_experts else []))
            layers += [getattr(s, n) for s in swiglus for n in MLP_PROJECTIONS]
    return layers


def _top_prefixes(model, n: int) -> tuple[str, ...]:
    """Path prefixes of `top:N`: the last N decoder blocks, (V4) the hyper head, final norm,
    head, MTP."""
    num = len(model.decoder_layers)
    if n > num:
        raise ValueError(f"train.trainable=top:{n}, but the model has {num} decoder blocks")
    head = "lm_head/" if model.lm_head is not None else "embed_tokens/"
    # hc_head/: a V4 model's hyper head, which collapses the streams before the final norm
    return (*(f"layers.{i}/" for i in range(num - n, num)), "hc_head/", "norm/", head, "mtp.")


def _picked(path: str, spec: str, model) -> bool:
    if spec == "all":
        return True
    if spec.startswith("top:"):
        return path.startswith(_top_prefixes(model, int(spec[4:])))
    return re.search(spec, path) is not None


@dataclasses.dataclass
class Selection:
    """The result of `prepare`.

    Attributes:
      variables: the variables that train (gradients, optimizer slots).
      lora_layers: the Dense layers with adapters (empty without LoRA).
      moe_mask: per MoE layer (`model.moe_layers` order), whether its router
        bias is updated (its router is trained).
      trainable_params, total_params: parameter counts (total = the model's
        weights without adapters, i.e. what is exported).
    """

    variables: list
    lora_layers: list
    moe_mask: list[bool]
    trainable_params: int
    total_params: int


def prepare(model, tc: TrainConfig) -> Selection:
    """Applies `tc.trainable` and LoRA to `model` (built, weights loaded). Call it in
    the strategy's scope: LoRA creates variables.

    Raises:
      ValueError: the rule picks no weight, or `top:N` with N above the number of blocks.
    """
    if not tc.lora_rank and is_quantized_model(model):
        raise ValueError(
            f"the base model is int8 and train.lora_rank=0 (train.trainable={tc.trainable!r}):"
            " its int8 projections take no gradient; fine-tune it with LoRA "
            "(train.lora_rank > 0, QLoRA-style: the base stays int8, float adapters train)")
    adapters = []
    if tc.lora_rank:
        adapters = _lora_candidates(model, tc)
        for layer in adapters:
            enable_float32_lora(layer, tc.lora_rank)
        trained = [v for layer in adapters for v in (layer.lora_kernel_a, layer.lora_kernel_b)]
    else:
        trained = [v for v in model.trainable_variables if _picked(weight_path(v), tc.trainable, model)]
    if not trained:
        raise ValueError(f"train.trainable={tc.trainable!r} (lora_rank={tc.lora_rank}) picks "
                         f"no weight of the model; weight paths look like "
                         f"{weight_path(model.trainable_variables[-1])!r}")
    trained_ids = {id(v) for v in trained}
    moe_mask = [tc.lora_rank == 0 and id(moe.gate.weight) in trained_ids
                for moe in model.moe_layers]
    total = sum(int(np.prod(v.shape)) for v in model.weights
                if not weight_path(v).endswith(("lora_kernel_a", "lora_kernel_b")))
    return Selection(trained, adapters, moe_mask,
                     sum(int(np.prod(v.shape)) for v in trained), total)


def enable_float32_lora(layer: keras.layers.Dense, rank: int) -> None:
    """`layer.enable_lora(rank)` with float32 adapters whatever the layer's variable dtype.

    A layer whose variables are not float32 (policy "bfloat16") is switched to the
    mixed policy of its compute dtype ("mixed_bfloat16") first: `add_weight` then
    creates A and B in float32, the existing kernel keeps its dtype, and the layer
    still computes in bf16 (Keras autocasts float32 variables inside a mixed layer's
    call). A float32 layer is left as it is.
    """
    if layer.dtype_policy.variable_dtype != "float32":
        layer.dtype_policy = f"mixed_{layer.dtype_policy.compute_dtype}"
    layer.enable_lora(rank)


def _lora_candidates(model, tc: TrainConfig) -> list:
    """The LoRA target projections whose kernel path `tc.trainable` picks."""
    return [layer for layer in lora_layers(model, tc.lora_targets)
            if _picked(_kernel_path(layer), tc.trainable, model)]


def _kernel_path(layer: keras.layers.Dense) -> str:
    (kernel,) = [w for w in layer.weights if w.path.endswith("/kernel")]
    return weight_path(kernel)


def merged_value(layer: keras.layers.Dense) -> np.ndarray:
    """W + A B of a LoRA-adapted layer (float32 numpy, computed outside any autocast),
    or its kernel's own value. An int8 layer: Q' of Q / s + A B re-quantized
    (`quantization.requantized`)."""
    if is_quantized(layer):
        return requantized(layer)[0]
    return keras.ops.convert_to_numpy(layer.kernel)


def merged_sources(model) -> dict:
    """Weight path -> a zero-argument function giving its value (numpy), LoRA adapters
    merged (W + A B) into their kernels and left out themselves: the weights of a plain
    model of the same config, each computed only when asked for (one at a time)."""
    adapted = {_kernel_path(layer): layer for layer in lora_layers(model, "attention,mlp")
               if layer.lora_enabled}
    sources = {}
    for v in model.weights:
        path = weight_path(v)
        if path.endswith(("lora_kernel_a", "lora_kernel_b")):
            continue
        layer = adapted.get(path)
        sources[path] = ((lambda layer=layer: merged_value(layer)) if layer is not None
                         else (lambda v=v: keras.ops.convert_to_numpy(v)))
    for path, layer in adapted.items():  # an int8 layer's scale goes with its new Q'
        if is_quantized(layer):
            sources[path + "_scale"] = lambda layer=layer: requantized(layer)[1]
    return sources


def assign_streaming(target, sources: dict) -> None:
    """Assigns every weight of `target` from `sources` (`merged_sources` of a model of
    the same config), one value in memory at a time, cast to the weight's dtype.

    Raises:
      ValueError: a weight is missing or has another shape (naming it).
    """
    for v in target.weights:
        path = weight_path(v)
        if path not in sources:
            raise ValueError(f"weight {path} of the model is not in the source weights")
        value = sources[path]()
        if tuple(v.shape) != value.shape:
            raise ValueError(f"weight {path}: shape {tuple(v.shape)} in the model, "
                             f"{value.shape} in the source")
        v.assign(tf.cast(value, v.dtype))
        del value


def without_indexers(model, selection: Selection) -> Selection:
    """`selection` without the lightning indexers' weights (V3.2, V4): their only training
    signal is the KL towards the main attention in the language-model loss
    (`losses.causal_lm_loss`); DPO's and GRPO's objectives have none, so the indexers stay
    as they are (no optimizer slot, no weight decay)."""
    indexers = {id(v) for v in model.weights if "/indexer/" in v.path}
    kept = [v for v in selection.variables if id(v) not in indexers]
    return dataclasses.replace(selection, variables=kept,
                               trainable_params=int(sum(np.prod(v.shape) for v in kept)))


def without_mtp(model, selection: Selection) -> Selection:
    """`selection` without the MTP modules' weights: DPO's and GRPO's objectives score the
    main head's next token only, so the MTP modules get no gradient and stay as they are
    (no optimizer slot, no weight decay); their router biases are not updated either."""
    mtp = {id(v) for module in model.mtp_layers for v in module.weights}
    kept = [v for v in selection.variables if id(v) not in mtp]
    n_mtp_moe = sum(1 for module in model.mtp_layers if module.block.is_moe)
    mask = list(selection.moe_mask)
    if n_mtp_moe:
        mask[-n_mtp_moe:] = [False] * n_mtp_moe
    return dataclasses.replace(
        selection, variables=kept, moe_mask=mask,
        trainable_params=int(sum(np.prod(v.shape) for v in kept)))
