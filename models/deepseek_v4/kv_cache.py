"""DeepSeek-V4's KV cache, bounded: rings for the window and the compressors' open windows.

The state DeepSeek's inference code (`inference/model.py`: `Attention.kv_cache`, a ring of
the last `window` keys; `Compressor.kv_state` / `score_state`, the open window's rows) and
vLLM keep, and transformers 5.24 keeps in `DeepseekV4HCACache` / `DeepseekV4CSACache`
(DeepSeek-V4 paper §2.3): the last sliding_window keys, the compressed entries emitted so
far, and the compressors' projections of the tokens of the windows not pooled for good
(the open window, and for CSA the previous one, whose Ca series is the overlap's prior).
Everything but the entries is a ring of fixed size: position p sits in slot p % R. The
entries are indexed by window (slot w holds window w), one per m tokens: the only part
that grows with the context.

One dict of tensors per layer (`init_layer_cache`), B = batch, S = the most positions it
holds, W = sliding_window, D = head_dim, m = the layer's compress rate, coff = 2 for CSA
(overlapping windows), 1 for HCA, c^I = index_head_dim:

  every layer   "kv"            (B, W, D)              ring: normalized, rotated shared
                                                        key/value (kv_norm, RoPE); compute dtype
  CSA / HCA     "comp_kv"       (B, coff*m, coff*D)    ring: compressor `kv_proj`, float32
                "comp_gate"     (B, coff*m, coff*D)    ring: compressor `gate_proj`, float32
                "entries"       (B, S // m + 1, D)     compressed entry of window w at slot w
  CSA           "index_kv"      (B, 2*m, 2*c^I)        ring: the indexer compressor's
                "index_gate"    (B, 2*m, 2*c^I)          projections, float32
                "index_entries" (B, S // m + 1, c^I)   the indexer's compressed keys

`memory_plan.kv_cache_items` counts the same items (a test holds them equal), up to the
entries' one extra slot (the open window's).

The contract (`DeepSeekV4CausalLM.call_with_cache`): a call appends the new tokens of
row b at positions index[b] .. index[b] + T - 1, and only its first lengths[b] of them
are kept (the rest are a right-padded batch's padding: attended by no later query). A
ring holds the R positions before a row's next index; a call must start where the last
one's kept tokens ended. An earlier index (a rewind) would read slots that later
positions overwrote, so a caller that rewinds starts a new cache (serving/chat.py).
An entry slot is written once, by the call whose kept tokens close its window (that call
pools the whole window from the ring before attending); before that it holds zeros, and
`ops.visible_compressed_count` keeps it from every query. So a decode step writes the
entries only when it closes a window, once per m tokens: in place (`in_place=True`, a
caller that owns its cache: `cache_buffers`), one row; else into a copy of them.
"""

from __future__ import annotations

import tensorflow as tf

from models.deepseek_v4.config import CSA, SLIDING, DeepSeekV4Config
from models.layers.cache_buffers import write_rows, zeros_buffer


def n_entry_slots(max_length, compress_rate: int):
    """Slots of an "entries" buffer: S // m + 1 (int or int32 scalar)."""
    return max_length // compress_rate + 1


def init_layer_cache(config: DeepSeekV4Config, layer_idx: int, batch_size, max_length,
                     dtype) -> dict:
    """Zeros for one layer (module docstring for the keys, shapes and dtypes).

    Args:
      config: the model's DeepSeekV4Config.
      layer_idx: selects config.layer_types[layer_idx].
      batch_size, max_length: B and S (int or int32 scalar tensors).
      dtype: the compute dtype (the window ring and the entries; the compressors' rings
        are float32, as DeepSeek's inference keeps its compressor state).
    """
    c = config
    layer_type = c.layer_types[layer_idx]
    cache = {"kv": tf.zeros([batch_size, c.sliding_window, c.head_dim], dtype)}
    if layer_type == SLIDING:
        return cache
    m = c.compress_rates[layer_type]
    slots = n_entry_slots(max_length, m)
    coff = 2 if layer_type == CSA else 1
    cache["comp_kv"] = tf.zeros([batch_size, coff * m, coff * c.head_dim], tf.float32)
    cache["comp_gate"] = tf.zeros([batch_size, coff * m, coff * c.head_dim], tf.float32)
    # The entries may be written in place (`update_compressed`): a new buffer every run.
    cache["entries"] = zeros_buffer([batch_size, slots, c.head_dim], dtype)
    if layer_type == CSA:
        cache["index_kv"] = tf.zeros([batch_size, 2 * m, 2 * c.index_head_dim], tf.float32)
        cache["index_gate"] = tf.zeros([batch_size, 2 * m, 2 * c.index_head_dim], tf.float32)
        cache["index_entries"] = zeros_buffer([batch_size, slots, c.index_head_dim], dtype)
    return cache


