"""Multi-token prediction (MTP) module, DeepSeek-V3 (arXiv 2412.19437) §2.2.

Depth k (k = 1..D) keeps the causal chain: for position i,

    h'_i^k = M_k [RMSNorm(Emb(t_{i+k})) ; RMSNorm(h_i^{k-1})]     eq. 21
    h_i^k  = TRM_k(h'_i^k)                                         eq. 22
    P_{i+1+k}^k = OutHead(h_i^k)                                   eq. 23

Concatenation order is [enorm(embedding), hnorm(hidden)], as in the released
weights and their reference implementations (the paper's eq. 21 prints the two
the other way round). Emb and OutHead are shared with the main model; each
module owns `enorm`, `hnorm`, `eh_proj` (2C -> C, no bias), a full decoder block
(HF places it at layer index num_hidden_layers + k - 1, so it is a MoE block
whenever first_k_dense_replace <= num_hidden_layers, i.e. always) and
`shared_head.norm`, the RMSNorm before the shared output head.
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.deepseek.decoder_block import DeepSeekDecoderBlock
from models.layers import initializers
from models.layers.rms_norm import RMSNorm


@keras.saving.register_keras_serializable(package="deepseek")
class MultiTokenPredictionLayer(keras.layers.Layer):
    """One MTP depth: combines h^{k-1} with the embedding of the token k ahead.

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).
      layer_idx: the HF layer index of this module (num_hidden_layers + k - 1).

    Call args:
      hidden_states: float tensor (B, T', C), h^{k-1} at positions 0..T'-1
        (for k = 1: the main model's last hidden states before its final norm).
      token_embeddings: float tensor (B, T', C), Emb(t_{i+k}) for the same positions.
      training: passed to the block.
      moe_capacity_factor: passed to the block (None: dropless MoE dispatch).

    Returns:
      (hidden_states, normed, moe_aux):
        hidden_states: h^k (B, T', C), the input of depth k + 1;
        normed: shared_head.norm(h^k) (B, T', C), to feed the shared output head;
        moe_aux: (expert_load (E,), balance_loss scalar, dropped scalar) of the
          block, or None if dense.

    Reference: DeepSeek-V3 arXiv 2412.19437 §2.2 eq. 21-23.
    """

    def __init__(self, config, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekConfig.from_dict(config)
        self.config = config
        self.layer_idx = layer_idx
        self.enorm = RMSNorm(config.rms_norm_eps, name="enorm", dtype=self.dtype_policy)
        self.hnorm = RMSNorm(config.rms_norm_eps, name="hnorm", dtype=self.dtype_policy)
        self.eh_proj = keras.layers.Dense(
            config.hidden_size, use_bias=False, name="eh_proj", dtype=self.dtype_policy,
            kernel_initializer=initializers.normal(config.initializer_range))
        self.block = DeepSeekDecoderBlock(config, layer_idx, name="block", dtype=self.dtype_policy)
        self.shared_head_norm = RMSNorm(config.rms_norm_eps, name="shared_head.norm",
                                        dtype=self.dtype_policy)

    def build(self, input_shape=None):
        c = self.config.hidden_size
        self.enorm.build((None, None, c))
        self.hnorm.build((None, None, c))
        self.eh_proj.build((None, None, 2 * c))
        self.block.build((None, None, c))
        self.shared_head_norm.build((None, None, c))

    def call(self, hidden_states, token_embeddings, training=False, moe_capacity_factor=None,
             return_indexer_loss=False):
        """(h, shared_head_norm(h), MoE statistics or None), h (B, T', C); with
        `return_indexer_loss` (a V3.2 block) also its indexer's KL loss, float32 scalar."""
        h = tf.concat([self.enorm(token_embeddings), self.hnorm(hidden_states)],
                      axis=-1)  # (B, T', 2C)
        h = self.eh_proj(h)  # (B, T', C)
        outs = self.block(h, training=training, moe_capacity_factor=moe_capacity_factor,
                          return_indexer_loss=return_indexer_loss)  # (B, T', C), ...
        h, moe_aux = outs[0], outs[2]
        return (h, self.shared_head_norm(h), moe_aux, *outs[3:])

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "layer_idx": self.layer_idx}
