"""One DeepSeek-V4 decoder block on hc_mult residual streams (paper §2, §2.2).

transformers 5.24 `DeepseekV4DecoderLayer`. With streams X (B, T, n, C):

    post, comb, x = attn_hc(X)              x = sum_j pre_j X_j          (B, T, C)
    X = post * Attn(input_layernorm(x)) + comb^T X
    post, comb, x = ffn_hc(X)
    X = post * MoE(post_attention_layernorm(x)) + comb^T X

where (post * y)_k = post_k y and (comb^T X)_k = sum_j comb_jk X_j (the first hc axis
is summed: comb is doubly stochastic but not symmetric).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.attention import DeepSeekV4Attention
from models.deepseek_v4.config import DeepSeekV4Config
from models.deepseek_v4.hyper_connection import HyperConnection
from models.deepseek_v4.moe import DeepSeekV4MoE
from models.layers.rms_norm import RMSNorm


def mix_streams(post, comb, block_output, streams):
    """post_k * y + sum_j comb_jk X_j.

    Args:
      post: float32 (B, T, n); comb: float32 (B, T, n, n); block_output y: (B, T, C);
      streams X: (B, T, n, C).

    Returns:
      (B, T, n, C) in the dtype of `streams`.
    """
    dtype = streams.dtype
    expanded = tf.cast(post, dtype)[..., None] * tf.cast(block_output, dtype)[:, :, None, :]
    # comb^T X as a batched matmul: the same sums as tf.einsum("btjk,btjc->btkc"), whose
    # oneDNN einsum and its gradients take ~1.5x as long at cpu_small_v4's shapes.
    mixed = tf.linalg.matmul(tf.cast(comb, dtype), streams, transpose_a=True)  # (B, T, n, C)
    return expanded + mixed


@keras.saving.register_keras_serializable(package="deepseek_v4")
class DeepSeekV4DecoderBlock(keras.layers.Layer):
    """Attention and MoE sub-blocks joined by mHC (module docstring).

    Sublayers (release names under `layers.N.`): `attn_hc`, `ffn_hc` HyperConnection
    [`hc_attn_{fn,base,scale}`, `hc_ffn_*`], `input_layernorm` [`attn_norm`],
    `self_attn` DeepSeekV4Attention [`attn.*`], `post_attention_layernorm` [`ffn_norm`],
    `mlp` DeepSeekV4MoE [`ffn.*`]. The norms are float32 (as transformers keeps them).

    Args:
      config: a DeepSeekV4Config (or its `to_dict()`).
      layer_idx: block index.

    Every V4 block is a MoE block (`is_moe` True, the attribute V3's trainer code reads:
    `mlp` is a DeepSeekV4MoE with `experts`, `shared_experts` and `gate`).

    Call args:
      streams: float (B, T, hc_mult, C).
      input_ids: int (B, T), for hash routing.
      training: dropout.
      moe_capacity_factor: `capacity_factor` of DeepSeekV4MoE.
      cache, cache_index, cache_lengths: None, or this layer's cache dict, the rows' first
        new positions and the new tokens each row keeps (see `DeepSeekV4Attention`); mHC,
        the norms and the MoE are per token.
      return_indexer_loss: also return the attention's lightning-indexer loss
        (`DeepSeekV4Attention.call(..., return_indexer_loss=True)`, a float32 scalar,
        0.0 without an indexer); stateless path only.

    Returns:
      (streams (B, T, hc_mult, C), moe_aux = (expert_load (E,), balance_loss, dropped)),
      plus the updated cache dict as a third item when a cache is given, or the
      indexer loss (float32 scalar) as a third item when `return_indexer_loss`.

    Raises:
      ValueError: `return_indexer_loss` together with a cache.
    """

    is_moe = True  # every V4 block's feed-forward is a DeepSeekV4MoE (no dense layers)

    def __init__(self, config, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekV4Config.from_dict(config)
        self.config = c = config
        self.layer_idx = layer_idx

        def hyper(name):
            return HyperConnection(c.hc_mult, c.hidden_size, c.hc_sinkhorn_iters, c.hc_eps,
                                   c.rms_norm_eps, c.initializer_range, name=name)

        self.attn_hc = hyper("attn_hc")
        self.input_layernorm = RMSNorm(c.rms_norm_eps, name="input_layernorm", dtype="float32")
        self.self_attn = DeepSeekV4Attention(c, layer_idx, name="self_attn",
                                             dtype=self.dtype_policy)
        self.ffn_hc = hyper("ffn_hc")
        self.post_attention_layernorm = RMSNorm(c.rms_norm_eps, name="post_attention_layernorm",
                                                dtype="float32")
        self.mlp = DeepSeekV4MoE(c, layer_idx, name="mlp", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        shape = (None, None, self.config.hidden_size)
        self.attn_hc.build()
        self.input_layernorm.build(shape)
        self.self_attn.build(shape)
        self.ffn_hc.build()
        self.post_attention_layernorm.build(shape)
        self.mlp.build(shape)

    def call(self, streams, input_ids=None, training=False, moe_capacity_factor=None,
             cache=None, cache_index=None, cache_lengths=None, return_indexer_loss=False,
             cache_in_place=False):
        if return_indexer_loss and cache is not None:
            raise ValueError(f"{self.name}: return_indexer_loss=True is for the stateless "
                             "forward (no cache)")
        dtype = self.compute_dtype
        post, comb, x = self.attn_hc(streams, training=training)  # (B,T,n), (B,T,n,n), (B,T,C)
        attn_input = tf.cast(self.input_layernorm(x), dtype)  # (B, T, C)
        indexer_loss = None
        if return_indexer_loss:
            attn, indexer_loss = self.self_attn(attn_input, training=training,
                                                return_indexer_loss=True)  # (B, T, C), ()
        elif cache is None:
            attn = self.self_attn(attn_input, training=training)  # (B, T, C)
        else:
            attn, cache = self.self_attn(attn_input, training=training, cache=cache,
                                         cache_index=cache_index,
                                         cache_lengths=cache_lengths,
                                         cache_in_place=cache_in_place)  # (B, T, C), dict
        streams = mix_streams(post, comb, attn, streams)  # (B, T, n, C)

        post, comb, x = self.ffn_hc(streams, training=training)
        h, expert_load, balance_loss, dropped = self.mlp(
            tf.cast(self.post_attention_layernorm(x), dtype), input_ids=input_ids,
            training=training, capacity_factor=moe_capacity_factor)  # (B, T, C)
        streams = mix_streams(post, comb, h, streams)  # (B, T, n, C)
        moe_aux = (expert_load, balance_loss, dropped)
        if indexer_loss is not None:
            return streams, moe_aux, tf.cast(indexer_loss, tf.float32)
        if cache is None:
            return streams, moe_aux
        return streams, moe_aux, cache

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "layer_idx": self.layer_idx}
