"""DeepSeek's tool calls on the host: the formats, and the model's calls parsed out of its
reply (whole or streamed). V4's prompt text for tools, calls and results is
`serving/tool_call_render.py`'s; a grammar that forces a call, `serving/tool_call_grammar.py`'s.

DeepSeek-V4 (DSML; encoding_dsv4.py) describes the request's `tools` in the system prompt
(`render_tools_v4`: deepseek_v4_chat.TOOLS_PROMPT with one `json.dumps(function,
ensure_ascii=False)` line per tool) and writes an assistant's calls after its content,
then EOS:

    content + "\\n\\n" + <｜DSML｜tool_calls>
    <｜DSML｜invoke name="get_weather">
    <｜DSML｜parameter name="城市" string="true">北京</｜DSML｜parameter>
    <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
    </｜DSML｜invoke>
    </｜DSML｜tool_calls>

A string argument is written as it is (no escaping) with string="true"; any other value
as JSON (`json.dumps(v, ensure_ascii=False)`) with string="false"; an invoke without
arguments has an empty line. A tool's result comes back inside a user turn as
"<tool_result>" + content + "</tool_result>" (`render_tool_result_v4`). The Jinja side of
the same format is tokenization/deepseek_v4_chat.py's template; these functions are its
Python twins (the tests hold them to each other and to DeepSeek's golden prompts).

The same block, named `function_calls` instead of `tool_calls`, is DeepSeek-V3.2's
(encoding_dsv32.py, `DEEPSEEK_V32`). DeepSeek-V3.1 uses special tokens and raw JSON
arguments, with nothing between the content and the block (`DEEPSEEK_V31`):

    content + <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{"a": 1}<｜tool▁call▁end｜>
        ...<｜tool▁calls▁end｜>

Parsing (`parse_tool_calls`, `ToolCallStreamParser`): a block runs from its opening
marker to the first closing marker after it. Its calls come out as `{"name", "arguments"}`
with `arguments` JSON text: for DSML exactly as encoding_dsv4.py's
`decode_dsml_to_arguments` builds it (`{"key": value, ...}`, string="true" values
JSON-encoded, string="false" values as written, which must be JSON); for V3.1 the
arguments as written, which must be a JSON object. The separator the encoder puts before
a block ("\\n\\n" for DSML) is not content; any text after a block is. Whitespace between
DSML elements is free (vLLM's parsers allow it; DeepSeek's own parser wants exactly
"\\n"). A malformed block (bad markup, a string="false" value that is not JSON, a repeated
parameter, no call, or no closing marker when the reply ends) is returned as content, as
the model wrote it with its separator: vLLM's `extract_tool_calls` likewise returns text
it cannot parse as content (it gives up on the whole reply; here on that block only).
`strict=True` raises `ToolCallParseError` instead, as DeepSeek's own parser does.

In a streamed reply the calls come after the reasoning (serving/reasoning.py):

    splitter, parser = ReasoningSplitter(thinking), ToolCallStreamParser()
    for piece in decoded_pieces:                   # then once more with finish()es
        reasoning, text = splitter.push(piece)     # -> delta.reasoning_content
        content, tool_calls = parser.push(text)    # -> delta.content, delta.tool_calls
    # finish_reason "tool_calls" when parser.calls > 0

Sources (formats transcribed exactly):
  - sgl-project/sglang python/sglang/srt/entrypoints/openai/encoding_dsv4.py at commit
    00370f2784265e663d500abcc6a59b13854840f5 (DeepSeek-V4's encoding/encoding_dsv4.py:
    TOOLS_TEMPLATE, tool_call(s)_template, encode_arguments_to_dsml, tool_output_template,
    decode_dsml_to_arguments, parse_tool_calls);
  - sgl-project/sglang python/sglang/srt/entrypoints/openai/encoding_dsv32.py at commit
    b135ce87cafdd095e92d0c2d985159584601dd4a (V3.2's `function_calls` block);
  - vllm-project/vllm vllm/tool_parsers/deepseekv32_tool_parser.py at commit
    0372d7fd06b3b9c2181992586154f67b9f449be9 (DSML regexes, call ids `call_` + 24 hex),
    deepseekv4_tool_parser.py at commit 15c99cb111e626d885d7f54a0b57dc9ff10168db (V4 =
    V3.2 with `tool_calls`), deepseekv31_tool_parser.py at commit
    e2fc92ec91d754266a76b9369da48f6693300c2e (V3.1 markers), and
    examples/tool_chat_template_deepseekv31.jinja at commit
    71742a80093f89b91a26d5297fd35199834ec8c5 (V3.1's rendering);
  - guidance-ai/llguidance docs/syntax.md at commit
    792d6bf63ac9582fa25cebe13509ca9cf71fbdca (Lark dialect: `%json {...}`, `[lazy]`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from serving.reasoning import partial_suffix
from tokenization.deepseek_v4_chat import (
    DSML_TOKEN,
    TOOL_CALLS_END,
    TOOL_CALLS_SEPARATOR,
    TOOL_CALLS_START,
)

INVOKE_CLOSE = f"</{DSML_TOKEN}invoke>"
PARAMETER_CLOSE = f"</{DSML_TOKEN}parameter>"
_INVOKE_OPEN = re.compile(rf'<{DSML_TOKEN}invoke\s+name="([^"]*)"\s*>')
_PARAMETER_OPEN = re.compile(
    rf'<{DSML_TOKEN}parameter\s+name="([^"]*)"\s+string="(true|false)"\s*>')
_V31_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>",
                       re.DOTALL)
_SPACE = re.compile(r"\s*")


class ToolCallParseError(ValueError):
    """A tool-call block the parser cannot read (raised with `strict=True`)."""


def to_json(value: Any) -> str:
    """encoding_dsv4.py `to_json`."""
    return json.dumps(value, ensure_ascii=False)


# --- parsing ---------------------------------------------------------------------------

def _excerpt(text: str, pos: int) -> str:
    return repr(text[pos:pos + 60])


def _check_json(value: str, what: str) -> Any:
    """`json.loads(value)` (no NaN or Infinity), or ToolCallParseError naming `what`."""
    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not JSON")

    try:
        return json.loads(value, parse_constant=refuse)
    except (ValueError, RecursionError) as e:
        raise ToolCallParseError(f"{what} is not JSON ({e}): {value[:60]!r}") from e


def _dsml_parameters(body: str, pos: int, name: str) -> tuple[str, int]:
    """The arguments JSON of the invoke whose parameters start at `pos`, and the position
    after its `</｜DSML｜invoke>`. The JSON is `decode_dsml_to_arguments`': "{" +
    ", ".join(f"{to_json(key)}: {value}") + "}", a string="true" value JSON-encoded."""
    arguments: dict[str, str] = {}
    while True:
        pos = _SPACE.match(body, pos).end()
        if body.startswith(INVOKE_CLOSE, pos):
            pairs = ", ".join(f"{to_json(k)}: {v}" for k, v in arguments.items())
            return "{" + pairs + "}", pos + len(INVOKE_CLOSE)
        opened = _PARAMETER_OPEN.match(body, pos)
        if opened is None:
            raise ToolCallParseError(f'expected <{DSML_TOKEN}parameter name="..." string='
                                     f'"true|false"> or {INVOKE_CLOSE} in {name!r} at '
                                     f"{_excerpt(body, pos)}")
        key, string = opened[1], opened[2]
        close = body.find(PARAMETER_CLOSE, opened.end())
        if close < 0:
            raise ToolCallParseError(f"parameter {key!r} of {name!r} is not closed")
        if key in arguments:
            raise ToolCallParseError(f"parameter {key!r} of {name!r} is given twice")
        value = body[opened.end():close]
        if string == "false":
            _check_json(value, f'parameter {key!r} of {name!r} (string="false")')
        arguments[key] = to_json(value) if string == "true" else value
        pos = close + len(PARAMETER_CLOSE)


def parse_dsml_block(body: str) -> list[dict[str, str]]:
    """The calls of one DSML block (V4 `tool_calls`, V3.2 `function_calls`), given the
    text between its opening and closing markers.

    Raises:
      ToolCallParseError: text that is not whitespace-separated invokes, an invoke without
        a name, a malformed or unclosed parameter, a repeated parameter, a string="false"
        value that is not JSON, or no invoke at all.
    """
    calls, pos = [], _SPACE.match(body).end()
    while pos < len(body):
        opened = _INVOKE_OPEN.match(body, pos)
        if opened is None or not opened[1]:
            raise ToolCallParseError(f'expected <{DSML_TOKEN}invoke name="..."> at '
                                     f"{_excerpt(body, pos)}")
        arguments, pos = _dsml_parameters(body, opened.end(), opened[1])
        calls.append({"name": opened[1], "arguments": arguments})
        pos = _SPACE.match(body, pos).end()
    if not calls:
        raise ToolCallParseError("a tool-call block without a call")
    return calls


def parse_v31_block(body: str) -> list[dict[str, str]]:
    """The calls of one V3.1 block, given the text between `<｜tool▁calls▁begin｜>` and
    `<｜tool▁calls▁end｜>`: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>`
    repeated (whitespace between calls is allowed), ARGS kept as written.

    Raises:
      ToolCallParseError: other text, an empty name, or ARGS that are not a JSON object.
    """
    calls, pos = [], _SPACE.match(body).end()
    while pos < len(body):
        call = _V31_CALL.match(body, pos)
        if call is None or not call[1] or "<｜tool▁" in call[1]:
            raise ToolCallParseError(f"expected <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS"
                                     f"<｜tool▁call▁end｜> at {_excerpt(body, pos)}")
        if not isinstance(_check_json(call[2], f"the arguments of {call[1]!r}"), dict):
            raise ToolCallParseError(f"the arguments of {call[1]!r} are not a JSON object")
        calls.append({"name": call[1], "arguments": call[2]})
        pos = _SPACE.match(body, call.end()).end()
    if not calls:
        raise ToolCallParseError("a tool-call block without a call")
    return calls


@dataclasses.dataclass(frozen=True)
class ToolCallFormat:
    """A tool-call block: its markers, what the encoder writes before it, its parser."""

    name: str
    start: str
    end: str
    separator: str
    parse_block: Callable[[str], list[dict[str, str]]]


DEEPSEEK_V4 = ToolCallFormat("deepseek_v4", TOOL_CALLS_START, TOOL_CALLS_END,
                             TOOL_CALLS_SEPARATOR, parse_dsml_block)
DEEPSEEK_V32 = ToolCallFormat("deepseek_v32", f"<{DSML_TOKEN}function_calls>",
                              f"</{DSML_TOKEN}function_calls>", "\n\n", parse_dsml_block)
DEEPSEEK_V31 = ToolCallFormat("deepseek_v31", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                              "", parse_v31_block)
FORMATS = {fmt.name: fmt for fmt in (DEEPSEEK_V4, DEEPSEEK_V32, DEEPSEEK_V31)}


def parse_tool_calls(text: str, fmt: ToolCallFormat = DEEPSEEK_V4, strict: bool = False
                     ) -> tuple[str, list[dict[str, str]]]:
    """A whole reply (after its reasoning) as (content, [{"name", "arguments"}, ...]).

    Content is the text outside the blocks, without the separator before each parsed
    block; a malformed block stays in it as written (see the module docstring).

    Raises:
      ToolCallParseError: with `strict`, a malformed or unclosed block.
    """
    content, calls, pos = [], [], 0
    while (start := text.find(fmt.start, pos)) >= 0:
        end = text.find(fmt.end, start + len(fmt.start))
        if end < 0:
            if strict:
                raise ToolCallParseError(f"the {fmt.start} block is not closed")
            break
        after = end + len(fmt.end)
        try:
            calls += fmt.parse_block(text[start + len(fmt.start):end])
        except ToolCallParseError:
            if strict:
                raise
            content.append(text[pos:after])
        else:
            before = text[pos:start]
            if fmt.separator and before.endswith(fmt.separator):
                before = before[:-len(fmt.separator)]
            content.append(before)
        pos = after
    content.append(text[pos:])
    return "".join(content), calls


def parse_tool_calls_v4(text: str, strict: bool = False) -> tuple[str, list[dict[str, str]]]:
    """`parse_tool_calls(text, DEEPSEEK_V4, strict)`."""
    return parse_tool_calls(text, DEEPSEEK_V4, strict)


def parse_tool_calls_v32(text: str, strict: bool = False) -> tuple[str, list[dict[str, str]]]:
    """`parse_tool_calls(text, DEEPSEEK_V32, strict)`."""
    return parse_tool_calls(text, DEEPSEEK_V32, strict)


def parse_tool_calls_v31(text: str, strict: bool = False) -> tuple[str, list[dict[str, str]]]:
    """`parse_tool_calls(text, DEEPSEEK_V31, strict)`."""
    return parse_tool_calls(text, DEEPSEEK_V31, strict)


def new_call_id(index: int) -> str:
    """A fresh OpenAI tool call id: "call_" + 24 hex digits (vLLM's DSML parsers)."""
    del index  # unused: ids are random
    return f"call_{uuid.uuid4().hex[:24]}"


def openai_tool_calls(calls: Sequence[Mapping[str, str]],
                      call_id: Callable[[int], str] = new_call_id) -> list[dict[str, Any]]:
    """Parsed calls as an OpenAI message's `tool_calls`: [{"id", "type": "function",
    "function": {"name", "arguments"}}, ...]."""
    return [{"id": call_id(i), "type": "function",
             "function": {"name": call["name"], "arguments": call["arguments"]}}
            for i, call in enumerate(calls)]


def _hold(text: str, fmt: ToolCallFormat) -> int:
    """How much of the end of `text` may still become the separator and opening marker."""
    return max(partial_suffix(text, fmt.separator + fmt.start), partial_suffix(text, fmt.start))


class ToolCallStreamParser:
    """`parse_tool_calls` for a reply that arrives in pieces.

    `push(piece)` returns (content_delta, tool_call_deltas): content up to where a block
    may begin (a partial separator or opening marker is held back across pieces), then,
    when a block closes, each of its calls complete, as OpenAI streaming deltas
    `{"index": i, "id": ..., "type": "function", "function": {"name", "arguments"}}`
    (indices count from 0 over the reply). `finish()` flushes what is held (an unclosed
    block: content, or ToolCallParseError with `strict`). Concatenated, the content deltas
    are `parse_tool_calls`' content and the deltas its calls, whatever the pieces.

    Args:
      fmt: DEEPSEEK_V4 (default), DEEPSEEK_V32 or DEEPSEEK_V31.
      strict: raise ToolCallParseError on a malformed block instead of returning it as
        content.
      call_id: index -> id of a call (default `new_call_id`, random).

    Raises:
      RuntimeError: `push` or `finish` after `finish`.
    """

    def __init__(self, fmt: ToolCallFormat = DEEPSEEK_V4, strict: bool = False,
                 call_id: Callable[[int], str] = new_call_id):
        self.fmt = fmt
        self.strict = strict
        self.call_id = call_id
        self.calls = 0  # tool calls emitted so far
        self._buf = ""
        self._in_block = False
        self._separator = ""  # the separator taken off before the open block
        self._scan_from = 0  # where in the open block the closing marker may begin
        self._finished = False

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """(content_delta, tool_call_deltas) for one more piece of the reply."""
        self._check_open()
        self._buf += text
        return self._advance(final=False)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(content_delta, tool_call_deltas): the rest, the reply being complete."""
        self._check_open()
        self._finished = True
        return self._advance(final=True)

    def _check_open(self) -> None:
        if self._finished:
            raise RuntimeError("ToolCallStreamParser: the reply was finished already")

    def _advance(self, final: bool) -> tuple[str, list[dict[str, Any]]]:
        content: list[str] = []
        deltas: list[dict[str, Any]] = []
        while True:
            progressed = (self._close_block(content, deltas, final) if self._in_block
                          else self._open_block(content, final))
            if not progressed:
                break
        return "".join(content), deltas

    def _open_block(self, content: list[str], final: bool) -> bool:
        """Emits content up to an opening marker (True) or up to what is held (False)."""
        fmt, buf = self.fmt, self._buf
        start = buf.find(fmt.start)
        if start < 0:
            keep = 0 if final else _hold(buf, fmt)
            content.append(buf[:len(buf) - keep])
            self._buf = buf[len(buf) - keep:]
            return False
        before, self._separator = buf[:start], ""
        if fmt.separator and before.endswith(fmt.separator):
            before, self._separator = before[:-len(fmt.separator)], fmt.separator
        content.append(before)
        self._buf, self._in_block, self._scan_from = buf[start:], True, len(fmt.start)
        return True

    def _close_block(self, content: list[str], deltas: list[dict[str, Any]],
                     final: bool) -> bool:
        """Parses the open block once its closing marker is in (True), else waits (False)."""
        fmt, buf = self.fmt, self._buf
        end = buf.find(fmt.end, self._scan_from)
        if end < 0:
            # Next time, look only where a closing marker could still begin (a long
            # argument arriving in many pieces is scanned once, not once per piece).
            self._scan_from = max(len(fmt.start), len(buf) - len(fmt.end) + 1)
            if final:
                if self.strict:
                    raise ToolCallParseError(f"the {fmt.start} block is not closed")
                content.append(self._separator + buf)
                self._buf, self._in_block = "", False
            return False
        block, self._buf = buf[:end + len(fmt.end)], buf[end + len(fmt.end):]
        self._in_block = False
        try:
            calls = fmt.parse_block(block[len(fmt.start):end])
        except ToolCallParseError:
            if self.strict:
                raise
            content.append(self._separator + block)
            return True
        for call in calls:
            deltas.append({"index": self.calls, "id": self.call_id(self.calls),
                           "type": "function",
                           "function": {"name": call["name"], "arguments": call["arguments"]}})
            self.calls += 1
        return True
