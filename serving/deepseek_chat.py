"""DeepSeek's own API on /v1/chat/completions: thinking mode, tool calls, JSON output and
chat prefix completion, planned per request (`plan_chat`) and read back from the reply
as it streams (`ChatOutput`).

What a request may ask, and what the model's chat template must have for it (else a 400
naming the field and the model):

  - thinking: `thinking: {"type": "enabled"}` (DeepSeek's), `chat_template_kwargs:
    {"thinking": true}` (vLLM's and SGLang's), or `reasoning_effort` ("low" and "medium"
    are "high", DeepSeek's mapping; "high", "max"): a template that reads `thinking`
    (DeepSeek-V3.1's, V4's). The prompt then ends in "<think>" and the reply's reasoning
    (up to "</think>") is `reasoning_content`, apart from `content`
    (`serving/reasoning.py`), in streamed deltas too; `usage.completion_tokens_details.
    reasoning_tokens` counts its tokens (up to the one that ends it). Off by default.
  - tools: `tools` with `tool_choice` "none" (rendered, never parsed), "auto" (the reply's
    calls are parsed into `tool_calls`, `finish_reason: "tool_calls"`), "required" or a
    named function (forced by a grammar: `serving/tool_call_grammar.tool_call_grammar_v4` in
    llguidance, V4's DSML only); the `tool` role and assistant `tool_calls` render as the
    template does (V4: `tokenization/deepseek_v4_chat.py`); `parallel_tool_calls: false`
    forces exactly one call. The template must render
    `tools`; calls are parsed in its own format (V4's DSML, V3.2's DSML or V3.1's markers).
  - JSON output: `response_format` `json_object` or `json_schema` (its `schema`, `strict`),
    forced by llguidance token masks (`serving/grammar.py`), compact JSON. Not with
    thinking or a forced tool call (one grammar per reply).
  - prefix completion: `prefix: true` on the last message, an assistant's: the prompt
    renders the messages before it with the generation prompt, then its content, which
    the reply continues (the reply holds only the continuation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from serving.grammar import Constraint, GrammarError, TokenGrammar
from serving.reasoning import ReasoningSplitter
from serving.tool_call_grammar import tool_call_grammar_v4
from serving.tool_calls import (
    DEEPSEEK_V4,
    DEEPSEEK_V31,
    DEEPSEEK_V32,
    ToolCallFormat,
    ToolCallStreamParser,
)
from tokenization import deepseek_v4_chat

# DeepSeek's API maps reasoning efforts below "high" to "high".
_EFFORTS = {"low": "high", "medium": "high", "high": "high", "max": "max"}


class ChatPlanError(ValueError):
    """A request the model cannot serve as asked: `param` names the field (a 400)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclasses.dataclass
class ChatPlan:
    """How to render one chat request and read its reply.

    Attributes:
      messages: the messages to render (prefix completion: without the last one), as the
        template reads them (tool call arguments decoded).
      template_kwargs: the template's variables (thinking, reasoning_effort, tools).
      prefix: the assistant text the reply continues ("" without prefix completion).
      thinking: the prompt ends in thinking mode (the reply starts with reasoning).
      tool_format: the format to parse tool calls in, or None (not parsed).
      constraint: makes each choice's grammar `Constraint`, or None.
    """
    messages: list[dict[str, Any]]
    template_kwargs: dict[str, Any]
    prefix: str = ""
    thinking: bool = False
    tool_format: ToolCallFormat | None = None
    constraint: Callable[[], Constraint] | None = None


def tool_format_of(template: str) -> ToolCallFormat | None:
    """The tool-call format a chat template renders, or None (it renders no tools)."""
    if "tools" not in template:
        return None
    if "tool_calls" in template and ("DSML" in template or "｜DSML｜" in template):
        return DEEPSEEK_V4
    if "function_calls" in template:
        return DEEPSEEK_V32
    if "tool▁calls▁begin" in template:
        return DEEPSEEK_V31
    return None


