"""DeepSeek's tool calls (`serving/tool_calls.py`) and V4's chat template with tools
(`tokenization/deepseek_v4_chat.py`): DeepSeek's own golden prompts, the template against
a transcription of encode_messages, parse <-> render round trips, streamed == whole at
every cut, V3.1/V3.2 markers, and the forcing grammar run through llguidance."""

from __future__ import annotations

import copy
import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.reasoning import ReasoningSplitter
from serving.tool_call_grammar import tool_call_grammar_v4
from serving.tool_call_render import (
    encode_arguments_v4,
    render_tool_calls_v4,
    render_tool_result_v4,
    render_tools_v4,
)
from serving.tool_calls import (
    DEEPSEEK_V4,
    DEEPSEEK_V31,
    DEEPSEEK_V32,
    FORMATS,
    ToolCallParseError,
    ToolCallStreamParser,
    openai_tool_calls,
    parse_tool_calls,
    parse_tool_calls_v4,
    parse_tool_calls_v31,
    parse_tool_calls_v32,
)
from tokenization.chat_template import ChatTemplateError, render_prompt
from tokenization.deepseek_v4_chat import (
    BOS_TOKEN,
    DEEPSEEK_V4_CHAT_TEMPLATE,
    EOS_TOKEN,
    REASONING_EFFORT_MAX,
    TOOLS_TEMPLATE,
    template_kwargs,
    template_messages,
    tool_call_arguments,
)

BOS, EOS = BOS_TOKEN, EOS_TOKEN
TINY_TOKENIZER = (Path(__file__).resolve().parents[1] / "fixtures" / "per_expert_savedmodel"
                  / "float32" / "assets" / "tokenizer.json")

