"""OpenAI-compatible endpoints beside TF Serving's: `make_openai_router(models)`.

  GET  /v1/models             {"object": "list", "data": [{"id", "object": "model",
                              "created", "owned_by": "deepseek-tfx"}]}
  POST /v1/completions        text completion of one prompt or a list (one choice each)
  POST /v1/chat/completions   messages rendered with the model's chat template

Request fields are OpenAI's (`serving/openai_schema.py` lists what is refused and what is
ignored); tokenization and scoring go through `ModelServer.run`, so they are validated and
batched with the TF Serving routes' requests. Defaults are OpenAI's: temperature 1,
top_p 1, completions max_tokens 16; a chat reply's max_tokens defaults to the model's
generation default (generation_config.json), at most what the context leaves. A request
without `seed` gets a random one; with one, the same request gives the same reply.

How text becomes token ids (what `usage`, the context check and logprobs count):
  - /v1/completions on a plain language model calls `generate`, on a chat model
    `generate_raw` (the prompt as given, no template): the model sees [EOS] (the document
    separator) + the `tokenize` ids of the prompt. A prompt given as token ids is scored
    on exactly those ids; to generate, it is decoded to text and the signature encodes
    that text again.
  - /v1/chat/completions (chat models only; a plain language model gets a 400 that
    points to /v1/completions): the messages are rendered with the tokenizer's
    chat_template (assets/tokenizer_config.json) when its single-turn affixes are the
    model's (assets.extra/chat_prompt.json), else as `prefix + user + suffix + reply +
    eos_token` per turn (system messages then refused). A rendering that starts with the
    prefix and ends with the suffix (any user/assistant conversation under DeepSeek's
    template) goes to `generate` with the affixes taken off, so the model sees exactly
    the rendered ids, as in training; any other (e.g. with a system message) goes to
    `generate_raw`, which puts [EOS] before it. `developer` messages are system messages.
  - prompt tokens + max_tokens must fit the model's context (max_position_embeddings,
    read from the SavedModel's assets.extra by `ModelServer`), else 400 with code
    `context_length_exceeded`, naming `prompt` (or `messages`) when the prompt alone
    leaves no room, else `max_tokens`;
    `usage.prompt_tokens` counts what the model sees ([EOS] or the template included).
  - a request has at most `serve.max_batch_size` prompts (one `generate` call).

Logprobs (completions `logprobs`: top-k alternatives, k <= 5, and `echo`; chat `logprobs`
and `top_logprobs` <= 20). `generate` returns text, not the sampled ids, so the
completion's ids are the `tokenize` ids of the completion text on its own (after a stop
sequence cut it), which is how the signature tokenized the prompt too. Where these are
not as many as the tokens generated (a character cut between byte tokens by
max_tokens decodes to U+FFFD), a greedy completion (temperature 0) not cut by a stop
sequence is decoded again by argmax over `logits` (up to 64 tokens), which gives the
ids generated; a sampled one keeps the `tokenize` ids. The sequence
[EOS or template] + prompt ids + completion ids (at most the context, plus the last
token, whose own logits are not needed) goes through the `logits` signature, the
prompts of a completions request together in batched calls (rows right-padded, at most
max_batch_size rows, 256 MiB of logits and what max_response_bytes allows a `logits`
request a call), so the reply is bounded: at most
context tokens, each with at most 5 or 20 alternatives; each token's logprob is
`log_softmax(logits[t - 1])[id_t]` in float64 numpy, one row at a time. The first prompt token's logprob
and alternatives are null, as OpenAI's. `tokens` are each token's UTF-8 text, or
`bytes:\\xe4\\xbd` for a token that is part of a character (OpenAI's form);
`text_offset` is the character offset in prompt + completion where the token's first
character starts. A completion the model ended with [EOS] has it as its last token
(its text, e.g. `<｜end▁of▁sentence｜>`, is not in `text`), as OpenAI lists
`<|endoftext|>`. With `echo`, `max_tokens: 0` scores the prompt without generating; its
prompt, [EOS] included, may fill the whole context.

One greedy token (`max_tokens: 1`, `temperature: 0`; lm-evaluation-harness's
log-likelihood request, which reads exactly one completion token) is the argmax of the
last position's logits, computed with the logprobs in the same batched calls, with no
`generate` call; it needs no position of its own, so its prompt may fill the context too,
and the harness's `max_length` is the model's context.

Generation. A model whose SavedModel has the serving engine's functions (every export
since the engine; `serve --decode-slots 0` turns it off) answers completions and chat
requests without logprobs through the engine (`serving/openai_engine.py`,
`serving/engine.py`): continuous batching, tokens streamed as they are made, stop strings
that stop generation at the token completing them (`usage.completion_tokens` counts up
to it), `n` choices (choice j samples with seed + j; at most the decode slots) and
`logit_bias`. Requests with logprobs, and models without the engine, go through the
batcher's `generate` call: there the reply is generated whole, a stop sequence cuts the
text after the fact (`usage.completion_tokens` counts every token generated), a stream
replays the finished reply in pieces of whole UTF-8 characters, and `n` must be 1.
`finish_reason` is "stop" (a stop sequence, or [EOS]) or "length".

Streaming (`stream: true`): server-sent events `data: {chunk}` ... `data: [DONE]`, each
piece whole UTF-8 characters; `stream_options.include_usage` adds a last chunk with
`usage`. `logprobs` with `stream` is refused.

Errors are OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`: 400
`invalid_request_error` naming the field, 404 `model_not_found`, 503 when the batch queue
is full, 500 `server_error`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from serving.http_body import HTTPError
from serving.openai_engine import EngineReply
from serving.openai_model import OpenAIError
from serving.openai_replies import chat_reply, completions_reply
from serving.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    parse,
)
from serving.server import ModelServer

# A/B splits are sticky per OpenAI's `user` field, or per this header on any route.
SESSION_HEADER = "x-session-id"
# The routes this module serves (metric labels).
OPENAI_ROUTES = ("/v1/models", "/v1/completions", "/v1/chat/completions")

OWNED_BY = "deepseek-tfx"
log = logging.getLogger(__name__)


class ModelRegistry(Protocol):
    """The models an OpenAI router serves.

    `names()`: the model ids /v1/models lists. `get(name, user)`: the ModelServer that
    answers a request for `name` (None: the default model) from `user` (the request's
    `user` field, or None; lets an A/B split pick a model per user); raises KeyError for
    a name it does not serve (the router answers 404 `model_not_found`). The response's
    `model` is the name of the ModelServer that answered (`ModelServer.name`).
    """

    def names(self) -> list[str]: ...

    def get(self, name: str | None, user: str | None) -> ModelServer: ...


class StaticModels:
    """A `ModelRegistry` of fixed servers; the default is `default` or the first."""

    def __init__(self, servers: dict[str, ModelServer], default: str | None = None):
        if not servers:
            raise ValueError("StaticModels needs at least one model")
        self.servers = dict(servers)
        self.default = default or next(iter(self.servers))

    def names(self) -> list[str]:
        return list(self.servers)

    def get(self, name: str | None, user: str | None) -> ModelServer:
        return self.servers[self.default if name is None else name]


def _pick(models: ModelRegistry, name: str | None, user: str | None) -> ModelServer:
    """The served model a request names (or the split's pick), else a 404."""
    try:
        return models.get(name, user)
    except KeyError:
        raise OpenAIError(404, f"The model '{name}' does not exist (this server serves "
                          f"{models.names()})", param="model", code="model_not_found") from None


def make_openai_router(models: ModelRegistry,
                       read_body: Callable[[Request], Awaitable[bytes]] | None = None,
                       on_usage: Callable[[str, int, int], None] | None = None) -> APIRouter:
    """The OpenAI-compatible routes (module docstring) over `models`.

    Every route answers in OpenAI's shapes, errors included, by itself (no exception
    handlers of the app are needed); the model work runs in Starlette's thread pool.

    Args:
      models: the served models (`ModelRegistry`).
      read_body: reads a request's body within the server's limits
        (`http_body.read_body`; its `HTTPError` is answered in OpenAI's shape with its
        status); None reads it whole (tests).
      on_usage: called as `on_usage(model, prompt_tokens, completion_tokens)` with each
        answered request's `usage` (the metrics' token counters), or None.
    """
    router = APIRouter()

    async def body_of(request: Request) -> bytes:
        if read_body is None:
            return await request.body()
        try:
            return await read_body(request)
        except HTTPError as e:
            raise OpenAIError(e.status, str(e), "invalid_request_error") from e

    def counted(server: ModelServer, completion: dict) -> None:
        if on_usage is not None:
            usage = completion["usage"]
            on_usage(server.name, usage["prompt_tokens"], usage["completion_tokens"])

    async def answer(request: Request, schema, work):
        loop = asyncio.get_running_loop()
        try:
            req = parse(schema, await body_of(request))
        except RequestError as e:
            return OpenAIError(400, str(e), param=e.param).response()
        except OpenAIError as e:
            return e.response(headers={"Connection": "close"})
        try:
            server = _pick(models, req.model, req.user or request.headers.get(SESSION_HEADER))
            request.state.model = server.name
            reply = await run_in_threadpool(work, server, req, loop)
            return await reply.response() if isinstance(reply, EngineReply) else reply
        except OpenAIError as e:
            return e.response()
        except Exception as e:  # noqa: BLE001 (a server keeps serving)
            log.exception("%s failed", request.url.path)
            return OpenAIError(500, f"internal error: {type(e).__name__}: {e}",
                               "server_error").response()

    @router.get("/v1/models")
    def list_models() -> JSONResponse:
        data = []
        for name in models.names():
            server = models.get(name, None)
            created = int(os.path.getmtime(server.path))
            data.append({"id": name, "object": "model", "created": created,
                         "owned_by": OWNED_BY})
        return JSONResponse({"object": "list", "data": data})

    @router.post("/v1/completions")
    async def completions(request: Request):
        return await answer(request, CompletionRequest,
                            lambda server, req, loop: completions_reply(server, req, loop,
                                                                         counted))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, ChatCompletionRequest,
                            lambda server, req, loop: chat_reply(server, req, loop, counted))

    return router
