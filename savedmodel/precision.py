"""The precision a model's weights are kept in: one knob, in one place.

  WEIGHT_DTYPES  the precisions a model's weights may be in: ("bfloat16", "float32",
                 "int8")
  HF_DTYPES      the dtypes a Hugging Face checkpoint is written in: ("bfloat16",
                 "float32")
  AUTO           "auto": the weights' own dtype (a checkpoint's, a SavedModel's)

`deepseek-tfx hf-import --dtype`, `hf-export --dtype` (HF_DTYPES), the pipeline's
`train.export_dtype`, a SavedModel's `assets.extra/precision.json`
(`layout.read_weight_dtype`) and the Trainer's base model all take these values.

"int8" is a float32 model whose linear projections hold int8 kernels with float32
per-output-channel scales (`models/formats/quantization.py`, Keras'
`Dense.quantize("int8")`); its embedding, norms and router stay float32. Such a model
is built in the policy "float32" (`keras_policy`) and then quantized.

This module imports neither TensorFlow nor Keras (the CLI's parser uses it).
"""

from __future__ import annotations

WEIGHT_DTYPES = ("bfloat16", "float32", "int8")
HF_DTYPES = ("bfloat16", "float32")
INT8 = "int8"
AUTO = "auto"
LEGACY_WEIGHT_DTYPE = "float32"  # a SavedModel without precision.json

# weight dtype -> the Keras dtype policy a model with such variables is built with
_KERAS_POLICIES = {"bfloat16": "bfloat16", "float32": "float32", "int8": "float32"}


def check_weight_dtype(dtype, what: str = "--dtype") -> str:
    """`dtype` if it is one of `WEIGHT_DTYPES`.

    Raises:
      ValueError: naming `what`, the value and the dtypes supported.
    """
    if dtype not in WEIGHT_DTYPES:
        raise ValueError(f"{what}={dtype!r}: the weights can be kept in one of {WEIGHT_DTYPES}")
    return dtype


def keras_policy(weight_dtype: str) -> str:
    """The Keras dtype policy of a model whose variables are `weight_dtype`:
    "bfloat16" -> "bfloat16" (bf16 variables and matmuls; RMSNorm statistics, attention
    softmax, the router and the logits stay float32 inside the model), "float32" ->
    "float32", "int8" -> "float32" (then `quantization.quantize_int8`).

    Raises:
      ValueError: `weight_dtype` is not one of `WEIGHT_DTYPES`.
    """
    return _KERAS_POLICIES[check_weight_dtype(weight_dtype, "weight dtype")]


def weight_dtype_of(model) -> str:
    """The precision of a model's weights: "int8" when the projections of a
    DeepSeekCausalLM or DeepSeekV4CausalLM are quantized (`quantization.is_quantized_model`),
    else its policy's variable dtype ("mixed_bfloat16" keeps float32 variables)."""
    from models.formats.quantization import is_quantized_model

    if is_quantized_model(model):
        return INT8
    return model.dtype_policy.variable_dtype


def resolve_weight_dtype(requested: str, stored: str) -> str:
    """`requested`, or `stored` (the weights' own dtype) when `requested` is `AUTO`.

    Raises:
      ValueError: either is not `AUTO` / one of `WEIGHT_DTYPES` (named).
    """
    if requested == AUTO:
        return check_weight_dtype(stored, "the stored weights' dtype")
    return check_weight_dtype(requested)