# --- DeepSeek's golden prompt 1 ---------------------------------------------------------
# DeepSeek-V4's encoding/tests/test_input_1.json and test_output_1.txt (encode_messages(
# messages with tools on messages[0], thinking_mode="thinking")), as vllm-project/vllm
# vendors them: tests/tokenizers_/fixtures/deepseek_v4/test_input_1.json at commit
# ad2012467fb2853a9fff033bd0a8a15748af44c5 and test_output_1.txt at commit
# 5beed0ad9dcf25c8a93b837b737ff2f19319c865. vLLM's copy names the reasoning "reasoning";
# encoding_dsv4.py reads "reasoning_content", the name used here.
GOLDEN_1_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather for a specific location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"],
                     "description": "Temperature unit"}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web for information",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Search query"},
            "num_results": {"type": "integer", "description": "Number of results to return"}},
            "required": ["query"]}}},
]
GOLDEN_1_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What's the weather in Beijing?"},
    {"role": "assistant",
     "reasoning_content": "The user wants to know the weather in Beijing. I should use the get_weather tool.",
     "tool_calls": [{"id": "call_001", "type": "function", "function": {
         "name": "get_weather", "arguments": "{\"location\": \"Beijing\", \"unit\": \"celsius\"}"}}]},
    {"role": "tool", "tool_call_id": "call_001",
     "content": "{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}"},
    {"role": "assistant", "reasoning_content": "Got the weather data. Let me format a nice response.",
     "content": "The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity."},
]
GOLDEN_1_TOOLS_SECTION = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n"
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{\"name\": \"get_weather\", \"description\": \"Get the weather for a specific location\", \"parameters\": {\"type\": \"object\", \"properties\": {\"location\": {\"type\": \"string\", \"description\": \"The city name\"}, \"unit\": {\"type\": \"string\", \"enum\": [\"celsius\", \"fahrenheit\"], \"description\": \"Temperature unit\"}}, \"required\": [\"location\"]}}\n"
    "{\"name\": \"search\", \"description\": \"Search the web for information\", \"parameters\": {\"type\": \"object\", \"properties\": {\"query\": {\"type\": \"string\", \"description\": \"Search query\"}, \"num_results\": {\"type\": \"integer\", \"description\": \"Number of results to return\"}}, \"required\": [\"query\"]}}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)
GOLDEN_1_CALLS = (
    "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
    "<｜DSML｜parameter name=\"location\" string=\"true\">Beijing</｜DSML｜parameter>\n"
    "<｜DSML｜parameter name=\"unit\" string=\"true\">celsius</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)
GOLDEN_1 = (
    "<｜begin▁of▁sentence｜>You are a helpful assistant.\n\n" + GOLDEN_1_TOOLS_SECTION
    + "<｜User｜>What's the weather in Beijing?<｜Assistant｜><think>The user wants to know the weather in Beijing. I should use the get_weather tool.</think>\n\n"
    + GOLDEN_1_CALLS
    + "<｜end▁of▁sentence｜><｜User｜><tool_result>{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}</tool_result>"
    "<｜Assistant｜><think>Got the weather data. Let me format a nice response.</think>The weather in Beijing is currently sunny with a temperature of 22°C and 45% humidity.<｜end▁of▁sentence｜>"
)

# --- DeepSeek's golden prompt 3, its tool parts (Chinese) --------------------------------
# test_input_3.json at commit 26792e4545f4b3750e133147a54ffe750cb93682 and
# test_output_3.txt at commit 7a24fbb332c9a7db49473e678e1d0b9dddf39e8d (same vLLM
# directory). The whole prompt needs the developer and latest_reminder roles, which the
# template refuses; its tools section, tool call and tool result are checked here.
GOLDEN_3_TOOLS = [
    {"type": "function", "function": {
        "name": "search", "description": "Web search. Split multiple queries with '||'.",
        "parameters": {"type": "object",
                       "properties": {"queries": {"type": "string", "description": "query1||query2"}},
                       "required": ["queries"], "additionalProperties": False,
                       "$schema": "http://json-schema.org/draft-07/schema#"}}},
    {"type": "function", "function": {
        "name": "open", "description": "Batch open IDs (format 【{id}†...】) or URLs.",
        "parameters": {"type": "object", "properties": {"open_list": {
            "type": "array", "items": {"type": "object", "properties": {
                "id": {"description": "ID or URL", "anyOf": [{"type": "integer"}, {"type": "string"}], "default": -1},
                "cursor": {"type": "integer", "description": "", "default": -1},
                "loc": {"type": "integer", "description": "Start line", "default": -1},
                "num_lines": {"type": "integer", "description": "", "default": -1},
                "view_source": {"type": "boolean", "description": "", "default": False}},
                "additionalProperties": False},
            "description": ""}},
            "required": ["open_list"], "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}}},
    {"type": "function", "function": {
        "name": "find", "description": "Find exact text pattern in pages.",
        "parameters": {"type": "object", "properties": {"find_list": {
            "type": "array", "items": {"type": "object", "properties": {
                "pattern": {"type": "string", "description": ""},
                "cursor": {"type": "integer", "description": "", "default": -1}},
                "required": ["pattern"], "additionalProperties": False},
            "description": ""}},
            "required": ["find_list"], "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#"}}},
]
GOLDEN_3_SCHEMAS = (
    "{\"name\": \"search\", \"description\": \"Web search. Split multiple queries with '||'.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"queries\": {\"type\": \"string\", \"description\": \"query1||query2\"}}, \"required\": [\"queries\"], \"additionalProperties\": false, \"$schema\": \"http://json-schema.org/draft-07/schema#\"}}\n"
    "{\"name\": \"open\", \"description\": \"Batch open IDs (format 【{id}†...】) or URLs.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"open_list\": {\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"id\": {\"description\": \"ID or URL\", \"anyOf\": [{\"type\": \"integer\"}, {\"type\": \"string\"}], \"default\": -1}, \"cursor\": {\"type\": \"integer\", \"description\": \"\", \"default\": -1}, \"loc\": {\"type\": \"integer\", \"description\": \"Start line\", \"default\": -1}, \"num_lines\": {\"type\": \"integer\", \"description\": \"\", \"default\": -1}, \"view_source\": {\"type\": \"boolean\", \"description\": \"\", \"default\": false}}, \"additionalProperties\": false}, \"description\": \"\"}}, \"required\": [\"open_list\"], \"additionalProperties\": false, \"$schema\": \"http://json-schema.org/draft-07/schema#\"}}\n"
    "{\"name\": \"find\", \"description\": \"Find exact text pattern in pages.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"find_list\": {\"type\": \"array\", \"items\": {\"type\": \"object\", \"properties\": {\"pattern\": {\"type\": \"string\", \"description\": \"\"}, \"cursor\": {\"type\": \"integer\", \"description\": \"\", \"default\": -1}}, \"required\": [\"pattern\"], \"additionalProperties\": false}, \"description\": \"\"}}, \"required\": [\"find_list\"], \"additionalProperties\": false, \"$schema\": \"http://json-schema.org/draft-07/schema#\"}}"
)
# The assistant turn of golden 3 after "<｜Assistant｜><think>", as the model wrote it.
GOLDEN_3_REPLY = (
    "用户想知道小柴胡冲剂和布洛芬能否一起服用。</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"search\">\n"
    "<｜DSML｜parameter name=\"queries\" string=\"true\">小柴胡冲剂 布洛芬 相互作用 一起吃</｜DSML｜parameter>\n"
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)


@functools.cache
def _transformers_template():
    """The template as transformers' `apply_chat_template` compiles it: its sandbox,
    trim_blocks, lstrip_blocks, loopcontrols, raise_exception and its `tojson`
    (`json.dumps`, non-ASCII kept, keys unsorted)."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(DEEPSEEK_V4_CHAT_TEMPLATE)


def _template(messages, tools=None, thinking=False, drop_thinking=True, effort=None):
    """The whole conversation through the template (transformers' way)."""
    kwargs = template_kwargs(thinking, effort, drop_thinking, tools=tools)
    return _transformers_template().render(messages=template_messages(messages), bos_token=BOS,
                                           eos_token=EOS, **kwargs)


def _prompt(messages, tools=None, thinking=False, drop_thinking=True, effort=None):
    """The prompt through this project's renderer (the last turn is not the assistant's)."""
    return render_prompt(DEEPSEEK_V4_CHAT_TEMPLATE, template_messages(messages), BOS, EOS,
                         template_kwargs=template_kwargs(thinking, effort, drop_thinking,
                                                         tools=tools))


# --- encode_messages with tools, transcribed (the reference for the template) -----------
# sgl-project/sglang python/sglang/srt/entrypoints/openai/encoding_dsv4.py at commit
# 00370f2784265e663d500abcc6a59b13854840f5, the same logic condensed: merge_tool_messages,
# sort_tool_results_by_call_order, find_last_user_index, _drop_thinking_messages,
# encode_arguments_to_dsml, render_tools and render_message's system (with tools), user
# (content blocks, tool results), assistant (tool calls) and transition branches. Left
# out: `context`, task, wo_eos, response_format, developer and latest_reminder.
DSML = "｜DSML｜"


def _up_to_json(value):
    try:
        return json.dumps(value, ensure_ascii=False)
    except Exception:  # noqa: BLE001 (upstream's bare except)
        return json.dumps(value, ensure_ascii=True)


def _up_encode_arguments_to_dsml(tool_call):
    p_dsml_template = '<{dsml_token}parameter name="{key}" string="{is_str}">{value}</{dsml_token}parameter>'
    try:
        arguments = json.loads(tool_call["arguments"])
    except Exception:  # noqa: BLE001
        arguments = {"arguments": tool_call["arguments"]}
    return "\n".join(p_dsml_template.format(
        dsml_token=DSML, key=k, is_str="true" if isinstance(v, str) else "false",
        value=v if isinstance(v, str) else _up_to_json(v)) for k, v in arguments.items())


def _up_render_tools(tools):
    return TOOLS_TEMPLATE.format(tool_schemas="\n".join(_up_to_json(t) for t in tools),
                                 dsml_token=DSML, thinking_start_token="<think>",
                                 thinking_end_token="</think>")


def _up_find_last_user_index(messages):
    for idx in range(len(messages) - 1, -1, -1):
        if messages[idx].get("role") in ["user", "developer"]:
            return idx
    return -1


def _up_user_text(msg):
    content_blocks = msg.get("content_blocks")
    if not content_blocks:
        return msg.get("content") or ""
    parts = []
    for block in content_blocks:
        if block.get("type") == "text":
            parts.append(block.get("text", ""))
        elif block.get("type") == "tool_result":
            tool_content = block.get("content", "")
            if isinstance(tool_content, list):
                tool_content = "\n\n".join(
                    b.get("text", "") if b.get("type") == "text" else f"[Unsupported {b.get('type')}]"
                    for b in tool_content)
            parts.append(f"<tool_result>{tool_content}</tool_result>")
    return "\n\n".join(parts)


def _up_assistant(index, messages, msg, thinking_mode, drop_thinking):
    tc_content = ""
    if msg.get("tool_calls"):
        calls = [{"name": tc["function"]["name"], "arguments": tc["function"]["arguments"]}
                 for tc in msg["tool_calls"]]
        tc_list = [f'<{DSML}invoke name="{tc.get("name")}">\n{_up_encode_arguments_to_dsml(tc)}\n</{DSML}invoke>'
                   for tc in calls]
        tc_content += "\n\n" + f"<{DSML}tool_calls>\n" + "\n".join(tc_list) + f"\n</{DSML}tool_calls>"
    thinking_part = ""
    if thinking_mode == "thinking":
        if not drop_thinking or index > _up_find_last_user_index(messages):
            thinking_part = (msg.get("reasoning_content") or "") + "</think>"
    return thinking_part + (msg.get("content") or "") + tc_content + EOS


def _up_render_message(index, messages, thinking_mode, drop_thinking, reasoning_effort):
    msg, prompt = messages[index], ""
    role = msg.get("role")
    if index == 0 and thinking_mode == "thinking" and reasoning_effort == "max":
        prompt += REASONING_EFFORT_MAX
    if role == "system":
        prompt += msg.get("content") or ""
        if msg.get("tools"):
            prompt += "\n\n" + _up_render_tools([t["function"] for t in msg["tools"]])
    elif role == "user":
        prompt += "<｜User｜>" + _up_user_text(msg)
    elif role == "assistant":
        prompt += _up_assistant(index, messages, msg, thinking_mode, drop_thinking)
    else:
        raise NotImplementedError(f"Unknown role: {role}")
    if index + 1 < len(messages) and messages[index + 1].get("role") not in ["assistant", "latest_reminder"]:
        return prompt
    if role in ["user", "developer"]:
        prompt += "<｜Assistant｜>"
        if not drop_thinking and thinking_mode == "thinking":
            prompt += "<think>"
        elif drop_thinking and thinking_mode == "thinking" and index >= _up_find_last_user_index(messages):
            prompt += "<think>"
        else:
            prompt += "</think>"
    return prompt


def _up_merge_tool_messages(messages):
    merged = []
    for msg in messages:
        msg = copy.deepcopy(msg)
        if msg.get("role") == "tool":
            tool_block = {"type": "tool_result", "tool_use_id": msg.get("tool_call_id", ""),
                          "content": msg.get("content", "")}
            if merged and merged[-1].get("role") == "user" and "content_blocks" in merged[-1]:
                merged[-1]["content_blocks"].append(tool_block)
            else:
                merged.append({"role": "user", "content_blocks": [tool_block]})
        elif msg.get("role") == "user":
            text_block = {"type": "text", "text": msg.get("content", "")}
            if merged and merged[-1].get("role") == "user" and "content_blocks" in merged[-1]:
                merged[-1]["content_blocks"].append(text_block)
            else:
                merged.append({"role": "user", "content": msg.get("content", ""),
                               "content_blocks": [text_block]})
        else:
            merged.append(msg)
    return merged


def _up_sort_tool_results_by_call_order(messages):
    last_tool_call_order = {}
    for msg in messages:
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            last_tool_call_order = {}
            for idx, tc in enumerate(msg["tool_calls"]):
                tc_id = tc.get("id") or tc.get("function", {}).get("id", "")
                if tc_id:
                    last_tool_call_order[tc_id] = idx
        elif msg.get("role") == "user" and msg.get("content_blocks"):
            tool_blocks = [b for b in msg["content_blocks"] if b.get("type") == "tool_result"]
            if len(tool_blocks) > 1 and last_tool_call_order:
                sorted_blocks = iter(sorted(tool_blocks, key=lambda b: last_tool_call_order.get(
                    b.get("tool_use_id", ""), 0)))
                msg["content_blocks"] = [next(sorted_blocks) if b.get("type") == "tool_result" else b
                                         for b in msg["content_blocks"]]
    return messages


def _up_encode_messages(messages, thinking_mode, drop_thinking=True, reasoning_effort=None):
    messages = _up_sort_tool_results_by_call_order(_up_merge_tool_messages(messages))
    effective_drop_thinking = drop_thinking and not any(m.get("tools") for m in messages)
    # _drop_thinking_messages only drops reasoning the render skips anyway, and roles
    # (developer) this subset has not.
    return BOS + "".join(_up_render_message(i, messages, thinking_mode, effective_drop_thinking,
                                            reasoning_effort) for i in range(len(messages)))


def _reference(messages, tools=None, thinking=False, drop_thinking=True, effort=None):
    """SGLang's serving path: tools on the first message, an empty system one put first."""
    messages = copy.deepcopy(messages)
    if tools:
        if not messages or messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": ""})
        messages[0]["tools"] = tools
    return _up_encode_messages(messages, "thinking" if thinking else "chat", drop_thinking,
                               effort)


# --- golden prompts -----------------------------------------------------------------------

def test_golden_1_through_the_template():
    """DeepSeek's test 1 (tools, a call, its result, thinking mode), byte for byte: the
    whole conversation, and the prompt before the last answer through render_prompt."""
    assert _template(GOLDEN_1_MESSAGES, GOLDEN_1_TOOLS, thinking=True) == GOLDEN_1
    assert _reference(GOLDEN_1_MESSAGES, GOLDEN_1_TOOLS, thinking=True) == GOLDEN_1
    prompt = _prompt(GOLDEN_1_MESSAGES[:-1], GOLDEN_1_TOOLS, thinking=True)
    assert prompt == GOLDEN_1[:GOLDEN_1.rindex("<｜Assistant｜>")] + "<｜Assistant｜><think>"


def test_golden_1_through_the_python_renderers():
    assert render_tools_v4(GOLDEN_1_TOOLS) == GOLDEN_1_TOOLS_SECTION
    assert render_tool_calls_v4(GOLDEN_1_MESSAGES[2]["tool_calls"]) == GOLDEN_1_CALLS
    assert render_tool_result_v4(GOLDEN_1_MESSAGES[3]["content"]) == (
        "<tool_result>{\"temperature\": 22, \"condition\": \"sunny\", \"humidity\": 45}</tool_result>")


def test_golden_1_reply_parses_back():
    """The assistant turn of test 1, as the model wrote it, parses to its message."""
    start = GOLDEN_1.index("<｜Assistant｜><think>") + len("<｜Assistant｜><think>")
    reply = GOLDEN_1[start:GOLDEN_1.index(EOS, start)]
    splitter = ReasoningSplitter()
    reasoning, rest = splitter.push(reply)
    tail = splitter.finish()
    reasoning, rest = reasoning + tail[0], rest + tail[1]
    assert reasoning == GOLDEN_1_MESSAGES[2]["reasoning_content"]
    content, calls = parse_tool_calls_v4(rest)
    assert content == ""
    assert calls == [{"name": "get_weather",
                      "arguments": GOLDEN_1_MESSAGES[2]["tool_calls"][0]["function"]["arguments"]}]


def test_golden_3_tool_parts_in_chinese():
    expected_tools = TOOLS_TEMPLATE.format(
        dsml_token=DSML, thinking_start_token="<think>", thinking_end_token="</think>",
        tool_schemas=GOLDEN_3_SCHEMAS)
    assert render_tools_v4(GOLDEN_3_TOOLS) == expected_tools
    call = [{"type": "function", "function": {
        "name": "search", "arguments": "{\"queries\": \"小柴胡冲剂 布洛芬 相互作用 一起吃\"}"}}]
    assert render_tool_calls_v4(call) == GOLDEN_3_REPLY[GOLDEN_3_REPLY.index("<｜DSML"):]
    assert render_tool_result_v4("[0]") == "<tool_result>[0]</tool_result>"
    reasoning, content = ReasoningSplitter().push(GOLDEN_3_REPLY)
    assert reasoning == "用户想知道小柴胡冲剂和布洛芬能否一起服用。"
    assert parse_tool_calls_v4(content) == ("", [
        {"name": "search", "arguments": "{\"queries\": \"小柴胡冲剂 布洛芬 相互作用 一起吃\"}"}])


# --- the template with tools, by hand ------------------------------------------------------

WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "查询城市天气",
    "parameters": {"type": "object", "properties": {"城市": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["城市"]}}}]


def test_tools_without_a_system_message_get_an_empty_one():
    messages = [{"role": "user", "content": "北京天气？"}]
    got = _prompt(messages, WEATHER, thinking=True, effort="max")
    assert got == (BOS + REASONING_EFFORT_MAX + "\n\n" + render_tools_v4(WEATHER)
                   + "<｜User｜>北京天气？<｜Assistant｜><think>")
    assert got == _reference(messages, WEATHER, thinking=True, effort="max")


def test_parallel_results_are_sorted_by_the_calls_order():
    calls = [{"id": f"call_{i}", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"城市": city}, ensure_ascii=False)}}
        for i, city in enumerate(["北京", "上海", "广州"])]
    messages = [{"role": "user", "content": "三个城市的天气"},
                {"role": "assistant", "content": "", "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_2", "content": "广州 30°C"},
                {"role": "tool", "tool_call_id": "call_0", "content": "北京 22°C"},
                {"role": "user", "content": "还有呢？"},
                {"role": "tool", "tool_call_id": "call_1", "content": "上海 25°C"}]
    got = _prompt(messages, WEATHER, thinking=False)
    # The three results take the tool slots in call order; the user's text keeps its place.
    assert got.endswith("<｜User｜><tool_result>北京 22°C</tool_result>\n\n<tool_result>上海 25°C"
                        "</tool_result>\n\n还有呢？\n\n<tool_result>广州 30°C</tool_result>"
                        "<｜Assistant｜></think>")
    assert got == _reference(messages, WEATHER)


def test_arguments_as_a_mapping_and_odd_values():
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {
            "s": "北京", "n": 1.5, "b": True, "z": None, "l": [1, "二"], "o": {"k": "v"}}}},
        {"type": "function", "function": {"name": "g", "arguments": "not json"}},
        {"type": "function", "function": {"name": "h", "arguments": "{}"}}]},
        {"role": "user", "content": "q2"}]
    got = _prompt(messages, thinking=True)
    assert ('<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="s" string="true">北京</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="n" string="false">1.5</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="b" string="false">true</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="z" string="false">null</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="l" string="false">[1, "二"]</｜DSML｜parameter>\n'
            '<｜DSML｜parameter name="o" string="false">{"k": "v"}</｜DSML｜parameter>\n'
            '</｜DSML｜invoke>\n<｜DSML｜invoke name="g">\n'
            '<｜DSML｜parameter name="arguments" string="true">not json</｜DSML｜parameter>\n'
            '</｜DSML｜invoke>\n<｜DSML｜invoke name="h">\n\n</｜DSML｜invoke>') in got
    # encoding_dsv4.py would nest a mapping under "arguments" (vLLM's fix is followed):
    # for JSON text the two agree.
    as_text = copy.deepcopy(messages)
    as_text[1]["tool_calls"][0]["function"]["arguments"] = json.dumps(
        messages[1]["tool_calls"][0]["function"]["arguments"], ensure_ascii=False)
    assert _prompt(as_text, thinking=True) == got == _reference(as_text, thinking=True)


