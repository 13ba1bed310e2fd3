"""/v1/chat/completions through the batcher: the messages rendered with the model's chat
template (or its affixes), the prompt's room in the context, and the chat.completion
with its logprobs (see the module docstring of `serving/openai_api.py`).
"""

from __future__ import annotations

import time
import uuid

from serving.deepseek_chat import ChatPlan, ChatPlanError, plan_chat
from serving.openai_completions import completion_token_ids
from serving.openai_logprobs import prompt_token_logprobs
from serving.openai_model import (
    ModelText,
    OpenAIError,
    check_room,
    cut_at_stops,
    generate_texts,
    grammar_of,
    text_of,
    token_pieces,
    token_string,
    tokenize_texts,
)
from serving.openai_schema import ChatCompletionRequest
from serving.server import ModelServer
from tokenization import chat_template


def chat_plan(server: ModelServer, text: ModelText, req: ChatCompletionRequest) -> ChatPlan:
    """The request's DeepSeek features (`serving/deepseek_chat.py`), checked against the
    model's template."""
    try:
        return plan_chat(req, text.template, server.name, lambda: grammar_of(server))
    except ChatPlanError as e:
        raise OpenAIError(400, str(e), param=e.param) from e


def _render(server: ModelServer, text: ModelText, req: ChatCompletionRequest,
            plan: ChatPlan) -> tuple[str, str]:
    """(signature, prompt) for the messages (see `serving/openai_api.py`)."""
    if server.chat_prompt is None:
        raise OpenAIError(400, f"model '{server.name}' is a plain language model (no chat "
                          "template): use /v1/completions", param="model")
    prefix, suffix = server.chat_prompt
    messages = plan.messages
    if text.template is not None:
        try:
            rendered = chat_template.render_prompt(
                text.template, messages, text.bos_token, text.eos_token,
                template_kwargs=plan.template_kwargs or None) + plan.prefix
        except chat_template.ChatTemplateError as e:
            raise OpenAIError(400, str(e), param="messages") from e
    elif plan.prefix or any(m["role"] == "system" for m in messages):
        raise OpenAIError(400, f"model '{server.name}''s chat template is not available: "
                          "no system messages nor prefix completion", param="messages")
    else:
        rendered = ""
        for i, m in enumerate(messages):
            expected = "user" if i % 2 == 0 else "assistant"
            if m["role"] != expected:
                raise OpenAIError(400, f"messages[{i}] is {m['role']}'s: this model's chat "
                                  "template is not available, so messages must alternate user "
                                  "and assistant, starting and ending with user",
                                  param=f"messages[{i}].role")
            rendered += (prefix + m["content"] + suffix if expected == "user"
                         else m["content"] + text.eos_token)
        if messages[-1]["role"] != "user":
            raise OpenAIError(400, "the last message must be the user's", param="messages")
    if rendered.startswith(prefix) and rendered.endswith(suffix) and (
            len(rendered) >= len(prefix) + len(suffix)):
        return "generate", rendered[len(prefix):len(rendered) - len(suffix)]
    return "generate_raw", rendered


def chat_prompt_ids(server: ModelServer, text: ModelText, req: ChatCompletionRequest,
                 plan: ChatPlan) -> tuple[str, str, list[int], int]:
    """(signature, prompt, what the model reads (ids), max_tokens) of a chat request, its
    room in the context checked."""
    signature, prompt = _render(server, text, req, plan)
    if signature == "generate":
        prefix, suffix = server.chat_prompt
        context = tokenize_texts(server, [prefix + prompt + suffix])[0]
    else:
        context = [text.eos_id, *tokenize_texts(server, [prompt])[0]]
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    room = (server.context - len(context)) if server.context else None
    if asked is None:
        asked = server.default_max_new_tokens or room or 16
        if room is not None:
            asked = max(min(asked, room), 1)
    check_room(server, len(context), asked, "messages")
    if asked == 0:
        raise OpenAIError(400, "max_tokens must be at least 1", param="max_tokens")
    return signature, prompt, context, asked


def chat_completion(server: ModelServer, req: ChatCompletionRequest) -> tuple[dict, list[str]]:
    """(the chat.completion, the reply's pieces of whole characters for streaming)."""
    if req.logprobs and req.stream:
        raise OpenAIError(400, "logprobs with stream is not supported", param="logprobs")
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    text = text_of(server)
    plan = chat_plan(server, text, req)
    if plan.thinking or plan.tool_format or plan.constraint:
        raise OpenAIError(400, "thinking, tools and response_format need the serving "
                          "engine (off, or not usable with logprobs)", param="model")
    signature, prompt, context, asked = chat_prompt_ids(server, text, req, plan)
    [reply], [generated] = generate_texts(server, signature, [prompt], asked, req)
    reply, stopped = cut_at_stops(reply, req.stop)
    finish = "stop" if stopped or generated < asked else "length"
    reply_ids = completion_token_ids(server, text, context, reply, generated,
                                exact=not stopped and req.temperature == 0)
    logprobs = None
    if req.logprobs:
        values, alternatives = prompt_token_logprobs(server, context + reply_ids, len(context),
                                               req.top_logprobs or 0)

        def entry(token_id, value):
            s = text.surface(token_id)
            return {"token": token_string(s), "logprob": value, "bytes": list(s)}

        logprobs = {"content": [
            {**entry(t, v), "top_logprobs": [entry(i, a) for i, a in alt]}
            for t, v, alt in zip(reply_ids, values, alternatives, strict=True)]}
    completion = {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
        "created": int(time.time()), "model": server.name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                     "logprobs": logprobs, "finish_reason": finish}],
        "usage": {"prompt_tokens": len(context), "completion_tokens": generated,
                  "total_tokens": len(context) + generated}}
    pieces = [p for p in token_pieces([text.surface(t) for t in reply_ids]) if p]
    return completion, pieces

