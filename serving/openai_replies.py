"""The OpenAI routes' replies: the serving engine's (`serving/openai_engine.py`) when the
model has it and the request needs no logprobs, else the batcher's, whole or replayed
as server-sent events.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator

from fastapi.responses import JSONResponse, StreamingResponse

from serving.engine import EngineOverloaded, Sampling
from serving.openai_chat import chat_completion, chat_plan, chat_prompt_ids
from serving.openai_completions import completion_prompts, text_completion
from serving.openai_engine import EngineReply, EngineRows, sse
from serving.openai_model import OpenAIError, text_of, token_pieces, tokenize_texts
from serving.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
)
from serving.server import ModelServer


def _engine_of(server: ModelServer, req):
    """The model's serving engine when it can answer `req` (no logprobs), else None."""
    engine = getattr(server, "engine", None)
    if engine is None or (req.logprobs is not None and req.logprobs is not False):
        return None
    return engine


def _include_usage(req) -> bool:
    return bool(req.stream and req.stream_options and req.stream_options.include_usage)


def _one_choice(req) -> None:
    """The batcher's path (no engine, or logprobs) takes neither n > 1 nor logit_bias."""
    if req.n != 1:
        raise OpenAIError(400, f"n={req.n}: this model serves one choice per prompt here "
                          "(the serving engine, off or not usable with logprobs, makes n > 1)",
                          param="n")
    if req.logit_bias:
        raise OpenAIError(400, "logit_bias needs the serving engine (off, or not usable with "
                          "logprobs)", param="logit_bias")


def _engine_rows(server: ModelServer, req, loop, contexts: list[list[int]],
                 max_tokens: int, constraint=None) -> EngineRows:
    """One engine request per prompt and choice (`n`): choice j of a prompt samples with
    seed + j. Refuses n beyond the free decode slots (400) and a full queue (503)."""
    engine = server.engine
    rows = len(contexts) * req.n
    if rows > engine.slots:
        raise OpenAIError(400, f"n x prompts = {rows} choices: at most {engine.slots} (the "
                          "decode slots, serve --decode-slots)", param="n")
    seed = req.seed if req.seed is not None else secrets.randbelow(2**31 - req.n)
    bias = _logit_bias(server, req)
    sampling = [Sampling(req.temperature, req.top_k, req.top_p, seed + j, bias)
                for _ in contexts for j in range(req.n)]
    try:
        return EngineRows(engine, loop, [c for c in contexts for _ in range(req.n)],
                          max_tokens, sampling, req.stop, constraint)
    except EngineOverloaded as e:
        raise OpenAIError(503, str(e), "server_error", code="overloaded") from e
    except ValueError as e:
        raise OpenAIError(400, str(e), param="max_tokens") from e


def _logit_bias(server: ModelServer, req) -> dict[int, float]:
    """OpenAI's logit_bias ({"token id": bias in [-100, 100]}) as {id: bias}."""
    vocab = server.vocab_size or len(text_of(server).surfaces)
    bias = {}
    for key, value in (req.logit_bias or {}).items():
        if not key.isdigit() or not 0 <= int(key) < vocab:
            raise OpenAIError(400, f"logit_bias keys must be token ids in [0, {vocab}); "
                              f"got {key!r}", param="logit_bias")
        bias[int(key)] = float(value)
    return bias


def _chat_events(completion: dict, pieces: list[str], include_usage: bool) -> Iterator[bytes]:
    head = {k: completion[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta, finish=None):
        return sse({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                          "finish_reason": finish}]})

    yield chunk({"role": "assistant", "content": ""})
    for piece in pieces:
        yield chunk({"content": piece})
    yield chunk({}, completion["choices"][0]["finish_reason"])
    if include_usage:
        yield sse({**head, "choices": [], "usage": completion["usage"]})
    yield b"data: [DONE]\n\n"


def _completion_events(completion: dict, pieces: list[list[str]],
                       include_usage: bool) -> Iterator[bytes]:
    head = {k: completion[k] for k in ("id", "object", "created", "model")}
    for choice, parts in zip(completion["choices"], pieces, strict=True):
        for part in parts:
            yield sse({**head, "choices": [{"index": choice["index"], "text": part,
                                             "logprobs": None, "finish_reason": None}]})
        yield sse({**head, "choices": [{"index": choice["index"], "text": "",
                                         "logprobs": None,
                                         "finish_reason": choice["finish_reason"]}]})
    if include_usage:
        yield sse({**head, "choices": [], "usage": completion["usage"]})
    yield b"data: [DONE]\n\n"


Counted = Callable[[ModelServer, dict], None]  # the router's usage hook: (server, {"usage"})


def completions_reply(server: ModelServer, req: CompletionRequest, loop, counted: Counted):
    """/v1/completions: the engine's reply (`EngineReply`, made in the event loop) when the
    model has the engine and the request needs no logprobs, else the batcher's."""
    if req.stream and req.logprobs is not None:
        raise OpenAIError(400, "logprobs with stream is not supported", param="logprobs")
    if _engine_of(server, req) is not None:
        text = text_of(server)
        prompts, contexts, max_tokens, _ = completion_prompts(server, req, text)
        if max_tokens and all(len(c) + max_tokens <= server.engine.max_len for c in contexts):
            rows = _engine_rows(server, req, loop, contexts, max_tokens)
            return EngineReply(rows, "completion", server.name, req.stream, _include_usage(req),
                               lambda usage: counted(server, {"usage": usage}),
                               echo=[p for p in prompts for _ in range(req.n)]
                               if req.echo else None)
    _one_choice(req)
    completion = text_completion(server, req)
    counted(server, completion)
    if not req.stream:
        return JSONResponse(completion)
    text = text_of(server)
    pieces = []
    for choice in completion["choices"]:
        ids = tokenize_texts(server, [choice["text"]])[0] if choice["text"] else []
        pieces.append([p for p in token_pieces([text.surface(t) for t in ids]) if p])
    return StreamingResponse(_completion_events(completion, pieces, _include_usage(req)),
                             media_type="text/event-stream")


def chat_reply(server: ModelServer, req: ChatCompletionRequest, loop, counted: Counted):
    """/v1/chat/completions: the engine's reply, or the batcher's (`completions_reply`)."""
    if _engine_of(server, req) is not None:
        text = text_of(server)
        plan = chat_plan(server, text, req)
        _, _, context, asked = chat_prompt_ids(server, text, req, plan)
        if len(context) + asked <= server.engine.max_len:
            rows = _engine_rows(server, req, loop, [context], asked, plan.constraint)
            return EngineReply(rows, "chat", server.name, req.stream, _include_usage(req),
                               lambda usage: counted(server, {"usage": usage}), plan=plan)
    _one_choice(req)
    completion, pieces = chat_completion(server, req)
    counted(server, completion)
    if not req.stream:
        return JSONResponse(completion)
    return StreamingResponse(_chat_events(completion, pieces, _include_usage(req)),
                             media_type="text/event-stream")

