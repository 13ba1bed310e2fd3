"""The two graph steps of a serving engine (iteration-level scheduling): `prefill_rows`
puts new prompts into a cache of their own and samples their first tokens, and
`decode_rows` advances every running row by one token. Between steps the caller owns the
rows' caches and may add rows to them (concatenate along the batch axis) or take rows out
(gather), so a request joins and leaves at any step instead of waiting for a batch to end:
the scheduling of Orca (Yu et al., OSDI 2022) and vLLM, with JetStream's split into
`prefill`/`insert` and `generate` over a pool of decode slots
(`serving/engine.py` is the host side).

Both steps choose tokens as `generation.generate` does, in the graph: row b's t-th new
token (t from 0; `prefill_rows` chooses t = 0) is `generate`'s rule (greedy at temperature
0, else top-k / top-p sampling with the stateless seed (seed_b, t)) applied to its logits,
so a row decodes the tokens `generate` gives it, whatever its batch-mates. Before the rule,
each row's logits get its own constraints (`constrain_logits`): an allowed-token bitmask
(grammar-constrained decoding: JSON output, forced tool calls) and OpenAI's `logit_bias`.
Only the chosen tokens leave the graph, never (rows, vocab) logits.
"""

from __future__ import annotations

import tensorflow as tf

from models.deepseek.generation import PREFILL_CHUNK, _choose, _prefill


