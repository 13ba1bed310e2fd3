"""Batched autoregressive generation as pure TensorFlow (tf.while_loop, fixed-size buffers).

Usable eagerly or inside a `tf.function` (e.g. a serving signature): the output
buffer has its final size from the start, and the loop stops early once every
row has finished. The control flow is explicit (tf.while_loop, tf.cond), so
`generate` is marked `do_not_convert`: a calling tf.function does not transpile it
and the model code under it with autograph.

One batch holds prompts of different lengths, right-padded: row b's prompt is
input_ids[b, :prompt_lengths[b]] and its new tokens follow it in place, so
every row sits at its own absolute positions (RoPE and cache slots) exactly as
if it ran alone. A query at position p attends the slots <= p of its own row,
so the padding after a prompt is never attended: the next token overwrites it
before any real query reaches it. Each row also has its own stop (its first
`stop_token_id`, or its own max_new_tokens), its own sampling knobs and its own
seed stream, so a row's tokens do not depend on its batch-mates (up to float32
rounding of sums over the padded width, which never flips a greedy choice
unless two logits tie within it).

Decoding: greedy when temperature == 0, else sampling from
softmax(logits / temperature) restricted to the top_k most likely tokens
(top_k > 0) and to the smallest set whose probability reaches top_p (nucleus
sampling, Holtzman et al. 2019, arXiv 1904.09751). Row b at step t draws one
uniform u from `tf.random.stateless_uniform(seed=(seed_b, t))` and takes the
first token whose cumulative probability exceeds u (inverse-CDF sampling), so a
seed makes a row's results reproducible whatever else is in the batch.
"""

import tensorflow as tf

_INT32_MAX = 2**31 - 1
# Prompt tokens per cached prefill call: a longer prompt runs through the cache in chunks
# of this many, so a call's attention scores are (chunk, keys), never (P, P).
PREFILL_CHUNK = 1024


