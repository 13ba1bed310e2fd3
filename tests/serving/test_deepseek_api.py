"""DeepSeek's own API through the `openai` client, stream and non-stream, on tiny V3 and V4
chat models carrying DeepSeek-V4's chat template: thinking mode with `reasoning_content`,
a tool round trip (tools rendered, the model's DSML call parsed into `tool_calls`, the
result sent back and rendered), `tool_choice: "required"` and `response_format:
json_schema` forced by llguidance on untrained models (50 of 50 valid, Chinese keys and
values byte for byte), chat prefix completion, FIM's named refusal, and hostile inputs."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from tiny_text_model import openai_app, tiny_causal_lm

# Slow tier: the module exports a tiny V3 and a tiny V4 chat SavedModel.
pytestmark = pytest.mark.slow

UNITS = {"the": 40, " the": 60, " weather": 12, " city": 9, "北京": 9, "上海": 5, "李白": 7,
         "杜甫": 7, "诗人": 6, "\n": 30, "你好": 6, "。": 10, "，": 20, '"': 30, "{": 10, "}": 10}
VOCAB, CONTEXT = 400, 2048
NAME = "tiny"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "天气",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["北京", "上海"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"]}}}
POETS = {"type": "object", "properties": {"诗人": {"enum": ["李白", "杜甫"]},
                                         "年": {"type": "integer", "minimum": 700,
                                                "maximum": 800}},
         "required": ["诗人", "年"], "additionalProperties": False}


def _export(out, family: str):
    from config import GenerationConfig
    from savedmodel.export import save_text_model
    from tokenization import chat_template
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.deepseek_v4_chat import DEEPSEEK_V4_CHAT_TEMPLATE
    from tokenization.tokenizer import learn

    tokenizer = ByteLevelBpe(learn(UNITS, VOCAB).json,
                             tokenizer_config={"chat_template": DEEPSEEK_V4_CHAT_TEMPLATE})
    model = tiny_causal_lm(family, VOCAB, CONTEXT, seed=5,
                           num_hidden_layers=1 if family == "v3" else None)
    affixes = chat_template.prompt_affixes(DEEPSEEK_V4_CHAT_TEMPLATE,
                                           *chat_template.special_tokens(tokenizer))
    save_text_model(model, tokenizer, GenerationConfig(max_new_tokens=32), str(out),
                    chat_prompt=affixes)
    return out


@pytest.fixture(scope="module", params=["v3", "v4"])
def served(request, tmp_path_factory):
    """(base URL, ModelServer, its warm-up's figures) of a tiny chat model behind the
    OpenAI router."""
    from config import ServeConfig
    from serving.server import ModelServer

    path = _export(tmp_path_factory.mktemp(request.param) / "saved", request.param)
    server = ModelServer(str(path), NAME, ServeConfig(decode_slots=25), warm=False)
    warmed = server.warm_up(signatures=False)  # the requests here use the engine
    with openai_app(server, NAME) as url:
        yield url, server, warmed


@pytest.fixture(scope="module")
def client(served):
    import openai

    return openai.OpenAI(base_url=served[0], api_key="x", max_retries=0, timeout=300)


USER = [{"role": "user", "content": "北京的天气怎么样？"}]


def test_an_engine_only_warm_up_is_available_and_a_signature_works_on_first_use(served):
    import numpy as np

    server, warmed = served[1], served[2]
    assert server.ready and server.status()["model_version_status"][0]["state"] == "AVAILABLE"
    # the engine's two functions, and no signature
    assert (warmed["requests"], warmed["failed"], warmed["signatures"]) == (2, 0, False)
    ids = server.run("tokenize", {"text": np.array([USER[0]["content"].encode()], object)}, 1)
    text = server.run("detokenize", {"input_ids": ids["input_ids"]}, 1)["text"]
    assert text[0] == USER[0]["content"].encode()  # byte for byte, Chinese


def _stream(client, **kwargs):
    return list(client.chat.completions.create(model=NAME, stream=True, **kwargs))


def test_thinking_mode_splits_reasoning_content(client):
    kwargs = dict(messages=USER, max_tokens=24, seed=3, extra_body={"thinking": {"type": "enabled"}})
    whole = client.chat.completions.create(model=NAME, **kwargs)
    message = whole.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    chunks = _stream(client, **kwargs, stream_options={"include_usage": True})
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    streamed = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert streamed == reasoning and content == message.content
    # an untrained model never writes "</think>": its whole reply is reasoning
    assert reasoning and message.content == ""
    details = chunks[-1].usage.completion_tokens_details
    assert details.reasoning_tokens == chunks[-1].usage.completion_tokens == 24
    off = client.chat.completions.create(model=NAME, messages=USER, max_tokens=4, seed=3,
                                         extra_body={"thinking": {"type": "disabled"}})
    assert "reasoning_content" not in (off.choices[0].message.model_extra or {})


def test_required_tool_calls_parse_and_validate_and_round_trip(client):
    calls = []
    for stream in (False, True):
        # one call each (parallel_tool_calls false): an untrained model may otherwise add
        # calls until max_tokens cuts the block off
        kwargs = dict(messages=USER, tools=[WEATHER], tool_choice="required", n=25, seed=1,
                      max_tokens=300, parallel_tool_calls=False)
        if stream:
            chunks = _stream(client, **kwargs)
            by_choice = {}
            for chunk in chunks:
                for choice in chunk.choices:
                    for call in choice.delta.tool_calls or []:
                        by_choice.setdefault(choice.index, []).append(call)
                    if choice.finish_reason:
                        assert choice.finish_reason == "tool_calls"
            calls += [c for index in sorted(by_choice) for c in by_choice[index][:1]]
        else:
            reply = client.chat.completions.create(model=NAME, **kwargs)
            for choice in reply.choices:
                assert choice.finish_reason == "tool_calls"
                calls.append(choice.message.tool_calls[0])
    assert len(calls) == 50
    for call in calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments),
                            WEATHER["function"]["parameters"])
    call = calls[0]
    back = USER + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "晴，25°C"}]
    answer = client.chat.completions.create(model=NAME, messages=back, tools=[WEATHER],
                                            max_tokens=4, seed=1)
    first = client.chat.completions.create(model=NAME, messages=USER, tools=[WEATHER],
                                           max_tokens=4, seed=1)
    # the call and its result are part of the prompt now
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens + 10


def test_json_schema_replies_are_valid_with_chinese_keys_and_values(client):
    replies = []
    for stream in (False, True):
        kwargs = dict(messages=USER, n=25, seed=2, max_tokens=80, response_format={
            "type": "json_schema", "json_schema": {"name": "poet", "schema": POETS}})
        if stream:
            texts = {}
            for chunk in _stream(client, **kwargs):
                for choice in chunk.choices:
                    texts[choice.index] = texts.get(choice.index, "") + (
                        choice.delta.content or "")
            replies += list(texts.values())
        else:
            replies += [c.message.content for c in
                        client.chat.completions.create(model=NAME, **kwargs).choices]
    assert len(replies) == 50
    for text in replies:
        value = json.loads(text)
        jsonschema.validate(value, POETS)
        assert value["诗人"] in ("李白", "杜甫")
        assert text.encode("utf-8") == json.dumps(value, ensure_ascii=False,
                                                  separators=(",", ":")).encode("utf-8")
    objects = client.chat.completions.create(model=NAME, messages=USER, n=5, seed=4,
                                             max_tokens=60,
                                             response_format={"type": "json_object"})
    for choice in objects.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)


def test_prefix_completion_continues_the_assistant_text(client, served):
    from serving.openai_model import text_of
    from tokenization import chat_template

    text = text_of(served[1])
    prefix = "床前明月光，"
    messages = USER + [{"role": "assistant", "content": prefix, "prefix": True}]
    chat = client.chat.completions.create(model=NAME, messages=messages, max_tokens=8,
                                          temperature=0)
    rendered = chat_template.render_prompt(text.template, USER, text.bos_token,
                                           text.eos_token) + prefix
    completion = client.completions.create(model=NAME, prompt=rendered, max_tokens=8,
                                           temperature=0)
    assert chat.choices[0].message.content == completion.choices[0].text


def _post(served, path: str, body) -> httpx.Response:
    return httpx.post(served[0] + path, json=body, timeout=60)


@pytest.mark.parametrize("path, body, param, words", [
    ("/completions", {"prompt": "x", "suffix": "y"}, "suffix", "<｜fim▁begin｜>"),
    ("/completions", {"prompt": "x", "best_of": 2}, "best_of", "best_of=1"),
    ("/completions", {"prompt": "x", "frequency_penalty": 1}, "frequency_penalty", "0"),
    ("/chat/completions", {"messages": USER, "functions": []}, "functions", "tools"),
    ("/chat/completions", {"messages": USER, "tools": [WEATHER], "tool_choice": {
        "type": "function", "function": {"name": "rm_rf"}}}, "tool_choice", "rm_rf"),
    ("/chat/completions", {"messages": USER, "tools": [{"type": "function", "function": {
        "name": "bad name!"}}]}, "tools[0].function.name", "pattern"),
    ("/chat/completions", {"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "object", "properties": {
            f"k{i}": {"type": "string", "description": "x" * 64} for i in range(1100)}}}}},
     "response_format.json_schema.schema", "64 KiB"),
    ("/chat/completions", {"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}},
     "response_format.json_schema.schema", "schema"),
    ("/chat/completions", {"messages": USER, "n": 26}, "n", "decode slots"),
    ("/chat/completions", {"messages": USER, "tool_choice": "auto"}, "tool_choice", "tools"),
    ("/chat/completions", {"messages": USER, "thinking": {"type": "enabled"},
                           "response_format": {"type": "json_object"}}, "response_format",
     "one grammar"),
])
def test_what_a_model_cannot_do_is_refused_by_name(served, path, body, param, words):
    r = _post(served, path, {"model": NAME, **body})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