def constrain_logits(logits, bitmask, bias_ids, bias_values):
    """Each row's logits with its logit_bias added and its disallowed tokens at -inf.

    Args:
      logits: float32 (B, V).
      bitmask: int32 (B, W) with W = ceil(V / 32): bit v % 32 of word v // 32 set = token
        v allowed (llguidance's and vLLM's layout); W = 0 = every token allowed. A row of
        all-ones words allows every token.
      bias_ids: int32 (B, K) token ids (-1 = no entry), K >= 0.
      bias_values: float32 (B, K), added to logits[b, bias_ids[b, k]] (OpenAI's
        `logit_bias`, -100..100).

    Returns:
      float32 (B, V).
    """
    logits = tf.cast(logits, tf.float32)
    vocab = tf.shape(logits)[1]
    entries = tf.where(bias_ids >= 0)  # (N, 2) int64: (row, k) of each real entry
    rows = tf.cast(entries[:, 0], tf.int32)  # (N,)
    tokens = tf.gather_nd(bias_ids, entries)  # (N,)
    inside = tokens < vocab  # ids past the vocabulary are ignored
    logits = tf.tensor_scatter_nd_add(
        logits, tf.stack([tf.boolean_mask(rows, inside), tf.boolean_mask(tokens, inside)], 1),
        tf.boolean_mask(tf.gather_nd(bias_values, entries), inside))  # (B, V)

    def masked():
        ids = tf.range(vocab)  # (V,)
        words = tf.gather(bitmask, ids // 32, axis=1)  # (B, V) each token's word
        allowed = tf.bitwise.bitwise_and(tf.bitwise.right_shift(words, ids % 32), 1) > 0
        return tf.where(allowed, logits, float("-inf"))  # (B, V)

    return tf.cond(tf.shape(bitmask)[1] > 0, masked, lambda: logits)


def prefill_rows(model, input_ids, prompt_lengths, cache_len, sampling, constraints):
    """New prompts into a new cache, and each row's first token.

    Args:
      model: a DeepSeekCausalLM or DeepSeekV4CausalLM.
      input_ids: int32 (B, P), the prompts, right-padded (any id).
      prompt_lengths: int32 (B,), each in [1, P].
      cache_len: int32 scalar, the positions the cache holds (every row's prompt + new
        tokens must fit). A multiple of `PREFILL_CHUNK` when P > PREFILL_CHUNK, so the
        chunked prefill leaves the cache at cache_len (`generation._prefill`).
      sampling: (temperature float32 (B,), top_k int32 (B,), top_p float32 (B,), seed
        int32 (B,)), as in `generate`.
      constraints: (bitmask, bias_ids, bias_values), see `constrain_logits`.

    Returns:
      (tokens int32 (B,): each row's first new token (its step 0); the cache, as
       `model.init_cache(B, cache_len)`: the prompts at positions [0, prompt_lengths)).
    """
    temperature, top_k, top_p, seed = sampling
    logits, cache = _prefill(model, input_ids, prompt_lengths, cache_len, PREFILL_CHUNK,
                             absorb=True)  # (B, V), the prompts in the cache
    logits = constrain_logits(logits, *constraints)
    token = _choose(logits, temperature, top_k, top_p, seed, tf.zeros_like(seed))  # (B,)
    return token, cache


def decode_rows(model, tokens, positions, cache, sampling, steps, constraints):
    """One decoding step of every row: feed each row's last token, choose its next.

    Args:
      model: as in `prefill_rows`.
      tokens: int32 (B,), each row's newest token (not yet in the cache).
      positions: int32 (B,), its position (the tokens already in row b's cache).
      cache: the rows' cache (`prefill_rows`'s, rows concatenated or gathered along
        axis 0). Written in place: the caller must use only the returned cache after.
      sampling: as in `prefill_rows`.
      steps: int32 (B,), the index of the token to choose in each row's continuation
        (1 for the token after the first).
      constraints: as in `prefill_rows`.

    Returns:
      (next tokens int32 (B,), the cache with `tokens` at `positions`).

    Raises:
      InvalidArgumentError (at run time): a position outside the cache.
    """
    temperature, top_k, top_p, seed = sampling
    logits, cache = model.call_with_cache(tokens[:, None], cache, positions, absorb=True,
                                          in_place=True)  # (B, 1, V)
    logits = constrain_logits(logits[:, -1], *constraints)  # (B, V)
    return _choose(logits, temperature, top_k, top_p, seed, steps), cache


def decode_steps(model, tokens, positions, cache, sampling, steps, constraints, num_steps):
    """`num_steps` decoding steps of every row in one graph (`tf.while_loop` of
    `decode_rows`): each step feeds the token the previous one chose. A caller pays one
    function call for `num_steps` tokens per row (vLLM's multi-step scheduling); the
    constraints' bitmask holds for every step, so a caller with a grammar row asks for 1.

    Args:
      model, tokens, positions, cache, sampling, steps, constraints: as `decode_rows`.
        Every row's positions + num_steps - 1 must be inside its cache.
      num_steps: int32 scalar >= 1.

    Returns:
      (tokens int32 (B, num_steps): each row's next num_steps tokens; the cache).
    """
    def body(i, token, cache, chosen):
        token, cache = decode_rows(model, token, positions + i, cache, sampling, steps + i,
                                   constraints)  # (B,)
        return i + 1, token, cache, chosen.write(i, token)

    chosen = tf.TensorArray(tf.int32, size=num_steps, element_shape=tokens.shape)
    _, _, cache, chosen = tf.while_loop(lambda i, *_: i < num_steps, body,
                                        (tf.constant(0), tokens, cache, chosen))
    return tf.transpose(chosen.stack()), cache  # (B, num_steps)


def generate_with_steps(prefill, decode, input_ids, prompt_lengths, max_new_tokens, sampling,
                        stop_token_id: int):
    """`generation.generate`'s cached decoding, as a `tf.while_loop` over the two steps.

    The same tokens as `generate(model, input_ids, max_new_tokens, *sampling,
    stop_token_id=stop_token_id, prompt_lengths=prompt_lengths)`: `prefill` chooses each
    row's step 0 from the prompt's logits, and each `decode` call feeds a row's newest token
    (the stop id once the row has finished) and chooses its next. A SavedModel whose
    `generate` signature calls its own `engine_prefill` and `engine_decode` functions
    holds one graph of the model per step instead of two (`savedmodel/export.py`).

    Args:
      prefill: `prefill_rows` with the model bound, called with keywords (input_ids,
        prompt_lengths, cache_len, temperature, top_k, top_p, seed, bitmask, bias_ids,
        bias_values) -> {"token", "cache"}.
      decode: `decode_rows` likewise (tokens, positions, cache, steps, and the same
        knobs) -> {"token", "cache"}.
      input_ids: int32 (B, P), right-padded prompts. prompt_lengths: int32 (B,).
      max_new_tokens: int32 (B,), each >= 1.
      sampling: (temperature, top_k, top_p, seed), each (B,).
      stop_token_id: a row that chooses it has finished.

    Returns:
      (tokens int32 (B, P + N) with each row's prompt then its new tokens then
       stop_token_id, N = max(max_new_tokens); lengths int32 (B,)), as `generate`.
    """
    temperature, top_k, top_p, seed = sampling
    batch = tf.shape(input_ids)[0]
    knobs = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                 bitmask=tf.zeros([batch, 0], tf.int32), bias_ids=tf.zeros([batch, 0], tf.int32),
                 bias_values=tf.zeros([batch, 0], tf.float32))
    ends = prompt_lengths + max_new_tokens  # (B,)
    cache_len = tf.reduce_max(tf.concat([ends, [1]], axis=0))  # 1 if B = 0
    most_new = tf.reduce_max(tf.concat([max_new_tokens, [1]], axis=0))
    tokens = tf.concat([input_ids, tf.fill([batch, most_new], stop_token_id)], axis=1)
    columns = tf.range(tf.shape(tokens)[1])[None, :]  # (1, P + N)
    first = prefill(input_ids=input_ids, prompt_lengths=prompt_lengths, cache_len=cache_len,
                    **knobs)

    def body(step, tokens, cache, token, finished, lengths):
        positions = prompt_lengths + step  # (B,) where this step's token goes
        active = tf.logical_not(finished)
        token = tf.where(active, token, stop_token_id)  # (B,)
        stopped = tf.logical_and(active, tf.equal(token, stop_token_id))
        lengths = tf.where(stopped, positions + 1, lengths)
        finished = tf.logical_or(tf.logical_or(finished, stopped), step + 1 >= max_new_tokens)
        write = tf.logical_and(tf.equal(columns, positions[:, None]), active[:, None])
        tokens = tf.where(write, token[:, None], tokens)  # (B, P + N)
        out = decode(tokens=token, positions=tf.minimum(positions, cache_len - 1), cache=cache,
                     steps=tf.fill([batch], step + 1), **knobs)  # unused after the last step
        return step + 1, tokens, out["cache"], out["token"], finished, lengths

    _, tokens, _, _, _, lengths = tf.while_loop(
        lambda step, tokens, cache, token, finished, lengths: tf.logical_not(
            tf.reduce_all(finished)),
        body, (tf.constant(0), tokens, first["cache"], first["token"],
               tf.zeros([batch], tf.bool), ends))
    return tf.where(columns < lengths[:, None], tokens, stop_token_id), lengths
