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
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import json
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

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


MAX_RENDER_CHARS = 4 * 2**20  # the hard cap on a rendered prompt (and on any value in it)
MAX_RENDER_SECONDS = 2.0  # wall time of one render
RENDER_ALLOWANCE_CHARS = 65_536  # the template's own text, beyond 2 x the messages'
MAX_INT_BITS = 1 << 16  # integers the template computes (`*`, `**`)
_PADDING_METHODS = frozenset({"center", "ljust", "rjust", "zfill", "expandtabs"})
_NUMBER = re.compile(r"\d+")


class ChatTemplateError(ValueError):
    """A chat template cannot be rendered (syntax error, `raise_exception`, bad messages)."""


class ChatTemplateLimitError(ChatTemplateError):
    """A render went past its `RenderLimits` (output or a value too large, too slow)."""


@dataclasses.dataclass(frozen=True)
class RenderLimits:
    """The bounds of one render.

    Attributes:
      max_chars: characters of the output, and of any one string or list built while
        rendering.
      max_seconds: wall time, seconds.
    """

    max_chars: int = MAX_RENDER_CHARS
    max_seconds: float = MAX_RENDER_SECONDS

    @classmethod
    def for_messages(cls, messages: Sequence[Mapping[str, Any]], *special: str) -> RenderLimits:
        """2 x (characters of the messages' `content` and `reasoning_content`, and of `special`)
        + RENDER_ALLOWANCE_CHARS, at most MAX_RENDER_CHARS; MAX_RENDER_SECONDS."""
        given = sum(len(str(m.get("content", ""))) + len(str(m.get("reasoning_content") or ""))
                    for m in messages) + sum(map(len, special))
        return cls(min(MAX_RENDER_CHARS, 2 * given + RENDER_ALLOWANCE_CHARS))


class _Budget:
    """What one render may still use; `check` raises once past it."""

    def __init__(self, limits: RenderLimits):
        self.limits = limits
        self.deadline = time.monotonic() + limits.max_seconds

    def check(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateLimitError(
                f"the chat template ran longer than {self.limits.max_seconds:g} s; refused")

    def size(self, n: int, what: str) -> None:
        self.check()
        if n > self.limits.max_chars:
            raise ChatTemplateLimitError(
                f"the chat template would build {what} of {n:,} characters (or items), over "
                f"the limit of {self.limits.max_chars:,}; refused")


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "chat_template_budget", default=None)


def _current() -> _Budget:
    budget = _budget.get()
    return budget if budget is not None else _Budget(RenderLimits())  # outside render_prompt


def _length(x: Any) -> int | None:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else None


def _check_int(value: Any, budget: _Budget) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ChatTemplateLimitError(f"the chat template would compute an integer of over "
                                     f"{MAX_INT_BITS:,} bits; refused")


def _check_binop(operator: str, left: Any, right: Any, budget: _Budget) -> None:
    """Refuses an operation whose result would be past the budget, before computing it."""
    budget.check()
    if operator == "*":
        for seq, times in ((left, right), (right, left)):
            if _length(seq) is not None and isinstance(times, int):
                budget.size(_length(seq) * max(times, 0), "a value")
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                _check_int(1 << (MAX_INT_BITS + 1), budget)
    elif operator == "+":
        if _length(left) is not None and _length(right) is not None:
            budget.size(_length(left) + _length(right), "a value")
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
            if right * left.bit_length() > MAX_INT_BITS:
                _check_int(1 << (MAX_INT_BITS + 1), budget)
    elif operator == "%" and isinstance(left, str):
        _check_format(left, budget)


def _check_format(spec: str, budget: _Budget) -> None:
    """A %-style or str.format string whose widths or precisions could be past the budget."""
    for number in _NUMBER.findall(spec):
        if len(number) > 9 or int(number) > budget.limits.max_chars:
            budget.size(int(number), "a formatted field")


def _replaced_length(text: str, old: Any, new: Any, count: Any = -1) -> int:
    """len(text.replace(old, new, count)), computed without building it."""
    old, new = str(old), str(new)
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * (len(new) - len(old))


def _check_call(obj: Any, args: tuple, kwargs: dict, budget: _Budget) -> tuple:
    """Refuses the str methods that build large values from small arguments; returns
    `args` (an iterator given to `join` is drawn into a list, to be measured)."""
    budget.check()
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return args
    if name in _PADDING_METHODS:
        for value in (*args, *kwargs.values()):
            if isinstance(value, int):
                budget.size(value * (8 if name == "expandtabs" else 1) + len(owner), "a string")
    elif name in ("format", "format_map"):
        _check_format(owner, budget)
    elif name == "replace" and len(args) >= 2:
        budget.size(_replaced_length(owner, *args[:3]), "a string")
    elif name == "join" and args:
        items = list(args[0]) if not isinstance(args[0], (str, list, tuple)) else args[0]
        budget.size(sum(len(str(x)) for x in items) + len(owner) * len(items), "a string")
        args = (items, *args[1:])
    return args


