"""A grammar that forces a tool call: `tool_call_grammar_v4`, an llguidance Lark grammar
for a DeepSeek-V4 reply that is only DSML tool calls, as encoding_dsv4.py renders them
(the format and its sources: `serving/tool_calls.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from serving.tool_calls import INVOKE_CLOSE, PARAMETER_CLOSE, to_json
from tokenization.deepseek_v4_chat import (
    DSML_TOKEN,
    THINKING_END_TOKEN,
    TOOL_CALLS_END,
    TOOL_CALLS_SEPARATOR,
    TOOL_CALLS_START,
)


def _lark_string(text: str) -> str:
    """`text` as a Lark string literal (JSON string syntax)."""
    return json.dumps(text, ensure_ascii=False)


def _parameter_rules(rule: str, key: str, schema: Mapping[str, Any],
                     defs: Mapping[str, Any]) -> list[str]:
    """Lark rules for one parameter `key`: string="true" with raw text for a string (the
    listed strings for an enum or const), string="false" with JSON (`%json`) otherwise;
    both when the schema allows a string and more (or does not say)."""
    head = f'<{DSML_TOKEN}parameter name="{key}" string='
    as_text, as_json = _lark_string(head + '"true">'), _lark_string(head + '"false">')
    close = _lark_string(PARAMETER_CLOSE)
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    alternatives, extra = [], []
    if isinstance(choices, list):  # each value with its closing tag: one lexeme apiece
        strings = [c for c in choices if isinstance(c, str)]
        others = [to_json(c) for c in choices if not isinstance(c, str)]
        if strings:
            values = " | ".join(_lark_string(c + PARAMETER_CLOSE) for c in strings)
            alternatives.append(f"{as_text} ({values})")
        if others:
            values = " | ".join(_lark_string(c + PARAMETER_CLOSE) for c in others)
            alternatives.append(f"{as_json} ({values})")
    else:
        kind = schema.get("type")
        types = {kind} if isinstance(kind, str) else set(kind or ())
        if not types or "string" in types:
            alternatives.append(f"{as_text} str_value")
        if not types or types - {"string"}:
            sub = dict(schema)
            if len(types) > 1:
                sub["type"] = sorted(types - {"string"})
            sub.update({k: v for k, v in defs.items() if k not in sub})
            alternatives.append(f"{as_json} {rule}_json {close}")
            extra.append(f"{rule}_json: %json {json.dumps(sub, ensure_ascii=False)}")
    if not alternatives:
        raise ValueError(f"parameter {key!r}: its schema admits no value ({schema!r:.80})")
    return [f"{rule}: " + " | ".join(alternatives), *extra]


def _invoke_rules(k: int, function: Mapping[str, Any]) -> list[str]:
    """Lark rules for an invoke of tool `k`: its parameters in the schema's order, the
    required ones always, each followed by "\\n" (none: the empty line)."""
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    defs = {name: parameters[name] for name in ("$defs", "definitions") if name in parameters}
    rules, items = [], []
    for j, (key, schema) in enumerate(properties.items()):
        rules += _parameter_rules(f"p{k}_{j}", key, schema if isinstance(schema, Mapping)
                                  else {}, defs)
        items.append((f'(p{k}_{j} "\\n")', key in required))
    if not properties:  # free-form arguments: any names, any values
        args = f'args{k}: "\\n" | (any_parameter "\\n")+'
    elif any(is_required for _, is_required in items):
        args = f"args{k}: " + " ".join(item + ("" if is_required else "?")
                                       for item, is_required in items)
    else:  # all optional: the empty line, or the first one present and any after it
        firsts = [" ".join([items[j][0]] + [item + "?" for item, _ in items[j + 1:]])
                  for j in range(len(items))]
        args = f"args{k}: " + " | ".join(['"\\n"', *firsts])
    # The "\n" before an invoke is in its literal: a "\n" lexeme of its own would be a
    # prefix of "\n</｜DSML｜tool_calls>", which llguidance's greedy lexer cannot split.
    header = _lark_string(f'\n<{DSML_TOKEN}invoke name="{function["name"]}">\n')
    return [f"invoke{k}: {header} args{k} {_lark_string(INVOKE_CLOSE)}", args, *rules]


def _chosen(tools: Sequence[Mapping[str, Any]], tool_choice: str | Mapping[str, Any]
            ) -> tuple[list[Mapping[str, Any]], bool]:
    """(the functions a call may use, whether exactly one call) for `tool_choice`."""
    functions = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"a tool must be {{'type': 'function', 'function': {{'name': ...}}}}"
                             f", got {tool!r:.80}")
        functions.append(function)
    if not functions:
        raise ValueError("tool_choice needs tools to choose from; the request has none")
    if tool_choice == "required":
        return functions, False
    named = tool_choice.get("function") if isinstance(tool_choice, Mapping) else None
    name = named.get("name") if isinstance(named, Mapping) else None
    if not isinstance(name, str):
        raise ValueError(f"tool_choice {tool_choice!r:.80} asks for no call to force; a grammar "
                         "is for \"required\" or {\"type\": \"function\", \"function\": "
                         "{\"name\": ...}}")
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
    return chosen[:1], True


def tool_call_grammar_v4(tools: Sequence[Mapping[str, Any]],
                         tool_choice: str | Mapping[str, Any] = "required", *,
                         thinking: bool = False, parallel: bool = True) -> str:
    """An llguidance Lark grammar for a V4 reply that is only tool calls, in DSML exactly as
    encoding_dsv4.py renders them (for `serving.grammar.TokenGrammar.lark`).

    The reply is `[reasoning "</think>"] "\\n\\n" <｜DSML｜tool_calls> block`, nothing
    before the block (OpenAI's "required" allows no content either) and nothing after it
    (the grammar then accepts only EOS). `tool_choice` "required": one or more calls of any
    tool; `{"type": "function", "function": {"name": N}}`: exactly one call of N. Each
    call writes the tool's parameters in its schema's `properties` order, the `required`
    ones always and the others optionally; a string parameter (an enum or const of strings:
    one of them) as raw text with string="true", any other type as `%json` of its schema
    (with the parameters' `$defs`) with string="false"; both where the schema allows a
    string and more or gives no type; with no `properties`, any parameters. String
    constraints other than enum/const (pattern, lengths, formats) are not enforced.

    Args:
      tools: the request's OpenAI tools.
      tool_choice: "required" or a named function.
      thinking: the prompt ended in "<think>" (thinking mode): reasoning up to the first
        "</think>" comes first, free.
      parallel: OpenAI's `parallel_tool_calls`; False: exactly one call.

    Raises:
      ValueError: no tools, a tool without a function name, a tool_choice that forces
        nothing ("none", "auto") or names no tool, or a parameter schema with no value.
    """
    functions, single = _chosen(tools, tool_choice)
    single = single or not parallel
    opening = _lark_string(TOOL_CALLS_SEPARATOR + TOOL_CALLS_START)
    closing = _lark_string("\n" + TOOL_CALLS_END)
    lines = [f"start: {'think ' if thinking else ''}{opening} calls {closing}",
             "calls: call" + ("" if single else "+"),
             "call: " + " | ".join(f"invoke{k}" for k in range(len(functions)))]
    if thinking:
        end = THINKING_END_TOKEN.replace("/", "\\/")
        lines.append(f"think[lazy]: /(?s:.*){end}/")
    for k, function in enumerate(functions):
        lines += _invoke_rules(k, function)
    close = PARAMETER_CLOSE.replace("/", "\\/")
    head = _lark_string(f'<{DSML_TOKEN}parameter name="')
    lines += [f"str_value[lazy]: /(?s:.*){close}/",
              f'any_parameter: {head} PARAMETER_NAME "\\" string=\\"true\\">" str_value'
              f' | {head} PARAMETER_NAME "\\" string=\\"false\\">" any_json '
              f"{_lark_string(PARAMETER_CLOSE)}",
              'PARAMETER_NAME: /[^"\\n]+/',
              "any_json: %json {}"]
    return "\n".join(lines) + "\n"

