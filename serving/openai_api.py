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
import codecs
import logging
import os
import secrets
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Protocol

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from savedmodel.layout import read_tokenizer
from savedmodel.task_scoring import cut_at_stop
from serving.batcher import Unavailable
from serving.deepseek_chat import ChatPlan, ChatPlanError, plan_chat
from serving.engine import EngineOverloaded, Sampling
from serving.grammar import TokenGrammar
from serving.http_body import HTTPError
from serving.openai_engine import EngineReply, EngineRows, sse
from serving.openai_schema import (
    ChatCompletionRequest,
    CompletionRequest,
    RequestError,
    parse,
)
from serving.server import JSON_BYTES_PER_FLOAT, BadRequest, ModelServer
from tokenization import chat_template

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


class OpenAIError(Exception):
    """An error answered in OpenAI's shape with HTTP `status`."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.type, self.param, self.code = status, type_, param, code

    def response(self, headers: dict | None = None) -> JSONResponse:
        return JSONResponse({"error": {"message": str(self), "type": self.type,
                                       "param": self.param, "code": self.code}},
                            status_code=self.status, headers=headers)


# ----------------------------------------------------------------------------- the model


class _Text:
    """What the endpoints need of one model's tokenizer, read once from its SavedModel."""

    def __init__(self, server: ModelServer):
        tokenizer = read_tokenizer(server.path)
        if tokenizer is None:
            raise OpenAIError(400, f"model '{server.name}' has no tokenizer: it serves "
                              "logits only (token ids in), through TF Serving's routes",
                              param="model")
        # bytes of each id; special tokens as their text, so that echoed tokens join to
        # the prompt as given
        self.surfaces = tokenizer.surfaces(skip_special=False)
        self.plain_surfaces = tokenizer.surfaces()  # special tokens as b"", as `generate` decodes
        self.eos_id = tokenizer.eos_id
        self.added = {t.content for t in tokenizer.added_tokens}
        self.bos_token, self.eos_token = chat_template.special_tokens(tokenizer)
        self.template = None  # the full chat template, when its affixes are the model's
        if server.chat_prompt is not None and tokenizer.chat_template:
            try:
                affixes = chat_template.prompt_affixes(tokenizer.chat_template,
                                                       self.bos_token, self.eos_token)
                if affixes == tuple(server.chat_prompt):
                    self.template = tokenizer.chat_template
            except chat_template.ChatTemplateError:
                pass

    def surface(self, token_id: int) -> bytes:
        return self.surfaces[token_id] if 0 <= token_id < len(self.surfaces) else b""


_texts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_texts_lock = threading.Lock()


def _text_of(server: ModelServer) -> _Text:
    with _texts_lock:
        if server not in _texts:
            _texts[server] = _Text(server)
        return _texts[server]


def _run(server: ModelServer, name: str, inputs: dict, rows: int) -> dict:
    """`server.run`, its errors as OpenAIError."""
    try:
        return server.run(name, inputs, rows)
    except BadRequest as e:
        raise OpenAIError(400, str(e)) from e
    except Unavailable as e:
        raise OpenAIError(503, str(e), "server_error", code="overloaded") from e


def _strings(texts: Sequence[str]) -> np.ndarray:
    return np.array([t.encode("utf-8") for t in texts], dtype=object)


def _tokenize(server: ModelServer, texts: Sequence[str]) -> list[list[int]]:
    out = _run(server, "tokenize", {"text": _strings(texts)}, len(texts))
    return [ids[:n].tolist() for ids, n in zip(out["input_ids"], out["lengths"], strict=True)]


def _decode(text: _Text, ids: Sequence[int]) -> str:
    return b"".join(text.surface(i) for i in ids).decode("utf-8", errors="replace")


def token_pieces(surfaces: Sequence[bytes]) -> list[str]:
    """The text each token completes, whole UTF-8 characters only: a character split
    between tokens is in the piece of its last byte; pieces join to the bytes decoded at
    once (invalid UTF-8 as U+FFFD)."""
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pieces = [utf8.decode(s) for s in surfaces]
    if pieces:
        pieces[-1] += utf8.decode(b"", final=True)
    return pieces