def _guarded_filter(name: str, fn):
    """`fn` (a jinja2 filter) checked against the budget before it runs."""

    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        budget = _current()
        budget.check()
        values = list(args[1:] if getattr(fn, "jinja_pass_arg", None) else args)  # no context
        value, rest = (values[0], values[1:]) if values else (None, [])
        rest = [*rest, *kwargs.values()]
        if name in ("center", "indent"):
            lines = str(value).count("\n") + 1 if name == "indent" else 1
            for width in rest:
                if isinstance(width, int):
                    budget.size(len(str(value)) + width * lines, "a string")
                elif isinstance(width, str):
                    budget.size(len(str(value)) + len(width) * lines, "a string")
        elif name == "replace" and len(rest) >= 2:
            budget.size(_replaced_length(str(value), *rest[:3]), "a string")
        elif name == "format" and isinstance(value, str):
            _check_format(value, budget)
        elif name == "join" and value is not None and not isinstance(value, str):
            value = list(value)
            sep = str(rest[0]) if rest else ""
            budget.size(sum(len(str(x)) for x in value) + len(sep) * len(value), "a string")
            args = tuple(value if a is values[0] else a for a in args)
        result = fn(*args, **kwargs)
        if _length(result) is not None:
            budget.size(len(result), "a value")
        return result

    return guarded


def _range(*args: int) -> range:
    """jinja2's `safe_range` (at most `MAX_RANGE` items), refusing with the limit error."""
    from jinja2.sandbox import MAX_RANGE, safe_range

    try:
        return safe_range(*args)
    except OverflowError as e:
        raise ChatTemplateLimitError(
            f"the chat template asked for a range of over {MAX_RANGE:,} items; refused") from e


def _guarded_iter(iterable):
    """A for loop's items, the budget checked before each."""
    budget = _current()
    for item in iterable:
        budget.check()
        yield item


def _concat(*pieces) -> str:
    """`a ~ b ~ ...`, its length checked before it is joined."""
    texts = [str(p) for p in pieces]
    _current().size(sum(map(len, texts)), "a string")
    return "".join(texts)


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


def _environment():
    """transformers' sandbox, with the budget checked by its hooks (see the module)."""
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**", "%"})

        def call_binop(self, context, operator, left, right):
            budget = _current()
            _check_binop(operator, left, right, budget)
            result = super().call_binop(context, operator, left, right)
            _check_int(result, budget)
            return result

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's form)
            args = _check_call(__obj, args, kwargs, _current())
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj, attribute):
            budget = _current()
            budget.check()
            if isinstance(obj, str) and attribute in ("format", "format_map"):
                _check_format(obj, budget)  # the sandbox wraps these: no __self__ to see
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _current().check()
            return super().getitem(obj, argument)

    env = LimitedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    for name, fn in list(env.filters.items()):
        env.filters[name] = _guarded_filter(name, fn)
    env.globals["range"] = _range
    env.globals["dtfx_guarded_iter"] = _guarded_iter
    env.globals["dtfx_concat"] = _concat
    return env


def _guard(tree, env):
    """The parsed template with each for loop's items drawn through `_guarded_iter` and
    each `~` through `_concat` (jinja2 has no hook for either)."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    def call(name: str, args: list, lineno: int):
        return nodes.Call(nodes.Name(name, "load"), args, [], None, None, lineno=lineno)

    class Guard(NodeTransformer):
        def visit_For(self, node):  # noqa: N802 (jinja2's visitor names)
            node = self.generic_visit(node)
            node.iter = call("dtfx_guarded_iter", [node.iter], node.lineno)
            return node

        def visit_Concat(self, node):  # noqa: N802
            node = self.generic_visit(node)
            return call("dtfx_concat", node.nodes, node.lineno)

    tree = Guard().visit(tree)
    tree.set_environment(env)
    return tree


@functools.lru_cache(maxsize=16)
def _compile(template: str):
    from jinja2 import TemplateError

    def raise_exception(message):
        raise ChatTemplateError(f"the chat template refused the messages: {message}")

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        _current().check()
        text = json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)
        _current().size(len(text), "a value")
        return text

    env = _environment()
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(_guard(env.parse(template), env))
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template is not valid Jinja: {e}") from e


# The variables render_prompt sets itself, which template_kwargs may not set.
_RENDER_VARIABLES = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token"})


def _check_template_kwargs(template_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """`template_kwargs` as a dict, refused when a name is not an identifier, is one that
    render_prompt sets, or would hide one of the sandbox's globals (`raise_exception`,
    `range`, the guards of `_guard`)."""
    kwargs = dict(template_kwargs or {})
    if not kwargs:
        return kwargs
    taken = _RENDER_VARIABLES | set(_compile(DEFAULT_CHAT_TEMPLATE).environment.globals)
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
    compiled = _compile(template)
    limits = limits or RenderLimits.for_messages(
        messages, bos_token, eos_token, *(v for v in kwargs.values() if isinstance(v, str)))
    budget = _Budget(limits)
    token = _budget.set(budget)
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
        _budget.reset(token)
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