def test_tool_content_parts():
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "content": [{"type": "text", "text": "第一"}, {"type": "image_url"},
                                             {"type": "text", "text": "第二"}]}]
    got = _prompt(messages)
    assert got.endswith("<tool_result>第一\n\n[Unsupported image_url]\n\n第二</tool_result>"
                        "<｜Assistant｜></think>")
    assert got == _reference(messages)
    assert render_tool_result_v4(messages[2]["content"]) == (
        "<tool_result>第一\n\n[Unsupported image_url]\n\n第二</tool_result>")


@pytest.mark.parametrize("messages, tools, match", [
    ([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{}"}}]}, {"role": "user", "content": "q"}], None,
     "arguments as a mapping"),
    ([{"role": "user", "content": "q", "tool_calls": [{"function": {"name": "f"}}]}], None,
     "a user message with tool_calls is not supported"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"name": "f"}]},
      {"role": "user", "content": "q"}], None, "needs each call as"),
    ([{"role": "tool", "content": None}], None, "a tool content must be"),
    ([{"role": "tool", "content": ["x"]}], None, "a tool content must be"),
    ([{"role": "user", "content": "q"}], [{"name": "f"}], "a tool must be"),
    ([{"role": "developer", "content": "q"}], None, "role developer is not supported"),
    ([{"role": "system", "content": "s", "tools": WEATHER}], None,
     "a system message with tools is not supported"),
])
def test_refusals_name_the_problem(messages, tools, match):
    kwargs = template_kwargs(tools=tools)
    with pytest.raises(ChatTemplateError, match=match):
        render_prompt(DEEPSEEK_V4_CHAT_TEMPLATE, messages, BOS, EOS, template_kwargs=kwargs)


