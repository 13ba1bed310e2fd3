"""The OpenAI routes' generation through the serving engine (`serving/engine.py`):
tokens streamed as they are made.

`openai_api` decides what the model reads (the prompt's ids, the chat rendering, the
context checks) and hands the rows here when the model has an engine and the request
needs no logprobs. Each choice is one engine request (`n` choices of a prompt: seeds
seed, seed + 1, ...); their events go, from the engine thread, into one asyncio queue of
the request's event loop, so no thread waits on a reply:

  - `stream: false`: the reply is built when every choice has finished;
  - `stream: true`: server-sent events as OpenAI's (`chat.completion.chunk` deltas, or
    `text_completion` pieces), each as soon as the engine sends its text (whole UTF-8
    characters, none that could begin a stop string), then each choice's
    `finish_reason`, the `usage` chunk when `stream_options.include_usage`, and
    `data: [DONE]`. A client that disconnects cancels its choices: their slots are free
    at the engine's next step.

`usage.completion_tokens` counts the tokens each choice generated up to its end: a stop
string ends generation at the token that completes it ([EOS] is not counted, as in
`generate`'s `num_generated`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from fastapi.responses import JSONResponse, StreamingResponse

from serving.deepseek_chat import ChatOutput, ChatPlan
from serving.engine import Delta, EngineOverloaded, Finished, Request, Sampling

FINISH_REASONS = {"stop": "stop", "length": "length"}


class EngineRows:
    """The engine requests of one HTTP request, their events in one asyncio queue.

    Args:
      engine: the model's `Engine`.
      loop: the HTTP request's event loop.
      contexts: one prompt (token ids) per choice.
      max_tokens: new tokens at most, per choice.
      sampling: one `Sampling` per choice.
      stop: the stop strings.
      constraint: makes each choice's grammar `Constraint` (`serving/grammar.py`), or None.

    Raises:
      EngineOverloaded: the engine's queue is full (the rows already queued are cancelled).
    """

    def __init__(self, engine, loop: asyncio.AbstractEventLoop, contexts: Sequence[list[int]],
                 max_tokens: int, sampling: Sequence[Sampling], stop: Sequence[str],
                 constraint: Callable | None = None):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.requests: list[Request] = []
        self.finished: dict[int, Finished] = {}
        try:
            for i, (ids, knobs) in enumerate(zip(contexts, sampling, strict=True)):
                self.requests.append(engine.submit(Request(
                    ids, max_tokens, knobs, self._sink(loop, i), stop=stop,
                    constraint=constraint() if constraint is not None else None)))
        except (EngineOverloaded, ValueError):
            self.cancel()
            raise

    def _sink(self, loop: asyncio.AbstractEventLoop, index: int) -> Callable:
        def sink(event) -> None:
            loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))
        return sink

    def cancel(self) -> None:
        for r in self.requests:
            r.cancel()

    async def events(self) -> AsyncIterator[tuple[int, Delta | Finished]]:
        """(choice index, event) until every choice has finished; cancels the choices
        if the consumer stops early (a client that disconnected)."""
        try:
            while len(self.finished) < len(self.requests):
                index, event = await self.queue.get()
                if isinstance(event, Finished):
                    self.finished[index] = event
                yield index, event
        finally:
            if len(self.finished) < len(self.requests):
                self.cancel()

    def usage(self) -> dict:
        prompt = sum(len(r.prompt_ids) for r in self.requests)
        completion = sum(f.completion_tokens for f in self.finished.values())
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}


class EngineFailed(RuntimeError):
    """The engine ended a choice with an error (a 500)."""


def _finish_reason(event: Finished) -> str:
    if event.reason == "error":
        raise EngineFailed(f"the engine failed: {event.error}")
    return FINISH_REASONS.get(event.reason, "stop")


def _error_event(error: Exception) -> bytes:
    """OpenAI's error shape as a stream's last event (the HTTP status was sent already)."""
    return sse({"error": {"message": str(error), "type": "server_error", "param": None,
                           "code": None}})


def sse(payload) -> bytes:
    """One server-sent event: `data: <JSON>` and a blank line (OpenAI's streams)."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode("utf-8") + b"\n\n"


class EngineReply:
    """An OpenAI reply to be made from engine rows in the event loop (`response()`).

    Args:
      rows: the `EngineRows`.
      kind: "chat" or "completion".
      model: the served model's name.
      stream: server-sent events, else one JSON reply.
      include_usage: `stream_options.include_usage`.
      on_usage: called with `usage` once every choice has finished, or None.
      echo: per choice, text to put before the completion (completions' `echo`), or None.
      plan: a chat request's `ChatPlan` (thinking, tool calls), or None.
    """

    def __init__(self, rows: EngineRows, kind: str, model: str, stream: bool,
                 include_usage: bool = False, on_usage: Callable[[dict], None] | None = None,
                 echo: Sequence[str] | None = None, plan: ChatPlan | None = None):
        self.rows, self.kind, self.model, self.stream = rows, kind, model, stream
        self.include_usage, self.on_usage, self.echo = include_usage, on_usage, echo
        self.plan = plan or ChatPlan([], {})
        self.outputs = [ChatOutput(self.plan) for _ in rows.requests]
        prefix = "chatcmpl" if kind == "chat" else "cmpl"
        self.head = {"id": f"{prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
                     "model": model}

    def _usage(self) -> dict:
        usage = self.rows.usage()
        if self.plan.thinking:
            usage["completion_tokens_details"] = {
                "reasoning_tokens": sum(o.reasoning_tokens for o in self.outputs)}
        if self.on_usage is not None:
            self.on_usage(usage)
        return usage

    async def response(self):
        if self.stream:
            return StreamingResponse(self._events(), media_type="text/event-stream")
        texts: dict[int, list[str]] = {i: [] for i in range(len(self.rows.requests))}
        async for index, event in self.rows.events():
            if isinstance(event, Delta):
                texts[index].append(event.text)
                self.outputs[index].push(event.text, event.tokens)
        usage = self._usage()
        choices = []
        for i, parts in texts.items():
            text, finish = "".join(parts), _finish_reason(self.rows.finished[i])
            if self.kind == "chat":
                output = self.outputs[i]
                output.finish(self.rows.finished[i].completion_tokens)
                choices.append({"index": i, "message": output.message(), "logprobs": None,
                                "finish_reason": output.finish_reason(finish)})
            else:
                echo = self.echo[i] if self.echo else ""
                choices.append({"text": echo + text, "index": i, "logprobs": None,
                                "finish_reason": finish})
        kind = "chat.completion" if self.kind == "chat" else "text_completion"
        return JSONResponse({**self.head, "object": kind, "choices": choices, "usage": usage})

    def _chunk(self, index: int, delta: dict | str, finish: str | None = None) -> bytes:
        if self.kind == "chat":
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            return sse({**self.head, "object": "chat.completion.chunk", "choices": [choice]})
        choice = {"index": index, "text": delta, "logprobs": None, "finish_reason": finish}
        return sse({**self.head, "object": "text_completion", "choices": [choice]})

    async def _events(self) -> AsyncIterator[bytes]:
        try:
            async for event in self._chunks():
                yield event
        except EngineFailed as e:  # the stream ends with the error, then [DONE]
            self.rows.cancel()
            yield _error_event(e)
            yield b"data: [DONE]\n\n"

    async def _chunks(self) -> AsyncIterator[bytes]:
        empty = {} if self.kind == "chat" else ""
        for i in range(len(self.rows.requests)):
            if self.kind == "chat":
                yield self._chunk(i, {"role": "assistant", "content": ""})
            elif self.echo and self.echo[i]:
                yield self._chunk(i, self.echo[i])
        async for index, event in self.rows.events():
            output = self.outputs[index]
            if isinstance(event, Delta) and self.kind == "chat":
                for delta in output.push(event.text, event.tokens):
                    yield self._chunk(index, delta)
            elif isinstance(event, Delta):
                yield self._chunk(index, event.text)
            elif self.kind == "chat":
                for delta in output.finish(event.completion_tokens):
                    yield self._chunk(index, delta)
                yield self._chunk(index, empty, output.finish_reason(_finish_reason(event)))
            else:
                yield self._chunk(index, empty, _finish_reason(event))
        usage = self._usage()
        if self.include_usage:
            object_ = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
            yield sse({**self.head, "object": object_, "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"