def query_positions(cache_index, batch, seq):
    """(index int32 (B,), positions int32 (B, T) = index[b] + t) from a scalar or (B,) index."""
    index = tf.broadcast_to(tf.cast(cache_index, tf.int32), [batch])  # (B,)
    return index, index[:, None] + tf.range(seq)[None, :]  # (B,), (B, T)


def _write_kept(buffer, values, slots, keep, in_place: bool = False):
    """buffer[b, slots[b, j]] = values[b, j] where keep[b, j] (`cache_buffers.write_rows`:
    in place, or one new buffer). buffer (B, N, W); values (B, J, W); slots int32 (B, J),
    no two kept equal in a row; keep bool (B, J)."""
    kept = tf.where(keep)  # (K, 2) int64: (b, j) of each kept value
    return write_rows(buffer, kept[:, 0], tf.gather_nd(slots, kept),
                      tf.gather_nd(values, kept), in_place)  # (B, N, W)


def read_ring(ring, index, count: int):
    """The `count` positions before each row's index, oldest first, from a ring (slot
    p % R holds position p).

    Args:
      ring: (B, R, W). index: int32 (B,). count: how many positions, <= R.

    Returns:
      values (B, count, W): positions index[b] - count .. index[b] - 1. A negative
      position's row holds zeros or garbage: the callers mask it by position.
    """
    size = tf.shape(ring)[1]
    positions = index[:, None] - count + tf.range(count)[None, :]  # (B, count)
    return tf.gather(ring, tf.math.floormod(positions, size), batch_dims=1)  # (B, count, W)


def write_ring(ring, values, index, lengths):
    """Keeps each row's first lengths[b] new values in the ring (slot p % R for position p).

    Args:
      ring: (B, R, W). values: (B, T, W), the rows' positions index[b] .. index[b] + T - 1.
      index: int32 (B,). lengths: int32 (B,), each in [0, T]: values past them are padding.

    Returns:
      The ring (B, R, W) after the kept values: only their last R are written, so no two
      writes of a call meet in one slot.
    """
    size = tf.shape(ring)[1]
    t = tf.range(tf.shape(values)[1])[None, :]  # (1, T)
    keep = (t < lengths[:, None]) & (t >= lengths[:, None] - size)  # (B, T)
    slots = tf.math.floormod(index[:, None] + t, size)  # (B, T)
    return _write_kept(ring, values, slots, keep)


