"""DeepSeek-V4 language models in Keras 3 on TensorFlow.

Follows transformers 5.24 `DeepseekV4ForCausalLM` (`models/deepseek_v4/modular_deepseek_v4.py`)
and the DeepSeek-V4 paper. Shares RMSNorm, the YaRN helpers, the stacked routed experts,
the MoE dispatch and the initializers with `models.deepseek`.

Public names are imported lazily (PEP 562): `import models.deepseek_v4` and
`from models.deepseek_v4 import DeepSeekV4Config` do not import TensorFlow. This package
never imports TFX, Apache Beam or tf.Transform.
"""

from models.layers.lazy_exports import lazy_exports

_EXPORTS = {
    "DeepSeekV4Config": "config",
    "DeepSeekV4CausalLM": "causal_lm",
    "DeepSeekV4DecoderBlock": "decoder_block",
    "DeepSeekV4MTPLayer": "mtp",
    "DeepSeekV4Attention": "attention",
    "KVCompressor": "compressor",
    "LightningIndexer": "lightning_indexer",
    "HyperConnection": "hyper_connection",
    "HyperHead": "hyper_head",
    "DeepSeekV4MoE": "moe",
    "DeepSeekV4Router": "router",
    "load_v4_checkpoint": "hf_checkpoint",
    "save_hf_checkpoint": "hf_checkpoint",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
