"""DeepSeek-V4 cached decoding (`DeepSeekV4CausalLM.init_cache` / `call_with_cache`).

The cache must give the full forward's logits however the tokens are split into calls:
a prefill then one token at a time (also against transformers' own cached decode,
`tests/fixtures/hf_deepseek_v4/tiny/decode_logits.npy`), odd-sized chunks that cross CSA
and HCA window boundaries and wrap the rings many times, and a right-padded batch whose
rows keep only their own tokens (`lengths`) and go on at their own positions. The cache
is bounded: its rings do not grow with the context. `generate` runs on it unchanged, and
a decode step projects only its own token (the prefix is not recomputed).

Fast tests use a random 4-layer model (sliding / CSA / HCA / CSA, compress rates 4 and 8,
sliding window 6) in eager mode; the fixture tests compile the step (tf.function).
"""

import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf
from v4_random_model import SMALL_V4, random_v4_model

from models.deepseek import generation
from models.deepseek_v4.compressor import KVCompressor
from models.deepseek_v4.config import CSA, HCA

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v4" / "tiny"
TOLERANCE = 1e-4

SMALL = SMALL_V4


@pytest.fixture(scope="module")
def small_model():
    return random_v4_model(SMALL)


def _ids(batch, seq, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, SMALL.vocab_size, (batch, seq)).astype(np.int32)


def _run_chunks(model, ids, sizes, cache=None, start=0, step=None):
    """Feeds ids (B, T) in chunks of `sizes` from position `start`; -> (logits, cache)."""
    step = step or model.call_with_cache
    if cache is None:
        cache = model.init_cache(ids.shape[0], start + ids.shape[1])
    outs, at = [], 0
    for size in sizes:
        logits, cache = step(tf.constant(ids[:, at:at + size]), cache,
                             tf.constant(start + at, tf.int32))
        outs.append(logits.numpy())
        at += size
    assert at == ids.shape[1]
    return np.concatenate(outs, axis=1), cache


def _max_diff(a, b):
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# ----------------------------------------------------------------------------- structure


