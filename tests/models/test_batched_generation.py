"""generate() on a batch of prompts of different lengths: each row as if it ran alone."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.generation import generate

LENGTHS = [3, 7, 5]


def _prompts(lengths=LENGTHS, seed=0):
    """Right-padded int32 (B, max(lengths)) (padding 63, a real id) and the prompts alone."""
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, 64, size=n) for n in lengths]
    padded = np.full((len(rows), max(lengths)), 63)
    for b, row in enumerate(rows):
        padded[b, : len(row)] = row
    return tf.constant(padded, tf.int32), [tf.constant(r[None], tf.int32) for r in rows]


def _alone(model, prompt, **kwargs):
    tokens, lengths = generate(model, prompt, **kwargs)
    return tokens.numpy()[0, : int(lengths[0])]


def _rows(tokens, lengths):
    return [tokens.numpy()[b, : int(n)] for b, n in enumerate(lengths.numpy())]


@pytest.mark.parametrize("mode", [dict(absorb=True), dict(absorb=False), dict(use_cache=False)])
def test_greedy_batch_of_different_lengths_equals_each_prompt_alone(tiny_model, mode):
    padded, prompts = _prompts()
    new = [6, 2, 4]
    tokens, lengths = generate(tiny_model, padded, tf.constant(new), temperature=0.0,
                               prompt_lengths=tf.constant(LENGTHS), **mode)
    assert tokens.shape == (3, 7 + 6)
    np.testing.assert_array_equal(lengths, [3 + 6, 7 + 2, 5 + 4])
    for b, row in enumerate(_rows(tokens, lengths)):
        np.testing.assert_array_equal(
            row, _alone(tiny_model, prompts[b], max_new_tokens=new[b], temperature=0.0, **mode))
    # After its length every row holds the padding (0 without a stop token).
    assert np.all(tokens.numpy()[0, 9:] == 0) and np.all(tokens.numpy()[1, 9:] == 0)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_each_row_stops_at_its_own_stop_token(tiny_model):
    padded, prompts = _prompts(seed=1)
    free, free_lengths = generate(tiny_model, padded, 8, temperature=0.0,
                                  prompt_lengths=LENGTHS)
    stop = int(free[1, 7 + 1])  # row 1 emits it at its 2nd new token (if not before)
    tokens, lengths = generate(tiny_model, padded, 8, temperature=0.0, stop_token_id=stop,
                               prompt_lengths=LENGTHS)
    for b, row in enumerate(_rows(tokens, lengths)):
        np.testing.assert_array_equal(
            row, _alone(tiny_model, prompts[b], max_new_tokens=8, temperature=0.0,
                        stop_token_id=stop))
        generated = free.numpy()[b, LENGTHS[b]: free_lengths[b]]
        hits = np.flatnonzero(generated == stop)
        assert lengths[b] == LENGTHS[b] + (hits[0] + 1 if hits.size else 8)
        assert np.all(tokens.numpy()[b, lengths[b]:] == stop)
    assert lengths[1] <= 7 + 2


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_sampled_row_does_not_depend_on_its_batch_mates(tiny_model):
    padded, prompts = _prompts(seed=2)
    knobs = dict(temperature=[1.0, 0.8, 1.2], top_k=[0, 10, 5], top_p=[1.0, 0.9, 0.95],
                 seed=[7, 8, 9], max_new_tokens=[8, 5, 6])
    tokens, lengths = generate(tiny_model, padded, prompt_lengths=LENGTHS,
                               **{k: tf.constant(v) for k, v in knobs.items()})
    for b, row in enumerate(_rows(tokens, lengths)):
        alone = _alone(tiny_model, prompts[b], **{k: v[b] for k, v in knobs.items()})
        np.testing.assert_array_equal(row, alone)
    # The same prompt twice with a scalar seed: the same tokens; another seed differs.
    twice = tf.concat([prompts[0], prompts[0]], axis=0)
    same, _ = generate(tiny_model, twice, 8, seed=5)
    np.testing.assert_array_equal(same[0], same[1])
    other, _ = generate(tiny_model, twice, 8, seed=[5, 6])
    np.testing.assert_array_equal(other[0], same[0])
    assert not np.array_equal(other[1], same[1])


def test_per_row_knobs_mix_greedy_and_sampling(tiny_model):
    padded, prompts = _prompts(seed=3)
    greedy, _ = generate(tiny_model, padded, 8, temperature=0.0, prompt_lengths=LENGTHS)
    # Row 0 greedy by temperature 0, row 1 by top_k 1, row 2 by a tiny nucleus.
    mixed, _ = generate(tiny_model, padded, 8, temperature=[0.0, 1.5, 1.5], top_k=[0, 1, 0],
                        top_p=[1.0, 1.0, 1e-6], seed=3, prompt_lengths=LENGTHS)
    np.testing.assert_array_equal(mixed, greedy)
    sampled, _ = generate(tiny_model, padded, 8, temperature=[0.0, 1.5, 1.5], top_k=[0, 0, 3],
                          seed=3, prompt_lengths=LENGTHS)
    np.testing.assert_array_equal(sampled[0], greedy[0])
    assert not np.array_equal(sampled[1:], greedy[1:])


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_batched_generate_in_tf_function(tiny_model):
    vector = lambda dtype: tf.TensorSpec([None], dtype)  # noqa: E731

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), vector(tf.int32),
                                  vector(tf.int32), vector(tf.float32), vector(tf.int32),
                                  vector(tf.float32), vector(tf.int32)])
    def serve(ids, prompt_lengths, max_new_tokens, temperature, top_k, top_p, seed):
        return generate(tiny_model, ids, max_new_tokens, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, stop_token_id=0, prompt_lengths=prompt_lengths)

    padded, prompts = _prompts(seed=4)
    knobs = ([4, 6, 2], [0.0, 1.0, 0.7], [0, 10, 3], [1.0, 0.9, 1.0], [1, 2, 3])
    tokens, lengths = serve(padded, LENGTHS, *knobs)
    assert tokens.shape == (3, 7 + 6)
    for b, row in enumerate(_rows(tokens, lengths)):
        alone = _alone(tiny_model, prompts[b], max_new_tokens=knobs[0][b],
                       temperature=knobs[1][b], top_k=knobs[2][b], top_p=knobs[3][b],
                       seed=knobs[4][b], stop_token_id=0)
        np.testing.assert_array_equal(row, alone)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_position_embeddings"):
        serve(padded, LENGTHS, [4, 26, 2], *knobs[1:])  # 7 + 26 > 32 in row 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="prompt_lengths"):
        serve(padded, [3, 8, 5], *knobs)


def test_an_empty_batch_gives_no_rows(tiny_model):
    for mode in (dict(use_cache=True), dict(use_cache=False)):
        tokens, lengths = generate(tiny_model, tf.zeros([0, 3], tf.int32), 4, **mode)
        assert tokens.shape == (0, 7) and lengths.shape == (0,)


def test_sliding_window_rows_of_different_lengths(tiny_config):
    keras.utils.set_random_seed(5)
    model = DeepSeekCausalLM(tiny_config.replace(max_position_embeddings=8))
    padded, prompts = _prompts(lengths=[6, 3], seed=5)
    tokens, lengths = generate(model, padded, 5, temperature=0.0, use_cache=False,
                               prompt_lengths=[6, 3])
    np.testing.assert_array_equal(lengths, [11, 8])
    for b, row in enumerate(_rows(tokens, lengths)):
        np.testing.assert_array_equal(
            row, _alone(model, prompts[b], max_new_tokens=5, temperature=0.0, use_cache=False))
    # Row 0's last token came from a window of its last 8 tokens.
    last = tf.argmax(model(tokens[:1, 2:10])[:, -1], -1, output_type=tf.int32)
    np.testing.assert_array_equal(tokens[:1, 10], last)
