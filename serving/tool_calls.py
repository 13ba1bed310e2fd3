"""DeepSeek's tool calls on the host: V4's prompt text for tools, calls and results; the
model's calls parsed out of its reply (whole or streamed); a grammar that forces a call.

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
    THINKING_END_TOKEN,
    TOOL_CALLS_END,
    TOOL_CALLS_SEPARATOR,
    TOOL_CALLS_START,
    TOOL_RESULT_END,
    TOOL_RESULT_START,
    TOOLS_PROMPT,
    tool_call_arguments,
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


def _to_json(value: Any) -> str:
    """encoding_dsv4.py `to_json`."""
    return json.dumps(value, ensure_ascii=False)


# --- rendering (V4) ------------------------------------------------------------------

def render_tools_v4(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system prompt's tools section for OpenAI `tools` ([{"type": "function",
    "function": {...}}, ...]): encoding_dsv4.py `render_tools(tools_from_openai_format(
    tools))`, starting "## Tools" and ending in a newline. The encoder puts "\\n\\n" between
    the system content and it.

    Raises:
      ValueError: a tool without a `function` mapping.
    """
    functions = []
    for tool in tools:
        if not isinstance(tool, Mapping) or not isinstance(tool.get("function"), Mapping):
            raise ValueError(f"a tool must be {{'type': 'function', 'function': {{...}}}}, "
                             f"got {tool!r:.80}")
        functions.append(tool["function"])
    return TOOLS_PROMPT.replace("{tool_schemas}", "\n".join(map(_to_json, functions)))


def encode_arguments_v4(arguments: str | Mapping[str, Any] | None) -> str:
    """encoding_dsv4.py `encode_arguments_to_dsml`: one `<｜DSML｜parameter ...>` line per
    argument (JSON text decoded as `deepseek_v4_chat.tool_call_arguments` does).

    Raises:
      ValueError: arguments that are JSON but not an object.
    """
    lines = []
    for key, value in tool_call_arguments(arguments).items():
        is_str = isinstance(value, str)
        lines.append(f'<{DSML_TOKEN}parameter name="{key}" string="{"true" if is_str else "false"}">'
                     f"{value if is_str else _to_json(value)}{PARAMETER_CLOSE}")
    return "\n".join(lines)


def _name_and_arguments(call: Mapping[str, Any]) -> tuple[str, Any]:
    """(name, arguments) of an OpenAI tool call or of a parsed `{"name", "arguments"}`."""
    function = call.get("function", call)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ValueError(f"a tool call needs a function name, got {call!r:.80}")
    return function["name"], function.get("arguments")


def render_tool_calls_v4(tool_calls: Sequence[Mapping[str, Any]]) -> str:
    """An assistant's `tool_calls` as encoding_dsv4.py writes them: the
    `<｜DSML｜tool_calls>` block (the encoder puts `TOOL_CALLS_SEPARATOR`, "\\n\\n", between
    the content and it). Calls are OpenAI's (`{"function": {"name", "arguments"}}`, the
    arguments JSON text or a mapping) or the parser's (`{"name", "arguments"}`).

    Raises:
      ValueError: a call without a function name, or arguments that are JSON but not an
        object.
    """
    invokes = []
    for call in tool_calls:
        name, arguments = _name_and_arguments(call)
        invokes.append(f'<{DSML_TOKEN}invoke name="{name}">\n'
                       f"{encode_arguments_v4(arguments)}\n{INVOKE_CLOSE}")
    return f"{TOOL_CALLS_START}\n" + "\n".join(invokes) + f"\n{TOOL_CALLS_END}"