def _token_string(surface: bytes) -> str:
    """A token's text, or OpenAI's `bytes:\\xe4\\xbd` for bytes that are not whole UTF-8."""
    try:
        return surface.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in surface)


def _logits(server: ModelServer, ids: list[int]) -> np.ndarray:
    """The logits signature on `ids`: float32 [len(ids), vocab]; 400 past the context."""
    if server.context and len(ids) > server.context:
        raise OpenAIError(400, f"{len(ids)} tokens to score do not fit the {server.context}-"
                          f"token context (max_position_embeddings) of model '{server.name}'",
                          param="prompt", code=CONTEXT_LENGTH_EXCEEDED)
    return _run(server, "logits", {"input_ids": np.array([ids], np.int32)}, 1)["logits"][0]


LOGITS_BUDGET_BYTES = 256 * 1024**2  # float32 logits of one batched `logits` call


def _logits_many(server: ModelServer, seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The logits signature on each of `seqs` in as few calls as allowed: rows sorted by
    length, right-padded (causal attention and dropless routing: a row's logits do not
    depend on what follows it or on the other rows), at most `serve.max_batch_size` rows
    and LOGITS_BUDGET_BYTES of logits per call. Returns float32 [len(seq), V] each; 400
    for a sequence longer than the context."""
    for ids in seqs:
        if server.context and len(ids) > server.context:
            _logits(server, list(ids))  # raises the 400 naming the prompt
    serve = getattr(server, "serve", None)
    vocab = server.vocab_size or len(_text_of(server).surfaces)
    order = sorted((i for i in range(len(seqs)) if seqs[i]), key=lambda i: -len(seqs[i]))
    out: list[np.ndarray] = [np.zeros([0, vocab], np.float32)] * len(seqs)
    while order:
        width = len(seqs[order[0]])  # the longest row of this call
        most = LOGITS_BUDGET_BYTES // (width * vocab * 4)
        if serve is not None:  # and what `run` allows a logits call (as if sent as JSON)
            most = min(most, serve.max_batch_size,
                       serve.max_response_bytes // (width * vocab * JSON_BYTES_PER_FLOAT))
        rows = max(1, min(len(order), most))
        chunk, order = order[:rows], order[rows:]
        batch = np.full([rows, width], _text_of(server).eos_id, np.int32)  # [B, T]
        for r, i in enumerate(chunk):
            batch[r, :len(seqs[i])] = seqs[i]
        logits = _run(server, "logits", {"input_ids": batch}, rows)["logits"]  # [B, T, V]
        for r, i in enumerate(chunk):
            out[i] = logits[r, :len(seqs[i])]
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax of one position's logits [vocab], in float64."""
    x = logits.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


def _token_logprobs(server: ModelServer, ids: list[int], start: int, top: int,
                    null_first: bool = False, logits: np.ndarray | None = None
                    ) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
    """Logprobs of ids[start:] given the ids before each (one `logits` call on ids[:-1],
    unless `logits` [len(ids) - 1, V] of it are given),
    and each one's `top` most likely (id, logprob), most likely first; ids[start]'s are
    None when `null_first` (OpenAI's first prompt token). Row by row: float64 memory is
    one vocabulary row, not [T, vocab]."""
    if start >= len(ids):
        return [], []
    # The last token's own logits predict nothing scored here: a sequence one token past
    # the context (a prompt that fills it, plus the token generated from its last
    # position) is scored within the context.
    if logits is None and len(ids) > 1:  # else given: the logits of ids[:-1]
        logits = _logits(server, ids[:-1])  # [T - 1, V]
    values: list[float | None] = []
    alternatives: list[list[tuple[int, float]] | None] = []
    for position in range(start, len(ids)):
        if position == 0 or (null_first and position == start):
            values.append(None)
            alternatives.append(None)
            continue
        row = log_softmax(logits[position - 1])  # the distribution that predicted ids[position]
        values.append(float(row[ids[position]]))
        best = np.argpartition(-row, top - 1)[:top] if 0 < top < row.size else np.arange(
            min(top, row.size))
        best = best[np.argsort(-row[best], kind="stable")]
        alternatives.append([(int(i), float(row[i])) for i in best])
    return values, alternatives


def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    """(text before the first stop sequence, whether one was found)."""
    cut = cut_at_stop(text, stops)
    return cut, len(cut) < len(text)


def _generate(server: ModelServer, signature: str, prompts: list[str], max_tokens: int,
              req) -> tuple[list[str], list[int]]:
    """(completion text, tokens generated) per prompt: one call of `signature`."""
    rows = len(prompts)
    seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
    out = _run(server, signature, {
        "prompt": _strings(prompts),
        "max_new_tokens": np.full([rows], max_tokens, np.int32),
        "temperature": np.full([rows], req.temperature, np.float32),
        "top_k": np.full([rows], req.top_k, np.int32),
        "top_p": np.full([rows], req.top_p, np.float32),
        "seed": np.full([rows], seed, np.int32),
    }, rows)
    texts = [c.decode("utf-8", errors="replace") for c in out["completion"]]
    return texts, [int(n) for n in out["num_generated"]]


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a prompt too long


def _check_room(server: ModelServer, prompt_tokens: int, max_tokens: int, param: str,
                at: str = "") -> None:
    """prompt_tokens + max_tokens within the context (max_position_embeddings: what cached
    decoding holds, prompt and reply together), else a 400 `context_length_exceeded`
    naming `param` ("prompt" or "messages": the prompt leaves no room) or max_tokens (the
    prompt fits, max_tokens does not)."""
    if not server.context:
        return
    room = server.context - prompt_tokens
    takes = "take" if param == "messages" else "takes"
    if room < 0 or (room == 0 and max_tokens > 0):
        limit = f"the {server.context}-token context (max_position_embeddings) of model " \
                f"'{server.name}'"
        where = (f"over {limit}" if room < 0 else
                 f"which fills {limit}, leaving no room for max_tokens={max_tokens}")
        raise OpenAIError(400, f"the {param}{at} {takes} {prompt_tokens} tokens ([EOS] or the chat "
                          f"template included), {where}: shorten the {param}", param=param,
                          code=CONTEXT_LENGTH_EXCEEDED)
    if max_tokens > room:
        raise OpenAIError(400, f"max_tokens={max_tokens} must be at most {room}: the {param}"
                          f"{at} {takes} {prompt_tokens} tokens of the {server.context}-token "
                          f"context (max_position_embeddings) of model '{server.name}'",
                          param="max_tokens", code=CONTEXT_LENGTH_EXCEEDED)


# ----------------------------------------------------------------------------- completions


def _completion_prompts(server: ModelServer, req: CompletionRequest,
                        text: _Text) -> tuple[list[str], list[list[int]], int, bool]:
    """(prompts as text, what the model reads of each ([EOS] + ids), max_tokens, whether
    it is one greedy token), the prompts checked (count, ids, room in the context)."""
    max_tokens = 16 if req.max_tokens is None else req.max_tokens
    given_ids = not isinstance(req.prompt[0], str)
    serve = getattr(server, "serve", None)
    if serve is not None and len(req.prompt) > serve.max_batch_size:
        raise OpenAIError(400, f"at most max_batch_size={serve.max_batch_size} prompts per "
                          f"request; this one has {len(req.prompt)}: split it", param="prompt")
    if given_ids:
        vocab = server.vocab_size or len(text.surfaces)
        for i, ids in enumerate(req.prompt):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise OpenAIError(400, f"prompt token ids must be in [0, {vocab}) "
                                  f"(vocab_size); prompt {i} has {bad[0]}", param="prompt")
        prompt_ids = [list(ids) for ids in req.prompt]
        prompts = [_decode(text, ids) for ids in prompt_ids]
    else:
        prompts = [_fim(text, p, req.suffix) for p in req.prompt]
        prompt_ids = _tokenize(server, prompts)
    contexts = [[text.eos_id, *ids] for ids in prompt_ids]  # what generate prepends
    # One greedy token is the argmax of the last position's logits: no `generate` call,
    # and no position of its own, so the prompt may fill the context (lm-evaluation-
    # harness's log-likelihood request: echo, logprobs, max_tokens 1, temperature 0).
    greedy_one = max_tokens == 1 and req.temperature == 0
    for i, ids in enumerate(contexts):
        if not (greedy_one and server.context and len(ids) <= server.context):
            _check_room(server, len(ids), max_tokens, "prompt",
                        f" {i}" if len(contexts) > 1 else "")
    return prompts, contexts, max_tokens, greedy_one


# DeepSeek's fill-in-the-middle tokens (DeepSeek-Coder, V2, V3: `suffix` on /beta/completions).
FIM_BEGIN, FIM_HOLE, FIM_END = "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"


def _fim(text: _Text, prompt: str, suffix: str | None) -> str:
    """`prompt`, or with a `suffix` DeepSeek's FIM prompt: begin + prompt + hole + suffix +
    end (the reply is the middle). 400 naming the FIM tokens the tokenizer lacks."""
    if suffix is None:
        return prompt
    missing = [t for t in (FIM_BEGIN, FIM_HOLE, FIM_END) if t not in text.added]
    if missing:
        raise OpenAIError(400, f"suffix (fill in the middle) needs DeepSeek's FIM tokens; this "
                          f"model's tokenizer lacks {', '.join(missing)}", param="suffix")
    return FIM_BEGIN + prompt + FIM_HOLE + suffix + FIM_END


def _completion(server: ModelServer, req: CompletionRequest) -> dict:
    text = _text_of(server)
    prompts, contexts, max_tokens, greedy_one = _completion_prompts(server, req, text)
    signature = "generate_raw" if "generate_raw" in server.signatures else "generate"
    completions, generated = [""] * len(prompts), [0] * len(prompts)
    known_ids: list[list[int] | None] = [None] * len(prompts)  # completion ids, when known
    memo: dict[tuple[int, ...], np.ndarray] = {}  # logits of a sequence, computed once
    if greedy_one:
        for i, logits in enumerate(_logits_many(server, contexts)):
            memo[tuple(contexts[i])] = logits
            token = int(np.argmax(logits[-1]))
            known_ids[i] = [] if token == text.eos_id else [token]
            if token != text.eos_id:  # as generate: [EOS] ends the completion, uncounted
                completions[i], generated[i] = _decode(text, [token]), 1
    elif max_tokens:
        completions, generated = _generate(server, signature, prompts, max_tokens, req)
    finished, scored = [], []
    for i, (completion, n) in enumerate(zip(completions, generated, strict=True)):
        completion, stopped = _cut(completion, req.stop)
        ended = not stopped and n < max_tokens  # the model ended it with [EOS]
        finished.append((completion, "stop" if stopped or ended else "length"))
        if req.logprobs is not None:
            if known_ids[i] is not None and not stopped:
                ids = list(known_ids[i])
            else:
                ids = _completion_ids(server, text, contexts[i], completion, n,
                                      exact=not stopped and req.temperature == 0)
            scored.append(ids + ([text.eos_id] if ended else []))
    if req.logprobs is not None:  # every choice's logits in batched calls
        wanted = {tuple((c + ids)[:-1]) for c, ids in zip(contexts, scored, strict=True)}
        wanted = [w for w in wanted if w and w not in memo]
        memo.update(zip(wanted, _logits_many(server, wanted), strict=True))
    choices = []
    for i, (prompt, (completion, finish)) in enumerate(zip(prompts, finished, strict=True)):
        logprobs = None
        if req.logprobs is not None:
            sequence = tuple((contexts[i] + scored[i])[:-1])
            logprobs = _completion_logprobs(server, text, contexts[i], scored[i], req,
                                            memo.get(sequence))
        choices.append({"text": (prompt if req.echo else "") + completion, "index": i,
                        "logprobs": logprobs, "finish_reason": finish})
    prompt_tokens = sum(len(c) for c in contexts)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
            "created": int(time.time()), "model": server.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": sum(generated),
                      "total_tokens": prompt_tokens + sum(generated)}}


