"""Autoregressive generation as pure TensorFlow (tf.while_loop, fixed-size buffers).

Usable eagerly or inside a `tf.function` (e.g. a serving signature): the output
buffer has the final size from the start, and the loop stops early once every
row has emitted `stop_token_id`.

Decoding: greedy when temperature == 0, else sampling from
softmax(logits / temperature) restricted to the top_k most likely tokens
(top_k > 0) and to the smallest set whose probability reaches top_p (nucleus
sampling, Holtzman et al. 2019, arXiv 1904.09751). Sampling uses stateless ops
seeded with (seed, step), so a seed makes results reproducible.
"""

import tensorflow as tf

_INT32_MAX = 2**31 - 1


def generate(model, input_ids, max_new_tokens, temperature=1.0, top_k=0, top_p=1.0,
             seed=None, stop_token_id=None, use_cache=True):
    """Extends each prompt by up to `max_new_tokens` tokens.

    Args:
      model: a DeepSeekCausalLM (anything with `config`, `__call__`,
        `init_cache`, `call_with_cache`).
      input_ids: int32 tensor (B, P), P >= 1 (all rows the same length).
      max_new_tokens: Python int or int32 scalar tensor N >= 1.
      temperature: float or float32 scalar tensor; 0 = greedy (argmax).
      top_k: int or int32 scalar tensor; 0 = no top-k filter.
      top_p: float or float32 scalar tensor in (0, 1]; 1.0 = no nucleus filter.
      seed: int or int32 scalar tensor; None = a random seed per call.
      stop_token_id: int or None. A row that emits it is finished: its later
        positions hold `stop_token_id`.
      use_cache: decode with the latent KV cache (one token per step). Requires
        P + N <= config.max_position_embeddings. Without the cache every step
        re-runs the model on the last max_position_embeddings tokens (a sliding
        window), so any P + N works, at a much higher cost.

    Returns:
      (tokens, lengths):
        tokens: int32 (B, P + N), the prompt then the generated tokens; rows
          that stopped early are padded with stop_token_id (with 0 if
          stop_token_id is None, which cannot happen);
        lengths: int32 (B,), P + number of generated tokens up to and including
          the first stop token (P + N for rows that never stopped).

    Raises:
      ValueError: if max_new_tokens < 1, or if use_cache and the static
        P + N exceeds max_position_embeddings.
      InvalidArgumentError (at run time): the same check when P is not static.
    """
    if isinstance(max_new_tokens, int):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 1")
    else:  # a scalar tensor (e.g. a serving-signature input)
        max_new_tokens = tf.cast(max_new_tokens, tf.int32)
        tf.debugging.assert_greater_equal(max_new_tokens, 1, message="max_new_tokens must be >= 1")
    max_positions = model.config.max_position_embeddings
    input_ids = tf.cast(input_ids, tf.int32)
    batch, prompt_len = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
    total_len = prompt_len + max_new_tokens

    if use_cache:
        static_len = input_ids.shape[1]
        if (static_len is not None and isinstance(max_new_tokens, int)
                and static_len + max_new_tokens > max_positions):
            raise ValueError(
                f"prompt length {static_len} + max_new_tokens {max_new_tokens} exceeds "
                f"max_position_embeddings={max_positions}; use use_cache=False for a "
                "sliding window")
        tf.debugging.assert_less_equal(
            total_len, max_positions,
            message="prompt + max_new_tokens exceeds max_position_embeddings (cached mode)")

    pad_id = 0 if stop_token_id is None else stop_token_id
    tokens = tf.concat([input_ids, tf.fill([batch, max_new_tokens], pad_id)], axis=1)  # (B, P+N)
    if seed is None:
        seed = tf.random.uniform([], 0, _INT32_MAX, dtype=tf.int32)
    seed = tf.cast(seed, tf.int32)

    def next_logits_uncached(tokens, end):
        """Logits after tokens[:, :end], from the last max_positions tokens only."""
        start = tf.maximum(end - max_positions, 0)
        return model(tokens[:, start:end], training=False)[:, -1]  # (B, V)

    if use_cache:
        cache = model.init_cache(batch, total_len)  # (L, B, P+N, R+Dr)
        logits, cache = model.call_with_cache(input_ids, cache, 0)  # (B, P, V)
        logits = logits[:, -1]  # (B, V)
    else:
        cache = tf.zeros([0])  # unused loop variable
        logits = next_logits_uncached(tokens, prompt_len)  # (B, V)

    finished = tf.zeros([batch], tf.bool)
    lengths = tf.fill([batch], total_len)

    def cond(step, tokens, cache, logits, finished, lengths):
        return tf.logical_and(step < max_new_tokens,
                              tf.logical_not(tf.reduce_all(finished)))

    def body(step, tokens, cache, logits, finished, lengths):
        position = prompt_len + step
        next_token = _choose(logits, temperature, top_k, top_p,
                             tf.stack([seed, step]))  # (B,)
        if stop_token_id is not None:
            next_token = tf.where(finished, stop_token_id, next_token)
            stopped = tf.logical_and(tf.logical_not(finished),
                                     tf.equal(next_token, stop_token_id))  # (B,)
            lengths = tf.where(stopped, position + 1, lengths)
            finished = tf.logical_or(finished, stopped)
        indices = tf.stack([tf.range(batch), tf.fill([batch], position)], axis=1)  # (B, 2)
        tokens = tf.tensor_scatter_nd_update(tokens, indices, next_token)  # (B, P+N)
        # Logits for the following step (computed, unused, after the last one).
        if use_cache:
            step_logits, cache = model.call_with_cache(next_token[:, None], cache, position)
            logits = step_logits[:, -1]  # (B, V)
        else:
            logits = next_logits_uncached(tokens, position + 1)  # (B, V)
        return step + 1, tokens, cache, logits, finished, lengths

    _, tokens, _, _, _, lengths = tf.while_loop(
        cond, body, (tf.constant(0), tokens, cache, logits, finished, lengths))
    return tokens, lengths


