"""DeepSeek-V4's attention as its design costs it: gathered keys, never a T x T matrix.

The dense reference (`attention.attend_with_sink` under `sliding_window_mask` and
`compressed_block_mask`) scores every query against all T tokens and N entries and masks
what it may not see. This module attends the same visible sets, and only those
(DeepSeek-V4 paper §2.3; DeepSeek's `inference/model.py` passes window, HCA and CSA
indices to one `sparse_attn` kernel; vLLM's V4 prefill gathers the SWA and compressed
regions into one workspace for `flash_mla_sparse_fwd`; Megatron-LM's
`unfused_compressed_sparse_attn` gathers the top-k keys as [b, sq, topk, hn]):

  * sliding window, in blocks of W = sliding_window queries: block i of queries
    (positions iW .. iW + W - 1) scores the 2W keys of positions (i-1)W .. iW + W - 1,
    of which each query sees its W (q - W < k <= q): (B, T/W, H, W, 2W) scores, O(T*W);
  * HCA: all N = T // m' entries under the block mask (w + 1) * m' <= p + 1, O(T*T/m');
  * CSA: the indexer's k picks per query, gathered to (B, T, k, D), O(T*k); a pick of
    -1 (fewer than k complete entries) is masked;
  * one float32 softmax over [window | entries | sink] per query and head (the sink's
    column is dropped after normalizing: gpt-oss `eager_attention_forward`).

A query's visible set and logits are the dense path's, so the output equals it up to
float32 summation order (tests/models/test_v4_sparse_attention.py pins the two).

Long sequences run in query chunks of `QUERY_CHUNK` tokens (T static and larger than it),
each under `tf.recompute_grad`: the backward pass recomputes a chunk's scores and gathered
keys instead of keeping every chunk's (a CSA layer's gathered keys are T*k*D numbers:
4 GiB at T = 32K, k = 512, D = 64), so a training step holds one chunk's at a time.
"""

from __future__ import annotations

import tensorflow as tf

# Queries per recomputed chunk of a long stateless forward (module docstring).
QUERY_CHUNK = 4096


def _pad_to(x, axis: int, length):
    """x zero-padded at the end of `axis` to `length` (>= its size)."""
    pad = [[0, 0]] * len(x.shape)
    pad[axis] = [0, length - tf.shape(x)[axis]]
    return tf.pad(x, pad)


def _window_blocks(q_blocks, window_keys, first, window: int, n_blocks):
    """The sliding window in blocks: (block_keys (B, nb, 2W, D), logits (B, nb, H, W, 2W),
    mask bool (1, nb, 1, W, 2W)) for q_blocks float32 (B, nb, W, H, D) scaled, and
    window_keys (B, W + T, D) of positions first - W .. (module docstring)."""
    batch, padded, dim = tf.shape(q_blocks)[0], n_blocks * window, q_blocks.shape[-1]
    keys = tf.cast(_pad_to(window_keys, 1, window + padded), tf.float32)  # (B, W + Tp, D)
    prev = tf.reshape(keys[:, :padded], [batch, n_blocks, window, dim])  # (B, nb, W, D)
    cur = tf.reshape(keys[:, window:], [batch, n_blocks, window, dim])  # (B, nb, W, D)
    block_keys = tf.concat([prev, cur], axis=2)  # (B, nb, 2W, D): positions (i-1)W .. iW+W-1
    logits = tf.einsum("bnqhd,bnkd->bnhqk", q_blocks, block_keys)  # (B, nb, H, W, 2W)
    # Query a of block i (position first + iW + a) sees key j (position first + (i-1)W + j)
    # iff a < j <= W + a, and the key's position is >= 0.
    offset = tf.range(window)  # a
    key_index = tf.range(2 * window)  # j
    in_window = (key_index[None, :] > offset[:, None]) & (
        key_index[None, :] <= offset[:, None] + window)  # (W, 2W)
    key_pos = first + (tf.range(n_blocks)[:, None] - 1) * window + key_index[None, :]  # (nb,2W)
    mask = in_window[None, :, :] & (key_pos >= 0)[:, None, :]  # (nb, W, 2W)
    return block_keys, logits, mask[None, :, None]


