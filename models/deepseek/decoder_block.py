"""One pre-norm DeepSeek-V3 decoder block: MLA then a dense MLP or DeepSeekMoE."""

import keras

from models.deepseek.config import DeepSeekConfig
from models.deepseek.mla_attention import MultiHeadLatentAttention
from models.deepseek.moe import DeepSeekMoE
from models.layers.mlp import SwiGLU
from models.layers.rms_norm import RMSNorm


@keras.saving.register_keras_serializable(package="deepseek")
class DeepSeekDecoderBlock(keras.layers.Layer):
    """x = x + MLA(input_layernorm(x)); x = x + MLP(post_attention_layernorm(x)).

    The MLP (`mlp`) is a dense SwiGLU of width intermediate_size when
    layer_idx < first_k_dense_replace, else a DeepSeekMoE (HF
    `DeepseekV3DecoderLayer`). MTP blocks use layer_idx >= num_hidden_layers.

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).
      layer_idx: index of the block (decides dense vs MoE).

    Call args:
      hidden_states: float tensor (B, T, C).
      positions_offset, cache, cache_index, training, absorb: as for
        `MultiHeadLatentAttention`.
      moe_capacity_factor: `capacity_factor` of DeepSeekMoE (None: dropless).
      return_indexer_loss: (no cache only) also return the attention's lightning-indexer
        KL loss (`MultiHeadLatentAttention`; 0.0 without DeepSeek Sparse Attention).

    Returns:
      (hidden_states, new_cache, moe_aux), and indexer_loss (float32 scalar) as a fourth
      item with `return_indexer_loss`:
        hidden_states: (B, T, C);
        new_cache: the updated layer cache (a dict, `MultiHeadLatentAttention`), or None
          when no cache was given;
        moe_aux: None for a dense block, else (expert_load float32 (E,),
          balance_loss float32 scalar, dropped float32 scalar) from DeepSeekMoE.

    Reference: HF transformers `modeling_deepseek_v3.py` (DeepseekV3DecoderLayer).
    """

    def __init__(self, config, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekConfig.from_dict(config)
        self.config = config
        self.layer_idx = layer_idx
        self.is_moe = config.is_moe_layer(layer_idx)

        self.input_layernorm = RMSNorm(config.rms_norm_eps, name="input_layernorm",
                                       dtype=self.dtype_policy)
        self.self_attn = MultiHeadLatentAttention(config, name="self_attn",
                                                  dtype=self.dtype_policy)
        self.post_attention_layernorm = RMSNorm(config.rms_norm_eps,
                                                name="post_attention_layernorm",
                                                dtype=self.dtype_policy)
        if self.is_moe:
            self.mlp = DeepSeekMoE(config, name="mlp", dtype=self.dtype_policy)
        else:
            self.mlp = SwiGLU(config.hidden_size, config.intermediate_size,
                              config.initializer_range, name="mlp", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        shape = (None, None, self.config.hidden_size)
        self.input_layernorm.build(shape)
        self.self_attn.build(shape)
        self.post_attention_layernorm.build(shape)
        self.mlp.build(shape)

    def call(self, hidden_states, positions_offset=0, cache=None, cache_index=None,
             training=False, moe_capacity_factor=None, absorb=True,
             return_indexer_loss=False, in_place=False):
        attn = self.self_attn(self.input_layernorm(hidden_states),
                              positions_offset=positions_offset, cache=cache,
                              cache_index=cache_index, training=training, absorb=absorb,
                              return_indexer_loss=return_indexer_loss, in_place=in_place)
        new_cache = None
        if cache is not None:
            attn, new_cache = attn
        if return_indexer_loss:
            attn, indexer_loss = attn  # (B, T, C), float32 scalar
        hidden_states = hidden_states + attn  # (B, T, C)

        h = self.post_attention_layernorm(hidden_states)
        moe_aux = None
        if self.is_moe:
            h, expert_load, balance_loss, dropped = self.mlp(
                h, training=training, capacity_factor=moe_capacity_factor)
            moe_aux = (expert_load, balance_loss, dropped)
        else:
            h = self.mlp(h)
        if return_indexer_loss:
            return hidden_states + h, new_cache, moe_aux, indexer_loss  # (B, T, C), ...
        return hidden_states + h, new_cache, moe_aux  # (B, T, C)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "layer_idx": self.layer_idx}
