"""DeepSeek-V4's `encode_messages`, transcribed for the tests (the reference the Jinja
template `tokenization.deepseek_v4_chat.DEEPSEEK_V4_CHAT_TEMPLATE` is checked against).

Source: sgl-project/sglang, python/sglang/srt/entrypoints/openai/encoding_dsv4.py at
commit 00370f2784265e663d500abcc6a59b13854840f5 (SGLang's vendored copy of the
DeepSeek-V4 release's encoding/encoding_dsv4.py, "Adapted from the DeepSeek-V4 release
reference implementation"; reasoning efforts None, "high", "max").

The subset: `encode_messages` without `context`, for system, user and assistant
messages with string contents and `reasoning_content`. Kept line for line from the
source: `merge_tool_messages` (which makes consecutive user messages one message of
content blocks), `find_last_user_index`, `_drop_thinking_messages`, and
`render_message`'s system, user, assistant and transition branches. Left out:
`context`, tools and `response_format` (system/developer), tool calls and tool results,
`task` tokens, `wo_eos`, developer and latest_reminder roles (each raises here instead
of rendering) and `sort_tool_results_by_call_order` (a no-op without tool results).
Upstream's `assert`s are kept as asserts.
"""

from __future__ import annotations

import copy
from typing import Any

bos_token: str = "<｜begin▁of▁sentence｜>"
eos_token: str = "<｜end▁of▁sentence｜>"
thinking_start_token: str = "<think>"
thinking_end_token: str = "</think>"

USER_SP_TOKEN = "<｜User｜>"
ASSISTANT_SP_TOKEN = "<｜Assistant｜>"

system_msg_template: str = "{content}"
assistant_msg_template: str = "{reasoning}{content}{tool_calls}" + eos_token
thinking_template: str = "{reasoning_content}"

REASONING_EFFORT_MAX = (
    "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
    "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
    "resolve the root cause, rigorously stress-testing your logic against all potential paths, "
    "edge cases, and adversarial scenarios.\n"
    "Explicitly write out your entire deliberation process, documenting every intermediate "
    "step, considered alternative, and rejected hypothesis to ensure absolutely no assumption "
    "is left unchecked.\n\n"
)

_OUT_OF_SUBSET = ("tools", "response_format", "tool_calls", "task", "wo_eos")


def find_last_user_index(messages: list[dict[str, Any]]) -> int:
    """Find the index of the last user/developer message."""
    last_user_index = -1
    for idx in range(len(messages) - 1, -1, -1):
        if messages[idx].get("role") in ["user", "developer"]:
            last_user_index = idx
            break
    return last_user_index


def render_message(index: int, messages: list[dict[str, Any]], thinking_mode: str,
                   drop_thinking: bool = True, reasoning_effort: str | None = None) -> str:
    """Render a single message at the given index into its encoded string form."""
    assert 0 <= index < len(messages)
    assert thinking_mode in ["chat", "thinking"], f"Invalid thinking_mode `{thinking_mode}`"

    prompt = ""
    msg = messages[index]
    last_user_idx = find_last_user_index(messages)

    role = msg.get("role")
    content = msg.get("content")
    reasoning_content = msg.get("reasoning_content")
    for key in _OUT_OF_SUBSET:
        if msg.get(key):
            raise NotImplementedError(f"out of the reference's subset: {key}")

    # Reasoning effort prefix (only at index 0 in thinking mode with max effort)
    assert reasoning_effort in ["max", None, "high"], (
        f"Invalid reasoning effort: {reasoning_effort}")
    if index == 0 and thinking_mode == "thinking" and reasoning_effort == "max":
        prompt += REASONING_EFFORT_MAX

    if role == "system":
        prompt += system_msg_template.format(content=content or "")

    elif role == "user":
        prompt += USER_SP_TOKEN

        # Handle content blocks (tool results mixed with text)
        content_blocks = msg.get("content_blocks")
        if content_blocks:
            parts = []
            for block in content_blocks:
                block_type = block.get("type")
                if block_type == "text":
                    parts.append(block.get("text", ""))
                else:
                    raise NotImplementedError(f"out of the reference's subset: {block_type}")
            prompt += "\n\n".join(parts)
        else:
            prompt += content or ""

    elif role == "assistant":
        thinking_part = ""
        tc_content = ""

        summary_content = content or ""
        rc = reasoning_content or ""

        # Check if previous message has a task - if so, this is a task output (no thinking)
        prev_has_task = index - 1 >= 0 and messages[index - 1].get("task") is not None

        if thinking_mode == "thinking" and not prev_has_task:
            if not drop_thinking or index > last_user_idx:
                thinking_part = thinking_template.format(reasoning_content=rc) + thinking_end_token
            else:
                thinking_part = ""

        prompt += assistant_msg_template.format(
            reasoning=thinking_part, content=summary_content, tool_calls=tc_content)
    else:
        raise NotImplementedError(f"Unknown role: {role}")

    # Append transition tokens based on what follows
    if index + 1 < len(messages) and messages[index + 1].get("role") not in [
            "assistant", "latest_reminder"]:
        return prompt

    if messages[index].get("role") in ["user", "developer"]:
        # Normal generation: append Assistant + thinking token
        prompt += ASSISTANT_SP_TOKEN
        if not drop_thinking and thinking_mode == "thinking":
            prompt += thinking_start_token
        elif drop_thinking and thinking_mode == "thinking" and index >= last_user_idx:
            prompt += thinking_start_token
        else:
            prompt += thinking_end_token

    return prompt