def _thinking(req, template: str, model: str) -> tuple[bool, dict]:
    """(thinking mode, the template variables it sets)."""
    kwargs = dict(req.chat_template_kwargs or {})
    thinking = bool(kwargs.pop("thinking", False))
    if req.thinking is not None:
        thinking = req.thinking.type == "enabled"
    effort = _EFFORTS.get(req.reasoning_effort) if req.reasoning_effort else None
    asked = thinking or effort is not None
    if asked and "thinking" not in template:
        field = "thinking" if req.thinking is not None else (
            "reasoning_effort" if effort else "chat_template_kwargs")
        raise ChatPlanError(f"model '{model}' has no thinking mode: its chat template does "
                            "not read `thinking`", field)
    if effort is not None:
        thinking = True
        kwargs["reasoning_effort"] = effort
    if asked:
        kwargs["thinking"] = thinking
    return thinking, kwargs


def _messages(req, template: str, model: str) -> tuple[list[dict], str]:
    """(the messages to render, the prefix-completion text)."""
    messages = []
    for i, m in enumerate(req.messages):
        if m.prefix and (i != len(req.messages) - 1 or m.role != "assistant"):
            raise ChatPlanError("prefix: true belongs on the last message, an assistant's",
                                f"messages[{i}].prefix")
        if (m.role == "tool" or m.tool_calls) and tool_format_of(template) is None:
            raise ChatPlanError(f"model '{model}' cannot take tool messages or tool_calls: "
                                "its chat template renders no tools", f"messages[{i}].role")
        entry = {"role": "system" if m.role == "developer" else m.role, "content": m.content}
        if m.tool_calls:
            entry["tool_calls"] = [c.model_dump() for c in m.tool_calls]
        if m.tool_call_id is not None:
            entry["tool_call_id"] = m.tool_call_id
        if m.reasoning_content is not None:
            entry["reasoning_content"] = m.reasoning_content
        messages.append(entry)
    prefix = ""
    if req.messages[-1].prefix:
        prefix = messages.pop()["content"]
        if not messages:
            raise ChatPlanError("prefix completion needs a message before the assistant's",
                                "messages")
    try:
        return deepseek_v4_chat.template_messages(messages), prefix
    except ValueError as e:
        raise ChatPlanError(str(e), "messages") from e


def plan_chat(req, template: str | None, model: str,
              grammar: Callable[[], TokenGrammar]) -> ChatPlan:
    """The `ChatPlan` of a chat request (module docstring).

    Args:
      req: the `ChatCompletionRequest`.
      template: the model's chat template, or None (then none of the features).
      model: the served model's name (for messages).
      grammar: the model's `TokenGrammar` (built on first use).

    Raises:
      ChatPlanError: a feature the template lacks, a tool_choice naming no tool, a
        grammar llguidance refuses, or two features that each need the grammar.
    """
    wants = [name for name, asked in (
        ("thinking", req.thinking is not None), ("reasoning_effort", req.reasoning_effort),
        ("chat_template_kwargs", req.chat_template_kwargs), ("tools", req.tools),
        ("tool_choice", req.tool_choice),
        ("messages", any(m.role == "tool" or m.tool_calls for m in req.messages))) if asked]
    if template is None and wants:
        raise ChatPlanError(f"model '{model}' has no chat template to render {wants[0]} with",
                            wants[0])
    template = template or ""
    thinking, kwargs = _thinking(req, template, model)
    messages, prefix = _messages(req, template, model)
    plan = ChatPlan(messages, kwargs, prefix, thinking)
    _plan_tools(req, template, model, plan, grammar)
    fmt = req.response_format
    if fmt is not None and fmt.type != "text":
        if plan.constraint is not None or thinking:
            raise ChatPlanError("response_format with thinking or a forced tool call is not "
                                "supported (one grammar per reply)", "response_format")
        plan.constraint = _json_constraint(fmt, grammar)
    return plan


