"""Chat templates for supervised fine-tuning (SFT): prompt records -> prompt text.

An SFT example is a prompt and a response. The prompt text is the conversation
before the response rendered by a chat template (a Jinja template in Hugging Face
transformers' form, `tokenizer_config.json`'s `chat_template`), ending with the
generation prompt; the response follows it as it is, and the end-of-sequence token
is appended as an id by Transform (never as text). So that training, evaluation
and serving agree, every stage renders prompts here:

  - TextExampleGen renders each record's prompt (`render_prompt`);
  - Transform records the template in the transform graph's tokenizer_config.json
    asset, which the pushed model and `hf-export` carry;
  - serving wraps a user's prompt as `prefix + prompt + suffix` (`prompt_affixes`).

The template comes from `data.chat_template`, else the tokenizer's (its
tokenizer_config.json), else `DEFAULT_CHAT_TEMPLATE` (`resolve`).

Rendering follows transformers' `apply_chat_template` (transformers 4.4x
`utils/chat_template_utils.py`): `jinja2.sandbox.ImmutableSandboxedEnvironment`
with `trim_blocks`, `lstrip_blocks` and the `loopcontrols` extension; the
variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, and any
extra ones the caller gives (`template_kwargs`, as `apply_chat_template(...,
**kwargs)` passes e.g. `thinking=True` to DeepSeek's templates); the global
`raise_exception(message)`; a `tojson` filter that keeps non-ASCII text.

A template is a user's code, so a render runs within limits (`RenderLimits`) and is
refused with `ChatTemplateLimitError` (a `ChatTemplateError`) past them, before the
memory is taken where it can be: the sandbox's `range` (at most 100,000 items,
jinja2's `MAX_RANGE`) and

  - size: every string or list that `*`, `+`, `~`, `%`, the padding filters and
    methods (`center`, `indent`, `ljust`, `rjust`, `zfill`, `expandtabs`), `replace`,
    `join` and `format` would build is checked before it is built, and so is the text
    written so far: at most `RenderLimits.max_chars` characters, by default
    2 x (the characters of the messages and special tokens) + 65,536, never more than
    `MAX_RENDER_CHARS` (4 Mi characters; a character is at most 4 UTF-8 bytes).
    Integers from `*` and `**` are kept under `MAX_INT_BITS` bits;
  - time: `RenderLimits.max_seconds` (`MAX_RENDER_SECONDS`, 2 s) of wall time, checked
    at every loop iteration, call, attribute and item access, operator, filter and
    piece of output (a render of a normal template takes well under a millisecond).

The sandbox and its limits are `tokenization/template_sandbox.py`'s (this module
re-exports the limits and the errors); here: which template, the rendering, the
affixes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from tokenization.template_sandbox import (
    MAX_INT_BITS,
    MAX_RENDER_CHARS,
    MAX_RENDER_SECONDS,
    RENDER_ALLOWANCE_CHARS,
    ChatTemplateError,
    ChatTemplateLimitError,
    RenderBudget,
    RenderLimits,
    compile_template,
    render_budget,
)

# This room's names, with the errors and limits it re-exports from `template_sandbox`.
__all__ = ["DEFAULT_CHAT_TEMPLATE", "ChatFormat", "chat_format", "pin_template", "prompt_affixes",
           "render_prompt", "resolve", "special_tokens", "ChatTemplateError",
           "ChatTemplateLimitError", "RenderLimits", "MAX_INT_BITS", "MAX_RENDER_CHARS",
           "MAX_RENDER_SECONDS", "RENDER_ALLOWANCE_CHARS"]

# DeepSeek-LLM-chat's format (deepseek-ai/deepseek-llm-7b-chat, tokenizer_config.json):
#   <bos>[system\n\n]User: {user}\n\nAssistant: {assistant}<eos>User: ...\n\nAssistant:
# with one change: the generation prompt is "Assistant: " (with its space), so that the
# response text follows it as written and is encoded on its own. Roles other than
# system, user and assistant raise an error.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'user' %}"
    "{{ 'User: ' + message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{% else %}"
    "{{ raise_exception('unknown role ' + message['role'] + '; expected system, user or assistant') }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant: ' }}{% endif %}"
)

# A prompt that no template changes (no whitespace to trim, no markup), to find
# where a template puts the user's content.
_SENTINEL = "Q7xSentinelPromptZ3k"


def resolve(data_config: Any, tokenizer: Any = None) -> str:
    """The chat template of an SFT run.

    Args:
      data_config: the `data` section (`config.DataConfig`); its
        `chat_template` wins when set.
      tokenizer: a `ByteLevelBpe` (or anything with a `chat_template` attribute),
        or None when Transform learns the tokenizer.

    Returns:
      `data_config.chat_template` if set, else the tokenizer's `chat_template`
      if it has one, else `DEFAULT_CHAT_TEMPLATE`.
    """
    if data_config.chat_template:
        return data_config.chat_template
    template = getattr(tokenizer, "chat_template", None) if tokenizer is not None else None
    if isinstance(template, str) and template:
        return template
    return DEFAULT_CHAT_TEMPLATE


def special_tokens(tokenizer: Any = None) -> tuple[str, str]:
    """(bos_token, eos_token) strings a template renders: the tokenizer's, else DeepSeek's
    (the learned tokenizer's, `tokenizer.LEARNED_ADDED_TOKENS`)."""
    if tokenizer is None:
        from tokenization.byte_level_bpe import BOS_TOKEN, EOS_TOKEN  # imports TF

        return BOS_TOKEN, EOS_TOKEN
    return tokenizer.bos_token or "", tokenizer.eos_token or ""


# The variables render_prompt sets itself, which template_kwargs may not set.
_RENDER_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


def _check_template_kwargs(template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """`template_kwargs` as a dict, refused when a name is not an identifier, is one that
    render_prompt sets, or would hide one of the sandbox's globals (`raise_exception`,
    `range`, the guards of `_guard`)."""
    kwargs = dict(template_kwargs or {})
    if not kwargs:
        return kwargs
    taken = _RENDER_VARIABLES | set(compile_template(DEFAULT_CHAT_TEMPLATE).environment.globals)
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier() or name in taken:
            raise ChatTemplateError(
                f"template_kwargs may not set {name!r}: not an identifier, or a name the "
                "renderer sets itself")
    return kwargs


def render_prompt(template: str, messages: Sequence[Mapping[str, Any]], bos_token: str,
                  eos_token: str, limits: RenderLimits | None = None,
                  template_kwargs: Mapping[str, Any] | None = None) -> str:
    """The prompt text: `messages` (the turns before the response) rendered with the
    generation prompt (`add_generation_prompt=True`), as transformers'
    `apply_chat_template(messages, tokenize=False, add_generation_prompt=True)`.

    Args:
      template: a Jinja chat template (`resolve`).
      messages: `[{"role": str, "content": str}, ...]`, not empty; the last turn is
        not the assistant's (the response is not part of the prompt).
      bos_token, eos_token: the strings the template's `bos_token` / `eos_token`
        stand for (the encoder maps them to their ids as added tokens).
      limits: the render's bounds; default `RenderLimits.for_messages(messages,
        bos_token, eos_token, *the string values of template_kwargs)`.
      template_kwargs: extra template variables, as the keyword arguments of transformers'
        `apply_chat_template` (e.g. `{"thinking": True}` for
        `deepseek_v4_chat.DEEPSEEK_V4_CHAT_TEMPLATE`); default none.

    Returns:
      The rendered text.

    Raises:
      ChatTemplateError (a ValueError): no messages, the last one is the
        assistant's, a `template_kwargs` name is one the renderer sets (`messages`,
        `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`, `range`, ...),
        the template is not valid Jinja, or rendering fails (its `raise_exception`, or any
        error inside the template), naming the cause; ChatTemplateLimitError (a
        ChatTemplateError) when it goes past `limits`.
    """
    kwargs = _check_template_kwargs(template_kwargs)
    if not messages:
        raise ChatTemplateError("no messages to render")
    if messages[-1].get("role") == "assistant":
        raise ChatTemplateError("the last message is the assistant's: the prompt holds the "
                                "turns before the response, not the response")
    compiled = compile_template(template)
    limits = limits or RenderLimits.for_messages(
        messages, bos_token, eos_token, *(v for v in kwargs.values() if isinstance(v, str)))
    budget = RenderBudget(limits)
    token = render_budget.set(budget)
    pieces, size = [], 0
    try:
        for piece in compiled.generate(**kwargs, messages=[dict(m) for m in messages],
                                       add_generation_prompt=True, bos_token=bos_token,
                                       eos_token=eos_token):
            size += len(piece)
            if size > limits.max_chars:
                raise ChatTemplateLimitError(
                    f"the chat template's output is over the limit of {limits.max_chars:,} "
                    "characters; refused")
            budget.check()
            pieces.append(piece)
    except ChatTemplateError:
        raise
    except MemoryError as e:
        raise ChatTemplateLimitError("the chat template ran out of memory; refused") from e
    except Exception as e:  # noqa: BLE001 (any error inside a user's template)
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from e
    finally:
        render_budget.reset(token)
    return "".join(pieces)


def prompt_affixes(template: str, bos_token: str, eos_token: str,
                   template_kwargs: Mapping[str, Any] | None = None) -> tuple[str, str]:
    """(prefix, suffix) with `render_prompt(template, [{"role": "user", "content": p}],
    bos_token, eos_token, template_kwargs=template_kwargs) == prefix + p + suffix` for
    every p (`template_kwargs`: see `render_prompt`; e.g. `{"thinking": True}` gives
    DeepSeek-V4's thinking-mode affixes).

    Found by rendering a sentinel and splitting there, then checked on a second
    prompt with surrounding whitespace and newlines (a template that trims or
    changes the content fails the check).

    Raises:
      ChatTemplateError (a ValueError): the template does not put the user's
        content into the text verbatim exactly once (or cannot render one user turn).
    """
    rendered = render_prompt(template, [{"role": "user", "content": _SENTINEL}], bos_token,
                             eos_token, template_kwargs=template_kwargs)
    if rendered.count(_SENTINEL) != 1:
        raise ChatTemplateError(
            f"the chat template places a user's content {rendered.count(_SENTINEL)} times, "
            "not exactly once; serving cannot wrap a prompt with it")
    prefix, suffix = rendered.split(_SENTINEL)
    probe = " \n 两 lines\n\n" + _SENTINEL[::-1] + " "
    if render_prompt(template, [{"role": "user", "content": probe}], bos_token, eos_token,
                     template_kwargs=template_kwargs) != prefix + probe + suffix:
        raise ChatTemplateError(
            "the chat template does not place a user's content verbatim (it trims or changes "
            "it); serving cannot wrap a prompt with it")
    return prefix, suffix


@dataclasses.dataclass(frozen=True)
class ChatFormat:
    """A template with the special-token strings it renders (picklable, for Beam)."""

    template: str
    bos_token: str
    eos_token: str

    def render(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """`render_prompt(self.template, messages, self.bos_token, self.eos_token)`."""
        return render_prompt(self.template, messages, self.bos_token, self.eos_token)


def chat_format(data_config: Any, tokenizer: Any = None) -> ChatFormat:
    """The `ChatFormat` of an SFT run: `resolve`d template, `special_tokens`."""
    return ChatFormat(resolve(data_config, tokenizer), *special_tokens(tokenizer))


def pin_template(config: Any) -> Any:
    """`config` (a PipelineConfig) with `data.chat_template` set to the template `resolve`
    picks now (from `tokenizer.path`'s tokenizer_config.json when given), so that every
    component renders and records the same template, and a template edited inside the
    tokenizer's files changes the config (and the cache keys) of the components that
    use it. Pretraining configs and configs with a template are returned as they are.

    Raises:
      FileNotFoundError, pre_tokenizer.UnsupportedTokenizerError: see `ByteLevelBpe.from_file`.
    """
    if config.data.task == "pretrain" or config.data.chat_template:  # sft, dpo, grpo: pinned
        return config
    tokenizer = None
    if config.tokenizer.path:
        from tokenization.byte_level_bpe import ByteLevelBpe

        tokenizer = ByteLevelBpe.from_file(config.tokenizer.path)
    data = dataclasses.replace(config.data, chat_template=resolve(config.data, tokenizer))
    return dataclasses.replace(config, data=data)
