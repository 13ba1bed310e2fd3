"""The exported `generate` runs prompts of different lengths, each with its own knobs, in
one batch: every row gets what it gets alone (the contract a batching server relies on)."""

from __future__ import annotations

import dataclasses

import pytest
import tensorflow as tf

# Slow tier: a child pytest process (tests/conftest.py) that exports batched SavedModels.
pytestmark = pytest.mark.slow

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         " lazy": 4, " dog": 8, "你好": 6, "世界": 5, "。": 10, ",": 20, " 12": 7, "345": 3,
         "\r\n": 15, "\n\n": 10, "😀": 4}
CHAT_PROMPT = ("<｜begin▁of▁sentence｜>User: ", "\nAssistant:")
# Three lengths; the last is longer than the tiny model's 64 positions leave room for,
# so it is cropped to its last 64 - max_new_tokens tokens.
PROMPTS = ["the", "the quick brown fox jumps over", " the lazy dog 你好世界。" * 12]
GREEDY = dict(max_new_tokens=[5, 9, 3], temperature=[0.0] * 3, top_k=[0] * 3,
              top_p=[1.0] * 3, seed=[0] * 3)
DTYPES = dict(max_new_tokens=tf.int32, temperature=tf.float32, top_k=tf.int32,
              top_p=tf.float32, seed=tf.int32)


@pytest.fixture(scope="module")
def signatures(tmp_path_factory):
    """The signatures of a saved chat model (tiny preset, vocab 512, learned tokenizer)."""
    import keras

    from config import GenerationConfig, get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from savedmodel.export import save_text_model
    from tokenization.tokenizer import learn

    keras.utils.set_random_seed(3)
    model = DeepSeekCausalLM(dataclasses.replace(get_config("tiny").model, vocab_size=512))
    out = tmp_path_factory.mktemp("batched") / "saved"
    generation = GenerationConfig(max_new_tokens=6, temperature=0.9, top_k=20, top_p=0.9)
    save_text_model(model, learn(UNITS, 400), generation, str(out), chat_prompt=CHAT_PROMPT)
    return tf.saved_model.load(str(out)).signatures


def _call(fn, prompts, knobs):
    inputs = {k: tf.constant(v, DTYPES[k]) for k, v in knobs.items()}
    out = fn(prompt=tf.constant(prompts), **inputs)
    return {k: v.numpy().tolist() for k, v in out.items()}


def _each_alone(fn, prompts, knobs):
    rows = [_call(fn, [p], {k: [v[b]] for k, v in knobs.items()}) for b, p in enumerate(prompts)]
    return {k: [row[k][0] for row in rows] for k in rows[0]}


@pytest.mark.slow
def test_generate_signature_takes_one_value_per_prompt(signatures):
    for name in ("generate", "generate_raw"):
        specs = signatures[name].structured_input_signature[1]
        assert {k: (s.dtype, s.shape.as_list()) for k, s in specs.items()} == {
            "prompt": (tf.string, [None]), **{k: (d, [None]) for k, d in DTYPES.items()}}


@pytest.mark.parametrize("name", ["generate", "generate_raw"])
def test_greedy_batch_equals_each_prompt_alone(signatures, name):
    batch = _call(signatures[name], PROMPTS, GREEDY)
    assert batch == _each_alone(signatures[name], PROMPTS, GREEDY)
    assert [t.decode() for t in batch["text"]] == [
        p + c.decode() for p, c in zip(PROMPTS, batch["completion"], strict=True)]
    assert all(1 <= n <= m for n, m in zip(batch["num_generated"], GREEDY["max_new_tokens"],
                                           strict=True))


def test_sampled_rows_keep_their_seeds_in_a_batch(signatures):
    knobs = dict(max_new_tokens=[6, 4, 8], temperature=[1.0, 0.7, 1.3], top_k=[0, 20, 5],
                 top_p=[0.9, 1.0, 0.95], seed=[11, 12, 13])
    batch = _call(signatures["generate"], PROMPTS, knobs)
    assert batch == _each_alone(signatures["generate"], PROMPTS, knobs)


def test_serving_default_broadcasts_the_defaults_with_seed_0(signatures):
    out = signatures["serving_default"](prompt=tf.constant(PROMPTS))
    defaults = dict(max_new_tokens=[6] * 3, temperature=[0.9] * 3, top_k=[20] * 3,
                    top_p=[0.9] * 3, seed=[0] * 3)
    expected = _call(signatures["generate"], PROMPTS, defaults)
    assert out["completion"].numpy().tolist() == expected["completion"]
    assert out["text"].numpy().tolist() == expected["text"]


def test_no_prompts_give_no_rows(signatures):
    out = _call(signatures["generate"], tf.zeros([0], tf.string),
                {k: tf.zeros([0], d) for k, d in DTYPES.items()})
    assert out == {"completion": [], "text": [], "num_generated": []}
