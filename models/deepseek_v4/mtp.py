"""Multi-token prediction (MTP) on DeepSeek-V4 blocks: DeepSeek-V3 (arXiv 2412.19437) §2.2
as DeepSeek's V4 release builds it (`inference/model.py` `MTPBlock`, weights `mtp.{d}.*`).

Depth k (k = 1..D) keeps V3's causal chain, on the hc_mult residual streams of V4:

    X'^k_i = e_proj(enorm(Emb(t_{i+k})))  +  h_proj(hnorm(X^{k-1}_i))   (B, T', n, C)
    X^k    = Block_k(X'^k)                          one V4 block, its own mHC
    P^k_{i+1+k} = OutHead(norm(HyperHead_k(X^k)))   (B, T', V)

where X^0 are the main model's streams after its last block (before its hyper head),
hnorm acts on each stream, and the one embedded row e_proj(...) (B, T', C) is added to
every stream (the release's `e_proj(e).unsqueeze(2) + h_proj(x)`); V3's single
`eh_proj` on [enorm(e); hnorm(h)] is the release's two C -> C projections. Emb and
OutHead (the embedding and `head`) are shared with the main model; the hyper head
(`hc_head_{fn,base,scale}`) and the final RMSNorm (`norm`) are the depth's own.

Block_k is a normal `DeepSeekV4DecoderBlock` at layer index num_hidden_layers + k - 1,
built from `DeepSeekV4Config.mtp_block_config()`: sliding-window attention (the release's
`compress_ratios` entry for its MTP block is 0) and a score-routed top-k MoE with a
selection bias (the release's `mtp.0.ffn.gate.bias`; it hash-routes only layers below
`num_hash_layers`). It gets the shifted ids t_{i+k} as `input_ids` (what the release's
block receives; unused by score routing).

transformers 5.24 builds no MTP module (`_keys_to_ignore_on_load_unexpected` drops
`mtp.*`), so there is no transformers reference to compare against.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.config import DeepSeekV4Config
from models.deepseek_v4.decoder_block import DeepSeekV4DecoderBlock
from models.deepseek_v4.hyper_head import HyperHead
from models.layers import initializers
from models.layers.rms_norm import RMSNorm


@keras.saving.register_keras_serializable(package="deepseek_v4")
class DeepSeekV4MTPLayer(keras.layers.Layer):
    """One MTP depth on V4 blocks (module docstring).

    Sublayers (release names under `mtp.{k-1}.` in brackets): `enorm`, `hnorm` RMSNorm,
    float32 [`enorm`, `hnorm`]; `e_proj`, `h_proj` Dense C -> C, no bias [`e_proj`,
    `h_proj`]; `block` DeepSeekV4DecoderBlock [`attn.*`, `ffn.*`, `attn_norm`, `ffn_norm`,
    `hc_attn_*`, `hc_ffn_*`]; `hc_head` HyperHead, float32 [`hc_head_{fn,base,scale}`];
    `norm` RMSNorm, float32 [`norm`].

    Args:
      config: the model's DeepSeekV4Config (or its `to_dict()`); the block is built
        from `config.mtp_block_config()`.
      layer_idx: the block's layer index, num_hidden_layers + k - 1 for depth k.

    Call args:
      streams: float (B, T', hc_mult, C), X^{k-1} at positions 0 .. T'-1.
      token_embeddings: float (B, T', C), Emb(t_{i+k}) for the same positions.
      input_ids: int (B, T'), the ids t_{i+k} (the block's `input_ids`).
      training: passed to the block.
      moe_capacity_factor: passed to the block (None: dropless MoE dispatch).
      return_indexer_loss: also return the block's indexer loss (float32 scalar).

    Returns:
      (streams X^k (B, T', hc_mult, C), the input of depth k + 1;
       normed = norm(hc_head(X^k)) float32 (B, T', C), for the shared output head;
       moe_aux = (expert_load (E,), balance_loss, dropped) of the block),
      plus the block's indexer loss as a fourth item when `return_indexer_loss`.

    Raises:
      ValueError: layer_idx < config.num_hidden_layers (that is a decoder block's).

    Reference: DeepSeek-V3 arXiv 2412.19437 §2.2 eq. 21-23; DeepSeek-V4 release
    `MTPBlock` (`e_proj`, `h_proj`, `enorm`, `hnorm`, `norm`, `hc_head_*`).
    """

    def __init__(self, config, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekV4Config.from_dict(config)
        if layer_idx < config.num_hidden_layers:
            raise ValueError(f"mtp.py: layer_idx={layer_idx} must be >= num_hidden_layers="
                             f"{config.num_hidden_layers} (MTP blocks follow the decoder)")
        self.config = c = config
        self.layer_idx = layer_idx
        init = initializers.normal(c.initializer_range)
        self.enorm = RMSNorm(c.rms_norm_eps, name="enorm", dtype="float32")
        self.hnorm = RMSNorm(c.rms_norm_eps, name="hnorm", dtype="float32")
        self.e_proj = keras.layers.Dense(c.hidden_size, use_bias=False, name="e_proj",
                                         dtype=self.dtype_policy, kernel_initializer=init)
        self.h_proj = keras.layers.Dense(c.hidden_size, use_bias=False, name="h_proj",
                                         dtype=self.dtype_policy, kernel_initializer=init)
        self.block = DeepSeekV4DecoderBlock(c.mtp_block_config(), layer_idx, name="block",
                                            dtype=self.dtype_policy)
        self.hc_head = HyperHead(c.hc_mult, c.hidden_size, c.hc_eps, c.rms_norm_eps,
                                 c.initializer_range, name="hc_head")
        self.norm = RMSNorm(c.rms_norm_eps, name="norm", dtype="float32")

    def build(self, input_shape=None):
        shape = (None, None, self.config.hidden_size)
        self.enorm.build(shape)
        self.hnorm.build(shape)
        self.e_proj.build(shape)
        self.h_proj.build(shape)
        self.block.build()
        self.hc_head.build()
        self.norm.build(shape)

    def call(self, streams, token_embeddings, input_ids, training=False,
             moe_capacity_factor=None, return_indexer_loss=False):
        dtype = self.compute_dtype
        e = self.e_proj(tf.cast(self.enorm(token_embeddings), dtype))  # (B, T', C)
        h = self.h_proj(tf.cast(self.hnorm(streams), dtype))  # (B, T', n, C) per stream
        x = e[:, :, None, :] + h  # (B, T', n, C): the embedding row added to every stream
        outs = self.block(x, input_ids=input_ids, training=training,
                          moe_capacity_factor=moe_capacity_factor,
                          return_indexer_loss=return_indexer_loss)
        streams = outs[0]  # (B, T', n, C)
        normed = self.norm(self.hc_head(streams))  # (B, T', C) float32
        return (streams, normed, *outs[1:])

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "layer_idx": self.layer_idx}