def test_tool_call_arguments_and_template_messages():
    assert tool_call_arguments('{"城市": "北京"}') == {"城市": "北京"}
    assert tool_call_arguments("北京") == {"arguments": "北京"}  # upstream's fallback
    assert tool_call_arguments("") == {"arguments": ""}
    assert tool_call_arguments(None) == {}
    assert tool_call_arguments({"a": 1}) == {"a": 1}
    with pytest.raises(ValueError, match="must be a JSON object"):
        tool_call_arguments("[1, 2]")
    messages = [{"role": "assistant", "tool_calls": [{"id": "c", "function": {
        "name": "f", "arguments": '{"a": 1}'}}, "junk"]}]
    copied = template_messages(messages)
    assert copied[0]["tool_calls"] == [{"id": "c", "function": {"name": "f", "arguments": {"a": 1}}},
                                       "junk"]
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'  # not changed


# --- the template against the reference, generated conversations ------------------------

_PIECES = ["北京", "城市", "🌸", "\n\n", " ", '"', "\\", "{", "}", "<think>", "</think>",
           "<｜User｜>", "<tool_result>", "{content}", "{{ x }}"]
_TEXT = st.lists(st.one_of(st.text(max_size=4), st.sampled_from(_PIECES)),
                 max_size=4).map("".join)
_JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), _TEXT,
              st.floats(allow_nan=False, allow_infinity=False, width=32)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(_TEXT, inner, max_size=3)),
    max_leaves=6)
_ARGUMENTS = st.one_of(
    st.dictionaries(st.sampled_from(["城市", "days", "q", "a b", ""]), _JSON_VALUES,
                    max_size=4).map(lambda d: json.dumps(d, ensure_ascii=False)),
    _TEXT.filter(lambda t: not _is_json_non_object(t)))
_IDS = st.sampled_from(["call_0", "call_1", "call_2", "", None])


def _is_json_non_object(text: str) -> bool:
    try:
        return not isinstance(json.loads(text), dict)
    except ValueError:
        return False


@st.composite
def _message(draw):
    role = draw(st.sampled_from(["system", "user", "assistant", "tool", "tool"]))
    if role == "tool":
        message = {"role": role, "content": draw(st.one_of(_TEXT, st.just(
            [{"type": "text", "text": "部分"}, {"type": "image_url"}])))}
        tool_call_id = draw(_IDS)
        if tool_call_id is not None:
            message["tool_call_id"] = tool_call_id
        return message
    message = {"role": role, "content": draw(_TEXT if role == "user" else st.one_of(_TEXT, st.none()))}
    if role == "assistant":
        if draw(st.booleans()):
            message["reasoning_content"] = draw(st.one_of(st.none(), _TEXT))
        calls = draw(st.lists(st.tuples(_IDS, st.sampled_from(["get_weather", "搜索"]), _ARGUMENTS),
                              max_size=3))
        if calls or draw(st.booleans()):
            message["tool_calls"] = [
                {**({"id": i} if i is not None else {}), "type": "function",
                 "function": {"name": name, "arguments": arguments}}
                for i, name, arguments in calls]
    return message


_MODES = st.sampled_from([(False, True, None), (True, True, None), (True, False, None),
                          (True, True, "max"), (False, False, "max")])


