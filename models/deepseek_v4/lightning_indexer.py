"""The lightning indexer of DeepSeek-V4's CSA layers (paper §2.3.1, eqs. 13-17).

transformers 5.24 `DeepseekV4Indexer` + `DeepseekV4IndexerScorer`. The indexer keeps its
own overlapping compressor at index_head_dim (`KVCompressor`, overlap=True, same windows
as the CSA compressor) giving keys K^I (B, N, c^I), and scores every query t against them:

    q^I_t   = RoPE(c_q,t W^IUQ)                 (B, T, n^I, c^I), c_q = the q_lora residual
                                                 (after q_norm), compress rope at position t
    w_t     = (h_t W^w) * n^I^-0.5              (B, T, n^I)       (`weights_proj`)
    I_t,s   = sum_h w_t,h * ReLU(q^I_t,h . K^I_s) * c^I^-0.5      (B, T, N)

Entries not yet complete at t (s >= (t + 1) // m) score -inf; the top min(index_topk, N)
entries are kept, and picks that are not complete (queries with fewer than index_topk
usable entries) become -1.

The indexer reads `hidden_states` and `q_residual` through `tf.stop_gradient` (DeepSeek-V3.2
-Exp report §2.1.1: "we detach the indexer input from the computational graph for separate
optimization"): its picks are integers, so the LM loss never reaches it, and its own loss
(`DeepSeekV4Attention(..., return_indexer_loss=True)`, from `return_scores=True` here)
trains its weights only, never the main model's. The forward values are unchanged.
With a static T, k = min(index_topk, N) is a Python int (`tf.math.top_k` under XLA).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.compressor import KVCompressor
from models.deepseek_v4.config import CSA, DeepSeekV4Config
from models.deepseek_v4.ops import apply_rope, rope_cos_sin, visible_compressed_count
from models.deepseek_v4.sparse_attention import QUERY_CHUNK
from models.layers import initializers
from models.layers.indexer_scores import one_query_index_scores

# Queries scored at once by `LightningIndexer.select`.
INDEX_QUERY_BLOCK = 1024


@keras.saving.register_keras_serializable(package="deepseek_v4")
class LightningIndexer(keras.layers.Layer):
    """Picks the index_topk compressed entries each query of a CSA layer attends to.

    Sublayers (release names in brackets, under `attn.indexer.`): `compressor`
    KVCompressor(index_head_dim, overlap) [`compressor.{wkv,wgate,ape,norm}`], `q_b_proj`
    Dense q_lora_rank -> index_n_heads * index_head_dim [`wq_b`], `weights_proj` Dense
    C -> index_n_heads [`weights_proj`].

    Args:
      config: a DeepSeekV4Config (or its `to_dict()`).

    Call args:
      hidden_states: float (B, T, C), the attention input, positions 0 .. T-1.
      q_residual: float (B, T, q_lora_rank), the normalized query latent.
      positions: int32 (T,) or (B, T) absolute positions of the queries (default 0 .. T-1).
      compressed_keys: optional (B, N, index_head_dim) keys (a cache's); default: computed
        from `hidden_states` by the compressor.
      return_scores: also return the index scores.

    Returns:
      int32 (B, T, min(index_topk, N)): entry indices, -1 where no usable entry was left;
      with `return_scores`, (that, float32 (B, T, N) scores I, -inf for entries not
      complete at the query).
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekV4Config.from_dict(config)
        self.config = c = config
        self.compress_rate = c.compress_rates[CSA]
        self.compressor = KVCompressor(
            c.hidden_size, c.index_head_dim, self.compress_rate, True, c.qk_rope_head_dim,
            c.compress_rope_theta, c.rope_scaling, c.rms_norm_eps, c.initializer_range,
            name="compressor", dtype=self.dtype_policy)
        self.q_b_proj = keras.layers.Dense(
            c.index_n_heads * c.index_head_dim, use_bias=False, name="q_b_proj",
            dtype=self.dtype_policy, kernel_initializer=initializers.normal(c.initializer_range))
        self.weights_proj = keras.layers.Dense(
            c.index_n_heads, use_bias=False, name="weights_proj", dtype=self.dtype_policy,
            kernel_initializer=initializers.normal(c.initializer_range))

    def build(self, input_shape=None):
        c = self.config
        self.compressor.build()
        self.q_b_proj.build((None, None, c.q_lora_rank))
        self.weights_proj.build((None, None, c.hidden_size))

    def call(self, hidden_states, q_residual, positions=None, compressed_keys=None,
             return_scores=False):
        c = self.config
        hidden_states = tf.stop_gradient(hidden_states)  # (module docstring)
        q_residual = tf.stop_gradient(q_residual)
        seq = tf.shape(hidden_states)[1]
        if positions is None:
            positions = tf.range(seq)  # (T,)
        if compressed_keys is None:
            compressed_keys = self.compressor(hidden_states)  # (B, N, c^I)
        n_entries = compressed_keys.shape[1]  # static when T is (XLA's top_k needs k so)
        n_entries = tf.shape(compressed_keys)[1] if n_entries is None else n_entries
        q, weights = self._score_inputs(hidden_states, q_residual, positions)
        index_scores = _index_scores(q, weights, compressed_keys, positions,
                                     self.compress_rate)  # (B, T, N)
        indices = _top_k_picks(index_scores, c.index_topk, n_entries, positions,
                               self.compress_rate)  # (B, T, k)
        return (indices, index_scores) if return_scores else indices

    def select(self, hidden_states, q_residual, return_scores=False,
               query_block: int = INDEX_QUERY_BLOCK, query_chunk: int = QUERY_CHUNK):
        """The stateless picks of queries at positions 0 .. T-1, scored in query blocks.

        The same picks as `call` (up to float32 rounding between equal-scored entries)
        without its (B, T, N) scores: each block of `query_block` queries scores the N
        entries, (B, block, n^I, N), keeps its top-k and drops them (`tf.map_fn` over
        the blocks). With `return_scores`, the scores I of the picked entries only are
        computed again, with gradients to the indexer's weights, for its KL loss.

        Args:
          hidden_states: float (B, T, C); q_residual: float (B, T, q_lora_rank).
          return_scores: also return the picks' scores.
          query_block: queries scored at once.
          query_chunk: with T static and larger, the picks' scores (with gradients) are
            computed in chunks of this many queries, each under `tf.recompute_grad`.

        Returns:
          int32 (B, T, k), k = min(index_topk, N): entry indices, -1 where none is left;
          with `return_scores`, (that, float32 (B, T, k) scores, 0 at the -1 picks).
        """
        c = self.config
        hidden_states = tf.stop_gradient(hidden_states)  # (module docstring)
        q_residual = tf.stop_gradient(q_residual)
        positions = tf.range(tf.shape(hidden_states)[1])  # (T,)
        keys = self.compressor(hidden_states)  # (B, N, c^I)
        n_entries = keys.shape[1]
        n_entries = tf.shape(keys)[1] if n_entries is None else n_entries
        q, weights = self._score_inputs(hidden_states, q_residual, positions)
        static_seq = hidden_states.shape[1]
        if static_seq is not None and static_seq <= query_block:
            picks = _top_k_picks(_index_scores(q, weights, keys, positions, self.compress_rate),
                                 c.index_topk, n_entries, positions, self.compress_rate)
        else:
            picks = self._blocked_picks(tf.stop_gradient(q), tf.stop_gradient(weights),
                                        tf.stop_gradient(keys), n_entries, query_block)
        if not return_scores:
            return picks
        if static_seq is None or static_seq <= query_chunk:
            return picks, _scores_at(q, weights, keys, picks)
        # Long sequences: chunks of queries, each recomputed in backward, so the gathered
        # keys (B, T, k, c^I) are never all held at once (as `sparse_attention`'s chunks).
        scores = []
        for start in range(0, static_seq, query_chunk):
            picks_c = picks[:, start:start + query_chunk]  # integers: no gradient

            def chunk(q_c, w_c, keys_c, picks_c=picks_c):
                return _scores_at(q_c, w_c, keys_c, picks_c)

            scores.append(tf.recompute_grad(chunk)(
                q[:, start:start + query_chunk], weights[:, start:start + query_chunk],
                tf.cast(keys, tf.float32)))
        return picks, tf.concat(scores, axis=1)  # (B, T, k)

    def _blocked_picks(self, q, weights, keys, n_entries, query_block: int):
        """`select`'s picks, one block of queries at a time: int32 (B, T, k)."""
        c = self.config
        batch, seq = tf.shape(q)[0], tf.shape(q)[1]
        n_blocks = (seq + query_block - 1) // query_block
        padded = n_blocks * query_block

        def blocks(x):  # (B, T, ...) -> (nb, B, block, ...)
            x = tf.pad(x, [[0, 0], [0, padded - seq]] + [[0, 0]] * (len(x.shape) - 2))
            x = tf.reshape(x, tf.concat([[batch, n_blocks, query_block], tf.shape(x)[2:]], 0))
            return tf.transpose(x, [1, 0, 2] + list(range(3, len(x.shape))))

        positions = tf.reshape(tf.range(padded), [n_blocks, query_block])  # (nb, block)
        top_k = min(c.index_topk, n_entries) if isinstance(n_entries, int) else tf.minimum(
            c.index_topk, n_entries)

        def pick(args):
            q_b, w_b, pos_b = args  # (B, block, n^I, c^I), (B, block, n^I), (block,)
            scores = _index_scores(q_b, w_b, keys, pos_b, self.compress_rate)  # (B, block, N)
            return _top_k_picks(scores, c.index_topk, n_entries, pos_b, self.compress_rate)

        picks = tf.map_fn(pick, (blocks(q), blocks(weights), positions),
                          fn_output_signature=tf.TensorSpec([None, query_block, None],
                                                            tf.int32))  # (nb, B, block, k)
        picks = tf.reshape(tf.transpose(picks, [1, 0, 2, 3]), [batch, padded, top_k])
        return picks[:, :seq]  # (B, T, k)

    def _score_inputs(self, hidden_states, q_residual, positions):
        """(q^I float32 (B, T, n^I, c^I) rotated at `positions`, w float32 (B, T, n^I) with
        n^I^-0.5 folded in): the module docstring's first two lines."""
        c = self.config
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        cos, sin = rope_cos_sin(positions, self.compressor.inv_freq)  # (T|B,T, rope/2)
        q = self.q_b_proj(q_residual)  # (B, T, n^I * c^I)
        q = tf.reshape(q, [batch, seq, c.index_n_heads, c.index_head_dim])  # (B,T,n^I,c^I)
        q = tf.cast(apply_rope(q, cos, sin), tf.float32)
        weights = tf.cast(self.weights_proj(hidden_states), tf.float32)  # (B, T, n^I)
        return q, weights * c.index_n_heads ** -0.5

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def _index_scores(q, weights, keys, positions, compress_rate: int):
    """I (module docstring): float32 (B, T, N), -inf for entries not complete at a query.

    Args: q float32 (B, T, n^I, c^I); weights float32 (B, T, n^I); keys (B, N, c^I);
    positions int32 (T,) or (B, T).
    """
    batch, seq = tf.shape(q)[0], tf.shape(q)[1]
    keys = tf.cast(keys, tf.float32)
    weights = weights * q.shape[-1] ** -0.5  # (B, T, n^I), c^I^-0.5 folded in

    def by_head():  # (B, T, N)
        # A head at a time, summed: no (B, T, n^I, N) tensor, and one pass over (B, T, N)
        # per head instead of four. Measured 2026-11-28 on a 1,024-query block of 4,096
        # entries at n^I 4, with the top-k: 110 -> 58 ms.
        index_scores = None
        for h in range(q.shape[2]):
            head = tf.nn.relu(tf.matmul(q[:, :, h], keys, transpose_b=True))  # (B, T, N)
            head = head * weights[:, :, h, None]
            index_scores = head if index_scores is None else index_scores + head
        return index_scores

    def one_query():  # T = 1 (a decode step): the keys read once
        return one_query_index_scores(q[:, 0], weights[:, 0], keys)  # (B, 1, N)

    if q.shape[1] is not None:
        index_scores = one_query() if q.shape[1] == 1 else by_head()
    else:  # known at run time only (a (B, None) decode step's signature)
        index_scores = tf.cond(tf.equal(seq, 1), one_query, by_head)
    visible = visible_compressed_count(positions, compress_rate)  # (T,) or (B, T)
    visible = tf.broadcast_to(visible, [batch, seq])[..., None]  # (B, T, 1)
    future = tf.range(tf.shape(keys)[1])[None, None, :] >= visible  # (B, T, N)
    return tf.where(future, float("-inf"), index_scores)


def _scores_at(q, weights, keys, picks):
    """I at the picks: float32 (B, T, k), 0 at the -1 picks.

    Args: q float32 (B, T, n^I, c^I); weights float32 (B, T, n^I); keys (B, N, c^I);
    picks int32 (B, T, k).
    """
    picked = tf.gather(tf.cast(keys, tf.float32), tf.maximum(picks, 0),
                       batch_dims=1)  # (B, T, k, c^I)
    scores = tf.einsum("bthd,btkd->bthk", q, picked)  # (B, T, n^I, k)
    scores = tf.nn.relu(scores) * q.shape[-1] ** -0.5
    scores = tf.reduce_sum(scores * weights[..., None], axis=2)  # (B, T, k)
    return tf.where(picks >= 0, scores, 0.0)


def _top_k_picks(index_scores, index_topk: int, n_entries, positions, compress_rate: int):
    """int32 (B, T, min(index_topk, N)) best entries of each query, in no particular order,
    -1 where not complete."""
    if isinstance(n_entries, int):
        top_k = min(index_topk, n_entries)
    else:
        top_k = tf.minimum(index_topk, n_entries)
    # Unsorted: the attention does not care for the order, and at 512 of 3,584 entries
    # unsorted measured 6.2 against 7.8 ms for 128 queries (2026-11-29, 2-core EPYC).
    indices = tf.math.top_k(index_scores, k=top_k, sorted=False).indices  # (B, T, k)
    visible = visible_compressed_count(positions, compress_rate)  # (T,) or (B, T)
    visible = tf.broadcast_to(visible, tf.shape(indices)[:2])[..., None]  # (B, T, 1)
    return tf.where(indices >= visible, -1, indices)  # (B, T, k), -1 = not usable