def render_tool_result_v4(content: str | Sequence[Mapping[str, Any]]) -> str:
    """A `tool` message's content as encoding_dsv4.py writes it inside a user turn:
    "<tool_result>" + content + "</tool_result>"; a list of content parts gives its text
    parts joined by "\\n\\n", any other part as "[Unsupported <type>]". (Several results
    and user texts of one turn are joined by "\\n\\n" after one "<｜User｜>".)

    Raises:
      ValueError: content neither a string nor a list of mappings.
    """
    if not isinstance(content, str):
        if not isinstance(content, Sequence) or not all(isinstance(p, Mapping) for p in content):
            raise ValueError(f"a tool content must be a string or a list of content parts, "
                             f"got {content!r:.80}")
        content = "\n\n".join(p.get("text", "") if p.get("type") == "text"
                              else f"[Unsupported {p.get('type')}]" for p in content)
    return f"{TOOL_RESULT_START}{content}{TOOL_RESULT_END}"


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
            pairs = ", ".join(f"{_to_json(k)}: {v}" for k, v in arguments.items())
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
        arguments[key] = _to_json(value) if string == "true" else value
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


# --- a grammar that forces a call (llguidance Lark) -------------------------------------

def _lark_string(text: str) -> str:
    """`text` as a Lark string literal (JSON string syntax)."""
    return json.dumps(text, ensure_ascii=False)


def _parameter_rules(rule: str, key: str, schema: Mapping[str, Any],
                     defs: Mapping[str, Any]) -> list[str]:
    """Lark rules for one parameter `key`: string="true" with raw text for a string (the
    listed strings for an enum or const), string="false" with JSON (`%json`) otherwise;
    both when the schema allows a string and more (or does not say)."""
    head = f'<{DSML_TOKEN}parameter name="{key}" string='
    as_text, as_json = _lark_string(head + '"true">'), _lark_string(head + '"false">')
    close = _lark_string(PARAMETER_CLOSE)
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    alternatives, extra = [], []
    if isinstance(choices, list):  # each value with its closing tag: one lexeme apiece
        strings = [c for c in choices if isinstance(c, str)]
        others = [_to_json(c) for c in choices if not isinstance(c, str)]
        if strings:
            values = " | ".join(_lark_string(c + PARAMETER_CLOSE) for c in strings)
            alternatives.append(f"{as_text} ({values})")
        if others:
            values = " | ".join(_lark_string(c + PARAMETER_CLOSE) for c in others)
            alternatives.append(f"{as_json} ({values})")
    else:
        kind = schema.get("type")
        types = {kind} if isinstance(kind, str) else set(kind or ())
        if not types or "string" in types:
            alternatives.append(f"{as_text} str_value")
        if not types or types - {"string"}:
            sub = dict(schema)
            if len(types) > 1:
                sub["type"] = sorted(types - {"string"})
            sub.update({k: v for k, v in defs.items() if k not in sub})
            alternatives.append(f"{as_json} {rule}_json {close}")
            extra.append(f"{rule}_json: %json {json.dumps(sub, ensure_ascii=False)}")
    if not alternatives:
        raise ValueError(f"parameter {key!r}: its schema admits no value ({schema!r:.80})")
    return [f"{rule}: " + " | ".join(alternatives), *extra]