def _choose(logits, temperature, top_k, top_p, seed):
    """One token per row from float32 logits (B, V) -> int32 (B,)."""
    logits = tf.cast(logits, tf.float32)
    greedy = tf.argmax(logits, axis=-1, output_type=tf.int32)  # (B,)
    if isinstance(temperature, (int, float)) and temperature == 0:
        return greedy

    temperature = tf.cast(temperature, tf.float32)
    logits = logits / tf.where(temperature > 0, temperature, 1.0)
    if not (isinstance(top_k, int) and top_k == 0):
        logits = _top_k_filter(logits, top_k)
    if not (isinstance(top_p, (int, float)) and top_p >= 1.0):
        logits = _top_p_filter(logits, top_p)
    sampled = tf.random.stateless_categorical(logits, 1, seed, dtype=tf.int32)[:, 0]  # (B,)
    return tf.where(temperature > 0, sampled, greedy)


def _top_k_filter(logits, top_k):
    """Keeps the top_k largest logits per row (all if top_k <= 0); (B, V) -> (B, V)."""
    vocab = tf.shape(logits)[-1]
    k = tf.cast(top_k, tf.int32)
    k = tf.where(k > 0, tf.minimum(k, vocab), vocab)
    kth_largest = tf.math.top_k(logits, k=k).values[:, -1:]  # (B, 1)
    return tf.where(logits < kth_largest, float("-inf"), logits)


def _top_p_filter(logits, top_p):
    """Keeps the smallest set of most likely tokens whose probability reaches top_p."""
    top_p = tf.cast(top_p, tf.float32)
    sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")  # (B, V)
    mass_before = tf.cumsum(tf.nn.softmax(sorted_logits, axis=-1), axis=-1,
                            exclusive=True)  # (B, V)
    kept = tf.where(mass_before < top_p, sorted_logits, float("inf"))  # (B, V)
    threshold = tf.minimum(tf.reduce_min(kept, axis=-1, keepdims=True),
                           sorted_logits[:, :1])  # (B, 1), the best token is always kept
    filtered = tf.where(logits < threshold, float("-inf"), logits)
    return tf.where(top_p >= 1.0, logits, filtered)