def _plan_tools(req, template: str, model: str, plan: ChatPlan,
                grammar: Callable[[], TokenGrammar]) -> None:
    choice = req.tool_choice
    if choice is not None and not req.tools:
        raise ChatPlanError("tool_choice needs tools", "tool_choice")
    if not req.tools:
        return
    fmt = tool_format_of(template)
    if fmt is None:
        raise ChatPlanError(f"model '{model}' cannot take tools: its chat template renders "
                            "none", "tools")
    tools = [t.model_dump(exclude_none=True) for t in req.tools]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) < len(names):
        raise ChatPlanError("tools have two functions of one name", "tools")
    if isinstance(choice, dict) and choice["function"]["name"] not in names:
        raise ChatPlanError(f"tool_choice names {choice['function']['name']!r}, which is not "
                            f"one of the tools ({', '.join(names)})", "tool_choice")
    plan.template_kwargs["tools"] = tools
    if choice != "none":
        plan.tool_format = fmt
    if choice == "required" or isinstance(choice, dict):
        if fmt is not DEEPSEEK_V4:
            raise ChatPlanError(f"tool_choice {choice!r} is forced by a grammar of V4's DSML "
                                f"format; model '{model}' writes {fmt.name}", "tool_choice")
        try:
            text = tool_call_grammar_v4(tools, choice, thinking=plan.thinking,
                                        parallel=req.parallel_tool_calls is not False)
        except ValueError as e:
            raise ChatPlanError(str(e), "tools") from e
        plan.constraint = _compiled(lambda: grammar().lark(text, param="tools"))


def _json_constraint(fmt, grammar: Callable[[], TokenGrammar]) -> Callable[[], Constraint]:
    if fmt.type == "json_object":
        return _compiled(lambda: grammar().json_object())
    if fmt.json_schema is None:
        raise ChatPlanError("response_format json_schema needs its json_schema",
                            "response_format.json_schema")
    schema, strict = fmt.json_schema.schema_, fmt.json_schema.strict
    return _compiled(lambda: grammar().json_schema(schema, strict=strict is not False))


def _compiled(make: Callable[[], Constraint]) -> Callable[[], Constraint]:
    """`make`, called once now (a bad grammar is a 400 before any slot is taken), then once
    per further choice."""
    try:
        first = [make()]
    except GrammarError as e:
        raise ChatPlanError(str(e), e.param or "response_format") from e
    return lambda: first.pop() if first else make()


class ChatOutput:
    """One choice's reply read back as it streams: reasoning, content and tool calls.

    Args:
      plan: the request's `ChatPlan`.
    """

    def __init__(self, plan: ChatPlan):
        self.reasoning = ReasoningSplitter() if plan.thinking else None
        self.tools = ToolCallStreamParser(plan.tool_format) if plan.tool_format else None
        self.content: list[str] = []
        self.reasoning_content: list[str] = []
        self.tool_calls: list[dict] = []
        self.reasoning_tokens = 0

    def push(self, text: str, tokens: int) -> list[dict]:
        """The OpenAI chat deltas of a piece of the reply (`tokens`: generated so far)."""
        reasoning, content = self.reasoning.push(text) if self.reasoning else ("", text)
        if self.reasoning is not None and (reasoning or self.reasoning.end is None):
            self.reasoning_tokens = tokens
        return self._deltas(reasoning, content)

    def finish(self, tokens: int) -> list[dict]:
        """The deltas still held back, at the reply's end (`tokens`: all it generated)."""
        if self.reasoning is not None and self.reasoning.end is None:
            self.reasoning_tokens = tokens  # it ended inside its reasoning
        reasoning, content = self.reasoning.finish() if self.reasoning else ("", "")
        deltas = self._deltas(reasoning, content)
        if self.tools is not None:
            rest, calls = self.tools.finish()
            deltas += self._content_and_calls(rest, calls)
        return deltas

    def _deltas(self, reasoning: str, content: str) -> list[dict]:
        deltas = []
        if reasoning:
            self.reasoning_content.append(reasoning)
            deltas.append({"reasoning_content": reasoning})
        if content and self.tools is not None:
            deltas += self._content_and_calls(*self.tools.push(content))
        elif content:
            self.content.append(content)
            deltas.append({"content": content})
        return deltas

    def _content_and_calls(self, content: str, calls: list[dict]) -> list[dict]:
        deltas = []
        if content:
            self.content.append(content)
            deltas.append({"content": content})
        if calls:
            self.tool_calls += calls
            deltas.append({"tool_calls": calls})
        return deltas

    def message(self) -> dict:
        """The whole reply as a chat.completion `message`."""
        message = {"role": "assistant", "content": "".join(self.content)}
        if self.reasoning is not None:
            message["reasoning_content"] = "".join(self.reasoning_content)
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message

    def finish_reason(self, reason: str) -> str:
        return "tool_calls" if self.tool_calls else reason