def _invoke_rules(k: int, function: Mapping[str, Any]) -> list[str]:
    """Lark rules for an invoke of tool `k`: its parameters in the schema's order, the
    required ones always, each followed by "\\n" (none: the empty line)."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    defs = {name: parameters[name] for name in ("$defs", "definitions") if name in parameters}
    rules, items = [], []
    for j, (key, schema) in enumerate(properties.items()):
        rules += _parameter_rules(f"p{k}_{j}", key, schema if isinstance(schema, Mapping)
                                  else {}, defs)
        items.append((f'(p{k}_{j} "\\n")', key in required))
    if not properties:  # free-form arguments: any names, any values
        args = f'args{k}: "\\n" | (any_parameter "\\n")+'
    elif any(is_required for _, is_required in items):
        args = f"args{k}: " + " ".join(item + ("" if is_required else "?")
                                       for item, is_required in items)
    else:  # all optional: the empty line, or the first one present and any after it
        firsts = [" ".join([items[j][0]] + [item + "?" for item, _ in items[j + 1:]])
                  for j in range(len(items))]
        args = f"args{k}: " + " | ".join(['"\\n"', *firsts])
    # The "\n" before an invoke is in its literal: a "\n" lexeme of its own would be a
    # prefix of "\n</｜DSML｜tool_calls>", which llguidance's greedy lexer cannot split.
    header = _lark_string(f'\n<{DSML_TOKEN}invoke name="{function["name"]}">\n')
    return [f"invoke{k}: {header} args{k} {_lark_string(INVOKE_CLOSE)}", args, *rules]


def _chosen(tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping[str, Any]
            ) -> tuple[list[Mapping[str, Any]], bool]:
    """(the functions a call may use, whether exactly one call) for `tool_choice`."""
    functions = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"a tool must be {{'type': 'function', 'function': {{'name': ...}}}}"
                             f", got {tool!r:.80}")
        functions.append(function)
    if not functions:
        raise ValueError("tool_choice needs tools to choose from; the request has none")
    if tool_choice == "required":
        return functions, False
    named = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = named.get("name") if isinstance(named, Mapping) else None
    if not isinstance(name, str):
        raise ValueError(f"tool_choice {tool_choice!r:.80} asks for no call to force; a grammar "
                         "is for \"required\" or {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}")
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    return chosen[:1], True


def tool_call_grammar_v4(tools: Sequence[Mapping[str, Any]],
                         tool_choice: str | Mapping[str, Any] = "required", *,
                         thinking: bool = False, parallel: bool = True) -> str:
    """An llguidance Lark grammar for a V4 reply that is only tool calls, in DSML exactly as
    encoding_dsv4.py renders them (for `serving.grammar.TokenGrammar.lark`).

    The reply is `[reasoning "</think>"] "\\n\\n" <｜DSML｜tool_calls> block`, nothing
    before the block (OpenAI's "required" allows no content either) and nothing after it
    (the grammar then accepts only EOS). `tool_choice` "required": one or more calls of any
    tool; `{"type": "function", "function": {"name": N}}`: exactly one call of N. Each
    call writes the tool's parameters in its schema's `properties` order, the `required`
    ones always and the others optionally; a string parameter (an enum or const of strings:
    one of them) as raw text with string="true", any other type as `%json` of its schema
    (with the parameters' `$defs`) with string="false"; both where the schema allows a
    string and more or gives no type; with no `properties`, any parameters. String
    constraints other than enum/const (pattern, lengths, formats) are not enforced.

    Args:
      tools: the request's OpenAI tools.
      tool_choice: "required" or a named function.
      thinking: the prompt ended in "<think>" (thinking mode): reasoning up to the first
        "</think>" comes first, free.
      parallel: OpenAI's `parallel_tool_calls`; False: exactly one call.

    Raises:
      ValueError: no tools, a tool without a function name, a tool_choice that forces
        nothing ("none", "auto") or names no tool, or a parameter schema with no value.
    """
    functions, single = _chosen(tools, tool_choice)
    single = single or not parallel
    opening = _lark_string(TOOL_CALLS_SEPARATOR + TOOL_CALLS_START)
    closing = _lark_string("\n" + TOOL_CALLS_END)
    lines = [f"start: {'think ' if thinking else ''}{opening} calls {closing}",
             "calls: call" + ("" if single else "+"),
             "call: " + " | ".join(f"invoke{k}" for k in range(len(functions)))]
    if thinking:
        end = THINKING_END_TOKEN.replace("/", "\\/")
        lines.append(f"think[lazy]: /(?s:.*){end}/")
    for k, function in enumerate(functions):
        lines += _invoke_rules(k, function)
    close = PARAMETER_CLOSE.replace("/", "\\/")
    head = _lark_string(f'<{DSML_TOKEN}parameter name="')
    lines += [f"str_value[lazy]: /(?s:.*){close}/",
              f'any_parameter: {head} PARAMETER_NAME "\\" string=\\"true\\">" str_value'
              f' | {head} PARAMETER_NAME "\\" string=\\"false\\">" any_json '
              f"{_lark_string(PARAMETER_CLOSE)}",
              'PARAMETER_NAME: /[^"\\n]+/',
              "any_json: %json {}"]
    return "\n".join(lines) + "\n"
