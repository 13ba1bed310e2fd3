"""/v1/completions through the batcher: the prompts checked (ids, FIM, room in the
context), one `generate` call or the greedy token's argmax, and OpenAI's legacy
logprobs object (see the module docstring of `serving/openai_api.py`).
"""

from __future__ import annotations

import time
import uuid

import numpy as np

from serving.openai_logprobs import logits_of, logits_of_many, prompt_token_logprobs
from serving.openai_model import (
    ModelText,
    OpenAIError,
    check_room,
    cut_at_stops,
    decode_ids,
    generate_texts,
    text_of,
    token_pieces,
    token_string,
    tokenize_texts,
)
from serving.openai_schema import CompletionRequest
from serving.server import ModelServer


def completion_prompts(server: ModelServer, req: CompletionRequest,
                        text: ModelText) -> tuple[list[str], list[list[int]], int, bool]:
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
        prompts = [decode_ids(text, ids) for ids in prompt_ids]
    else:
        prompts = [_fim(text, p, req.suffix) for p in req.prompt]
        prompt_ids = tokenize_texts(server, prompts)
    contexts = [[text.eos_id, *ids] for ids in prompt_ids]  # what generate prepends
    # One greedy token is the argmax of the last position's logits: no `generate` call,
    # and no position of its own, so the prompt may fill the context (lm-evaluation-
    # harness's log-likelihood request: echo, logprobs, max_tokens 1, temperature 0).
    greedy_one = max_tokens == 1 and req.temperature == 0
    for i, ids in enumerate(contexts):
        if not (greedy_one and server.context and len(ids) <= server.context):
            check_room(server, len(ids), max_tokens, "prompt",
                        f" {i}" if len(contexts) > 1 else "")
    return prompts, contexts, max_tokens, greedy_one


# DeepSeek's fill-in-the-middle tokens (DeepSeek-Coder, V2, V3: `suffix` on /beta/completions).
FIM_BEGIN, FIM_HOLE, FIM_END = "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"


def _fim(text: ModelText, prompt: str, suffix: str | None) -> str:
    """`prompt`, or with a `suffix` DeepSeek's FIM prompt: begin + prompt + hole + suffix +
    end (the reply is the middle). 400 naming the FIM tokens the tokenizer lacks."""
    if suffix is None:
        return prompt
    missing = [t for t in (FIM_BEGIN, FIM_HOLE, FIM_END) if t not in text.added]
    if missing:
        raise OpenAIError(400, f"suffix (fill in the middle) needs DeepSeek's FIM tokens; this "
                          f"model's tokenizer lacks {', '.join(missing)}", param="suffix")
    return FIM_BEGIN + prompt + FIM_HOLE + suffix + FIM_END


def text_completion(server: ModelServer, req: CompletionRequest) -> dict:
    text = text_of(server)
    prompts, contexts, max_tokens, greedy_one = completion_prompts(server, req, text)
    signature = "generate_raw" if "generate_raw" in server.signatures else "generate"
    completions, generated = [""] * len(prompts), [0] * len(prompts)
    known_ids: list[list[int] | None] = [None] * len(prompts)  # completion ids, when known
    memo: dict[tuple[int, ...], np.ndarray] = {}  # logits of a sequence, computed once
    if greedy_one:
        for i, logits in enumerate(logits_of_many(server, contexts)):
            memo[tuple(contexts[i])] = logits
            token = int(np.argmax(logits[-1]))
            known_ids[i] = [] if token == text.eos_id else [token]
            if token != text.eos_id:  # as generate: [EOS] ends the completion, uncounted
                completions[i], generated[i] = decode_ids(text, [token]), 1
    elif max_tokens:
        completions, generated = generate_texts(server, signature, prompts, max_tokens, req)
    finished, scored = [], []
    for i, (completion, n) in enumerate(zip(completions, generated, strict=True)):
        completion, stopped = cut_at_stops(completion, req.stop)
        ended = not stopped and n < max_tokens  # the model ended it with [EOS]
        finished.append((completion, "stop" if stopped or ended else "length"))
        if req.logprobs is not None:
            if known_ids[i] is not None and not stopped:
                ids = list(known_ids[i])
            else:
                ids = completion_token_ids(server, text, contexts[i], completion, n,
                                      exact=not stopped and req.temperature == 0)
            scored.append(ids + ([text.eos_id] if ended else []))
    if req.logprobs is not None:  # every choice's logits in batched calls
        wanted = {tuple((c + ids)[:-1]) for c, ids in zip(contexts, scored, strict=True)}
        wanted = [w for w in wanted if w and w not in memo]
        memo.update(zip(wanted, logits_of_many(server, wanted), strict=True))
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


def completion_token_ids(server: ModelServer, text: ModelText, context: list[int], completion: str,
                    generated: int, exact: bool) -> list[int]:
    """The ids of a completion: the `tokenize` ids of its text. When they are not as many
    as the tokens generated (e.g. a byte token of a character cut off by max_tokens, whose
    text is U+FFFD) and the completion was greedy and not cut by a stop sequence
    (`exact`), the greedy ids are derived again, one `logits` call per token, and kept
    when they decode to the same text."""
    ids = tokenize_texts(server, [completion])[0] if completion else []
    if len(ids) == generated or not exact or generated > GREEDY_REDO_MAX:
        return ids
    greedy = list(context)
    for _ in range(generated):
        greedy.append(int(np.argmax(logits_of(server, greedy)[-1])))
    greedy = greedy[len(context):]
    same = b"".join(text.plain_surfaces[i] if i < len(text.plain_surfaces) else b""
                    for i in greedy).decode("utf-8", errors="replace") == completion
    return greedy if same else ids


def _completion_logprobs(server: ModelServer, text: ModelText, context: list[int],
                         completion_ids: list[int], req: CompletionRequest,
                         logits: np.ndarray | None = None) -> dict:
    """OpenAI's legacy logprobs object of one choice (see `serving/openai_api.py`); `logits`:
    those of (context + completion_ids)[:-1], when already computed."""
    # context = [EOS] + prompt ids: every token is scored after [EOS], as generated
    start = 1 if req.echo else len(context)
    ids = context + completion_ids
    values, alternatives = prompt_token_logprobs(server, ids, start, req.logprobs,
                                           null_first=req.echo and len(context) > 1,
                                           logits=logits)
    scored = ids[start:]
    prompt_chars = len(decode_ids(text, context[1:]))
    surfaces = [text.surface(t) for t in scored]
    offsets, chars = [], 0 if req.echo else prompt_chars
    for piece in token_pieces(surfaces):
        offsets.append(chars)
        chars += len(piece)
    return {
        "tokens": [token_string(s) for s in surfaces],
        "token_logprobs": values,
        "top_logprobs": [None if alt is None else
                         {token_string(text.surface(i)): v for i, v in alt}
                         for alt in alternatives],
        "text_offset": offsets,
    }

