"""DeepSeek-V3-style language models in Keras 3 on TensorFlow.

Public names are imported lazily (PEP 562), so `import models.deepseek` and
`from models.deepseek import DeepSeekConfig` (or the `flops` helpers) do not
import TensorFlow; the first access to a layer or model class does.
This package never imports TFX, Apache Beam or tf.Transform.

References: DeepSeek-V2 (arXiv 2405.04434), DeepSeek-V3 (arXiv 2412.19437),
HF transformers `modeling_deepseek_v3.py`.
"""

from models.layers.lazy_exports import lazy_exports

_EXPORTS = {
    "DeepSeekConfig": "config",
    "RMSNorm": "models.layers.rms_norm",
    "rope_cos_sin": "models.layers.rotary_embedding",
    "apply_rotary_pos_emb": "models.layers.rotary_embedding",
    "MultiHeadLatentAttention": "mla_attention",
    "SwiGLU": "models.layers.mlp",
    "DeepSeekTopKRouter": "router",
    "DeepSeekMoE": "moe",
    "DeepSeekDecoderBlock": "decoder_block",
    "MultiTokenPredictionLayer": "mtp",
    "DeepSeekCausalLM": "causal_lm",
    "causal_lm_loss": "models.layers.losses",
    "token_cross_entropy": "models.layers.losses",
    "generate": "generation",
    "next_token": "generation",
    "activated_params": "flops",
    "total_params": "flops",
    "flops_per_token": "flops",
    "mfu": "flops",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
