"""DeepSeek-V4's KV cache: position-indexed buffers for sliding-window, CSA and HCA layers.

The state transformers 5.24 keeps in `DeepseekV4HCACache` / `DeepseekV4CSACache`
(`modular_deepseek_v4.py`; DeepSeek-V4 paper §2.3) — the last sliding_window - 1 keys,
the compressed entries emitted so far, the compressor's buffer of the open window's
projections and CSA's overlap state (the previous window's Ca series) — is held here in
fixed-shape buffers indexed by absolute position, like the MLA cache of
`models.deepseek`, so that `tf.while_loop` can carry it and a write at position p
overwrites slot p. That makes per-row positions (right-padded batches), padding garbage
past a row's prompt and rewinds to an earlier position (serving/chat.py) safe: whatever
a slot held before is rewritten before any query can see it.

One dict of tensors per layer (`init_layer_cache`), B = batch, S = max_length, D =
head_dim, m = the layer's compress rate, coff = 2 for CSA (overlapping windows), 1 for
HCA, c^I = index_head_dim, all in the model's compute dtype:

  every layer   "kv"            (B, S, D)              normalized, rotated shared key/value
                                                        of each position (kv_norm, RoPE)
  CSA / HCA     "comp_kv"       (B, S, coff*D)         compressor `kv_proj` of each position
                "comp_gate"     (B, S, coff*D)         compressor `gate_proj` of each position
                "entries"       (B, S // m + 1, D)     compressed entry of window w at slot w
  CSA           "index_kv"      (B, S, 2*c^I)          the indexer compressor's projections
                "index_gate"    (B, S, 2*c^I)
                "index_entries" (B, S // m + 1, c^I)   the indexer's compressed keys

"comp_*" are the carried compressor state: the tokens of a window not yet closed are
read back from them when it closes, and CSA's overlap (window w-1's Ca) as well. An
entry slot of a window not closed yet holds garbage; `ops.visible_compressed_count`
keeps it from every query that could see it, and the call that writes the window's last
token recomputes it before attending.

Memory per token of capacity S (numbers of the compute dtype): D (every layer), plus
2*coff*D + D/m in CSA / HCA layers, plus 4*c^I + c^I/m in CSA layers. The projections
are kept for every position, O(S), where a deployment (transformers, DeepSeek's
inference code) keeps only the open window's (O(m), bounded) and only the last
sliding_window - 1 keys; `models.deepseek_v4.memory_plan.plan` counts that bounded form.
The position-indexed form trades memory for the simple rewrite-at-p semantics above.
"""

from __future__ import annotations

import tensorflow as tf

from models.deepseek_v4.config import CSA, SLIDING, DeepSeekV4Config


def n_entry_slots(max_length, compress_rate: int):
    """Slots of an "entries" buffer: S // m + 1 (int or int32 scalar)."""
    return max_length // compress_rate + 1


def init_layer_cache(config: DeepSeekV4Config, layer_idx: int, batch_size, max_length,
                     dtype) -> dict:
    """Zeros for one layer (module docstring for the keys and shapes).

    Args:
      config: the model's DeepSeekV4Config.
      layer_idx: selects config.layer_types[layer_idx].
      batch_size, max_length: B and S (int or int32 scalar tensors).
      dtype: the compute dtype.
    """
    c = config
    layer_type = c.layer_types[layer_idx]
    cache = {"kv": tf.zeros([batch_size, max_length, c.head_dim], dtype)}
    if layer_type == SLIDING:
        return cache
    m = c.compress_rates[layer_type]
    slots = n_entry_slots(max_length, m)
    width = (2 if layer_type == CSA else 1) * c.head_dim
    cache["comp_kv"] = tf.zeros([batch_size, max_length, width], dtype)
    cache["comp_gate"] = tf.zeros([batch_size, max_length, width], dtype)
    cache["entries"] = tf.zeros([batch_size, slots, c.head_dim], dtype)
    if layer_type == CSA:
        cache["index_kv"] = tf.zeros([batch_size, max_length, 2 * c.index_head_dim], dtype)
        cache["index_gate"] = tf.zeros([batch_size, max_length, 2 * c.index_head_dim], dtype)
        cache["index_entries"] = tf.zeros([batch_size, slots, c.index_head_dim], dtype)
    return cache


def query_positions(cache_index, batch, seq):
    """(index int32 (B,), positions int32 (B, T) = index[b] + t) from a scalar or (B,) index."""
    index = tf.broadcast_to(tf.cast(cache_index, tf.int32), [batch])  # (B,)
    return index, index[:, None] + tf.range(seq)[None, :]  # (B,), (B, T)


