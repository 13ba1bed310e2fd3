"""The one error a checkpoint that does not match the model raises.

Every reader in `models.formats` (safetensors headers, FP8 and MXFP4 scales) and each
family's checkpoint code (`models.deepseek.hf_checkpoint`, `models.deepseek_v4.hf_checkpoint`)
raise it, so a caller catches one class whichever layer found the problem.
"""


class CheckpointError(ValueError):
    """A checkpoint that does not match the model: names the tensor or key and the problem."""