@tf.autograph.experimental.do_not_convert
def generate(model, input_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             seed=None, stop_token_id=None, use_cache=True, prompt_lengths=None, absorb=True,
             prefill_chunk=PREFILL_CHUNK):
    """Extends each prompt by up to its `max_new_tokens` tokens.

    Every knob may be a scalar (all rows) or a (B,) vector (one value per row).

    Args:
      model: a DeepSeekCausalLM (anything with `config`, `__call__`,
        `init_cache`, `call_with_cache`).
      input_ids: int32 tensor (B, P), the prompts, right-padded (with any id).
      max_new_tokens: int or int32 tensor, scalar or (B,), each >= 1.
      temperature: float or float32 tensor, scalar or (B,); 0 = greedy (argmax).
      top_k: int or int32 tensor, scalar or (B,); 0 = no top-k filter.
      top_p: float or float32 tensor, scalar or (B,), in (0, 1]; 1.0 = no filter.
      seed: int or int32 tensor, scalar or (B,): row b samples step t with the
        stateless seed (seed_b, t). None = a random seed per row and call.
      stop_token_id: int or None. A row that emits it is finished.
      use_cache: decode with the latent KV cache (one token per step). Requires
        prompt_lengths[b] + max_new_tokens[b] <= config.max_position_embeddings
        in every row. Without the cache every step re-runs the model on each
        row's last max_position_embeddings tokens (a sliding window), so any
        length works, at a much higher cost.
      prompt_lengths: int32 (B,), each in [1, P]; None = every row is P long.
      absorb: cached decoding attends in MLA's latent space (see
        `MultiHeadLatentAttention`); False re-expands the cache every step.
      prefill_chunk: with the cache, prompts longer than this run through it in chunks
        of this many tokens (`tf.while_loop`; the last chunk padded), so no call holds
        (P, P) attention scores; a prompt of at most this many runs in one call.

    Returns:
      (tokens, lengths):
        tokens: int32 (B, P' + N), P' = max(prompt_lengths), N =
          max(max_new_tokens): row b holds its prompt then its generated tokens
          (up to and including its first stop token), then stop_token_id (0 if
          stop_token_id is None) up to the end;
        lengths: int32 (B,), prompt_lengths[b] + the number of tokens row b
          generated (prompt_lengths[b] + max_new_tokens[b] if it never stopped).

    Raises:
      ValueError: if a static max_new_tokens < 1, or if use_cache and the
        static P + max_new_tokens exceeds max_position_embeddings.
      InvalidArgumentError (at run time): the same checks on tensors, a prompt
        length outside [1, P], or a (B,) knob of another length than B.
    """
    input_ids = tf.cast(input_ids, tf.int32)
    batch = tf.shape(input_ids)[0]
    input_ids, prompt_lengths = _prompts(input_ids, prompt_lengths)  # (B, P'), (B,)
    new_tokens = _max_new_tokens(max_new_tokens, batch)  # (B,)
    ends = prompt_lengths + new_tokens  # (B,) the length of each finished row
    max_positions = model.config.max_position_embeddings
    if use_cache:
        _check_context(input_ids, max_new_tokens, ends, max_positions)
    pad_id = 0 if stop_token_id is None else stop_token_id
    most_new = (max_new_tokens if isinstance(max_new_tokens, int)
                else tf.reduce_max(tf.concat([new_tokens, [1]], axis=0)))  # 1 if B = 0
    tokens = tf.concat([input_ids, tf.fill([batch, most_new], pad_id)], axis=1)  # (B, P' + N)
    width = tf.shape(tokens)[1]
    columns = tf.range(width)[None, :]  # (1, P' + N)
    seeds = _row_seeds(seed, batch)  # (B,)

    if use_cache:
        cache_len = tf.reduce_max(tf.concat([ends, [1]], axis=0))  # 1 if B = 0
        logits, cache = _prefill(model, input_ids, prompt_lengths, cache_len, prefill_chunk,
                                 absorb)  # (B, V), the prompts in the cache
    else:
        cache = tf.zeros([0])  # unused loop variable
        logits = _window_logits(model, tokens, prompt_lengths, max_positions)  # (B, V)

    tokens, lengths = _decode(
        model, tokens, cache, logits, prompt_lengths, new_tokens, (temperature, top_k, top_p, seeds),
        stop_token_id, pad_id, cache_len if use_cache else None, absorb)  # (B, P' + N), (B,)
    return tf.where(columns < lengths[:, None], tokens, pad_id), lengths


def _decode(model, tokens, cache, logits, prompt_lengths, new_tokens, sampling, stop_token_id,
            pad_id, cache_len, absorb):
    """`generate`'s decoding loop: one token per unfinished row and step (`tf.while_loop`),
    until every row has emitted `stop_token_id` or its `new_tokens`.

    Args:
      model: as in `generate`.
      tokens: int32 (B, P' + N), the prompts, each followed by `pad_id` to the end.
      cache: the prompts' cache (`_prefill`), or any tensor when `cache_len` is None.
      logits: float32 (B, V), the scores of each row's first new token.
      prompt_lengths, new_tokens: int32 (B,).
      sampling: (temperature, top_k, top_p, seeds (B,)), as in `generate`.
      stop_token_id, pad_id: as in `generate`; pad_id fills finished rows.
      cache_len: the cache's positions; None = no cache (each step re-runs the model on
        each row's last max_position_embeddings tokens).
      absorb: as in `generate`.

    Returns:
      (tokens int32 (B, P' + N) with the new tokens written after each prompt,
       lengths int32 (B,): prompt + new tokens, up to and including a stop token).
    """
    temperature, top_k, top_p, seeds = sampling
    max_positions = model.config.max_position_embeddings
    columns = tf.range(tf.shape(tokens)[1])[None, :]  # (1, P' + N)

    def cond(step, tokens, cache, logits, finished, lengths):
        return tf.logical_not(tf.reduce_all(finished))

    def body(step, tokens, cache, logits, finished, lengths):
        positions = prompt_lengths + step  # (B,) where this step's token goes
        active = tf.logical_not(finished)  # (B,)
        next_token = _choose(logits, temperature, top_k, top_p, seeds, step)  # (B,)
        next_token = tf.where(active, next_token, pad_id)
        if stop_token_id is not None:
            stopped = tf.logical_and(active, tf.equal(next_token, stop_token_id))  # (B,)
            lengths = tf.where(stopped, positions + 1, lengths)
            finished = tf.logical_or(finished, stopped)
        finished = tf.logical_or(finished, step + 1 >= new_tokens)
        write = tf.logical_and(tf.equal(columns, positions[:, None]), active[:, None])
        tokens = tf.where(write, next_token[:, None], tokens)  # (B, P' + N)
        # Logits for the following step (computed, unused, after the last one).
        if cache_len is not None:
            index = tf.minimum(positions, cache_len - 1)  # finished rows may run past their end
            step_logits, cache = model.call_with_cache(next_token[:, None], cache, index,
                                                       absorb=absorb, in_place=True)  # (B, 1, V)
            logits = step_logits[:, -1]  # (B, V)
        else:
            logits = _window_logits(model, tokens, positions + 1, max_positions)  # (B, V)
        return step + 1, tokens, cache, logits, finished, lengths

    finished = tf.zeros([tf.shape(tokens)[0]], tf.bool)  # (B,)
    _, tokens, _, _, _, lengths = tf.while_loop(
        cond, body, (tf.constant(0), tokens, cache, logits, finished, prompt_lengths + new_tokens))
    return tokens, lengths


