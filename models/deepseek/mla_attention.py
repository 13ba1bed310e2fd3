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

Scores are one einsum of [q_nope | q_pe] against [k_nope | k_pe] (k_pe
broadcast to every head), with the scale folded into q and the sum and the
softmax in float32 whatever the compute dtype; probs * v runs in the compute
dtype.

The KV cache holds, per token, the normalized latent c_kv (after
kv_a_layernorm) and the already rotated k_pe: kv_lora_rank + qk_rope_head_dim
numbers per token per layer, instead of 2 * n_h * d_h for standard MHA. A layer's
cache is a dict of buffers (`init_layer_cache`): a cached call writes its new slots
into each and reads them whole, never sliced along the last axis. By default the write
is `tf.tensor_scatter_nd_update`, which on TF 2.16's CPU copies the buffer (~4 ms per
21 MB, so a decode step's cost grew with the context). With `in_place=True` (a caller
that owns the cache: `generate`'s loop, a chat session, the decode benchmark) it is
`tf.raw_ops.InplaceUpdate` on the buffer seen as (B*S, W) rows, which writes the T new
rows into the buffer itself, as DeepSeek's and vLLM's static caches are written: the
cache passed in must not be used again except as the returned one. `init_layer_cache`
allocates with `tf.raw_ops.Empty(init=True)`, a stateful op, so no graph folds a cache
into a constant that two calls would share (`cache_buffers`, shared with V4's cache).

Cached calls absorb the up-projections into the query and the output
(DeepSeek-V2 §2.1.2: "W_UK can be absorbed into W_UQ, and W_UV into W_O"; the
`attn_impl == "absorb"` path of DeepSeek-V3's `inference/model.py`), so the
cached latents are never re-expanded through kv_b_proj. With kv_b_proj's kernel
W (R, H*(Dn+Dv)) split per head into W_UK (R, H, Dn) and W_UV (R, H, Dv):

    q_lat  = q_nope W_UK^T                      (B, T, H, R)   q_nope.k_nope = q_lat.c_kv
    scores = ([q_lat | q_pe] . [c_kv | k_pe]) * scale          one einsum against the cache
    o_lat  = softmax(scores) c_kv               (B, T, H, R)
    o      = o_lat W_UV                         (B, T, H, Dv)  then o_proj

Per generated token this costs O(S * H * (R + Dr)) instead of expanding the S
cached latents (O(S * R * H * (Dn + Dv))); `flops.decode_flops_per_token`
gives both. `absorb=False` selects the expanding path (same logits up to
float32 rounding).

DeepSeek Sparse Attention (DeepSeek-V3.2; `config.uses_sparse_attention`): a
`LightningIndexer` (sublayer `indexer`, lightning_indexer.py) picks for each query
the `index_topk` visible tokens of highest index score, and the attention mask is
causal AND picked (HF transformers 5.24 `DeepseekV32Attention` folds the same top-k
into its attention mask). The indexer's key of every token (index_head_dim numbers)
is cached beside [c_kv | k_pe] ("index_keys"), so a cached call scores the new queries against the
cache and recomputes nothing of the prefix. With `config.attn_implementation`
"sparse" (the default) and more keys than index_topk, the attention gathers each
query's picked latents [c_kv | k_pe] (B, T, k, R + Dr) and attends them in the
absorbed form below, O(T*k) scores instead of O(T*S), as DeepSeek-V3.2 instantiates
DSA on MLA's MQA mode (report §2.1; DeepSeek's `inference/model.py` passes the top-k
indices to its sparse kernel); a cached call does so `QUERY_BLOCK` queries at a time.
"dense", or no more keys than index_topk, masks the dense score matrix to the picks,
as transformers' `DeepseekV32Attention` does: the reference. The indexer itself still
scores every (query, key) pair, (B, T, Hi, S), as transformers' does.
`call(..., return_indexer_loss=True)` (stateless) also returns the indexer's
sparse-stage KL loss (V3.2-Exp report §2.1.1, `models.layers.indexer_scores.indexer_kl_loss`):
the target is this layer's attention probabilities (before dropout) summed over heads
on the kept tokens, L1-normalized, stop-gradient.
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.deepseek.lightning_indexer import LightningIndexer
from models.formats.quantization import float_kernel
from models.layers import initializers
from models.layers.cache_buffers import write_rows, zeros_buffer
from models.layers.indexer_scores import indexer_kl_loss
from models.layers.rms_norm import RMSNorm
from models.layers.rope_scaling import softmax_scale
from models.layers.rotary_embedding import apply_rotary_pos_emb, rope_cos_sin

# HF uses eps 1e-6 for q_a_layernorm and kv_a_layernorm whatever rms_norm_eps is.
LATENT_NORM_EPS = 1e-6
_MASK_VALUE = -1e9
# Queries per block of a cached call's gathered DSA attention (`_in_query_blocks`): at
# V3.2's index_topk 2,048 and R + Dr = 576, one block's picked latents are 151 MB float32
# (cpu_small's R + Dr = 80: 21 MB; 128 queries a block measured 1.7x slower there).
QUERY_BLOCK = 32


@keras.saving.register_keras_serializable(package="deepseek")
class MultiHeadLatentAttention(keras.layers.Layer):
    """Causal MLA self-attention with decoupled RoPE and an optional latent cache.

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).

    Call args:
      hidden_states: float tensor (B, T, C).
      positions_offset: int scalar (Python or tensor), absolute position of the
        first of the T tokens when no cache is given (default 0).
      cache: optional dict, the latent cache of this layer (`init_layer_cache`):
        "kv" (B, S, kv_lora_rank + qk_rope_head_dim), per slot the normalized c_kv and
        the rotated k_pe; with DeepSeek Sparse Attention also "index_keys"
        (B, S, index_head_dim), the indexer's key. S is the maximum length.
      cache_index: int32 scalar or (B,) vector, the slot (= absolute position)
        where the first of the T tokens of each row is written; required with
        `cache`. A query at position p sees the slots <= p of its row only, so
        slots after it are ignored whatever they hold: rows of different
        lengths (right-padded) decode in one batch, each at its own index.
      training: enables attention dropout.
      absorb: with a cache, attend in the latent space (module docstring)
        instead of expanding the cache through kv_b_proj. Ignored without cache.
      return_indexer_loss: (no cache only) also return the lightning indexer's KL
        loss (module docstring), float32 scalar; 0.0 without DeepSeek Sparse Attention.

    Returns:
      Without cache: the output, float tensor (B, T, C); with `return_indexer_loss`,
      (output, indexer_loss float32 scalar).
      With cache: (output (B, T, C), new_cache, a dict as `cache`).

    Raises:
      ValueError: if `cache` is given without `cache_index`, or with
        `return_indexer_loss`, or is not a dict with this layer's keys.
      InvalidArgumentError (at run time): if cache_index + T > S in some row, or
        cache_index is neither a scalar nor (B,).

    Reference: DeepSeek-V2 arXiv 2405.04434 §2.1; HF transformers
    `modeling_deepseek_v3.py` (DeepseekV3Attention); with DSA, the DeepSeek-V3.2-Exp
    report §2.1 and `modeling_deepseek_v32.py` (DeepseekV32Attention).
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
                kernel_initializer=initializers.normal(config.initializer_range))

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
        self.indexer = (LightningIndexer(config, name="indexer", dtype=self.dtype_policy)
                        if config.uses_sparse_attention else None)

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
        if self.indexer is not None:
            self.indexer.build()

    def call(self, hidden_states, positions_offset=0, cache=None, cache_index=None,
             training=False, absorb=True, return_indexer_loss=False, in_place=False):
        c = self.config
        nh, dn, dr, r = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]

        # Queries: low-rank (or plain) projection, split into no-RoPE and RoPE parts.
        c_q = None  # the query latent (the indexer's input), with q_lora_rank
        if c.q_lora_rank is None:
            q = self.q_proj(hidden_states)  # (B, T, H*Dqk)
        else:
            c_q = self.q_a_layernorm(self.q_a_proj(hidden_states))  # (B, T, Rq)
            q = self.q_b_proj(c_q)  # (B, T, H*Dqk)
        q = tf.reshape(q, [batch, seq, nh, dn + dr])  # (B, T, H, Dqk)
        q_nope, q_pe = tf.split(q, [dn, dr], axis=-1)  # (B, T, H, Dn), (B, T, H, Dr)

        # Keys/values: one compressed latent plus one shared RoPE key per token.
        kv_a = self.kv_a_proj_with_mqa(hidden_states)  # (B, T, R + Dr)
        c_kv, k_pe = tf.split(kv_a, [r, dr], axis=-1)  # (B, T, R), (B, T, Dr)
        c_kv = self.kv_a_layernorm(c_kv)  # (B, T, R)

        if cache is None:
            q_positions = tf.cast(positions_offset, tf.int32) + tf.range(seq)  # (T,)
        else:
            if cache_index is None:
                raise ValueError("cache_index is required when a cache is given")
            if return_indexer_loss:
                raise ValueError("MultiHeadLatentAttention: return_indexer_loss is for the "
                                 "stateless forward (cache=None) only")
            _check_layer_cache(cache, self.indexer is not None, self.name)
            index = tf.broadcast_to(tf.cast(cache_index, tf.int32), [batch])  # (B,)
            q_positions = index[:, None] + tf.range(seq)[None, :]  # (B, T)
        q_pe = self._rotate(q_pe, q_positions)  # (B, T, H, Dr)
        k_pe = self._rotate(k_pe[:, :, None, :], q_positions)[:, :, 0, :]  # (B, T, Dr)

        index_keys = None
        if self.indexer is not None:
            index_keys = self.indexer.keys(hidden_states, q_positions)  # (B, T, Di)

        indexer_loss = tf.constant(0.0, tf.float32)
        if cache is None:
            with_loss = return_indexer_loss and self.indexer is not None
            out = self._stateless_attention(hidden_states, c_q, q_nope, q_pe, c_kv, k_pe,
                                            index_keys, q_positions, training, with_loss)
            if with_loss:
                out, indexer_loss = out  # (B, T, H, Dv), float32 scalar
        else:
            new_cache = {"kv": _write_cache(cache["kv"], tf.concat([c_kv, k_pe], axis=-1),
                                            index, in_place)}  # (B, S, R + Dr)
            if index_keys is not None:
                new_cache["index_keys"] = _write_cache(cache["index_keys"], index_keys,
                                                       index, in_place)  # (B, S, Di)
            out = self._cached_attention(hidden_states, c_q, q_nope, q_pe, new_cache,
                                         q_positions, training, absorb)  # (B, T, H, Dv)

        out = tf.reshape(out, [batch, seq, nh * c.v_head_dim])  # (B, T, H*Dv)
        out = self.o_proj(out)  # (B, T, C)
        if cache is not None:
            return out, new_cache
        if return_indexer_loss:
            return out, indexer_loss
        return out

    def _gathers(self, keys_len) -> bool:
        """True where DSA attends gathered picks: `attn_implementation` "sparse" and
        more keys than index_topk (static `keys_len`); a Python bool, or a bool tensor
        for a length known only at run time."""
        c = self.config
        if self.indexer is None or c.attn_implementation != "sparse":
            return False
        if isinstance(keys_len, int):
            return c.index_topk < keys_len
        return tf.convert_to_tensor(keys_len) > c.index_topk

    def _stateless_attention(self, hidden_states, c_q, q_nope, q_pe, c_kv, k_pe, index_keys,
                             q_positions, training, with_loss):
        """The no-cache forward (training, `logits`): causal MLA over the T tokens; with
        DSA the indexer's picks, gathered (`_gathers`) or masked.

        Args: q_nope (B, T, H, Dn), q_pe (B, T, H, Dr) rotated, c_kv (B, T, R), k_pe
          (B, T, Dr) rotated, index_keys (B, T, Di) or None, q_positions int32 (T,).
        Returns: (B, T, H, Dv); with `with_loss`, (that, the indexer's KL loss float32).
        """
        causal = (q_positions[None, :] <= q_positions[:, None])[None]  # (1, T, S = T)

        def dense():
            mask = causal
            if self.indexer is not None:
                mask = self.indexer(hidden_states, c_q, index_keys, q_positions, causal,
                                    return_scores=with_loss)  # (B, T, S) causal and picked
                if with_loss:
                    mask, index_scores = mask  # (B, T, S) bool, float32
            out = self._expanded_attention(q_nope, q_pe, c_kv, k_pe, mask[:, None],
                                           training, return_probs=with_loss)  # (B,T,H,Dv)
            if not with_loss:
                return out
            out, probs = out  # (B, T, H, Dv), float32 (B, H, T, S)
            return out, indexer_kl_loss(tf.reduce_sum(probs, axis=1), index_scores,
                                        mask)  # over heads: (B, T, S)

        def sparse():
            picked = self.indexer.select(hidden_states, c_q, index_keys, q_positions, causal,
                                         return_scores=with_loss)  # (B, T, k) each
            latents = tf.concat([c_kv, tf.cast(k_pe, c_kv.dtype)], axis=-1)  # (B, T, R+Dr)
            out = self._gathered_attention(q_nope, q_pe, latents, picked[0], picked[1],
                                           training, return_probs=with_loss)  # (B,T,H,Dv)
            if not with_loss:
                return out
            out, probs = out  # (B, T, H, Dv), float32 (B, H, T, k)
            return out, indexer_kl_loss(tf.reduce_sum(probs, axis=1), picked[2],
                                        picked[1])  # over heads: (B, T, k)

        return self._gathered_or_not(q_nope.shape[1], tf.shape(q_nope)[1], sparse, dense)

    def _cached_attention(self, hidden_states, c_q, q_nope, q_pe, cache, q_positions,
                          training, absorb):
        """Attention of the T new queries to the updated layer cache (`call`);
        with DSA the indexer's picks, gathered (`_gathers`, in query blocks of
        `QUERY_BLOCK`; a block none of whose queries sees more than index_topk slots
        attends them all, without the indexer, the same set) or masked. q_positions int32
        (B, T). Returns (B, T, H, Dv)."""
        c = self.config
        r, dr = c.kv_lora_rank, c.qk_rope_head_dim
        latents = cache["kv"]  # (B, S, R + Dr)
        index_keys = cache.get("index_keys")  # (B, S, Di) with DSA

        def masked():
            slots = tf.range(tf.shape(latents)[1])  # (S,)
            causal = slots[None, None, :] <= q_positions[:, :, None]  # (B, T, S)
            mask = causal
            if self.indexer is not None:
                mask = self.indexer(hidden_states, c_q, index_keys, q_positions,
                                    causal)  # (B, T, S) causal and picked
            if absorb:
                return self._absorbed_attention(q_nope, q_pe, latents, mask[:, None],
                                                training)  # (B, T, H, Dv)
            c_kv, k_pe = tf.split(latents, [r, dr], axis=-1)  # (B, S, R), (B, S, Dr)
            return self._expanded_attention(q_nope, q_pe, c_kv, k_pe, mask[:, None],
                                            training)  # (B, T, H, Dv)

        def gathered():
            def block(q_nope_b, q_pe_b, hidden_b, c_q_b, positions_b):  # queries of a block
                # Only the slots up to the block's last query can be picked.
                n_visible = tf.minimum(tf.shape(latents)[1], tf.reduce_max(positions_b) + 1)
                slots_b = tf.range(n_visible)  # (n,)
                causal_b = slots_b[None, None, :] <= positions_b[:, :, None]  # (B, b, n)

                def all_kept():  # no query sees more than index_topk slots: all are picked
                    return self._absorbed_attention(q_nope_b, q_pe_b, latents[:, :n_visible],
                                                    causal_b[:, None], training)

                def picked():  # the picks are slots < n of the whole buffer: no copy of it
                    # Slicing the indexer's keys to the visible slots copies them (a slice
                    # of the whole buffer does not): worth it while it halves the slots
                    # scored (a prefill chunk), not past that (a decode step scores every
                    # slot, the invisible ones masked).
                    n_slots = tf.shape(index_keys)[1]
                    n_scored = tf.where(n_visible * 2 > n_slots, n_slots, n_visible)
                    visible_b = tf.range(n_scored)[None, None, :] <= positions_b[:, :, None]
                    picks, valid = self.indexer.select(
                        hidden_b, c_q_b, index_keys[:, :n_scored], positions_b,
                        visible_b)  # (B, b, k)
                    return self._gathered_attention(q_nope_b, q_pe_b, latents, picks, valid,
                                                    training)  # (B, b, H, Dv)

                return tf.cond(n_visible <= c.index_topk, all_kept, picked)

            return _in_query_blocks(block, QUERY_BLOCK, q_nope, q_pe, hidden_states, c_q,
                                    q_positions)  # (B, T, H, Dv)

        return self._gathered_or_not(latents.shape[1], tf.shape(latents)[1], gathered,
                                     masked)

    def _gathered_or_not(self, static_len, dynamic_len, gathered, masked):
        """gathered() or masked() by `_gathers` of the keys' length: chosen in Python when
        the length is static, by tf.cond when it is known at run time only."""
        gathers = self._gathers(static_len if static_len is not None else dynamic_len)
        if isinstance(gathers, bool):
            return gathered() if gathers else masked()
        return tf.cond(gathers, gathered, masked)

    def _gathered_attention(self, q_nope, q_pe, latents, picks, valid, training,
                            return_probs=False):
        """Attention to each query's picked latents only (DSA gathered), in the absorbed
        form (module docstring), as DeepSeek-V3.2 runs DSA on MLA's MQA mode.

        Args: q_nope (B, T, H, Dn), q_pe (B, T, H, Dr) rotated, latents (B, S, R + Dr)
          = [c_kv | k_pe], picks int32 (B, T, k) slots of `latents`, valid bool (B, T, k).
        Returns: (B, T, H, Dv), equal to `_expanded_attention` masked to the valid picks
          in exact arithmetic; with `return_probs`, also the float32 (B, H, T, k)
          probabilities before dropout.
        Memory: the picked latents, (B, T, k, R + Dr) in the compute dtype.
        """
        r = self.config.kv_lora_rank
        w_uk, w_uv = self._absorbed_kernels(q_nope.dtype)  # (R, H, Dn), (R, H, Dv)
        q_lat = tf.einsum("bthd,rhd->bthr", q_nope, w_uk)  # (B, T, H, R)
        q = tf.concat([q_lat, q_pe], axis=-1)  # (B, T, H, R+Dr)
        picked = tf.gather(tf.cast(latents, q_nope.dtype), picks,
                           batch_dims=1)  # (B, T, k, R+Dr)
        probs = self._softmax(q, picked, "bthc,btkc->bhtk", valid[:, None], q_nope.dtype,
                              training, return_probs)  # (B, H, T, k)
        if return_probs:
            probs, probs32 = probs  # compute dtype after dropout, float32 before
        o_lat = tf.einsum("bhtk,btkr->bthr", probs, picked[..., :r])  # (B, T, H, R)
        out = tf.einsum("bthr,rhd->bthd", o_lat, w_uv)  # (B, T, H, Dv)
        return (out, probs32) if return_probs else out

    def _absorbed_kernels(self, dtype):
        """kv_b_proj's float kernel split per head: W_UK (R, H, Dn), W_UV (R, H, Dv)."""
        c = self.config
        nh, dn, dv, r = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
        # W + A B (LoRA), Q / s (int8) dequantized at each call: `quantization.float_kernel`.
        w = tf.reshape(float_kernel(self.kv_b_proj, dtype), [r, nh, dn + dv])  # (R, H, Dn+Dv)
        return tf.split(w, [dn, dv], axis=-1)  # (R, H, Dn), (R, H, Dv)

    def _rotate(self, x, positions):
        """RoPE of x (B, T, H, Dr) at positions (T,) shared by the rows, or (B, T) per row."""
        c = self.config
        if positions.shape.rank == 1:
            cos, sin = rope_cos_sin(positions, c.qk_rope_head_dim, c.rope_theta,
                                    c.rope_scaling)  # (T, Dr)
            return apply_rotary_pos_emb(x, cos, sin, c.rope_interleave)  # (B, T, H, Dr)
        # Per-row positions: rotate the B*T tokens as one sequence of B*T positions.
        cos, sin = rope_cos_sin(tf.reshape(positions, [-1]), c.qk_rope_head_dim, c.rope_theta,
                                c.rope_scaling)  # (B*T, Dr)
        shape = tf.shape(x)
        flat = tf.reshape(x, [1, -1, shape[2], c.qk_rope_head_dim])  # (1, B*T, H, Dr)
        flat = apply_rotary_pos_emb(flat, cos, sin, c.rope_interleave)  # (1, B*T, H, Dr)
        return tf.reshape(flat, shape)  # (B, T, H, Dr)

    def _softmax(self, q, k, equation, mask, dtype, training, return_float32=False):
        """Attention probabilities, scale folded into q, scores and softmax in float32.

        Args:
          q: (B, T, H, D) queries; k: keys (B, S, H, D) or latents (B, S, D), as
            `equation` says; mask: bool (B or 1, 1, T, S), True where attended.
          dtype: the dtype of the returned probabilities (the compute dtype).
          return_float32: also return the float32 probabilities before dropout.

        Returns:
          (B, H, T, S) probabilities in `dtype`, after attention dropout; with
          `return_float32`, (those, the float32 (B, H, T, S) ones before dropout).
        """
        q = tf.cast(q, tf.float32) * self.scale  # (B, T, H, D)
        scores = tf.einsum(equation, q, tf.cast(k, tf.float32))  # (B, H, T, S) float32
        scores = tf.where(mask, scores, _MASK_VALUE)  # (B, H, T, S)
        probs32 = tf.nn.softmax(scores, axis=-1)  # (B, H, T, S) float32
        probs = tf.cast(probs32, dtype)  # (B, H, T, S)
        if self.dropout is not None:
            probs = self.dropout(probs, training=training)
        return (probs, probs32) if return_float32 else probs

    def _expanded_attention(self, q_nope, q_pe, c_kv, k_pe, mask, training,
                            return_probs=False):
        """Attention with per-head keys and values expanded from the latents by kv_b_proj.

        Args: q_nope (B, T, H, Dn), q_pe (B, T, H, Dr) rotated, c_kv (B, S, R),
          k_pe (B, S, Dr) rotated, mask bool (B or 1, 1, T, S).
        Returns: (B, T, H, Dv); with `return_probs`, (that, float32 (B, H, T, S)
          probabilities before dropout).
        """
        c = self.config
        nh, dn, dr, dv = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        batch, keys = tf.shape(c_kv)[0], tf.shape(c_kv)[1]
        # kv_b_proj through its float kernel (LoRA merged, int8 dequantized): the same
        # weights as the absorbed path reads, so the two agree on a quantized model too.
        kv = tf.matmul(c_kv, float_kernel(self.kv_b_proj, c_kv.dtype))  # (B, S, H*(Dn+Dv))
        kv = tf.reshape(kv, [batch, keys, nh, dn + dv])  # (B, S, H, Dn+Dv)
        k_nope, v = tf.split(kv, [dn, dv], axis=-1)  # (B, S, H, Dn), (B, S, H, Dv)
        k_pe = tf.broadcast_to(k_pe[:, :, None, :], [batch, keys, nh, dr])  # (B, S, H, Dr)
        q = tf.concat([q_nope, q_pe], axis=-1)  # (B, T, H, Dqk)
        k = tf.concat([k_nope, tf.cast(k_pe, k_nope.dtype)], axis=-1)  # (B, S, H, Dqk)
        probs = self._softmax(q, k, "bthd,bshd->bhts", mask, v.dtype, training,
                              return_probs)  # (B, H, T, S)
        if return_probs:
            probs, probs32 = probs  # compute dtype after dropout, float32 before
            return tf.einsum("bhts,bshd->bthd", probs, v), probs32  # (B, T, H, Dv), (B,H,T,S)
        return tf.einsum("bhts,bshd->bthd", probs, v)  # (B, T, H, Dv)

    def _absorbed_attention(self, q_nope, q_pe, cache, mask, training):
        """Attention in the latent space: W_UK absorbed into q, W_UV applied after.

        Args: q_nope (B, T, H, Dn), q_pe (B, T, H, Dr) rotated, cache (B, S, R + Dr)
          = [c_kv | k_pe], mask bool (B, 1, T, S).
        Returns: (B, T, H, Dv), equal to `_expanded_attention` in exact arithmetic.
        """
        r = self.config.kv_lora_rank
        w_uk, w_uv = self._absorbed_kernels(q_nope.dtype)  # (R, H, Dn), (R, H, Dv)
        q_lat = tf.einsum("bthd,rhd->bthr", q_nope, w_uk)  # (B, T, H, R)
        q = tf.concat([q_lat, q_pe], axis=-1)  # (B, T, H, R+Dr)
        probs = self._softmax(q, cache, "bthc,bsc->bhts", mask, q_nope.dtype,
                              training)  # (B, H, T, S)
        # p . [c_kv | k_pe], then its c_kv part: slicing the cache would copy it whole.
        o_lat = tf.einsum("bhts,bsc->bthc", probs,
                          tf.cast(cache, q_nope.dtype))[..., :r]  # (B, T, H, R)
        return tf.einsum("bthr,rhd->bthd", o_lat, w_uv)  # (B, T, H, Dv)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def _in_query_blocks(fn, block, *tensors):
    """fn(*tensors of `block` queries) -> (B, b, H, Dv), run on `block` queries at a time
    (tf.map_fn, one block after another) so the index scores and picked latents of a long
    chunk are never held at once; T of at most `block` is one call (tf.cond when T is
    known at run time only).

    Args: tensors, each (B, T, ...), the first the queries (B, T, H, Dn). A padded query
      (after the T-th) is all zeros (position 0) and its output row is cut off.
    Returns: (B, T, H, Dv).
    """
    first = tensors[0]
    if first.shape[1] is not None and first.shape[1] <= block:
        return fn(*tensors)
    if first.shape[1] is None:  # known at run time only: a decode step stays one call
        return tf.cond(tf.shape(first)[1] <= block, lambda: fn(*tensors),
                       lambda: _blocks(fn, block, tensors))
    return _blocks(fn, block, tensors)


def _blocks(fn, block, tensors):
    """`_in_query_blocks`'s tf.map_fn over blocks of `block` queries."""
    first = tensors[0]
    batch, seq = tf.shape(first)[0], tf.shape(first)[1]
    blocks = (seq + block - 1) // block
    pad = blocks * block - seq

    def split(x):  # (B, T, ...) -> (blocks, B, block, ...), padded queries at the end
        x = tf.pad(x, [[0, 0], [0, pad]] + [[0, 0]] * (x.shape.rank - 2))  # (B, nb*blk, ...)
        x = tf.reshape(x, tf.concat([[batch, blocks, block], tf.shape(x)[2:]], 0))
        return tf.transpose(x, [1, 0, 2] + list(range(3, x.shape.rank)))  # (nb, B, blk, ...)

    out = tf.map_fn(lambda args: fn(*args), tuple(split(x) for x in tensors),
                    fn_output_signature=first.dtype, parallel_iterations=1)  # (nb,B,blk,H,Dv)
    out = tf.transpose(out, [1, 0, 2, 3, 4])  # (B, nb, blk, H, Dv)
    out = tf.reshape(out, tf.concat([[batch, blocks * block], tf.shape(out)[3:]], 0))
    return out[:, :seq]  # (B, T, H, Dv)


def init_layer_cache(config, batch_size, max_length, dtype):
    """One layer's empty latent cache (`MultiHeadLatentAttention`'s `cache`).

    Args:
      config: a DeepSeekConfig. batch_size, max_length: int or int32 scalar tensors B, S.
      dtype: the buffers' dtype (the model's compute dtype).

    Returns:
      {"kv": zeros (B, S, kv_lora_rank + qk_rope_head_dim)}, with DeepSeek Sparse
      Attention also "index_keys": zeros (B, S, index_head_dim); config.cache_width
      numbers per slot in all.
    """
    c = config
    cache = {"kv": zeros_buffer([batch_size, max_length, c.kv_lora_rank + c.qk_rope_head_dim],
                              dtype)}
    if c.uses_sparse_attention:
        cache["index_keys"] = zeros_buffer([batch_size, max_length, c.index_head_dim], dtype)
    return cache


def _check_layer_cache(cache, with_indexer: bool, layer: str):
    """ValueError unless `cache` is a dict with exactly this layer's keys."""
    want = {"kv", "index_keys"} if with_indexer else {"kv"}
    if not isinstance(cache, dict) or set(cache) != want:
        got = sorted(cache) if isinstance(cache, dict) else type(cache).__name__
        raise ValueError(f"{layer}: the cache of an MLA layer is a dict with keys "
                         f"{sorted(want)} (DeepSeekCausalLM.init_cache), got {got}")


def _write_cache(cache, new_entries, index, in_place=False):
    """cache[b, index[b]:index[b]+T] = new_entries[b] for every row b.

    Args:
      cache: (B, S, D). new_entries: (B, T, D). index: int32 (B,).
      in_place: write into `cache`'s own buffer (`tf.raw_ops.InplaceUpdate` on its
        (B*S, D) rows: O(T*D), no copy); the caller must not use `cache` again except
        as the returned tensor. False: `tf.tensor_scatter_nd_update` (a new buffer,
        O(S*D) on CPU).

    Returns:
      The updated cache (B, S, D).

    Raises:
      InvalidArgumentError (at run time): if index[b] + T > S for some b.
    """
    batch, seq = tf.shape(new_entries)[0], tf.shape(new_entries)[1]
    check = tf.debugging.assert_less_equal(
        tf.reduce_max(index) + seq, tf.shape(cache)[1],
        message="KV cache overflow: cache_index + T > S")
    slots = index[:, None] + tf.range(seq)[None, :]  # (B, T)
    rows = tf.broadcast_to(tf.range(batch)[:, None], tf.shape(slots))  # (B, T)
    width = tf.shape(new_entries)[2]
    with tf.control_dependencies([check] if check is not None else []):
        return write_rows(cache, tf.reshape(rows, [-1]), tf.reshape(slots, [-1]),
                          tf.reshape(new_entries, [-1, width]), in_place)  # (B, S, D)