GREEDY_REDO_MAX = 64  # the most tokens re-derived by argmax (one logits call each)


def _completion_ids(server: ModelServer, text: _Text, context: list[int], completion: str,
                    generated: int, exact: bool) -> list[int]:
    """The ids of a completion: the `tokenize` ids of its text. When they are not as many
    as the tokens generated (e.g. a byte token of a character cut off by max_tokens, whose
    text is U+FFFD) and the completion was greedy and not cut by a stop sequence
    (`exact`), the greedy ids are derived again, one `logits` call per token, and kept
    when they decode to the same text."""
    ids = _tokenize(server, [completion])[0] if completion else []
    if len(ids) == generated or not exact or generated > GREEDY_REDO_MAX:
        return ids
    greedy = list(context)
    for _ in range(generated):
        greedy.append(int(np.argmax(_logits(server, greedy)[-1])))
    greedy = greedy[len(context):]
    same = b"".join(text.plain_surfaces[i] if i < len(text.plain_surfaces) else b""
                    for i in greedy).decode("utf-8", errors="replace") == completion
    return greedy if same else ids


def _completion_logprobs(server: ModelServer, text: _Text, context: list[int],
                         completion_ids: list[int], req: CompletionRequest,
                         logits: np.ndarray | None = None) -> dict:
    """OpenAI's legacy logprobs object of one choice (see the module docstring); `logits`:
    those of (context + completion_ids)[:-1], when already computed."""
    # context = [EOS] + prompt ids: every token is scored after [EOS], as generated
    start = 1 if req.echo else len(context)
    ids = context + completion_ids
    values, alternatives = _token_logprobs(server, ids, start, req.logprobs,
                                           null_first=req.echo and len(context) > 1,
                                           logits=logits)
    scored = ids[start:]
    prompt_chars = len(_decode(text, context[1:]))
    surfaces = [text.surface(t) for t in scored]
    offsets, chars = [], 0 if req.echo else prompt_chars
    for piece in token_pieces(surfaces):
        offsets.append(chars)
        chars += len(piece)
    return {
        "tokens": [_token_string(s) for s in surfaces],
        "token_logprobs": values,
        "top_logprobs": [None if alt is None else
                         {_token_string(text.surface(i)): v for i, v in alt}
                         for alt in alternatives],
        "text_offset": offsets,
    }