@settings(max_examples=120, deadline=None)
@given(st.lists(_message(), min_size=1, max_size=7), _MODES, st.booleans())
def test_template_equals_encode_messages(messages, mode, with_tools):
    thinking, drop_thinking, effort = mode
    tools = WEATHER if with_tools else None
    expected = _reference(messages, tools, thinking, drop_thinking, effort)
    assert _template(messages, tools, thinking, drop_thinking, effort) == expected
    if messages[-1]["role"] != "assistant":
        assert _prompt(messages, tools, thinking, drop_thinking, effort) == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(_message(), min_size=1, max_size=5), _MODES)
def test_the_response_follows_the_prompt(messages, mode):
    """An SFT example with a tool-calling answer: the whole conversation is the prompt,
    then the answer as the model writes it (reasoning, "</think>", content, "\\n\\n",
    the block), then EOS."""
    thinking, drop_thinking, effort = mode
    prompt = [*messages, {"role": "user", "content": "天气？"}]
    calls = [{"type": "function", "function": {"name": "get_weather",
                                               "arguments": '{"城市": "北京", "days": 3}'}}]
    answer = {"role": "assistant", "content": "我查一下。", "reasoning_content": "要调用工具。",
              "tool_calls": calls}
    whole = _template([*prompt, answer], WEATHER, thinking, drop_thinking, effort)
    text = ("要调用工具。</think>" if thinking else "") + "我查一下。\n\n" + render_tool_calls_v4(calls)
    assert whole == _prompt(prompt, WEATHER, thinking, drop_thinking, effort) + text + EOS


# --- parsing: whole and streamed ----------------------------------------------------------

def _ids(index: int) -> str:
    return f"call_{index}"


def _stream(text: str, cuts: list[int], fmt=DEEPSEEK_V4, strict=False):
    """`text` pushed in the pieces between `cuts`, then finished: (content, calls)."""
    parser = ToolCallStreamParser(fmt, strict=strict, call_id=_ids)
    content, deltas = [], []
    bounds = [0, *cuts, len(text)]
    for start, stop in [*zip(bounds, bounds[1:], strict=False), (None, None)]:
        piece, got = parser.push(text[start:stop]) if start is not None else parser.finish()
        content.append(piece)
        deltas += got
    assert [d["index"] for d in deltas] == list(range(len(deltas)))
    assert all(d["id"] == _ids(d["index"]) and d["type"] == "function" for d in deltas)
    return "".join(content), [{"name": d["function"]["name"], "arguments": d["function"]["arguments"]}
                              for d in deltas]


CALLS = [{"name": "get_weather", "arguments": '{"城市": "北京", "days": 3}'},
         {"name": "搜索", "arguments": '{"q": "小柴胡冲剂 布洛芬", "filters": {"年份": [2024, 2025]}, "exact": false}'},
         {"name": "now", "arguments": "{}"}]
BLOCK = render_tool_calls_v4(CALLS)
# (reply, content, calls); V4 unless noted.
PARSE_CASES = [
    ("北京今天晴。", "北京今天晴。", []),
    ("我来查一下。\n\n" + BLOCK, "我来查一下。", CALLS),
    (BLOCK, "", CALLS),
    ("\n\n" + BLOCK, "", CALLS),
    ("a\n\n\n" + BLOCK + "  尾巴", "a\n  尾巴", CALLS),  # one separator comes off
    ("x" + BLOCK + "\n\n" + render_tool_calls_v4(CALLS[:1]), "x", CALLS + CALLS[:1]),
    # Lenient whitespace between elements (vLLM's parsers allow it).
    ('<｜DSML｜tool_calls><｜DSML｜invoke  name="f" ><｜DSML｜parameter name="a"  string="false" >'
     '[1]</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜tool_calls>', "", [
        {"name": "f", "arguments": '{"a": [1]}'}]),
    # Raw JSON kept as written; string values re-encoded (decode_dsml_to_arguments).
    ('\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="v" string="false">'
     '{"x":1}</｜DSML｜parameter>\n<｜DSML｜parameter name="s" string="true">"引号"\n\\n</｜DSML｜'
     'parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>', "",
     [{"name": "f", "arguments": '{"v": {"x":1}, "s": "\\"引号\\"\\n\\\\n"}'}]),
]
MALFORMED = [
    "答\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"f\">\n",  # never closed
    "\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>",  # no call
    "\n\n<｜DSML｜tool_calls>\nhello\n</｜DSML｜tool_calls>",  # stray text
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="">\n\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>',
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="n" string="false">'
    "北京</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",  # not JSON
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="n" string="false">'
    "NaN</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",  # not JSON either
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="true">1'
    '</｜DSML｜parameter>\n<｜DSML｜parameter name="a" string="true">2</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",  # repeated parameter
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n<｜DSML｜parameter name="a" string="yes">1'
    "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>",  # bad string attribute
    '\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name="f">\n</｜DSML｜tool_calls>',  # invoke not closed
]
PARSE_CASES += [("前" + bad, "前" + bad, []) for bad in MALFORMED]
PARSE_CASES += [("前" + MALFORMED[1] + "中" + BLOCK, "前" + MALFORMED[1] + "中", CALLS)]


_CASE_IDS = [f"case{i}" for i in range(len(PARSE_CASES))]


@pytest.mark.parametrize("text, content, calls", PARSE_CASES, ids=_CASE_IDS)
def test_parse_by_hand(text, content, calls):
    assert parse_tool_calls_v4(text) == (content, calls)
    assert parse_tool_calls(text, FORMATS["deepseek_v4"]) == (content, calls)
    for call in calls:
        json.loads(call["arguments"])  # always JSON


@pytest.mark.parametrize("text, content, calls", PARSE_CASES, ids=_CASE_IDS)
def test_streamed_equals_whole_at_every_cut(text, content, calls):
    for i in range(len(text) + 1):
        assert _stream(text, [i]) == (content, calls), i
    assert _stream(text, list(range(1, len(text)))) == (content, calls)  # char by char


