"""DeepSeek-V4's prompt text for tool calls (DSML): the request's `tools` as the system
prompt's tools section, an assistant's `tool_calls` as the `<｜DSML｜tool_calls>` block,
and a `tool` message's result; the Python twins of tokenization/deepseek_v4_chat.py's
template (the format and its sources: `serving/tool_calls.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from serving.tool_calls import INVOKE_CLOSE, PARAMETER_CLOSE, to_json
from tokenization.deepseek_v4_chat import (
    DSML_TOKEN,
    TOOL_CALLS_END,
    TOOL_CALLS_START,
    TOOL_RESULT_END,
    TOOL_RESULT_START,
    TOOLS_PROMPT,
    tool_call_arguments,
)


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
    return TOOLS_PROMPT.replace("{tool_schemas}", "\n".join(map(to_json, functions)))


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
                     f"{value if is_str else to_json(value)}{PARAMETER_CLOSE}")
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