# ----------------------------------------------------------------------------- chat


def _plan(server: ModelServer, text: _Text, req: ChatCompletionRequest) -> ChatPlan:
    """The request's DeepSeek features (`serving/deepseek_chat.py`), checked against the
    model's template."""
    try:
        return plan_chat(req, text.template, server.name, lambda: _grammar_of(server))
    except ChatPlanError as e:
        raise OpenAIError(400, str(e), param=e.param) from e


def _render(server: ModelServer, text: _Text, req: ChatCompletionRequest,
            plan: ChatPlan) -> tuple[str, str]:
    """(signature, prompt) for the messages (see the module docstring)."""
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


def _chat_prompt(server: ModelServer, text: _Text, req: ChatCompletionRequest,
                 plan: ChatPlan) -> tuple[str, str, list[int], int]:
    """(signature, prompt, what the model reads (ids), max_tokens) of a chat request, its
    room in the context checked."""
    signature, prompt = _render(server, text, req, plan)
    if signature == "generate":
        prefix, suffix = server.chat_prompt
        context = _tokenize(server, [prefix + prompt + suffix])[0]
    else:
        context = [text.eos_id, *_tokenize(server, [prompt])[0]]
    asked = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    room = (server.context - len(context)) if server.context else None
    if asked is None:
        asked = server.default_max_new_tokens or room or 16
        if room is not None:
            asked = max(min(asked, room), 1)
    _check_room(server, len(context), asked, "messages")
    if asked == 0:
        raise OpenAIError(400, "max_tokens must be at least 1", param="max_tokens")
    return signature, prompt, context, asked