def test_streamed_equals_whole_at_every_pair_of_cuts():
    text = "好的。\n\n" + render_tool_calls_v4(CALLS[:1]) + "\n尾"
    expected = parse_tool_calls_v4(text)
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert _stream(text, [i, j]) == expected, (i, j)


@pytest.mark.parametrize("bad", MALFORMED, ids=[f"bad{i}" for i in range(len(MALFORMED))])
def test_strict_raises(bad):
    with pytest.raises(ToolCallParseError):
        parse_tool_calls_v4(bad, strict=True)
    with pytest.raises(ToolCallParseError):
        _stream(bad, [3], strict=True)


def test_strict_errors_say_what_is_wrong():
    with pytest.raises(ToolCallParseError, match=r"parameter 'n' of 'f' \(string=\"false\"\) is not JSON"):
        parse_tool_calls_v4(MALFORMED[4], strict=True)
    with pytest.raises(ToolCallParseError, match="given twice"):
        parse_tool_calls_v4(MALFORMED[6], strict=True)
    with pytest.raises(ToolCallParseError, match="not closed"):
        parse_tool_calls_v4(MALFORMED[0], strict=True)


def test_content_streams_before_the_block_and_calls_come_whole():
    parser = ToolCallStreamParser(call_id=_ids)
    assert parser.push("我来查一下") == ("我来查一下", [])
    assert parser.push("。\n") == ("。", [])  # "\n" may start the separator
    assert parser.push("\n<｜DSML｜tool") == ("", [])
    half = len(BLOCK) // 2
    assert parser.push(BLOCK[len("<｜DSML｜tool"):half]) == ("", [])
    content, deltas = parser.push(BLOCK[half:] + "。")
    assert content == "。"
    assert deltas[0] == {"index": 0, "id": "call_0", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"城市": "北京", "days": 3}'}}
    assert len(deltas) == 3 and parser.calls == 3
    assert parser.finish() == ("", [])
    with pytest.raises(RuntimeError, match="finished already"):
        parser.push("x")


def test_a_long_argument_in_small_pieces():
    """A 60,000-character argument, 3 characters a piece: scanned once, not per piece."""
    calls = [{"name": "write_file", "arguments": json.dumps(
        {"path": "a.txt", "text": "床前明月光，疑是地上霜。\n" * 5000}, ensure_ascii=False)}]
    text = "写文件。\n\n" + render_tool_calls_v4(calls)
    assert _stream(text, list(range(3, len(text), 3))) == ("写文件。", calls)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["get_weather", "搜索", "f"]),
                          st.dictionaries(st.sampled_from(["城市", "days", "q", ""]), _JSON_VALUES,
                                          max_size=3)), max_size=3),
       _TEXT, _TEXT, st.lists(st.integers(0, 400), max_size=5))
def test_render_parse_round_trip(calls, before, after, cuts):
    """render -> parse gives the calls back, arguments as json.dumps wrote them; the reply
    cut anywhere streams to the same."""
    calls = [{"name": n, "arguments": json.dumps(a, ensure_ascii=False)} for n, a in calls]
    text = before + ("\n\n" + render_tool_calls_v4(calls) if calls else "") + after
    content, parsed = parse_tool_calls_v4(text)
    if "<｜DSML｜tool_calls>" not in before + after:
        assert parsed == calls
        assert content == before + after
    assert _stream(text, sorted(min(c, len(text)) for c in cuts)) == (content, parsed)


def test_openai_tool_calls_and_encode_arguments():
    assert openai_tool_calls(CALLS[:1], call_id=_ids) == [
        {"id": "call_0", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"城市": "北京", "days": 3}'}}]
    assert openai_tool_calls(CALLS[:1])[0]["id"].startswith("call_")
    assert encode_arguments_v4('{"城市": "北京", "days": 3}') == (
        '<｜DSML｜parameter name="城市" string="true">北京</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>')
    with pytest.raises(ValueError, match="function name"):
        render_tool_calls_v4([{"function": {"arguments": "{}"}}])
    with pytest.raises(ValueError, match="a tool must be"):
        render_tools_v4([{"name": "f"}])


# --- V3.2 and V3.1 -----------------------------------------------------------------------

V31_BLOCK = ('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"城市": "北京"}'
             '<｜tool▁call▁end｜><｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜>'
             '<｜tool▁calls▁end｜>')
V31_CASES = [
    ("先查天气" + V31_BLOCK, "先查天气", [{"name": "get_weather", "arguments": '{"城市": "北京"}'},
                                          {"name": "now", "arguments": "{}"}]),
    # Whitespace between calls, multi-line JSON kept as written.
    ('<｜tool▁calls▁begin｜>\n<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\n "a": [1, 2]\n}<｜tool▁call▁end｜>\n'
     '<｜tool▁calls▁end｜>', "", [{"name": "f", "arguments": '{\n "a": [1, 2]\n}'}]),
    ("x\n\n" + V31_BLOCK, "x\n\n", [{"name": "get_weather", "arguments": '{"城市": "北京"}'},
                                    {"name": "now", "arguments": "{}"}]),  # no separator
    ("坏<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "坏<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>[1]<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     []),  # arguments not an object: content
    ("坏<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     "坏<｜tool▁calls▁begin｜><｜tool▁call▁begin｜><｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
     []),  # no name
    ("断<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}",
     "断<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}", []),  # cut off
]


@pytest.mark.parametrize("text, content, calls", V31_CASES,
                         ids=[f"v31_{i}" for i in range(len(V31_CASES))])
def test_v31(text, content, calls):
    assert parse_tool_calls_v31(text) == (content, calls)
    for i in range(len(text) + 1):
        assert _stream(text, [i], DEEPSEEK_V31) == (content, calls), i


def test_v32_is_v4_with_function_calls():
    """encoding_dsv32.py writes the same block under <｜DSML｜function_calls>."""
    v32 = BLOCK.replace("tool_calls>", "function_calls>")
    assert parse_tool_calls_v32("嗯\n\n" + v32) == ("嗯", CALLS)
    assert parse_tool_calls_v4("嗯\n\n" + v32) == ("嗯\n\n" + v32, [])
    assert parse_tool_calls_v32("嗯\n\n" + BLOCK) == ("嗯\n\n" + BLOCK, [])
    for i in range(0, len(v32), 7):
        assert _stream("嗯\n\n" + v32, [i], DEEPSEEK_V32) == ("嗯", CALLS)


# --- the forcing grammar, run through llguidance ----------------------------------------

GRAMMAR_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {
            "城市": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1},
            "note": {"type": ["string", "null"]},
            "where": {"$ref": "#/$defs/place"}},
        "required": ["城市"],
        "$defs": {"place": {"type": "object", "properties": {"lat": {"type": "number"}},
                            "required": ["lat"]}}}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "pick", "parameters": {
        "type": "object", "properties": {"a": {"type": "boolean"}, "b": {"const": 7}}}}},
]