def _entry_blocks(q_blocks, entries, picks, compress_rate: int, query_pos, batch,
                  window: int, n_blocks, padded):
    """The compressed entries' part of the blocked queries (module docstring): (values,
    logits, mask) for q_blocks float32 (B, nb, W, H, D) scaled, entries float (B, N, D)
    and query_pos int32 (nb, W), the positions of the queries (padded = nb * W of them).

    HCA (picks None): values float32 (B, N, D), every entry; logits (B, nb, H, W, N);
    mask bool (1, nb, 1, W, N), entry w visible from position p iff
    (w + 1) * m <= p + 1 (m = compress_rate).
    CSA (picks int32 (B, T, k), -1 for none): values float32 (B, nb, W, k, D), the
    picked entries gathered per query; logits (B, nb, H, W, k); mask bool
    (B, nb, 1, W, k), False for a -1 pick (and for the padded queries).
    """
    if picks is None:  # HCA: every entry, block mask
        entry_keys = tf.cast(entries, tf.float32)  # (B, N, D)
        n_entries = tf.shape(entries)[1]
        logits = tf.einsum("bnqhd,bmd->bnhqm", q_blocks, entry_keys)  # (B,nb,H,W,N)
        visible = (query_pos + 1) // compress_rate  # (nb, W) complete entries
        mask = (tf.range(n_entries)[None, None, :] < visible[..., None])[None, :, None]
        return entry_keys, logits, mask  # mask (1, nb, 1, W, N)
    # CSA: the picks, gathered
    top_k = picks.shape[-1] if picks.shape[-1] is not None else tf.shape(picks)[-1]
    picks = tf.reshape(_pad_to(picks + 1, 1, padded) - 1,
                       [batch, n_blocks, window, top_k])  # (B, nb, W, k), pad = -1
    gathered = tf.gather(tf.cast(entries, tf.float32), tf.maximum(picks, 0),
                         batch_dims=1)  # (B, nb, W, k, D)
    logits = tf.einsum("bnqhd,bnqkd->bnhqk", q_blocks, gathered)  # (B,nb,H,W,k)
    return gathered, logits, (picks >= 0)[:, :, None]  # mask (B, nb, 1, W, k)