def merge_tool_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Merge tool messages into the preceding user message using content_blocks format
    (here: no tool messages; consecutive user messages become one message's text blocks)."""
    merged: list[dict[str, Any]] = []

    for msg in messages:
        msg = copy.deepcopy(msg)
        role = msg.get("role")

        if role == "tool":
            raise NotImplementedError("out of the reference's subset: tool")
        elif role == "user":
            text_block = {"type": "text", "text": msg.get("content", "")}
            if (merged and merged[-1].get("role") == "user"
                    and "content_blocks" in merged[-1] and merged[-1].get("task") is None):
                merged[-1]["content_blocks"].append(text_block)
            else:
                new_msg = {
                    "role": "user",
                    "content": msg.get("content", ""),
                    "content_blocks": [text_block],
                }
                # Preserve extra fields (task, wo_eos, mask, etc.)
                for key in ("task", "wo_eos", "mask"):
                    if key in msg:
                        new_msg[key] = msg[key]
                merged.append(new_msg)
        else:
            merged.append(msg)

    return merged


def _drop_thinking_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop reasoning_content and non-essential messages before the last user message."""
    last_user_idx = find_last_user_index(messages)
    result = []
    keep_roles = {"user", "system", "tool", "latest_reminder", "direct_search_results"}

    for idx, msg in enumerate(messages):
        role = msg.get("role")
        if role in keep_roles or idx >= last_user_idx:
            result.append(msg)
        elif role == "assistant":
            msg = copy.copy(msg)
            msg.pop("reasoning_content", None)
            result.append(msg)
        # developer and other roles before last_user_idx are dropped

    return result


def encode_messages(messages: list[dict[str, Any]], thinking_mode: str,
                    drop_thinking: bool = True, add_default_bos_token: bool = True,
                    reasoning_effort: str | None = None) -> str:
    """Encode a list of messages into the DeepSeek-V4 prompt format (no `context`)."""
    messages = merge_tool_messages(messages)
    full_messages = messages

    prompt = bos_token if add_default_bos_token else ""

    # Resolve drop_thinking: if any message has tools defined, don't drop thinking
    effective_drop_thinking = drop_thinking
    if any(m.get("tools") for m in full_messages):
        effective_drop_thinking = False

    if thinking_mode == "thinking" and effective_drop_thinking:
        full_messages = _drop_thinking_messages(full_messages)
        num_to_render = len(full_messages) - len(_drop_thinking_messages([]))
        context_len = len(full_messages) - num_to_render
    else:
        num_to_render = len(messages)
        context_len = 0

    for idx in range(num_to_render):
        prompt += render_message(idx + context_len, full_messages, thinking_mode=thinking_mode,
                                 drop_thinking=effective_drop_thinking,
                                 reasoning_effort=reasoning_effort)

    return prompt
