"""The shared kit of the DeepSeek families: what V2/V3/V3.2 (`models.deepseek`) and V4
(`models.deepseek_v4`) both build on.

RMSNorm, RoPE and YaRN (rotary_embedding, rope_scaling), the initializers, the SwiGLU MLP,
the stacked routed experts (routed_experts, expert_projection), their dispatch
(moe_dispatch), the balance losses and the routers' bias update (balance_losses,
router_bias), the expert load pruning measures (expert_load), the lightning indexer's
shared arithmetic (indexer_scores), the losses, the cache buffers, the training outputs,
the names of the projections, the checkpoint tracking workaround (tracking), and the
bases both families' configs and causal LMs inherit (config_checks, model_config,
causal_lm_base, lazy_exports). The kit imports no family (an import-linter contract in
pyproject.toml); checkpoint formats live next door in `models.formats`, the memory
planner's core in `models.planning`.
"""