def update_compressed(compressor, kv_ring, gate_ring, entries, hidden_states, index, lengths,
                      in_place: bool = False):
    """Pools every window the new tokens touch, then keeps their projections in the rings.

    transformers `DeepseekV4HCACache.store_compression_weights` /
    `update_compressor_states` and `DeepseekV4CSACache.update_overlap_state`, DeepSeek's
    `Compressor.forward` with `kv_state` / `score_state`: row b's T new tokens sit at
    positions index[b] .. index[b] + T - 1, in windows w_first = index[b] // m ..
    (index[b] + T - 1) // m. Those windows are pooled (`KVCompressor.compress`) from the
    ring's projections of positions w_first*m .. index[b] - 1 followed by the new ones,
    and, with overlap (CSA), window w_first - 1's Ca series (in the ring too) as the prior
    state (kv 0 / gate -inf before position 0, as the full path's window 0). Every row
    pools the same number of windows, J = ceil((T - 1) / m) + 1 (the most any row
    touches); only the windows the kept tokens close are written to their slots (a call
    that closes none leaves `entries` as they are); an open one is pooled again when a
    later call closes it (module docstring).

    Args:
      compressor: a built KVCompressor (the attention's, or the indexer's).
      kv_ring, gate_ring: float32 (B, R, coff*D), R = coff*m: the projections of each
        row's last R positions (m + index % m <= R of them are read).
      entries: (B, S // m + 1, D), the entry slots.
      hidden_states: (B, T, C), the new tokens' attention input.
      index: int32 (B,), each row's first new position.
      lengths: int32 (B,), the new tokens each row keeps (`write_ring`).
      in_place: write the closed windows into `entries`' own buffer
        (`cache_buffers.write_rows`; the caller must not use `entries` again except as
        the returned tensor), else into a copy. The rings (O(m) rows) are always copied.

    Returns:
      (kv_ring, gate_ring, entries), updated, same shapes.
    """
    m = compressor.compress_rate
    ring = m * (2 if compressor.overlap else 1)  # R = coff*m, the rings' size
    seq = tf.shape(hidden_states)[1]
    new_kv = compressor.kv_proj(hidden_states)  # (B, T, coff*D)
    new_gate = compressor.gate_proj(hidden_states)
    old_kv = read_ring(kv_ring, index, ring)  # (B, R, coff*D): index - R .. index - 1
    old_gate = read_ring(gate_ring, index, ring)
    local_kv = tf.concat([tf.cast(old_kv, new_kv.dtype), new_kv], axis=1)  # (B, R + T, .)
    local_gate = tf.concat([tf.cast(old_gate, new_gate.dtype), new_gate], axis=1)

    first_window = index // m  # (B,)
    n_windows = (seq + m - 2) // m + 1  # J: ceil((T - 1) / m) + 1
    start = ring - index % m  # (B,) where position w_first*m sits in local_*
    chunk = start[:, None] + tf.range(n_windows * m)[None, :]  # (B, J*m)
    chunk = tf.minimum(chunk, ring + seq - 1)  # past the new tokens: garbage, not closed
    chunk_kv = tf.gather(local_kv, chunk, batch_dims=1)  # (B, J*m, coff*D)
    chunk_gate = tf.gather(local_gate, chunk, batch_dims=1)
    prior_kv = prior_gate = None
    if compressor.overlap:  # R = 2m: window w_first - 1 is in the ring
        dim = compressor.head_dim
        prior = start[:, None] - m + tf.range(m)[None, :]  # (B, m), >= 0
        valid = (first_window >= 1)[:, None, None]  # (B, 1, 1): position >= 0
        prev_kv = tf.gather(local_kv, prior, batch_dims=1)  # (B, m, 2D)
        prev_gate = tf.gather(local_gate, prior, batch_dims=1)
        prior_kv = tf.where(valid, tf.cast(prev_kv[..., :dim], tf.float32), 0.0)  # (B, m, D)
        bias = tf.cast(compressor.position_bias, tf.float32)[:, :dim]  # (m, D), Ca's
        prior_gate = tf.where(valid, tf.cast(prev_gate[..., :dim], tf.float32) + bias,
                              float("-inf"))  # (B, m, D), gate + bias as `pool_windows` takes
    pooled = compressor.compress(chunk_kv, chunk_gate, first_window * m, prior_kv,
                                 prior_gate)  # (B, J, D)
    slots = first_window[:, None] + tf.range(n_windows)[None, :]  # (B, J)
    # Only the windows the kept tokens close are written (an open one is pooled again from
    # the ring when it closes, and no query sees it before): most decode steps close none
    # and leave the entries as they are, instead of copying them (O(context) per step).
    closed = (slots + 1) * m <= (index + lengths)[:, None]  # (B, J)
    keep = closed & (slots < tf.shape(entries)[1])
    entries = tf.cond(tf.reduce_any(keep),
                      lambda: _write_kept(entries, pooled, slots, keep, in_place),
                      lambda: tf.identity(entries))
    return (write_ring(kv_ring, new_kv, index, lengths),
            write_ring(gate_ring, new_gate, index, lengths), entries)