_grammars: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _grammar_of(server: ModelServer) -> TokenGrammar:
    """The model's `TokenGrammar` (llguidance over its tokenizer.json), built once."""
    with _texts_lock:
        if server not in _grammars:
            tokenizer = read_tokenizer(server.path)
            _grammars[server] = TokenGrammar(tokenizer.to_json_string(),
                                             server.vocab_size or len(tokenizer.surfaces()),
                                             tokenizer.eos_id)
        return _grammars[server]


# ----------------------------------------------------------------------------- the engine


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
    vocab = server.vocab_size or len(_text_of(server).surfaces)
    bias = {}
    for key, value in (req.logit_bias or {}).items():
        if not key.isdigit() or not 0 <= int(key) < vocab:
            raise OpenAIError(400, f"logit_bias keys must be token ids in [0, {vocab}); "
                              f"got {key!r}", param="logit_bias")
        bias[int(key)] = float(value)
    return bias


def _chat(server: ModelServer, req: ChatCompletionRequest) -> tuple[dict, list[str]]:
    """(the chat.completion, the reply's pieces of whole characters for streaming)."""
    if req.logprobs and req.stream:
        raise OpenAIError(400, "logprobs with stream is not supported", param="logprobs")
    if req.top_logprobs is not None and not req.logprobs:
        raise OpenAIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    text = _text_of(server)
    plan = _plan(server, text, req)
    if plan.thinking or plan.tool_format or plan.constraint:
        raise OpenAIError(400, "thinking, tools and response_format need the serving "
                          "engine (off, or not usable with logprobs)", param="model")
    signature, prompt, context, asked = _chat_prompt(server, text, req, plan)
    [reply], [generated] = _generate(server, signature, [prompt], asked, req)
    reply, stopped = _cut(reply, req.stop)
    finish = "stop" if stopped or generated < asked else "length"
    reply_ids = _completion_ids(server, text, context, reply, generated,
                                exact=not stopped and req.temperature == 0)
    logprobs = None
    if req.logprobs:
        values, alternatives = _token_logprobs(server, context + reply_ids, len(context),
                                               req.top_logprobs or 0)

        def entry(token_id, value):
            s = text.surface(token_id)
            return {"token": _token_string(s), "logprob": value, "bytes": list(s)}

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