def write_positions(buffer, values, positions):
    """buffer[b, positions[b, t]] = values[b, t]: a write at p overwrites slot p.

    Args:
      buffer: (B, S, W). values: (B, T, W). positions: int32 (B, T), each in [0, S).

    Returns:
      The updated buffer (B, S, W).

    Raises:
      InvalidArgumentError (at run time, on CPU): a position outside [0, S).
    """
    rows = tf.broadcast_to(tf.range(tf.shape(positions)[0])[:, None],
                           tf.shape(positions))  # (B, T)
    indices = tf.stack([rows, positions], axis=-1)  # (B, T, 2)
    return tf.tensor_scatter_nd_update(buffer, indices, tf.cast(values, buffer.dtype))


def write_slots_within(buffer, values, slots):
    """buffer[b, slots[b, j]] = values[b, j] for the slots < buffer.shape[1]; the others
    (windows past the capacity, which can never close) are dropped.

    Args: buffer (B, N, W); values (B, J, W); slots int32 (B, J), each >= 0.
    Returns: the updated buffer (B, N, W).
    """
    n_slots = tf.shape(buffer)[1]
    padded = tf.pad(buffer, [[0, 0], [0, 1], [0, 0]])  # (B, N + 1, W): a discard slot
    slots = tf.where(slots < n_slots, slots, n_slots)  # (B, J), past the end -> discard
    return write_positions(padded, values, slots)[:, :n_slots]  # (B, N, W)


def read_positions(buffer, positions):
    """(buffer[b, clip(positions[b, j])] (B, J, W), valid bool (B, J) = 0 <= position < S).

    Invalid positions read a clipped (finite, meaningless) slot: mask them.
    """
    length = tf.shape(buffer)[1]
    valid = (positions >= 0) & (positions < length)  # (B, J)
    values = tf.gather(buffer, tf.clip_by_value(positions, 0, length - 1),
                       batch_dims=1)  # (B, J, W)
    return values, valid


def update_compressed(compressor, kv_buffer, gate_buffer, entries, hidden_states, index):
    """Writes the new tokens' projections and re-pools every window they touch.

    transformers `DeepseekV4HCACache.store_compression_weights` /
    `update_compressor_states` and `DeepseekV4CSACache.update_overlap_state`, on
    position-indexed buffers: row b's T new tokens sit at positions index[b] .. index[b]
    + T - 1, in windows w_first = index[b] // m .. (index[b] + T - 1) // m. Those windows
    are pooled again (`KVCompressor.compress`) from the buffered projections of positions
    w_first*m .. and, with overlap (CSA), window w_first - 1's Ca series as the prior
    state (kv 0 / gate -inf before position 0, as the full path's window 0). Every row
    pools the same number of windows, J = ceil((T - 1) / m) + 1 (the most any row
    touches); a window past the ones a row's tokens close is not closed yet, so its
    entry is garbage that no query sees (module docstring).

    Args:
      compressor: a built KVCompressor (the attention's, or the indexer's).
      kv_buffer, gate_buffer: (B, S, coff*D), the projections of every position.
      entries: (B, S // m + 1, D), the entry slots.
      hidden_states: (B, T, C), the new tokens' attention input.
      index: int32 (B,), each row's first new position.

    Returns:
      (kv_buffer, gate_buffer, entries), updated, same shapes.
    """
    m = compressor.compress_rate
    seq = tf.shape(hidden_states)[1]
    positions = index[:, None] + tf.range(seq)[None, :]  # (B, T)
    kv_buffer = write_positions(kv_buffer, compressor.kv_proj(hidden_states), positions)
    gate_buffer = write_positions(gate_buffer, compressor.gate_proj(hidden_states), positions)

    first_window = index // m  # (B,)
    n_windows = (seq + m - 2) // m + 1  # J: ceil((T - 1) / m) + 1
    chunk = first_window[:, None] * m + tf.range(n_windows * m)[None, :]  # (B, J*m)
    chunk_kv, _ = read_positions(kv_buffer, chunk)  # (B, J*m, coff*D); past S: garbage
    chunk_gate, _ = read_positions(gate_buffer, chunk)
    prior_kv = prior_gate = None
    if compressor.overlap:
        dim = compressor.head_dim
        prior = (first_window[:, None] - 1) * m + tf.range(m)[None, :]  # (B, m)
        prev_kv, valid = read_positions(kv_buffer, prior)  # (B, m, 2D), valid (B, m)
        prev_gate, _ = read_positions(gate_buffer, prior)
        valid = valid[..., None]  # (B, m, 1)
        prior_kv = tf.where(valid, tf.cast(prev_kv[..., :dim], tf.float32), 0.0)  # (B, m, D)
        bias = tf.cast(compressor.position_bias, tf.float32)[:, :dim]  # (m, D), Ca's
        prior_gate = tf.where(valid, tf.cast(prev_gate[..., :dim], tf.float32) + bias,
                              float("-inf"))  # (B, m, D), gate + bias as `pool_windows` takes
    pooled = compressor.compress(chunk_kv, chunk_gate, first_window * m, prior_kv,
                                 prior_gate)  # (B, J, D)
    slots = first_window[:, None] + tf.range(n_windows)[None, :]  # (B, J)
    return kv_buffer, gate_buffer, write_slots_within(entries, pooled, slots)
