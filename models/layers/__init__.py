"""The shared kit of the DeepSeek families: what V2/V3/V3.2 (`models.deepseek`) and V4
(`models.deepseek_v4`) both build on.

RMSNorm, RoPE and YaRN (rotary_embedding, rope_scaling), the initializers, the SwiGLU MLP,
the stacked routed experts (routed_experts, expert_projection), the losses, the cache
buffers, the training outputs, the names of the projections, and the checkpoint tracking
workaround (tracking). The kit imports no family (an import-linter contract in
pyproject.toml); checkpoint formats live next door in `models.formats`.
"""