def next_token(logits, temperature=0.0, top_k=0, top_p=1.0, seed=0, step=0):
    """One decoding step of `generate`'s rule, for callers that run their own loop.

    Row b of `generate` with seed s_b chooses its t-th new token (t from 0) as
    `next_token(logits, ..., seed=s_b, step=t)` does, so a loop that calls this
    once per token reproduces `generate` token for token (e.g. streaming chat).

    Args:
      logits: float tensor (B, V), the scores of the next token.
      temperature, top_k, top_p: scalars or (B,) vectors, as in `generate`.
      seed: int or int32 tensor, scalar or (B,); the stateless seed is (seed_b, step).
      step: int or int32 scalar, the index of this new token in its continuation.

    Returns:
      int32 (B,), the chosen token of each row.
    """
    seeds = tf.broadcast_to(tf.cast(seed, tf.int32), [tf.shape(logits)[0]])  # (B,)
    return _choose(logits, temperature, top_k, top_p, seeds, tf.cast(step, tf.int32))


def _prompts(input_ids, prompt_lengths):
    """(input_ids cropped to the longest prompt (B, P'), prompt lengths int32 (B,))."""
    batch, width = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    if prompt_lengths is None:
        return input_ids, tf.fill([batch], width)
    prompt_lengths = tf.broadcast_to(tf.cast(prompt_lengths, tf.int32), [batch])
    tf.debugging.assert_greater_equal(prompt_lengths, 1, message="prompt_lengths must be >= 1")
    tf.debugging.assert_less_equal(prompt_lengths, width,
                                   message="prompt_lengths must be <= input_ids.shape[1]")
    input_ids = input_ids[:, : tf.reduce_max(prompt_lengths)]  # (B, P')
    padding = tf.range(tf.shape(input_ids)[1])[None, :] >= prompt_lengths[:, None]  # (B, P')
    return tf.where(padding, 0, input_ids), prompt_lengths  # any padding id is fine


