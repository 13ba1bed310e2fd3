"""DeepSeek-V4 attention: shared-KV MQA over a sliding window plus compressed entries.

transformers 5.24 `DeepseekV4Attention` (with gpt-oss's `eager_attention_forward` for the
sink) and the DeepSeek-V4 paper §2.3. For hidden states h (B, T, C) at positions p:

    c_q = RMSNorm(h W_qa)                         (B, T, q_lora_rank)   q_a_proj, q_a_norm
    q   = RoPE(RMSNorm_unweighted(c_q W_qb))      (B, T, H, D) per head, q_b_proj
    kv  = RoPE(RMSNorm(h W_kv))                   (B, T, D), ONE head, key = value
    RoPE on the trailing qk_rope_head_dim dims (layout [nope | rope], interleaved pairs):
    the "main" rope (rope_theta) in sliding layers, the "compress" rope (compress_rope_theta,
    YaRN) in CSA / HCA layers.

Keys/values = [kv_1..kv_T | e_1..e_N]: the T tokens under a sliding-window causal mask
(query p sees keys p - sliding_window < k <= p: `sliding_window` keys, itself included,
as transformers' `masking_utils`), then the N compressed entries of the layer's
`KVCompressor` (none in sliding layers) under a block mask: HCA: entry w iff
(w + 1) * m <= p + 1; CSA: the entries the `LightningIndexer` picked for the query (never
-1). Per head h, with a learned sink logit s_h (`sinks`, release `attn_sink`):

    a = softmax([q.k_1, ..., q.k_S, s_h] * [D^-0.5, ..., 1])  then the sink column dropped
    o = sum_j a_j v_j                                         (B, T, H, D)

(the sink takes probability mass but has no value; logits minus their max, float32).

How it is computed (`config.attn_implementation`): "sparse", the default, attends only
what each query sees, gathered (`sparse_attention`: the window in blocks of W queries,
the CSA picks as (B, T, k, D), every HCA entry; O(T * (W + k + T/m')) scores, chunks of
long sequences recomputed in backward); the cached path (prefill chunks, decode) runs
`CACHED_BLOCK` queries at a time, each block scoring the W - 1 + b window keys it sees,
the entry slots complete at its last query and, in CSA, its picks gathered; "dense" builds the whole (B, H, T, T + N) score matrix and masks it (`attend_with_sink`),
the reference the sparse path is tested against (tests/models/test_v4_sparse_attention.py).
Because value = key carries RoPE, the output's rope slice is rotated back by -p (cos, -sin
at the query position). The grouped output projection splits the H*D outputs into
o_groups groups of H*D/g, maps each by its own (H*D/g, o_lora_rank) matrix (`o_a_proj`, an
`ExpertProjection` with one "expert" per group: transformers' `DeepseekV4GroupedLinear`
`o_a_proj`, release `wo_a`) to o_lora_rank, and mixes the g*o_lora_rank values with
`o_b_proj` (`wo_b`) to C. Being an ExpertProjection, `o_a_proj` takes per-group LoRA
adapters (`enable_lora`) and int8 (`quantize("int8")`) as the stacked experts do.

The lightning indexer's training signal (CSA layers; `call(..., return_indexer_loss=True)`).
The DeepSeek-V4 report (§2.3.1) reuses DeepSeek-V3.2's DSA indexer on the compressed
entries but, in the material found for this implementation (the report's summaries,
transformers 5.24, which runs the indexer without any loss), does not restate how the
indexer is trained; V3.2's sparse-stage rule (DeepSeek-V3.2-Exp report §2.1.1) is used:

    p_t = stop_gradient(sum_h a_{h,t,s} over the kept entries s in S_t, L1-normalized)
    L^I = mean_t KL(p_t || softmax_{s in S_t}(I_t,s))

where a are this layer's attention probabilities (sink and sliding-window columns
included in the softmax, then only the kept compressed entries' columns taken), S_t the
entries the indexer picked for query t, and I the indexer's scores; the indexer reads
its inputs through `tf.stop_gradient`, so L^I trains only the indexer and the LM loss
never reaches it (the picks are integers). `models.deepseek.lightning_indexer.
indexer_kl_loss` computes it (the mean is over the queries with at least one kept entry,
as Megatron-LM's `compute_dsa_indexer_loss` averages over queries).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4 import kv_cache, sparse_attention
from models.deepseek_v4.compressor import KVCompressor
from models.deepseek_v4.config import CSA, SLIDING, DeepSeekV4Config
from models.deepseek_v4.lightning_indexer import LightningIndexer
from models.deepseek_v4.ops import (
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
    sliding_window_mask,
    unweighted_rms_norm,
    visible_compressed_count,
)
from models.layers import initializers
from models.layers.expert_projection import ExpertProjection
from models.layers.indexer_scores import indexer_kl_loss
from models.layers.rms_norm import RMSNorm

# Queries per block of the cached path's sparse attention (`_cached_sparse`).
CACHED_BLOCK = 128


def compressed_block_mask(positions, n_entries, compress_rate: int, batch, topk_indices=None):
    """bool (B, T, N): which compressed entries each query may attend to.

    Args:
      positions: int32 (T,) or (B, T) query positions.
      n_entries: N (int or int32 scalar).
      compress_rate: m.
      batch: B.
      topk_indices: None (HCA: every complete entry), or int32 (B, T, k) indexer picks
        with -1 for none (CSA: the picked entries only; picks are always complete).
    """
    seq = tf.shape(positions)[-1]
    if topk_indices is None:
        visible = visible_compressed_count(positions, compress_rate)  # (T,) or (B, T)
        visible = tf.broadcast_to(visible, [batch, seq])[..., None]  # (B, T, 1)
        return tf.range(n_entries)[None, None, :] < visible  # (B, T, N)
    # Scatter a hit per pick into N + 1 columns, -1 (no pick) into the extra last one
    # (transformers' `block_bias.scatter_`), then drop it: O(B*T*k) work, not B*T*k*N.
    picks = tf.where(topk_indices >= 0, topk_indices, n_entries)  # (B, T, k)
    shape = tf.shape(picks)
    rows = tf.broadcast_to(tf.range(shape[0])[:, None, None], shape)  # (B, T, k) batch index
    cols = tf.broadcast_to(tf.range(shape[1])[None, :, None], shape)  # (B, T, k) query index
    coords = tf.stack([rows, cols, picks], axis=-1)  # (B, T, k, 3)
    hits = tf.scatter_nd(coords, tf.ones_like(picks), [shape[0], shape[1], n_entries + 1])
    return hits[..., :n_entries] > 0  # (B, T, N)


def attend_with_sink(q, keys, mask, sinks, scale: float, dropout_rate: float = 0.0,
                     training: bool = False, return_probs: bool = False):
    """Single-KV-head attention with a per-head sink logit (gpt-oss `eager_attention_forward`).

    Args:
      q: float (B, T, H, D).
      keys: float (B, S, D), also the values.
      mask: bool (B or 1, T, S), True = may attend.
      sinks: float32 (H,).
      scale: multiplies q.k (not the sink).
      dropout_rate, training: attention dropout on the probabilities.
      return_probs: also return the probabilities.

    Returns:
      (B, T, H, D) in the dtype of `q`; with `return_probs`, (that, float32 (B, H, T, S)
      probabilities before dropout, the sink's column dropped).
    """
    logits = tf.einsum("bthd,bsd->bhts", tf.cast(q, tf.float32),
                       tf.cast(keys, tf.float32)) * scale  # (B, H, T, S)
    logits = tf.where(mask[:, None], logits, float("-inf"))  # (B, H, T, S)
    batch, seq = tf.shape(q)[0], tf.shape(q)[1]
    sink = tf.broadcast_to(tf.cast(sinks, tf.float32)[None, :, None, None],
                           [batch, sinks.shape[0], seq, 1])  # (B, H, T, 1)
    combined = tf.concat([logits, sink], axis=-1)  # (B, H, T, S + 1)
    combined -= tf.reduce_max(combined, axis=-1, keepdims=True)
    probs = tf.nn.softmax(combined, axis=-1)[..., :-1]  # (B, H, T, S): the sink dropped
    attended = probs
    if training and dropout_rate > 0:
        attended = tf.nn.dropout(probs, rate=dropout_rate)
    out = tf.einsum("bhts,bsd->bthd", tf.cast(attended, keys.dtype), keys)  # (B, T, H, D)
    if return_probs:
        return tf.cast(out, q.dtype), probs
    return tf.cast(out, q.dtype)


@keras.saving.register_keras_serializable(package="deepseek_v4")
class DeepSeekV4Attention(keras.layers.Layer):
    """Sliding-window MQA with attention sinks, plus CSA / HCA compressed entries.

    Sublayers and weights (release names under `layers.N.attn.` in brackets):
    `q_a_proj` [`wq_a`], `q_a_norm` [`q_norm`], `q_b_proj` [`wq_b`], `kv_proj` [`wkv`],
    `kv_norm` [`norm`], `o_a_proj` ExpertProjection(g, H*D/g, o_lora_rank), kernel
    (g, H*D/g, o_lora_rank), group j's block `kernel[j]` [`wo_a`, stored
    (g*o_lora_rank, H*D/g): rows j*o_lora_rank .. (j+1)*o_lora_rank - 1 are
    kernel[j] transposed], `o_b_proj` [`wo_b`], `sinks` float32 (H,),
    zeros [`attn_sink`]; CSA / HCA: `compressor` (KVCompressor) [`compressor.*`]; CSA:
    `indexer` (LightningIndexer) [`indexer.*`].

    Args:
      config: a DeepSeekV4Config (or its `to_dict()`).
      layer_idx: block index (selects config.layer_types[layer_idx]).

    Call args:
      hidden_states: float (B, T, C), at positions 0 .. T-1 without a cache, or at
        cache_index[b] .. cache_index[b] + T - 1 with one.
      training: enables attention dropout.
      cache: None (the stateless forward), or this layer's dict of buffers
        (`kv_cache.init_layer_cache`; keys "kv", and "comp_kv", "comp_gate", "entries"
        in CSA / HCA, "index_kv", "index_gate", "index_entries" in CSA).
      cache_index: int32 scalar or (B,), the first new position of each row (required
        with a cache; it must be where the row's kept tokens ended: `kv_cache`).
      cache_lengths: None (all T), or int32 (B,): the new tokens each row keeps in the
        cache (the rest are padding of a right-padded batch).
      return_indexer_loss: (stateless path only) also return the indexer's KL loss
        (module docstring): float32 scalar, 0.0 in layers without an indexer.

    Returns:
      Without a cache: (B, T, C), the compute dtype; with `return_indexer_loss`,
      ((B, T, C), indexer_loss float32 scalar). With a cache: ((B, T, C), the updated
      cache dict).

    Raises:
      ValueError: a cache without cache_index, or return_indexer_loss with a cache.

    Shapes are static under `tf.function(jit_compile=True)` when (B, T) are: N = T // m
    entries, the indexer's k = min(index_topk, N) (a Python int then).

    The cached path (transformers `DeepseekV4HCACache` / `CSACache`, DeepSeek's ring of
    the last W keys; bounded buffers, see `models.deepseek_v4.kv_cache`): the keys are
    the ring's W - 1 positions before the first new token plus the new ones (W =
    sliding_window; positions < 0 masked), under the same sliding-window mask; then every
    entry slot (S // m + 1) under the block mask (HCA: complete windows; CSA: the
    indexer's picks over all its key slots, gathered when "sparse"). Entry slots of
    windows not closed yet are never visible; the compressors pool the windows the new
    tokens touch (`kv_cache.update_compressed`). The work per new token is O(W + S / m),
    the prefix is never recomputed; the cache holds O(W + m) positions' keys and
    projections plus one entry per m tokens.
    """

    def __init__(self, config, layer_idx: int, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekV4Config.from_dict(config)
        self.config = c = config
        self.layer_idx = layer_idx
        self.layer_type = c.layer_types[layer_idx]
        if self.layer_type == SLIDING:  # the "main" rope
            self.inv_freq = rope_inv_freq(c.qk_rope_head_dim, c.rope_theta, None)
        else:  # the "compress" rope, shared with the compressor
            self.inv_freq = rope_inv_freq(c.qk_rope_head_dim, c.compress_rope_theta,
                                          c.rope_scaling)
        init = initializers.normal(c.initializer_range)

        def dense(units, name):
            return keras.layers.Dense(units, use_bias=False, name=name, dtype=self.dtype_policy,
                                      kernel_initializer=init)

        heads, dim = c.num_attention_heads, c.head_dim
        self.q_a_proj = dense(c.q_lora_rank, "q_a_proj")
        self.q_a_norm = RMSNorm(c.rms_norm_eps, name="q_a_norm", dtype="float32")
        self.q_b_proj = dense(heads * dim, "q_b_proj")
        self.kv_proj = dense(dim, "kv_proj")
        self.kv_norm = RMSNorm(c.rms_norm_eps, name="kv_norm", dtype="float32")
        self.o_a_proj = ExpertProjection(
            c.o_groups, heads * dim // c.o_groups, c.o_lora_rank, c.initializer_range,
            name="o_a_proj", dtype=self.dtype_policy)
        self.o_b_proj = dense(c.hidden_size, "o_b_proj")
        self.compressor = None
        self.indexer = None
        if self.layer_type != SLIDING:
            self.compress_rate = c.compress_rates[self.layer_type]
            self.compressor = KVCompressor(
                c.hidden_size, dim, self.compress_rate, self.layer_type == CSA,
                c.qk_rope_head_dim, c.compress_rope_theta, c.rope_scaling, c.rms_norm_eps,
                c.initializer_range, name="compressor", dtype=self.dtype_policy)
        if self.layer_type == CSA:
            self.indexer = LightningIndexer(c, name="indexer", dtype=self.dtype_policy)

    def build(self, input_shape=None):
        c = self.config
        heads, dim, groups = c.num_attention_heads, c.head_dim, c.o_groups
        self.q_a_proj.build((None, None, c.hidden_size))
        self.q_a_norm.build((None, None, c.q_lora_rank))
        self.q_b_proj.build((None, None, c.q_lora_rank))
        self.kv_proj.build((None, None, c.hidden_size))
        self.kv_norm.build((None, None, dim))
        self.o_a_proj.build((groups, None, heads * dim // groups))  # (g, H*D/g, R) kernel
        self.o_b_proj.build((None, None, groups * c.o_lora_rank))
        self.sinks = self.add_weight(name="sinks", shape=(heads,), initializer="zeros",
                                     dtype="float32")
        if self.compressor is not None:
            self.compressor.build()
        if self.indexer is not None:
            self.indexer.build()

    def call(self, hidden_states, training=False, cache=None, cache_index=None,
             cache_lengths=None, return_indexer_loss=False, cache_in_place=False):
        if cache is not None:
            if cache_index is None:
                raise ValueError(f"{self.name}: cache_index is required when a cache is given")
            if return_indexer_loss:
                raise ValueError(f"{self.name}: return_indexer_loss is for the stateless "
                                 "forward (cache=None) only")
            return self._call_cached(hidden_states, cache, cache_index, cache_lengths, training,
                                     cache_in_place)
        c = self.config
        if c.attn_implementation == "sparse":
            return self._call_sparse(hidden_states, training, return_indexer_loss)
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        positions = tf.range(seq)  # (T,)
        cos, sin = rope_cos_sin(positions, self.inv_freq)  # (T, rope/2)
        q_residual, q, kv = self._queries_and_kv(hidden_states, cos, sin)
        mask = sliding_window_mask(positions, positions, c.sliding_window)[None]  # (1, T, T)

        index_scores = None
        if self.compressor is not None:
            entries = self.compressor(hidden_states)  # (B, N, D)
            n_entries = entries.shape[1]  # static when T is
            n_entries = tf.shape(entries)[1] if n_entries is None else n_entries
            topk = None
            if self.indexer is not None:
                topk = self.indexer(hidden_states, q_residual, positions,
                                    return_scores=return_indexer_loss)  # (B, T, k)
                if return_indexer_loss:
                    topk, index_scores = topk  # (B, T, k), float32 (B, T, N)
            block = compressed_block_mask(positions, n_entries, self.compress_rate, batch,
                                          topk)  # (B, T, N)
            kv = tf.concat([kv, tf.cast(entries, kv.dtype)], axis=1)  # (B, T + N, D)
            mask = tf.concat([tf.broadcast_to(mask, [batch, seq, seq]), block],
                             axis=-1)  # (B, T, T + N)
        if not return_indexer_loss:
            return self._attend_and_project(q, kv, mask, cos, sin, training)  # (B, T, C)
        if index_scores is None:  # no indexer in this layer
            out = self._attend_and_project(q, kv, mask, cos, sin, training)  # (B, T, C)
            return out, tf.constant(0.0, tf.float32)
        out, probs = self._attend_and_project(q, kv, mask, cos, sin, training,
                                              return_probs=True)  # (B,T,C), (B,H,T,T+N)
        mass = tf.reduce_sum(probs[..., seq:], axis=1)  # (B, T, N): over heads, entries only
        return out, indexer_kl_loss(mass, index_scores, block)

    def _call_sparse(self, hidden_states, training, return_indexer_loss):
        """The stateless forward, gathered (`sparse_attention`; `attn_implementation`
        "sparse"): the same result as the dense path without its (B, H, T, T + N) scores."""
        c = self.config
        seq = tf.shape(hidden_states)[1]
        positions = tf.range(seq)  # (T,)
        cos, sin = rope_cos_sin(positions, self.inv_freq)  # (T, rope/2)
        q_residual, q, kv = self._queries_and_kv(hidden_states, cos, sin)
        entries = picks = index_scores = None
        if self.compressor is not None:
            entries = self.compressor(hidden_states)  # (B, N, D)
        if self.indexer is not None:
            picks = self.indexer.select(hidden_states, q_residual,
                                        return_scores=return_indexer_loss)  # (B, T, k)
            if return_indexer_loss:
                picks, index_scores = picks  # (B, T, k), float32 (B, T, k)
        with_mass = return_indexer_loss and picks is not None
        out = sparse_attention.attend_sequence(
            q, kv, self.sinks, c.head_dim ** -0.5, c.sliding_window, entries,
            self.compress_rate if entries is not None else 0, picks, c.attention_dropout,
            training, return_entry_mass=with_mass)  # (B, T, H, D)
        loss = tf.constant(0.0, tf.float32)
        if with_mass:
            out, mass = out  # (B, T, H, D), float32 (B, T, k)
            loss = indexer_kl_loss(mass, index_scores, picks >= 0)
        out = self._project(out, cos, sin)  # (B, T, C)
        return (out, loss) if return_indexer_loss else out

    def _queries_and_kv(self, hidden_states, cos, sin):
        """(q_residual (B, T, q_lora_rank), q (B, T, H, D), kv (B, T, D)), RoPE'd by cos/sin
        ((T, rope/2) or (B, T, rope/2)); the module docstring's first three lines."""
        c = self.config
        heads, dim = c.num_attention_heads, c.head_dim
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        q_residual = tf.cast(self.q_a_norm(self.q_a_proj(hidden_states)),
                             hidden_states.dtype)  # (B, T, q_lora_rank)
        q = self.q_b_proj(q_residual)  # (B, T, H*D)
        q = tf.reshape(q, [batch, seq, heads, dim])  # (B, T, H, D)
        q = apply_rope(unweighted_rms_norm(q, c.rms_norm_eps), cos, sin)

        kv = tf.cast(self.kv_norm(self.kv_proj(hidden_states)), q.dtype)  # (B, T, D)
        kv = apply_rope(kv[:, :, None, :], cos, sin)[:, :, 0, :]  # (B, T, 1, D) -> (B, T, D)
        return q_residual, q, kv

    def _attend_and_project(self, q, keys, mask, cos, sin, training, return_probs=False):
        """Sink attention of q (B, T, H, D) over keys (B, S, D) under mask (B|1, T, S), then
        `_project` -> (B, T, C); with `return_probs` also the float32 (B, H, T, S)
        attention probabilities (before dropout)."""
        c = self.config
        out = attend_with_sink(q, keys, mask, self.sinks, c.head_dim ** -0.5,
                               c.attention_dropout, training, return_probs)  # (B, T, H, D)
        if return_probs:
            out, probs = out  # (B, T, H, D), (B, H, T, S)
            return self._project(out, cos, sin), probs
        return self._project(out, cos, sin)

    def _project(self, out, cos, sin):
        """The values' rotation undone at the query positions (cos/sin), then the grouped
        output projection: (B, T, H, D) -> (B, T, C)."""
        c = self.config
        heads, dim, groups = c.num_attention_heads, c.head_dim, c.o_groups
        batch, seq = tf.shape(out)[0], tf.shape(out)[1]
        out = apply_rope(out, cos, sin, inverse=True)  # undo the values' rotation
        grouped = tf.reshape(out, [batch * seq, groups, heads * dim // groups])  # (BT,g,HD/g)
        grouped = tf.transpose(grouped, [1, 0, 2])  # (g, B*T, H*D/g)
        grouped = self.o_a_proj(grouped)  # (g, B*T, R): group j through kernel[j]
        grouped = tf.transpose(grouped, [1, 0, 2])  # (B*T, g, R)
        grouped = tf.reshape(grouped, [batch, seq, groups * c.o_lora_rank])  # (B, T, g*R)
        return self.o_b_proj(grouped)  # (B, T, C)

    def _call_cached(self, hidden_states, cache, cache_index, lengths, training,
                     in_place=False):
        """The cached path (class docstring); returns ((B, T, C), the updated cache dict).
        `in_place`: the entries are written in place (`kv_cache.update_compressed`)."""
        c = self.config
        window = c.sliding_window
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        index, positions = kv_cache.query_positions(cache_index, batch, seq)  # (B,), (B, T)
        lengths = tf.fill([batch], seq) if lengths is None else lengths  # (B,)
        cos, sin = rope_cos_sin(positions, self.inv_freq)  # (B, T, rope/2)
        q_residual, q, kv = self._queries_and_kv(hidden_states, cos, sin)
        new_cache = dict(cache)
        # The sliding window of the first query to the last: the ring's W - 1 keys before
        # the first new token, then the T new ones.
        old = kv_cache.read_ring(cache["kv"], index, window - 1)  # (B, W-1, D)
        keys = tf.concat([tf.cast(old, kv.dtype), kv], axis=1)  # (B, W-1+T, D)
        key_positions = index[:, None] - (window - 1) + tf.range(window - 1 + seq)[None, :]
        mask = sliding_window_mask(positions, key_positions, window)  # (B, T, W-1+T)
        mask &= (key_positions >= 0)[:, None, :]
        new_cache["kv"] = kv_cache.write_ring(cache["kv"], kv, index, lengths)  # (B, W, D)

        entries = index_entries = None
        if self.compressor is not None:
            new_cache["comp_kv"], new_cache["comp_gate"], new_cache["entries"] = (
                kv_cache.update_compressed(self.compressor, cache["comp_kv"],
                                           cache["comp_gate"], cache["entries"],
                                           hidden_states, index, lengths, in_place))
            entries = new_cache["entries"]  # (B, N, D), N = S // m + 1 slots
        if self.indexer is not None:
            new_cache["index_kv"], new_cache["index_gate"], new_cache["index_entries"] = (
                kv_cache.update_compressed(self.indexer.compressor, cache["index_kv"],
                                           cache["index_gate"], cache["index_entries"],
                                           hidden_states, index, lengths, in_place))
            index_entries = new_cache["index_entries"]  # (B, N, c^I)

        if c.attn_implementation == "sparse":
            out = self._cached_sparse(hidden_states, q_residual, q, keys, mask, positions,
                                      entries, index_entries, training)  # (B, T, H, D)
            return self._project(out, cos, sin), new_cache
        if entries is not None:  # the masked reference: every slot, masked to what is seen
            topk = None
            if self.indexer is not None:
                topk = self.indexer(hidden_states, q_residual, positions,
                                    compressed_keys=index_entries)  # (B, T, k)
            block = compressed_block_mask(positions, tf.shape(entries)[1], self.compress_rate,
                                          batch, topk)  # (B, T, N)
            keys = tf.concat([keys, tf.cast(entries, keys.dtype)], axis=1)  # (B, W-1+T+N, D)
            mask = tf.concat([mask, block], axis=-1)  # (B, T, W-1+T+N)
        out = self._attend_and_project(q, keys, mask, cos, sin, training)  # (B, T, C)
        return out, new_cache

    def _cached_sparse(self, hidden_states, q_residual, q, keys, mask, positions, entries,
                       index_entries, training):
        """The cached path's attention (`attn_implementation` "sparse"), `CACHED_BLOCK`
        queries at a time (tf.map_fn), so a block's index scores, picked entries and
        window keys stay small (at a 1,024-token chunk, k = 512, D = 64, the picks of the
        whole chunk are 134 MB, and gathering them at once measured 3x slower).

        Block i (queries i*b .. i*b + b - 1) attends the W - 1 + b window keys those
        queries can see, and: CSA, the indexer's picks of the block's queries, gathered;
        HCA, every entry slot under the block mask; a sliding layer, nothing else. Only
        the entry slots complete at the block's last query are scored (a prefill's early
        blocks see few of the N slots a long cache has).

        Args: hidden_states (B, T, C); q_residual (B, T, q_lora_rank); q (B, T, H, D);
          keys (B, W - 1 + T, D) = the ring's W - 1 keys, then the T new ones; mask bool
          (B, T, W - 1 + T); positions int32 (B, T); entries (B, N, D) or None;
          index_entries (B, N, c^I) or None (the indexer's keys).
        Returns: (B, T, H, D) in q's dtype, as the masked path up to summation order.
        """
        c = self.config
        batch, seq = tf.shape(q)[0], tf.shape(q)[1]
        scale = c.head_dim ** -0.5

        def attend(q_b, keys_b, mask_b, pos_b, hidden_b, q_residual_b, visible_only=True):
            """One block; `visible_only`: score only the slots complete at its last query
            (a prefill's early blocks), else all (a decode step sees nearly all of them,
            and slicing would copy the entries)."""
            block_entries, block_index_entries = entries, index_entries
            if entries is not None:
                n_visible = tf.shape(entries)[1]  # (B, n, D), n = N or the complete ones
                if visible_only:
                    n_visible = tf.minimum(n_visible,
                                           (tf.reduce_max(pos_b) + 1) // self.compress_rate)
                    block_entries = entries[:, :n_visible]
                    if index_entries is not None:
                        block_index_entries = index_entries[:, :n_visible]
            if self.indexer is not None:
                picks = self.indexer(hidden_b, q_residual_b, pos_b,
                                     compressed_keys=block_index_entries)  # (B, b, k)
                return sparse_attention.attend_with_sink_and_picks(
                    q_b, keys_b, mask_b, block_entries, picks, self.sinks, scale,
                    c.attention_dropout, training)  # (B, b, H, D)
            if entries is not None:  # HCA: every complete slot, under the block mask
                block_mask = compressed_block_mask(pos_b, n_visible, self.compress_rate,
                                                   batch)  # (B, b, n)
                keys_b = tf.concat([keys_b, tf.cast(block_entries, keys_b.dtype)], axis=1)
                mask_b = tf.concat([mask_b, block_mask], axis=-1)  # (B, b, W-1+b+n)
            return attend_with_sink(q_b, keys_b, mask_b, self.sinks, scale,
                                    c.attention_dropout, training)  # (B, b, H, D)

        def whole():  # decode, short chunks: one block of their own width
            return attend(q, keys, mask, positions, hidden_states, q_residual,
                          visible_only=False)

        if q.shape[1] is not None and q.shape[1] <= CACHED_BLOCK:
            return whole()
        if q.shape[1] is None:  # known at run time only (a decode step of a (B, None) step)
            return tf.cond(seq <= CACHED_BLOCK, whole, lambda: self._in_blocks(
                attend, hidden_states, q_residual, q, keys, mask, positions))
        return self._in_blocks(attend, hidden_states, q_residual, q, keys, mask, positions)

    def _in_blocks(self, attend, hidden_states, q_residual, q, keys, mask, positions):
        """`attend` (of `_cached_sparse`) on CACHED_BLOCK queries at a time (tf.map_fn), the
        last block padded; args as `_cached_sparse`'s. Returns (B, T, H, D)."""
        c = self.config
        batch, seq = tf.shape(q)[0], tf.shape(q)[1]
        block, span = CACHED_BLOCK, CACHED_BLOCK + c.sliding_window - 1
        n_blocks = (seq + block - 1) // block
        pad = n_blocks * block - seq

        def padded(x, axes):  # zeros (False) after the end of each of `axes`
            return tf.pad(x, [[0, pad if a in axes else 0] for a in range(len(x.shape))])

        # Padded queries see no window key and sit after the last position; the sink keeps
        # their softmax finite, and their rows are cut off below.
        q_p, keys_p = padded(q, (1,)), padded(keys, (1,))  # (B, Tp, H, D), (B, W-1+Tp, D)
        mask_p = padded(mask, (1, 2))  # (B, Tp, W-1+Tp)
        positions_p = tf.concat([positions, positions[:, -1:] + 1 + tf.range(pad)[None]
                                 + tf.zeros([batch, 1], tf.int32)], axis=1)  # (B, Tp)
        hidden_p, q_residual_p = padded(hidden_states, (1,)), padded(q_residual, (1,))

        def attend_block(i):  # queries i*b .. i*b + b - 1 and the window keys they see
            start = i * block
            rows = slice(None), slice(start, start + block)
            return attend(q_p[rows], keys_p[:, start:start + span],
                          mask_p[:, start:start + block, start:start + span],
                          positions_p[rows], hidden_p[rows], q_residual_p[rows])

        out = tf.map_fn(attend_block, tf.range(n_blocks),
                        fn_output_signature=tf.TensorSpec([None, block] + q.shape[2:],
                                                          q.dtype),
                        parallel_iterations=1)  # (nb, B, b, H, D)
        out = tf.transpose(out, [1, 0, 2, 3, 4])  # (B, nb, b, H, D)
        out = tf.reshape(out, [batch, n_blocks * block, q.shape[2], q.shape[3]])
        return out[:, :seq]  # (B, T, H, D)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(),
                "layer_idx": self.layer_idx}