@functools.cache
def _llg_tokenizer():
    llguidance = pytest.importorskip("llguidance")
    return llguidance.LLTokenizer(TINY_TOKENIZER.read_text(encoding="utf-8"))


def _accepts(grammar: str, text: str) -> bool:
    """The grammar takes `text` (the tiny byte-level tokenizer's tokens) and may stop."""
    import llguidance

    tokenizer = _llg_tokenizer()
    matcher = llguidance.LLMatcher(tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar),
                                   log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


def _calls_text(calls, reasoning=None):
    return ("" if reasoning is None else reasoning + "</think>") + "\n\n" + render_tool_calls_v4(calls)


GOOD_CALLS = [
    [{"name": "get_weather", "arguments": '{"城市": "北京"}'}],
    [{"name": "get_weather", "arguments": json.dumps(
        {"城市": "上海</p>", "unit": "celsius", "days": 3, "note": None, "where": {"lat": 31.2}},
        ensure_ascii=False)}],
    [{"name": "get_weather", "arguments": '{"城市": "北京", "note": "多云"}'},
     {"name": "now", "arguments": "{}"}, {"name": "now", "arguments": '{"任意": [1, "x"], "s": "t"}'},
     {"name": "pick", "arguments": "{}"}, {"name": "pick", "arguments": '{"b": 7}'},
     {"name": "pick", "arguments": '{"a": true, "b": 7}'}],
]
BAD_CALLS = [
    [{"name": "get_time", "arguments": "{}"}],  # no such tool
    [{"name": "get_weather", "arguments": '{"unit": "celsius"}'}],  # 城市 is required
    [{"name": "get_weather", "arguments": '{"城市": "北京", "days": "三"}'}],  # not an integer
    [{"name": "get_weather", "arguments": '{"城市": "北京", "unit": "kelvin"}'}],  # not in enum
    [{"name": "get_weather", "arguments": '{"unit": "celsius", "城市": "北京"}'}],  # schema order
    [{"name": "pick", "arguments": '{"b": 8}'}],  # const
]


@pytest.mark.parametrize("calls", GOOD_CALLS, ids=["one", "all_parameters", "many"])
def test_required_grammar_takes_rendered_calls(calls):
    assert _accepts(tool_call_grammar_v4(GRAMMAR_TOOLS, "required"), _calls_text(calls))
    assert _accepts(tool_call_grammar_v4(GRAMMAR_TOOLS, "required", thinking=True),
                    _calls_text(calls, "先想一想：</thi 不是结束。"))


@pytest.mark.parametrize("calls", BAD_CALLS, ids=["unknown_tool", "missing_required", "not_integer",
                                              "not_in_enum", "out_of_order", "not_const"])
def test_required_grammar_refuses_bad_calls(calls):
    assert not _accepts(tool_call_grammar_v4(GRAMMAR_TOOLS, "required"), _calls_text(calls))


def test_grammar_refuses_other_shapes():
    grammar = tool_call_grammar_v4(GRAMMAR_TOOLS, "required")
    calls = GOOD_CALLS[0]
    assert not _accepts(grammar, "好的" + _calls_text(calls))  # content first
    assert not _accepts(grammar, _calls_text(calls) + "\n")  # anything after
    assert not _accepts(grammar, "\n\n<｜DSML｜tool_calls>\n</｜DSML｜tool_calls>")  # no call
    assert not _accepts(grammar, _calls_text(calls)[:-5])  # unfinished
    assert not _accepts(grammar, _calls_text(calls, "想"))  # chat mode: no reasoning
    thinking = tool_call_grammar_v4(GRAMMAR_TOOLS, "required", thinking=True)
    assert not _accepts(thinking, _calls_text(calls))  # thinking mode: "</think>" first


def test_named_tool_choice_forces_one_call_of_it():
    named = {"type": "function", "function": {"name": "now"}}
    grammar = tool_call_grammar_v4(GRAMMAR_TOOLS, named)
    assert _accepts(grammar, _calls_text([{"name": "now", "arguments": "{}"}]))
    assert not _accepts(grammar, _calls_text([{"name": "now", "arguments": "{}"}] * 2))
    assert not _accepts(grammar, _calls_text(GOOD_CALLS[0]))


@pytest.mark.parametrize("tools, choice, match", [
    (GRAMMAR_TOOLS, "auto", "asks for no call to force"),
    (GRAMMAR_TOOLS, "none", "asks for no call to force"),
    (GRAMMAR_TOOLS, {"type": "function", "function": {"name": "nope"}}, "not among the tools"),
    ([], "required", "has none"),
    ([{"name": "f"}], "required", "a tool must be"),
    ([{"type": "function", "function": {"name": "f", "parameters": {
        "properties": {"x": {"enum": []}}}}}], "required", "admits no value"),
])
def test_grammar_errors(tools, choice, match):
    with pytest.raises(ValueError, match=match):
        tool_call_grammar_v4(tools, choice)