def sparse_attend_with_sink(q, window_keys, sinks, scale: float, sliding_window: int,
                            first_position=0, entries=None, compress_rate: int = 0,
                            picks=None, dropout_rate: float = 0.0, training: bool = False,
                            return_entry_mass: bool = False):
    """Sink attention of q over its sliding window and its compressed entries, gathered.

    Args:
      q: float (B, T, H, D) queries at positions first_position .. first_position + T - 1.
      window_keys: float (B, W + T, D), the shared keys (= values) of positions
        first_position - W .. first_position + T - 1 (W = sliding_window; rows of negative
        positions may hold anything, they are masked).
      sinks: float32 (H,) sink logits.
      scale: multiplies q.k (not the sink).
      sliding_window: W.
      first_position: int or int32 scalar, the position of q's first query.
      entries: None (a sliding layer), or float (B, N, D) compressed entries, entry w at
        position w * compress_rate (HCA, or CSA's entries that `picks` index).
      compress_rate: m of `entries` (HCA's block mask; unused with picks).
      picks: None (HCA: every complete entry), or int32 (B, T, k) entry indices per
        query, -1 for none (CSA: the lightning indexer's top-k).
      dropout_rate, training: attention dropout on the probabilities.
      return_entry_mass: also return the entries' probabilities summed over heads.

    Returns:
      (B, T, H, D) in q's dtype; with `return_entry_mass`, (that, float32 (B, T, k) with
      picks or (B, T, N) without: the probability of each entry column summed over heads,
      before dropout).
    """
    heads, dim = q.shape[2], q.shape[3]
    window = sliding_window
    batch, seq = tf.shape(q)[0], tf.shape(q)[1]
    static_seq = q.shape[1]
    if static_seq is not None:
        n_blocks = -(-static_seq // window)
    else:
        n_blocks = (seq + window - 1) // window
    padded = n_blocks * window  # Tp, a multiple of W
    first = tf.cast(first_position, tf.int32)

    q32 = tf.cast(q, tf.float32) * scale  # (B, T, H, D), the scale folded in
    q_blocks = tf.reshape(_pad_to(q32, 1, padded), [batch, n_blocks, window, heads, dim])
    block_keys, window_logits, window_mask = _window_blocks(q_blocks, window_keys, first,
                                                            window, n_blocks)
    logits, masks = [window_logits], [window_mask]

    query_pos = first + tf.reshape(tf.range(padded), [n_blocks, window])  # (nb, W)
    if entries is not None:  # HCA: every entry, block mask; CSA: the picks, gathered
        entry_values, entry_logits, entry_mask = _entry_blocks(
            q_blocks, entries, picks, compress_rate, query_pos, batch, window, n_blocks, padded)
        logits.append(entry_logits)
        masks.append(entry_mask)

    widths = [2 * window] + ([tf.shape(logits[1])[-1]] if len(logits) > 1 else [])
    logits = [tf.where(mask, x, float("-inf")) for x, mask in zip(logits, masks, strict=True)]
    sink = tf.broadcast_to(tf.cast(sinks, tf.float32)[None, None, :, None, None],
                           [batch, n_blocks, heads, window, 1])  # (B, nb, H, W, 1)
    combined = tf.concat(logits + [sink], axis=-1)  # (B, nb, H, W, 2W [+ N|k] + 1)
    combined -= tf.stop_gradient(tf.reduce_max(combined, axis=-1, keepdims=True))
    probs = tf.nn.softmax(combined, axis=-1)  # float32
    attended = probs
    if training and dropout_rate > 0:
        attended = tf.nn.dropout(probs, rate=dropout_rate)
    parts = tf.split(attended, widths + [1], axis=-1)  # the sink's column dropped
    out = tf.einsum("bnhqk,bnkd->bnqhd", parts[0], block_keys)  # (B, nb, W, H, D)
    if entries is not None and picks is None:
        out += tf.einsum("bnhqm,bmd->bnqhd", parts[1], entry_values)
    elif entries is not None:
        out += tf.einsum("bnhqk,bnqkd->bnqhd", parts[1], entry_values)
    out = tf.reshape(out, [batch, padded, heads, dim])[:, :seq]  # (B, T, H, D)
    out = tf.cast(out, q.dtype)
    if not return_entry_mass:
        return out
    entry_probs = tf.split(probs, widths + [1], axis=-1)[1]  # (B, nb, H, W, N|k)
    mass = tf.reduce_sum(entry_probs, axis=2)  # (B, nb, W, N|k): over heads
    mass = tf.reshape(mass, [batch, padded, tf.shape(mass)[-1]])[:, :seq]  # (B, T, N|k)
    return out, mass


def attend_sequence(q, kv, sinks, scale: float, sliding_window: int, entries=None,
                    compress_rate: int = 0, picks=None, dropout_rate: float = 0.0,
                    training: bool = False, return_entry_mass: bool = False,
                    query_chunk: int = QUERY_CHUNK):
    """`sparse_attend_with_sink` over a whole sequence at positions 0 .. T - 1.

    Args:
      q: float (B, T, H, D); kv: float (B, T, D), the shared keys (= values).
      query_chunk: with T static and larger, the queries run in chunks of this many, each
        under `tf.recompute_grad` (module docstring).
      The others: as `sparse_attend_with_sink`.

    Returns:
      As `sparse_attend_with_sink`.
    """
    window = sliding_window
    window_keys = tf.pad(kv, [[0, 0], [window, 0], [0, 0]])  # (B, W + T, D): W before 0
    static_seq = q.shape[1]
    kwargs = dict(scale=scale, sliding_window=window, compress_rate=compress_rate,
                  dropout_rate=dropout_rate, training=training,
                  return_entry_mass=return_entry_mass)
    if static_seq is None or static_seq <= query_chunk:
        return sparse_attend_with_sink(q, window_keys, sinks, entries=entries, picks=picks,
                                       **kwargs)
    outputs, masses = [], []
    for start in range(0, static_seq, query_chunk):
        end = min(start + query_chunk, static_seq)

        picks_c = None if picks is None else picks[:, start:end]  # integers: no gradient

        def chunk(q_c, keys_c, sinks_c, *rest, start=start, picks_c=picks_c):
            got = sparse_attend_with_sink(q_c, keys_c, sinks_c, first_position=start,
                                          entries=rest[0] if rest else None, picks=picks_c,
                                          **kwargs)
            return list(got) if return_entry_mass else got

        args = [q[:, start:end], window_keys[:, start:end + window], sinks]
        if entries is not None:
            args.append(entries)
        got = tf.recompute_grad(chunk)(*args)
        if return_entry_mass:
            outputs.append(got[0])
            masses.append(got[1])
        else:
            outputs.append(got)
    out = tf.concat(outputs, axis=1)  # (B, T, H, D)
    if return_entry_mass:
        return out, tf.concat(masses, axis=1)  # (B, T, N|k)
    return out


def attend_with_sink_and_picks(q, keys, mask, entries, picks, sinks, scale: float,
                               dropout_rate: float = 0.0, training: bool = False):
    """The cached path's sink attention: shared keys under a mask, plus gathered picks.

    One float32 softmax over [keys | the query's picked entries | sink], as the dense
    `attend_with_sink` over [keys | every entry slot] under the picks' block mask, but
    scoring k entries per query instead of all of them.

    Args:
      q: float (B, T, H, D).
      keys: float (B, S, D), shared by the queries (the sliding window), also the values.
      mask: bool (B or 1, T, S), True = may attend.
      entries: float (B, N, D), the entry slots the picks index.
      picks: int32 (B, T, k), -1 for none.
      sinks: float32 (H,). scale: multiplies q.k. dropout_rate, training: attention dropout.

    Returns:
      (B, T, H, D) in q's dtype.
    """
    q32 = tf.cast(q, tf.float32) * scale  # (B, T, H, D)
    keys32 = tf.cast(keys, tf.float32)
    gathered = tf.gather(tf.cast(entries, tf.float32), tf.maximum(picks, 0),
                         batch_dims=1)  # (B, T, k, D)
    logits_keys = tf.where(mask[:, None], tf.einsum("bthd,bsd->bhts", q32, keys32),
                           float("-inf"))  # (B, H, T, S)
    logits_picks = tf.where((picks >= 0)[:, None], tf.einsum("bthd,btkd->bhtk", q32, gathered),
                            float("-inf"))  # (B, H, T, k)
    batch, seq, heads = tf.shape(q)[0], tf.shape(q)[1], q.shape[2]
    sink = tf.broadcast_to(tf.cast(sinks, tf.float32)[None, :, None, None],
                           [batch, heads, seq, 1])  # (B, H, T, 1)
    combined = tf.concat([logits_keys, logits_picks, sink], axis=-1)  # (B, H, T, S + k + 1)
    combined -= tf.reduce_max(combined, axis=-1, keepdims=True)
    probs = tf.nn.softmax(combined, axis=-1)
    if training and dropout_rate > 0:
        probs = tf.nn.dropout(probs, rate=dropout_rate)
    p_keys, p_picks, _ = tf.split(probs, [tf.shape(keys)[1], tf.shape(picks)[2], 1], axis=-1)
    out = tf.einsum("bhts,bsd->bthd", p_keys, keys32)  # (B, T, H, D)
    out += tf.einsum("bhtk,btkd->bthd", p_picks, gathered)
    return tf.cast(out, q.dtype)
