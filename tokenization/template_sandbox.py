"""The sandbox a chat template renders in: transformers' `ImmutableSandboxedEnvironment`
with hooks that keep one render within its `RenderLimits` (the size of every string or
list built, integers, wall time), refusing with `ChatTemplateLimitError`; and the
compiled template, cached (the limits: `tokenization/chat_template.py`).
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


class RenderBudget:
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


render_budget: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar(
    "chat_template_budget", default=None)


def _current() -> RenderBudget:
    budget = render_budget.get()
    return budget if budget is not None else RenderBudget(RenderLimits())  # outside render_prompt


def _length(x: Any) -> int | None:
    return len(x) if isinstance(x, (str, bytes, list, tuple)) else None


def _check_int(value: Any, budget: RenderBudget) -> None:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ChatTemplateLimitError(f"the chat template would compute an integer of over "
                                     f"{MAX_INT_BITS:,} bits; refused")


def _check_binop(operator: str, left: Any, right: Any, budget: RenderBudget) -> None:
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


def _check_format(spec: str, budget: RenderBudget) -> None:
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


def _check_call(obj: Any, args: tuple, kwargs: dict, budget: RenderBudget) -> tuple:
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
def compile_template(template: str):
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

