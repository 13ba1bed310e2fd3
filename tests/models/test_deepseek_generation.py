"""generate(): greedy, cached vs uncached, seeded sampling, stop tokens, tf.function."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.generation import generate


def _prompt(batch=2, length=4, seed=0):
    return tf.constant(np.random.default_rng(seed).integers(0, 64, size=(batch, length)),
                       tf.int32)


def test_greedy_is_deterministic_and_cached_equals_uncached(tiny_model):
    prompt = _prompt()
    tokens, lengths = generate(tiny_model, prompt, 8, temperature=0.0)
    assert tokens.shape == (2, 12) and tokens.dtype == tf.int32
    np.testing.assert_array_equal(lengths, [12, 12])
    np.testing.assert_array_equal(tokens[:, :4], prompt)
    again, _ = generate(tiny_model, prompt, 8, temperature=0.0)
    np.testing.assert_array_equal(tokens, again)
    uncached, _ = generate(tiny_model, prompt, 8, temperature=0.0, use_cache=False)
    np.testing.assert_array_equal(tokens, uncached)
    # Greedy = argmax of the full forward pass at every step.
    logits = tiny_model(tokens[:, :-1])
    np.testing.assert_array_equal(tf.argmax(logits[:, 3:], -1, output_type=tf.int32),
                                  tokens[:, 4:])


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_long_prompt_prefills_in_chunks(tiny_model):
    """prefill_chunk=3: the prompts (7 and 10 tokens) go through the cache 3 tokens a call,
    in a tf.function with a dynamic prompt length too; the tokens are the one-call ones."""
    prompt = _prompt(length=10, seed=3)
    lengths = tf.constant([7, 10])
    whole, _ = generate(tiny_model, prompt, 5, temperature=0.0, prompt_lengths=lengths)
    chunked, _ = generate(tiny_model, prompt, 5, temperature=0.0, prompt_lengths=lengths,
                          prefill_chunk=3)
    np.testing.assert_array_equal(chunked, whole)
    fn = tf.function(lambda p, n: generate(tiny_model, p, 5, temperature=0.0,
                                           prompt_lengths=n, prefill_chunk=3)[0],
                     input_signature=[tf.TensorSpec([None, None], tf.int32),
                                      tf.TensorSpec([None], tf.int32)])
    np.testing.assert_array_equal(fn(prompt, lengths), whole)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_short_prompt_of_unknown_width_is_one_call_not_a_padded_chunk(tiny_model,
                                                                       monkeypatch):
    """In a serving signature the prompt's width is known only at run time: a prompt
    within prefill_chunk runs in calls of its own width (it was once padded to 1,024)."""
    widest = tf.Variable(0)
    call = type(tiny_model).call_with_cache

    def spy(self, input_ids, *args, **kwargs):
        widest.assign(tf.maximum(widest, tf.shape(input_ids)[1]))
        return call(self, input_ids, *args, **kwargs)

    monkeypatch.setattr(type(tiny_model), "call_with_cache", spy)
    fn = tf.function(lambda p: generate(tiny_model, p, 2, temperature=0.0)[0],
                     input_signature=[tf.TensorSpec([None, None], tf.int32)])
    fn(_prompt(length=6, seed=4))
    assert int(widest.numpy()) == 6


@pytest.mark.slow
def test_seeded_sampling_is_reproducible(tiny_model):
    prompt = _prompt(seed=1)
    a, _ = generate(tiny_model, prompt, 8, temperature=1.0, seed=42)
    b, _ = generate(tiny_model, prompt, 8, temperature=1.0, seed=42)
    c, _ = generate(tiny_model, prompt, 8, temperature=1.0, seed=43)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # top_k=1 and a tiny top_p both reduce sampling to greedy.
    greedy, _ = generate(tiny_model, prompt, 8, temperature=0.0)
    top1, _ = generate(tiny_model, prompt, 8, temperature=0.7, top_k=1, seed=3)
    nucleus, _ = generate(tiny_model, prompt, 8, temperature=0.7, top_p=1e-6, seed=3)
    np.testing.assert_array_equal(top1, greedy)
    np.testing.assert_array_equal(nucleus, greedy)
    filtered, _ = generate(tiny_model, prompt, 8, temperature=1.5, top_k=5, top_p=0.9, seed=4)
    assert filtered.shape == (2, 12)


def test_stop_token_pads_and_sets_lengths(tiny_model):
    prompt = _prompt(seed=2)
    free, _ = generate(tiny_model, prompt, 8, temperature=0.0)
    stop = int(free[0, 5])  # row 0 emits it at its 2nd new token (if not before)
    tokens, lengths = generate(tiny_model, prompt, 8, temperature=0.0, stop_token_id=stop)
    for row in range(2):
        generated = free.numpy()[row, 4:]
        hits = np.flatnonzero(generated == stop)
        n = hits[0] + 1 if hits.size else 8  # new tokens up to and including the stop
        assert lengths[row] == 4 + n
        np.testing.assert_array_equal(tokens[row, :4 + n], free[row, :4 + n])
        assert np.all(tokens.numpy()[row, 4 + n:] == stop)
    assert lengths[0] <= 6


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_generate_inside_tf_function_with_dynamic_shapes(tiny_model):
    # Every knob a tensor, as in a serving signature.
    @tf.function(input_signature=[
        tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)])
    def serve(ids, max_new_tokens, temperature, top_k, top_p, seed):
        return generate(tiny_model, ids, max_new_tokens, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, stop_token_id=0)

    prompt = _prompt(seed=3)
    eager, eager_len = generate(tiny_model, prompt, 5, temperature=0.0, stop_token_id=0)
    graph, graph_len = serve(prompt, 5, 0.0, 0, 1.0, 1)
    np.testing.assert_array_equal(graph, eager)
    np.testing.assert_array_equal(graph_len, eager_len)
    sampled, _ = serve(_prompt(batch=3, length=2), 6, 1.0, 10, 0.9, 7)
    assert sampled.shape == (3, 8)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_position_embeddings"):
        serve(prompt, 40, 0.0, 0, 1.0, 1)  # 4 + 40 > 32 in cached mode


def test_context_window(tiny_config):
    keras.utils.set_random_seed(5)
    model = DeepSeekCausalLM(tiny_config.replace(max_position_embeddings=8))
    prompt = _prompt(length=6, seed=4)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        generate(model, prompt, 4, temperature=0.0)
    # Uncached decoding slides a window over the last 8 tokens.
    tokens, lengths = generate(model, prompt, 4, temperature=0.0, use_cache=False)
    assert tokens.shape == (2, 10)
    np.testing.assert_array_equal(lengths, [10, 10])
    last = tf.argmax(model(tokens[:, 1:9])[:, -1], -1, output_type=tf.int32)
    np.testing.assert_array_equal(tokens[:, 9], last)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, prompt, 0)