def test_init_cache_holds_the_documented_buffers(small_model):
    """Rings of the window (W) and of the compressors' open windows (coff*m) whatever the
    capacity; only the entries (one per m positions) grow with it."""
    d, di, w = SMALL.head_dim, SMALL.index_head_dim, SMALL.sliding_window
    for capacity in (30, 300):
        cache = small_model.init_cache(2, capacity)
        assert len(cache) == SMALL.num_hidden_layers
        assert {k: v.shape for k, v in cache[0].items()} == {"kv": (2, w, d)}
        assert {k: (tuple(v.shape), v.dtype) for k, v in cache[1].items()} == {  # CSA, m 4
            "kv": ((2, w, d), tf.float32), "comp_kv": ((2, 8, 2 * d), tf.float32),
            "comp_gate": ((2, 8, 2 * d), tf.float32),
            "entries": ((2, capacity // 4 + 1, d), tf.float32),
            "index_kv": ((2, 8, 2 * di), tf.float32), "index_gate": ((2, 8, 2 * di), tf.float32),
            "index_entries": ((2, capacity // 4 + 1, di), tf.float32)}
        assert {k: tuple(v.shape) for k, v in cache[2].items()} == {  # HCA, m = 8
            "kv": (2, w, d), "comp_kv": (2, 8, d), "comp_gate": (2, 8, d),
            "entries": (2, capacity // 8 + 1, d)}
    tf.nest.assert_same_structure(cache, small_model.call_with_cache(
        tf.zeros([2, 1], tf.int32), cache, 0)[1])


def test_bad_cache_and_overflow_are_named(small_model):
    with pytest.raises(ValueError, match="init_cache's tuple of 4 dicts"):
        small_model.call_with_cache(tf.zeros([1, 1], tf.int32), tf.zeros([4, 1, 8, 16]), 0)
    cache = small_model.init_cache(1, 8)  # entries for (8 // 4 + 1) * 4 = 12 positions
    small_model.call_with_cache(tf.zeros([1, 3], tf.int32), cache, 9)
    with pytest.raises(tf.errors.InvalidArgumentError, match="KV cache overflow"):
        small_model.call_with_cache(tf.zeros([1, 3], tf.int32), cache, 10)


# ----------------------------------------------------------------------------- equality


@pytest.mark.slow
def test_token_by_token_decode_equals_the_full_forward(small_model):
    ids = _ids(2, 30, seed=1)
    full = small_model(tf.constant(ids)).numpy()
    got, _ = _run_chunks(small_model, ids, [11] + [1] * 19)
    assert _max_diff(got, full) < TOLERANCE


def test_chunked_prefill_crossing_windows_equals_the_full_forward(small_model):
    # Chunks end inside CSA (4) and HCA (8) windows; 7 + 9 = 16 ends on a boundary.
    ids = _ids(2, 33, seed=2)
    full = small_model(tf.constant(ids)).numpy()
    got, _ = _run_chunks(small_model, ids, [7, 9, 13, 1, 3])
    assert _max_diff(got, full) < TOLERANCE


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_right_padded_batch_decodes_each_row_as_if_alone(small_model):
    """One call prefills both rows, each keeping only its prompt (`lengths`); then each
    decodes at its own positions, 20 steps, past the rings' sizes."""
    lengths = [11, 18]
    prompts = _ids(2, 18, seed=3)
    prompts[0, lengths[0]:] = 5  # padding: any id, never kept
    new = _ids(2, 20, seed=4)  # each row's next 20 tokens
    cache = small_model.init_cache(2, 18 + 20)
    logits, cache = small_model.call_with_cache(tf.constant(prompts), cache, 0,
                                                lengths=tf.constant(lengths))
    batched = [[logits[b, :lengths[b]].numpy()] for b in range(2)]
    for t in range(new.shape[1]):
        index = tf.constant([lengths[0] + t, lengths[1] + t], tf.int32)  # (B,)
        logits, cache = small_model.call_with_cache(tf.constant(new[:, t:t + 1]), cache, index)
        for b in range(2):
            batched[b].append(logits[b].numpy())
    for b in range(2):
        alone = np.concatenate([prompts[b:b + 1, :lengths[b]], new[b:b + 1]], axis=1)
        expected = small_model(tf.constant(alone)).numpy()[0]
        assert _max_diff(np.concatenate(batched[b]), expected) < TOLERANCE, f"row {b}"


@pytest.mark.slow
def test_generate_greedy_equals_repeated_full_forwards(small_model):
    prompt = _ids(1, 13, seed=7)
    tokens, lengths = generation.generate(small_model, tf.constant(prompt), 8,
                                          temperature=0.0)
    assert lengths.numpy().tolist() == [21]
    expected = prompt
    for _ in range(8):
        logits = small_model(tf.constant(expected)).numpy()[:, -1]
        expected = np.concatenate([expected, logits.argmax(-1)[:, None].astype(np.int32)], 1)
    np.testing.assert_array_equal(tokens.numpy(), expected)


@pytest.mark.slow
def test_generate_batched_prompts_of_different_lengths(small_model):
    prompts = _ids(2, 12, seed=8)
    tokens, _ = generation.generate(small_model, tf.constant(prompts), 5, temperature=0.0,
                                    prompt_lengths=tf.constant([9, 12]))
    for b, length in enumerate([9, 12]):
        alone, _ = generation.generate(small_model, tf.constant(prompts[b:b + 1, :length]), 5,
                                       temperature=0.0)
        np.testing.assert_array_equal(tokens.numpy()[b, :length + 5], alone.numpy()[0])


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_generate_prefills_a_long_prompt_in_chunks(small_model):
    """`generate(prefill_chunk=5)` runs the prompts through the cache five tokens a call
    (a while loop; the last chunk padded past each prompt) and decodes as one call."""
    prompts = tf.constant(_ids(2, 23, seed=9))
    lengths = tf.constant([17, 23])
    whole, _ = generation.generate(small_model, prompts, 4, temperature=0.0,
                                   prompt_lengths=lengths)
    chunked, _ = generation.generate(small_model, prompts, 4, temperature=0.0,
                                     prompt_lengths=lengths, prefill_chunk=5)
    np.testing.assert_array_equal(chunked.numpy(), whole.numpy())


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_cached_csa_attends_gathered_picks_as_the_dense_mask(small_model):
    """The cached path with attn_implementation "sparse" (the picks gathered) gives the
    "dense" one's logits (the same picks masked over every entry slot)."""
    dense = random_v4_model(SMALL.replace(attn_implementation="dense"))
    ids = _ids(2, 20, seed=10)
    got, _ = _run_chunks(small_model, ids, [11, 1, 8])
    want, _ = _run_chunks(dense, ids, [11, 1, 8])
    assert _max_diff(got, want) < 1e-5


# ----------------------------------------------------------------------------- cost


def test_a_decode_step_projects_only_its_own_token(small_model, monkeypatch):
    """Every projection of a decode call (attention, compressors, indexer, MoE) sees one
    token per row, and each compressor pools one window: the prefix is read from the
    cache, never recomputed."""
    ids = _ids(2, 21, seed=9)
    _, cache = _run_chunks(small_model, ids[:, :20], [20], small_model.init_cache(2, 21))
    dense_inputs, pooled = [], []
    dense_call, compress = keras.layers.Dense.call, KVCompressor.compress

    def spy_dense(self, inputs, *args, **kwargs):
        dense_inputs.append((self.path, tuple(inputs.shape)))
        return dense_call(self, inputs, *args, **kwargs)

    def spy_compress(self, kv, gate, *args, **kwargs):
        pooled.append((self.path, tuple(kv.shape)))
        return compress(self, kv, gate, *args, **kwargs)

    monkeypatch.setattr(keras.layers.Dense, "call", spy_dense)
    monkeypatch.setattr(KVCompressor, "compress", spy_compress)
    small_model.call_with_cache(tf.constant(ids[:, 20:]), cache, 20)
    assert any("compressor/kv_proj" in path for path, _ in dense_inputs)
    assert any("indexer/compressor/kv_proj" in path for path, _ in dense_inputs)
    # (B, 1, C), or (B*1, C) for the MoE's flattened tokens
    assert all(np.prod(shape[:-1]) == 2 for _, shape in dense_inputs), dense_inputs
    # 2 CSA layers x (attention + indexer compressor) + 1 HCA compressor, one window each.
    assert len(pooled) == 5
    for path, shape in pooled:
        rate = SMALL.compress_rates[HCA] if "layers.2" in path else SMALL.compress_rates[CSA]
        assert shape[:2] == (2, rate), (path, shape)


# ----------------------------------------------------------------------------- fixture


@pytest.fixture(scope="module")
def fixture_model():
    if not (FIXTURE / "model.safetensors").exists():
        raise AssertionError("fixture hf_deepseek_v4/tiny is missing")
    from models.deepseek_v4.hf_checkpoint import load_v4_checkpoint

    return load_v4_checkpoint(str(FIXTURE))


def _compiled_step(model):
    """call_with_cache as one tf.function for any T and cache length (one trace)."""
    cache = model.init_cache(2, 8)
    cache_spec = tf.nest.map_structure(
        lambda t: tf.TensorSpec([None, None, t.shape[-1]], t.dtype), cache)
    return tf.function(model.call_with_cache, input_signature=[
        tf.TensorSpec([None, None], tf.int32), cache_spec, tf.TensorSpec([], tf.int32)])


@pytest.mark.slow
def test_fixture_prefill_200_then_decode_to_300_matches_full_and_transformers(fixture_model):
    ids = np.load(FIXTURE / "input_ids.npy")  # (2, 300)
    full = fixture_model(tf.constant(ids)).numpy()
    step = _compiled_step(fixture_model)
    got, _ = _run_chunks(fixture_model, ids, [200] + [1] * 100, step=step)
    assert _max_diff(got, full) < TOLERANCE
    if (FIXTURE / "decode_logits.npy").exists():  # transformers' own cached decode
        hf_decode = np.load(FIXTURE / "decode_logits.npy")
        assert _max_diff(got[:, -hf_decode.shape[1]:], hf_decode) < TOLERANCE
    # Chunks crossing the HCA window (128) and many CSA windows (4).
    chunked, _ = _run_chunks(fixture_model, ids, [61, 67, 1, 102, 69], step=step)
    assert _max_diff(chunked, full) < TOLERANCE


@pytest.mark.slow
def test_fixture_generate_matches_transformers_greedy_generation():
    """`generate` (prefill, then one cached token per step) reproduces transformers'
    `generate(do_sample=False)` on the `generation/` fixture (CSA, HCA rate 32)."""
    folder = FIXTURE.parent / "generation"
    if not (folder / "expected.json").exists():
        raise AssertionError("fixture hf_deepseek_v4/generation is missing")
    import json

    from models.deepseek_v4.hf_checkpoint import load_v4_checkpoint

    expected = json.loads((folder / "expected.json").read_text())
    model = load_v4_checkpoint(str(folder))
    prompt = tf.constant([expected["prompt_ids"]], tf.int32)
    new = len(expected["generated_ids"])
    tokens, _ = generation.generate(model, prompt, new, temperature=0.0)
    assert tokens.numpy()[0, prompt.shape[1]:].tolist() == expected["generated_ids"]
