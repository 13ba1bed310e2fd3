"""The memory planner's core, shared by both families' planners.

`models.deepseek.memory_plan` (V2/V3/V3.2) and `models.deepseek_v4.memory_plan` (V4) each
list their model's weights (`WeightTensor`), activations, KV cache and FLOPs; this package
holds what they share: the case (`PlanInput`), the trained/frozen/adapter counts
(`count_parameters`), the bytes per device by part, the fewest devices that fit, and the
time per step (`plan`). The method and its sources are in `models/deepseek/memory_plan.py`'s
module docstring. Like `models.layers`, this package imports no family.
"""