def _prefill(model, input_ids, prompt_lengths, cache_len, chunk: int, absorb):
    """The prompts through a new cache: (logits after each prompt float32 (B, V), cache).

    One `call_with_cache` when P' <= chunk is known statically; else chunks of
    min(chunk, P') tokens at positions 0, chunk, 2*chunk, ... (input_ids padded to a whole
    chunk; a P' <= chunk known only at run time is one chunk, not padded). Each
    call keeps only the rows' prompt tokens (`lengths`), and a row whose prompt has ended
    stays at its length, so a bounded cache (V4) never holds padding; the cache holds
    max(cache_len, the padded length) positions.
    """
    batch, width = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    static_width = input_ids.shape[1]
    if static_width is not None and static_width <= chunk:
        cache = model.init_cache(batch, cache_len)
        logits, cache = model.call_with_cache(input_ids, cache, 0, absorb=absorb,
                                              lengths=prompt_lengths, in_place=True)
        return tf.gather(logits, prompt_lengths - 1, batch_dims=1), cache  # (B, V)
    chunk = tf.maximum(tf.minimum(chunk, width), 1)  # a short prompt of unknown width: one
    # call, unpadded (no prompts, width 0: no call)
    n_chunks = (width + chunk - 1) // chunk
    padded = tf.pad(input_ids, [[0, 0], [0, n_chunks * chunk - width]])  # (B, n*chunk)
    cache = model.init_cache(batch, tf.maximum(cache_len, n_chunks * chunk))
    last = prompt_lengths - 1  # (B,) the position whose logits start the decoding

    def body(i, cache, logits):
        start = i * chunk
        ids = tf.slice(padded, [0, start], [batch, chunk])  # (B, chunk)
        index = tf.minimum(start, prompt_lengths)  # (B,) a finished prompt stays put
        kept = tf.clip_by_value(prompt_lengths - start, 0, chunk)  # (B,)
        chunk_logits, cache = model.call_with_cache(ids, cache, index, absorb=absorb,
                                                    lengths=kept, in_place=True)
        inside = (last >= start) & (last < start + chunk)  # (B,)
        here = tf.gather(chunk_logits, tf.clip_by_value(last - start, 0, chunk - 1),
                         batch_dims=1)  # (B, V)
        return i + 1, cache, tf.where(inside[:, None], here, logits)

    logits = tf.zeros([batch, model.config.vocab_size], tf.float32)
    _, cache, logits = tf.while_loop(lambda i, *_: i < n_chunks, body,
                                     (tf.constant(0), cache, logits))
    return logits, cache


def _max_new_tokens(max_new_tokens, batch):
    """max_new_tokens as int32 (B,), checked >= 1 (ValueError if static, else at run time)."""
    if isinstance(max_new_tokens, int):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    else:
        tf.debugging.assert_greater_equal(tf.cast(max_new_tokens, tf.int32), 1,
                                          message="max_new_tokens must be >= 1")
    return tf.broadcast_to(tf.cast(max_new_tokens, tf.int32), [batch])


def _check_context(input_ids, max_new_tokens, ends, max_positions):
    """Cached decoding: every row's prompt + new tokens within max_position_embeddings."""
    static_len = input_ids.shape[1]
    if (static_len is not None and isinstance(max_new_tokens, int)
            and static_len + max_new_tokens > max_positions):
        raise ValueError(
            f"prompt length {static_len} + max_new_tokens {max_new_tokens} exceeds "
            f"max_position_embeddings={max_positions}; use use_cache=False for a "
            "sliding window")
    tf.debugging.assert_less_equal(
        tf.reduce_max(ends), max_positions,
        message="prompt + max_new_tokens exceeds max_position_embeddings (cached mode)")


def _row_seeds(seed, batch):
    """Per-row seeds, int32 (B,): the given scalar or vector, or random ones."""
    if seed is None:
        return tf.random.uniform([batch], 0, _INT32_MAX, dtype=tf.int32)
    return tf.broadcast_to(tf.cast(seed, tf.int32), [batch])


def _window_logits(model, tokens, ends, max_positions):
    """Logits after tokens[b, :ends[b]], from each row's last max_positions tokens.

    Args: tokens int32 (B, W); ends int32 (B,), each in [1, W].
    Returns: float32 (B, V).
    """
    longest = tf.reduce_max(tf.concat([ends, [1]], axis=0))  # 1 if B = 0
    window = tf.minimum(longest, max_positions)  # one width for all rows
    starts = tf.maximum(ends - window, 0)  # (B,)
    columns = starts[:, None] + tf.range(window)[None, :]  # (B, window), all < W
    logits = model(tf.gather(tokens, columns, batch_dims=1), training=False)  # (B, window, V)
    # Causal attention: a row shorter than the window is not affected by what follows it.
    return tf.gather(logits, ends - starts - 1, batch_dims=1)  # (B, V)


