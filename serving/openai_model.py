"""What the OpenAI endpoints need of one served model: its tokenizer's text (`ModelText`,
read once per model), its signatures called with errors in OpenAI's shape
(`OpenAIError`), generation through the batcher, the context check, and its grammar.

The module docstring of `serving/openai_api.py` says how text becomes token ids.
"""

from __future__ import annotations

import codecs
import secrets
import threading
import weakref
from collections.abc import Sequence

import numpy as np
from fastapi.responses import JSONResponse

from evaluation.task_scoring import cut_at_stop
from savedmodel.layout import read_tokenizer
from serving.batcher import Unavailable
from serving.grammar import TokenGrammar
from serving.server import BadRequest, ModelServer
from tokenization import chat_template


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


class ModelText:
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


def text_of(server: ModelServer) -> ModelText:
    with _texts_lock:
        if server not in _texts:
            _texts[server] = ModelText(server)
        return _texts[server]


def run_signature(server: ModelServer, name: str, inputs: dict, rows: int) -> dict:
    """`server.run`, its errors as OpenAIError."""
    try:
        return server.run(name, inputs, rows)
    except BadRequest as e:
        raise OpenAIError(400, str(e)) from e
    except Unavailable as e:
        raise OpenAIError(503, str(e), "server_error", code="overloaded") from e


def _strings(texts: Sequence[str]) -> np.ndarray:
    return np.array([t.encode("utf-8") for t in texts], dtype=object)


def tokenize_texts(server: ModelServer, texts: Sequence[str]) -> list[list[int]]:
    out = run_signature(server, "tokenize", {"text": _strings(texts)}, len(texts))
    return [ids[:n].tolist() for ids, n in zip(out["input_ids"], out["lengths"], strict=True)]


def decode_ids(text: ModelText, ids: Sequence[int]) -> str:
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


def token_string(surface: bytes) -> str:
    """A token's text, or OpenAI's `bytes:\\xe4\\xbd` for bytes that are not whole UTF-8."""
    try:
        return surface.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in surface)


def cut_at_stops(text: str, stops: list[str]) -> tuple[str, bool]:
    """(text before the first stop sequence, whether one was found)."""
    cut = cut_at_stop(text, stops)
    return cut, len(cut) < len(text)


def generate_texts(server: ModelServer, signature: str, prompts: list[str], max_tokens: int,
              req) -> tuple[list[str], list[int]]:
    """(completion text, tokens generated) per prompt: one call of `signature`."""
    rows = len(prompts)
    seed = req.seed if req.seed is not None else secrets.randbelow(2**31)
    out = run_signature(server, signature, {
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


def check_room(server: ModelServer, prompt_tokens: int, max_tokens: int, param: str,
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


_grammars: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grammar_of(server: ModelServer) -> TokenGrammar:
    """The model's `TokenGrammar` (llguidance over its tokenizer.json), built once."""
    with _texts_lock:
        if server not in _grammars:
            tokenizer = read_tokenizer(server.path)
            _grammars[server] = TokenGrammar(tokenizer.to_json_string(),
                                             server.vocab_size or len(tokenizer.surfaces()),
                                             tokenizer.eos_id)
        return _grammars[server]