# ----------------------------------------------------------------------------- streaming


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


# ----------------------------------------------------------------------------- the router


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
                            lambda server, req, loop: _completions_reply(server, req, loop,
                                                                         counted))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(request, ChatCompletionRequest,
                            lambda server, req, loop: _chat_reply(server, req, loop, counted))

    return router


# ----------------------------------------------------------------------------- replies

Counted = Callable[[ModelServer, dict], None]  # the router's usage hook: (server, {"usage"})


def _completions_reply(server: ModelServer, req: CompletionRequest, loop, counted: Counted):
    """/v1/completions: the engine's reply (`EngineReply`, made in the event loop) when the
    model has the engine and the request needs no logprobs, else the batcher's."""
    if req.stream and req.logprobs is not None:
        raise OpenAIError(400, "logprobs with stream is not supported", param="logprobs")
    if _engine_of(server, req) is not None:
        text = _text_of(server)
        prompts, contexts, max_tokens, _ = _completion_prompts(server, req, text)
        if max_tokens and all(len(c) + max_tokens <= server.engine.max_len for c in contexts):
            rows = _engine_rows(server, req, loop, contexts, max_tokens)
            return EngineReply(rows, "completion", server.name, req.stream, _include_usage(req),
                               lambda usage: counted(server, {"usage": usage}),
                               echo=[p for p in prompts for _ in range(req.n)]
                               if req.echo else None)
    _one_choice(req)
    completion = _completion(server, req)
    counted(server, completion)
    if not req.stream:
        return JSONResponse(completion)
    text = _text_of(server)
    pieces = []
    for choice in completion["choices"]:
        ids = _tokenize(server, [choice["text"]])[0] if choice["text"] else []
        pieces.append([p for p in token_pieces([text.surface(t) for t in ids]) if p])
    return StreamingResponse(_completion_events(completion, pieces, _include_usage(req)),
                             media_type="text/event-stream")


def _chat_reply(server: ModelServer, req: ChatCompletionRequest, loop, counted: Counted):
    """/v1/chat/completions: the engine's reply, or the batcher's (`_completions_reply`)."""
    if _engine_of(server, req) is not None:
        text = _text_of(server)
        plan = _plan(server, text, req)
        _, _, context, asked = _chat_prompt(server, text, req, plan)
        if len(context) + asked <= server.engine.max_len:
            rows = _engine_rows(server, req, loop, [context], asked, plan.constraint)
            return EngineReply(rows, "chat", server.name, req.stream, _include_usage(req),
                               lambda usage: counted(server, {"usage": usage}), plan=plan)
    _one_choice(req)
    completion, pieces = _chat(server, req)
    counted(server, completion)
    if not req.stream:
        return JSONResponse(completion)
    return StreamingResponse(_chat_events(completion, pieces, _include_usage(req)),
                             media_type="text/event-stream")