def _choose(logits, temperature, top_k, top_p, seeds, step):
    """One token per row from logits (B, V) -> int32 (B,); see the module docstring."""
    logits = tf.cast(logits, tf.float32)
    greedy = tf.argmax(logits, axis=-1, output_type=tf.int32)  # (B,)
    if isinstance(temperature, (int, float)) and temperature == 0:
        return greedy

    batch = tf.shape(logits)[0]
    temperature = tf.broadcast_to(tf.cast(temperature, tf.float32), [batch])  # (B,)

    def sample():
        scaled = logits / tf.where(temperature > 0, temperature, 1.0)[:, None]  # (B, V)
        sampled = _sample(_filter(scaled, top_k, top_p), seeds, step)
        return tf.where(temperature > 0, sampled, greedy)

    # A batch of greedy rows (e.g. a server's batch of greedy requests) skips the
    # sort, softmax and draws of sampling altogether.
    return tf.cond(tf.reduce_any(temperature > 0), sample, lambda: greedy)


def _filter(logits, top_k, top_p):
    """Sets to -inf the logits outside each row's top_k and top_p sets; (B, V) -> (B, V).

    top_k, top_p: scalars or (B,) vectors; top_k <= 0 and top_p >= 1 keep everything.
    One sort serves both: the k-th largest value is gathered per row (so k may
    differ between rows), and the nucleus is cut on the top-k-filtered sort.
    """
    no_top_k = isinstance(top_k, int) and top_k == 0
    no_top_p = isinstance(top_p, (int, float)) and top_p >= 1.0
    if no_top_k and no_top_p:
        return logits
    batch, vocab = tf.shape(logits)[0], tf.shape(logits)[1]
    sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")  # (B, V)
    if not no_top_k:
        k = tf.broadcast_to(tf.cast(top_k, tf.int32), [batch])  # (B,)
        k = tf.where(k > 0, tf.minimum(k, vocab), vocab)
        kth_largest = tf.gather(sorted_logits, k - 1, batch_dims=1)[:, None]  # (B, 1)
        logits = tf.where(logits < kth_largest, float("-inf"), logits)
        sorted_logits = tf.where(sorted_logits < kth_largest, float("-inf"), sorted_logits)
    if not no_top_p:
        top_p = tf.broadcast_to(tf.cast(top_p, tf.float32), [batch])[:, None]  # (B, 1)
        mass_before = tf.cumsum(tf.nn.softmax(sorted_logits, axis=-1), axis=-1,
                                exclusive=True)  # (B, V)
        kept = tf.where(mass_before < top_p, sorted_logits, float("inf"))  # (B, V)
        threshold = tf.minimum(tf.reduce_min(kept, axis=-1, keepdims=True),
                               sorted_logits[:, :1])  # (B, 1), the best token is always kept
        filtered = tf.where(logits < threshold, float("-inf"), logits)
        logits = tf.where(top_p >= 1.0, logits, filtered)
    return logits


def _sample(logits, seeds, step):
    """Inverse-CDF sampling: row b takes the first token whose cumulative probability
    exceeds u_b * total, u_b = stateless_uniform(seed=(seeds[b], step)).

    Args: logits float32 (B, V) (-inf = excluded); seeds int32 (B,); step int32 scalar,
      or (B,) (the serving engine's rows are at different steps).
    Returns: int32 (B,); a token of probability 0 is never chosen (its cumulative
      probability equals its predecessor's).
    """
    steps = tf.broadcast_to(tf.cast(step, tf.int32), tf.shape(seeds))  # (B,)
    u = tf.map_fn(lambda pair: tf.random.stateless_uniform([], pair),
                  tf.stack([seeds, steps], axis=1),
                  fn_output_signature=tf.float32)  # (B,) one draw per row, batch-independent
    cdf = tf.cumsum(tf.nn.softmax(logits, axis=-1), axis=-1)  # (B, V)
    target = u[:, None] * cdf[:, -1:]  # (B, 1), below the total
    token = tf.reduce_sum(tf.cast(cdf <= target, tf.int32), axis=-1)  # (B,) first cdf > target
    return tf.minimum(token, tf.shape(logits)[1] - 1)
