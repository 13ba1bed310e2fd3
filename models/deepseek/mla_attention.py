"""Multi-head Latent Attention (MLA) with a compressed latent KV cache.

DeepSeek-V2 (arXiv 2405.04434) §2.1, in the layout of HF transformers
`DeepseekV3Attention`:

    c_q   = RMSNorm(x W_DQ)                     eq. 12  (q_a_proj, q_a_layernorm)
    q     = c_q W_UQ  -> [q_nope | q_pe] / head eq. 13  (q_b_proj; q_proj if no q_lora_rank)
    c_kv  = RMSNorm(x W_DKV)                    eq. 9   (kv_a_proj_with_mqa, kv_a_layernorm)
    k_pe  = RoPE(x W_KR), one key for all heads eq. 15  (the last qk_rope_head_dim outputs
                                                         of kv_a_proj_with_mqa, not normalized)
    k_nope, v = c_kv W_UK, c_kv W_UV            eq. 10-11 (kv_b_proj)
    o     = softmax((q_nope.k_nope + RoPE(q_pe).k_pe) * scale) v          eq. 17-18
            scale = d_qk^-0.5 (times mscale^2 with YaRN rope_scaling)
    out   = o W_O                               eq. 19  (o_proj)

The KV cache holds, per token, the normalized latent c_kv (after
kv_a_layernorm) and the already rotated k_pe: kv_lora_rank + qk_rope_head_dim
numbers per token per layer, instead of 2 * n_h * d_h for standard MHA.
Each decoding step re-expands the cached latents with kv_b_proj (no weight
absorption yet: simple, exact, O(cache length) extra matmul per step).
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.deepseek.rms_norm import RMSNorm
from models.deepseek.rope_scaling import softmax_scale
from models.deepseek.rotary_embedding import apply_rotary_pos_emb, rope_cos_sin

# HF uses eps 1e-6 for q_a_layernorm and kv_a_layernorm whatever rms_norm_eps is.
LATENT_NORM_EPS = 1e-6
_MASK_VALUE = -1e9


@keras.saving.register_keras_serializable(package="deepseek")
class MultiHeadLatentAttention(keras.layers.Layer):
    """Causal MLA self-attention with decoupled RoPE and an optional latent cache.

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).

    Call args:
      hidden_states: float tensor (B, T, C).
      positions_offset: int scalar (Python or tensor), absolute position of the
        first of the T tokens when no cache is given (default 0).
      cache: optional float tensor (B, S, kv_lora_rank + qk_rope_head_dim), the
        latent cache of this layer: per slot the normalized c_kv then the
        rotated k_pe. S is the maximum length (see `init_cache`).
      cache_index: int32 scalar, the slot (= absolute position) where the first
        of the T tokens is written; required with `cache`. Slots at and after
        cache_index + T are ignored (masked), whatever they hold.
      training: enables attention dropout.

    Returns:
      Without cache: the output, float tensor (B, T, C).
      With cache: (output (B, T, C), new_cache (B, S, kv_lora_rank + qk_rope_head_dim)).

    Raises:
      ValueError: if `cache` is given without `cache_index`.
      InvalidArgumentError (at run time): if cache_index + T > S.

    Reference: DeepSeek-V2 arXiv 2405.04434 §2.1; HF transformers
    `modeling_deepseek_v3.py` (DeepseekV3Attention).
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekConfig.from_dict(config)
        self.config = config
        self.num_heads = config.num_attention_heads
        # qk_head_dim^-0.5, times YaRN's mscale^2 (DeepSeek-V2 appendix B; HF DeepseekV3Attention).
        self.scale = softmax_scale(config.qk_head_dim, config.rope_scaling)

        def dense(units, name):
            return keras.layers.Dense(
                units, use_bias=False, name=name, dtype=self.dtype_policy,
                kernel_initializer=keras.initializers.RandomNormal(
                    stddev=config.initializer_range))

        h = config.num_attention_heads
        if config.q_lora_rank is None:
            self.q_proj = dense(h * config.qk_head_dim, "q_proj")
        else:
            self.q_a_proj = dense(config.q_lora_rank, "q_a_proj")
            self.q_a_layernorm = RMSNorm(LATENT_NORM_EPS, name="q_a_layernorm",
                                         dtype=self.dtype_policy)
            self.q_b_proj = dense(h * config.qk_head_dim, "q_b_proj")
        self.kv_a_proj_with_mqa = dense(
            config.kv_lora_rank + config.qk_rope_head_dim, "kv_a_proj_with_mqa")
        self.kv_a_layernorm = RMSNorm(LATENT_NORM_EPS, name="kv_a_layernorm",
                                      dtype=self.dtype_policy)
        self.kv_b_proj = dense(h * (config.qk_nope_head_dim + config.v_head_dim), "kv_b_proj")
        self.o_proj = dense(config.hidden_size, "o_proj")
        self.dropout = (keras.layers.Dropout(config.attention_dropout, name="attention_dropout")
                        if config.attention_dropout > 0 else None)

    def build(self, input_shape=None):
        c = self.config
        if c.q_lora_rank is None:
            self.q_proj.build((None, None, c.hidden_size))
        else:
            self.q_a_proj.build((None, None, c.hidden_size))
            self.q_a_layernorm.build((None, None, c.q_lora_rank))
            self.q_b_proj.build((None, None, c.q_lora_rank))
        self.kv_a_proj_with_mqa.build((None, None, c.hidden_size))
        self.kv_a_layernorm.build((None, None, c.kv_lora_rank))
        self.kv_b_proj.build((None, None, c.kv_lora_rank))
        self.o_proj.build((None, None, c.num_attention_heads * c.v_head_dim))

    def call(self, hidden_states, positions_offset=0, cache=None, cache_index=None,
             training=False):
        c = self.config
        nh, dn, dr, dv, r = (c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim,
                             c.v_head_dim, c.kv_lora_rank)
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]

        # Queries: low-rank (or plain) projection, split into no-RoPE and RoPE parts.
        if c.q_lora_rank is None:
            q = self.q_proj(hidden_states)  # (B, T, H*Dqk)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))  # (B, T, H*Dqk)
        q = tf.reshape(q, [batch, seq, nh, dn + dr])  # (B, T, H, Dqk)
        q_nope, q_pe = tf.split(q, [dn, dr], axis=-1)  # (B, T, H, Dn), (B, T, H, Dr)

        # Keys/values: one compressed latent plus one shared RoPE key per token.
        kv_a = self.kv_a_proj_with_mqa(hidden_states)  # (B, T, R + Dr)
        c_kv, k_pe = tf.split(kv_a, [r, dr], axis=-1)  # (B, T, R), (B, T, Dr)
        c_kv = self.kv_a_layernorm(c_kv)  # (B, T, R)

        if cache is not None:
            if cache_index is None:
                raise ValueError("cache_index is required when a cache is given")
            offset = tf.cast(cache_index, tf.int32)
        else:
            offset = tf.cast(positions_offset, tf.int32)
        q_positions = offset + tf.range(seq)  # (T,)
        cos, sin = rope_cos_sin(q_positions, dr, c.rope_theta, c.rope_scaling)  # (T, Dr)
        q_pe = apply_rotary_pos_emb(q_pe, cos, sin, c.rope_interleave)  # (B, T, H, Dr)
        k_pe = apply_rotary_pos_emb(k_pe[:, :, None, :], cos, sin, c.rope_interleave)
        k_pe = k_pe[:, :, 0, :]  # (B, T, Dr)

        if cache is not None:
            new_cache = _write_cache(cache, tf.concat([c_kv, k_pe], axis=-1), offset)  # (B,S,R+Dr)
            c_kv, k_pe = tf.split(new_cache, [r, dr], axis=-1)  # (B, S, R), (B, S, Dr)
            k_positions = tf.range(tf.shape(new_cache)[1])  # (S,)
        else:
            k_positions = q_positions  # (S = T,)

        # Expand latents to per-head keys and values.
        kv = self.kv_b_proj(c_kv)  # (B, S, H*(Dn+Dv))
        kv = tf.reshape(kv, [batch, -1, nh, dn + dv])  # (B, S, H, Dn+Dv)
        k_nope, v = tf.split(kv, [dn, dv], axis=-1)  # (B, S, H, Dn), (B, S, H, Dv)

        # Scores: q.k = q_nope.k_nope + q_pe.k_pe (same as concatenating [nope | pe]);
        # the shared k_pe is broadcast to every head by the einsum.
        scores = (tf.einsum("bthd,bshd->bhts", q_nope, k_nope)
                  + tf.einsum("bthd,bsd->bhts", q_pe, k_pe))  # (B, H, T, S)
        scores = tf.cast(scores, tf.float32) * self.scale
        causal = k_positions[None, :] <= q_positions[:, None]  # (T, S)
        scores = tf.where(causal[None, None, :, :], scores, _MASK_VALUE)  # (B, H, T, S)
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)  # (B, H, T, S)
        if self.dropout is not None:
            probs = self.dropout(probs, training=training)

        out = tf.einsum("bhts,bshd->bthd", probs, v)  # (B, T, H, Dv)
        out = tf.reshape(out, [batch, seq, nh * dv])  # (B, T, H*Dv)
        out = self.o_proj(out)  # (B, T, C)
        if cache is not None:
            return out, new_cache
        return out

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def _write_cache(cache, new_entries, index):
    """cache[:, index:index+T] = new_entries.

    Args:
      cache: (B, S, D). new_entries: (B, T, D). index: int32 scalar.

    Returns:
      The updated cache (B, S, D).
    """
    batch, seq = tf.shape(new_entries)[0], tf.shape(new_entries)[1]
    tf.debugging.assert_less_equal(
        index + seq, tf.shape(cache)[1], message="KV cache overflow: cache_index + T > S")
    rows, slots = tf.meshgrid(tf.range(batch), index + tf.range(seq), indexing="ij")  # (B, T)
    indices = tf.stack([rows, slots], axis=-1)  # (B, T, 2)
    return tf.tensor_scatter_nd_update(cache, indices, tf.cast(new_entries, cache.dtype))
