"""Checkpoint formats both DeepSeek families read and write.

The checked safetensors reader (safetensors_reader), FP8 block dequantization (fp8),
MXFP4 e2m1/e8m0 (mxfp4), int8 per-channel quantization (quantization) and the one error
they raise (checkpoint_error). Like `models.layers`, this package imports no family.
"""
