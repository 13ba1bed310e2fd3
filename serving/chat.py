"""`deepseek-tfx chat`: a conversation with a text SavedModel, printed as tokens come.

`ChatSession` holds the model (rebuilt as a Keras `DeepSeekCausalLM` from the
SavedModel's variables, `base_model.load_model`), its tokenizer (the SavedModel's
`assets/tokenizer.json`, run by the same in-graph `BytePairEncoder` as the
`tokenize` signature) and the conversation so far. Each prompt:

  1. becomes token ids as the `generate` signature would make them
     (`savedmodel/export.py`): a chat model (one with `assets.extra/chat_prompt.json`)
     renders the conversation with its chat template, the tokenizer's
     `chat_template` whose single-turn affixes are the ones in chat_prompt.json,
     else each turn as `prefix + user + suffix + reply + EOS`; a plain language
     model continues the running text (each line appended to the text so far,
     after a newline unless the text ends with one; an empty line adds nothing,
     the model continues), after the [EOS] document separator;
  2. is trimmed to the context: the oldest turns are dropped while the prompt +
     max_new_tokens exceeds the context (`chat_context`: max_position_embeddings, at
     most CHAT_CONTEXT_CAP for the MLA cache; one line on `err` says so); a single turn
     still too long keeps
     its last context -
     max_new_tokens tokens, as the `generate` signature crops it;
  3. is decoded one token per call of a compiled step over the model's latent KV
     cache (`DeepSeekCausalLM.call_with_cache`), sampled with `generate`'s own
     rule (`generation.next_token`; the t-th token of the first reply after a
     start or /reset uses the stateless seed (seed, t), and the count runs on
     through later replies), until [EOS] or max_new_tokens. The cache is kept
     between replies: the tokens a new prompt shares with the cached ones are
     not run again, except with a bounded cache (DeepSeek-V4's rings hold only the
     last positions: `bounded_cache`), where a prompt that leaves the cached ids
     before their end runs again from the start. A long prompt runs through the
     cache in chunks of `generation.PREFILL_CHUNK` tokens. The session owns its
     cache, so each step writes it in place (`call_with_cache(..., in_place=True)`):
     a step's cost does not grow with the copy of a long cache.

So a first reply equals the `generate` signature's completion for the same prompt
and knobs (the same prompt ids, the same seeds and steps). Each token's bytes go
through an incremental UTF-8 decoder (`StreamDecoder`), so a character cut
between byte-level tokens is printed once complete, and the printed reply equals
the decode of all its ids (invalid UTF-8 becomes U+FFFD, as `detokenize` does).

`/reset` clears the history, `/exit` or end of input leaves.

Ctrl-C (SIGINT) at any moment after a line is read (the template, the encoding, the
first step, the reply being written) stops that reply and keeps the session: while
`run` or `reply` runs in the main thread, SIGINT only sets a flag, which is checked
before the model's first step and between steps, so the KV cache and the history
stay consistent (a step is never cut in half; a reply stops within one step). The
interrupted turn stays in the history with the part of the reply that was printed
(possibly nothing), and `[reply stopped]` is written on `err`. Ctrl-C at the prompt
drops the line being typed; a second Ctrl-C in a row there leaves (exit code 130),
as do `/exit` and end of input (Ctrl-D; exit code 0). A turn the chat template
refuses (`chat_template.ChatTemplateError`, its limits included) is reported in one
line on `err` and left out of the history.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TextIO

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the regex ops of the encoder)

from config import GenerationConfig
from models.deepseek.generation import PREFILL_CHUNK, next_token
from savedmodel.layout import (
    NoTokenizerError,
    read_chat_prompt,
    read_generation_config,
    read_tokenizer,
)
from tokenization import chat_template
from tokenization.byte_level_bpe import ByteLevelBpe
from tokenization.byte_pair_encoder import BytePairEncoder

EXIT, RESET = "/exit", "/reset"
DEFAULT_MAX_NEW_TOKENS = 100  # a SavedModel without generation_config.json
CHAT_CONTEXT_CAP = 32_768  # the most positions a session's MLA cache holds


def chat_context(model) -> int:
    """The positions a session holds: the model's max_position_embeddings when its cache
    is bounded (V4: rings, and one entry per m tokens), else at most CHAT_CONTEXT_CAP (the
    MLA cache is allocated whole: per layer a (1, S, width) buffer)."""
    limit = model.config.max_position_embeddings
    return limit if getattr(model, "bounded_cache", False) else min(limit, CHAT_CONTEXT_CAP)


@dataclasses.dataclass(frozen=True)
class Sampling:
    """The knobs of every reply, as `deepseek-tfx generate` names them (0 temperature = greedy)."""

    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int = 0


def default_sampling(model_dir: str) -> Sampling:
    """The SavedModel's generation defaults (`assets.extra/generation_config.json`, the
    defaults of its `serving_default`), else `GenerationConfig()` with 100 new tokens."""
    g = read_generation_config(model_dir) or dataclasses.replace(
        GenerationConfig(), max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    return Sampling(g.max_new_tokens, g.temperature, g.top_k, g.top_p)


class StreamDecoder:
    """Token ids -> text pieces, each piece whole UTF-8 characters.

    The pieces of `push` for ids i_1..i_n, then `finish()`, join to the bytes of
    the ids decoded at once (invalid UTF-8 as U+FFFD), however a character is
    split between tokens.

    Args:
      surfaces: the bytes of each id (`ByteLevelBpe.surfaces()`: special tokens
        are b""); ids beyond it decode to nothing, as in `detokenize`.
    """

    def __init__(self, surfaces: list[bytes]):
        self._surfaces = surfaces
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by this token's bytes ("" while a character is unfinished)."""
        in_range = 0 <= token_id < len(self._surfaces)
        return self._utf8.decode(self._surfaces[token_id] if in_range else b"")

    def finish(self) -> str:
        """What an unfinished character at the end decodes to (U+FFFD), or ""."""
        return self._utf8.decode(b"", final=True)


class ChatSession:
    """A conversation with one model: history, template, context trimming, streaming.

    Args:
      model: a `DeepSeekCausalLM`.
      tokenizer: its `ByteLevelBpe`.
      sampling: the knobs of every reply.
      chat_prompt: (prefix, suffix) around a user's prompt for a chat model
        (`assets.extra/chat_prompt.json`), None for a plain language model.

    Raises:
      ValueError: max_new_tokens outside [1, context - 1] (the context:
        `chat_context(model)`).
    """

    def __init__(self, model, tokenizer: ByteLevelBpe, sampling: Sampling,
                 chat_prompt: tuple[str, str] | None = None):
        self.model = model
        self.sampling = sampling
        self.context = chat_context(model)
        if not 1 <= sampling.max_new_tokens < self.context:
            raise ValueError(f"max_new_tokens={sampling.max_new_tokens} must be in [1, "
                             f"{self.context - 1}] (the session's context of {self.context} positions)")
        self.eos_id = tokenizer.eos_id
        self.chat_prompt = chat_prompt
        self.bos_token, self.eos_token = chat_template.special_tokens(tokenizer)
        self.template = None  # the full template, when it renders exactly `chat_prompt`
        if chat_prompt is not None and tokenizer.chat_template:
            try:
                if chat_template.prompt_affixes(tokenizer.chat_template, self.bos_token,
                                                self.eos_token) == tuple(chat_prompt):
                    self.template = tokenizer.chat_template
            except chat_template.ChatTemplateError:
                pass  # turns are joined from the affixes instead
        self.surfaces = tokenizer.surfaces()
        encoder = BytePairEncoder(tokenizer.pre_tokenizer_config, tokenizer.added_tokens,
                                  tokenizer, self.surfaces)
        self._encode = tf.function(lambda text: encoder.encode(text), autograph=False,
                                   input_signature=[tf.TensorSpec([None], tf.string)])
        # The cache's structure is the model's own (one tensor for MLA; a tuple of dicts
        # of buffers for DeepSeek-V4): its specs come from an empty cache.
        cache_spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                           model.init_cache(1, self.context))
        self._step = tf.function(self._step_fn, autograph=False, input_signature=[
            tf.TensorSpec([1, None], tf.int32), cache_spec, tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.int32)])
        self._chunk = PREFILL_CHUNK
        self._extend = tf.function(  # a chunk of a long prompt: the cache only
            lambda ids, cache, index: self.model.call_with_cache(ids, cache, index,
                                                                 in_place=True)[1],
            autograph=False, input_signature=[tf.TensorSpec([1, self._chunk], tf.int32), cache_spec,
                             tf.TensorSpec([], tf.int32)])
        self.turns: list[tuple[str, str]] = []  # (user text, reply) of each finished turn
        self._stop = False  # set by Ctrl-C while a reply is made: stop at the next step
        self._at_prompt = False  # Ctrl-C raises KeyboardInterrupt (to end input())
        self.reset()

    @classmethod
    def from_dir(cls, model_dir: str, **knobs) -> ChatSession:
        """The session of a SavedModel directory (pushed version or hf-import output).

        Args:
          model_dir: the SavedModel directory.
          **knobs: `Sampling` fields to set; the others are `default_sampling`'s.

        Raises:
          NoTokenizerError: a logits-only SavedModel.
          base_model.BaseModelError, FileNotFoundError: no model or no config there.
          ValueError: a bad max_new_tokens (see the class).
        """
        from savedmodel import base_model

        tokenizer = read_tokenizer(model_dir)
        if tokenizer is None:
            raise NoTokenizerError(model_dir, "chat")
        sampling = dataclasses.replace(default_sampling(model_dir),
                                       **{k: v for k, v in knobs.items() if v is not None})
        model = base_model.load_model(model_dir)
        if knobs.get("max_new_tokens") is None:  # the default: clamped to the context
            context = chat_context(model)
            sampling = dataclasses.replace(
                sampling, max_new_tokens=min(sampling.max_new_tokens, context - 1))
        return cls(model, tokenizer, sampling, read_chat_prompt(model_dir))

    # -- Ctrl-C ---------------------------------------------------------------------
    def _on_sigint(self, signum, frame) -> None:
        if self._at_prompt:
            raise KeyboardInterrupt
        self._stop = True

    @contextlib.contextmanager
    def _sigint_stops_the_reply(self):
        """SIGINT handled by `_on_sigint` inside the block (main thread only: Python
        delivers signals there; elsewhere a KeyboardInterrupt is caught as before)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    # -- history --------------------------------------------------------------------
    def reset(self) -> None:
        """Forgets the conversation (and restarts the seed stream at step 0)."""
        self.turns = []
        self.steps = 0  # tokens sampled since the start or the last reset
        self._forget_cache()

    def _forget_cache(self) -> None:
        self._cache = None
        self._cached: list[int] = []  # the ids whose keys and values fill the cache

    def _text(self, turns: list[tuple[str, str]], user: str) -> str:
        """The prompt text of `turns` followed by `user`'s turn."""
        if self.chat_prompt is None:
            return "".join(u + r for u, r in turns) + user
        if self.template is not None:
            messages = []
            for u, r in turns:
                messages += [{"role": "user", "content": u}, {"role": "assistant", "content": r}]
            messages.append({"role": "user", "content": user})
            return chat_template.render_prompt(self.template, messages, self.bos_token,
                                               self.eos_token)
        prefix, suffix = self.chat_prompt
        return "".join(prefix + u + suffix + r + self.eos_token for u, r in turns) + (
            prefix + user + suffix)

    def prompt_ids(self, text: str) -> list[int]:
        """The ids the `generate` signature decodes from: [EOS] + ids of `text` (plain
        model), or the ids of the rendered `text` (chat model; already templated)."""
        ids = self._encode(tf.constant([text]))[0].numpy().tolist()
        return ids if self.chat_prompt is not None else [self.eos_id, *ids]

    def _fit(self, user: str, err: TextIO | None) -> list[int]:
        """Prompt ids for `user` after the history, dropping the oldest turns to fit."""
        room = self.context - self.sampling.max_new_tokens
        dropped = 0
        ids = self.prompt_ids(self._text(self.turns, user))
        while len(ids) > room and dropped < len(self.turns):
            dropped += 1
            ids = self.prompt_ids(self._text(self.turns[dropped:], user))
        if dropped:
            self.turns = self.turns[dropped:]
            _note(err, f"[dropped the {dropped} oldest turn(s): the prompt + max_new_tokens "
                       f"{self.sampling.max_new_tokens} must fit the context of {self.context} "
                       "tokens]")
        if len(ids) > room:
            _note(err, f"[prompt cropped to its last {room} tokens]")
            ids = ids[-room:]
        return ids

    # -- decoding -------------------------------------------------------------------
    def _step_fn(self, ids, cache, index, temperature, top_k, top_p, seed, step):
        """Runs ids (1, T) at positions index.. on the cache; -> (the next token, int32
        scalar, chosen from the last position; the new cache, as `init_cache(1, S)`)."""
        logits, cache = self.model.call_with_cache(ids, cache, index,
                                                   in_place=True)  # (1, T, V)
        token = next_token(logits[:, -1], temperature, top_k, top_p, seed, step)  # (1,)
        return token[0], cache

    def stream_ids(self, prompt: list[int]) -> Iterator[int]:
        """Yields the new tokens after `prompt` one by one, until [EOS] (not yielded) or
        max_new_tokens. len(prompt) + max_new_tokens must be <= the session's context.

        The cache keeps its longest prefix shared with `prompt` from the previous call;
        `_cached` always names exactly the ids whose keys and values it holds.
        """
        s = self.sampling
        shared = 0
        for a, b in zip(self._cached, prompt[:-1], strict=False):  # >= 1 token to run
            if a != b:
                break
            shared += 1
        if self._cache is None or (shared < len(self._cached)
                                   and getattr(self.model, "bounded_cache", False)):
            self._cache = self.model.init_cache(1, self.context)  # a bounded cache can't rewind
            self._cached, shared = [], 0
        pending, index = prompt[shared:], shared
        chunk = self._chunk
        while len(pending) > chunk:  # a long prompt: chunks through the cache
            if self._stop:
                return
            self._cached = self._cached[:index]
            self._cache = self._extend(tf.constant([pending[:chunk]], tf.int32), self._cache,
                                       tf.constant(index, tf.int32))
            self._cached = self._cached + pending[:chunk]
            index, pending = index + chunk, pending[chunk:]
        knobs = (tf.constant(s.temperature, tf.float32), tf.constant(s.top_k, tf.int32),
                 tf.constant(s.top_p, tf.float32), tf.constant(s.seed, tf.int32))
        for made in range(s.max_new_tokens):
            if self._stop:  # Ctrl-C: the cache holds exactly `_cached`
                return
            self._cached = self._cached[:index]  # about to be overwritten from `index`
            token, self._cache = self._step(tf.constant([pending], tf.int32), self._cache,
                                            tf.constant(index, tf.int32), *knobs,
                                            tf.constant(self.steps, tf.int32))
            self._cached = self._cached + pending
            self.steps += 1
            token = int(token)
            if token == self.eos_id:
                return
            yield token
            if made + 1 == s.max_new_tokens:
                return
            index, pending = index + len(pending), [token]

    def reply(self, line: str, out: TextIO, err: TextIO | None = None) -> str:
        """Answers one line: writes the reply to `out` as tokens come (flushed per
        piece) and returns it; the turn joins the history.

        Ctrl-C (SIGINT, or a KeyboardInterrupt raised inside) stops the reply at any
        point: what was written is kept as the reply, `[reply stopped]` goes to `err`.
        A turn the chat template refuses (`ChatTemplateError`) is reported on `err` in
        one line, returns "" and is not added to the history.
        """
        if self.chat_prompt is None:  # plain: the line continues the running text
            history = "".join(u + r for u, r in self.turns)
            user = "\n" + line if line and history and not history.endswith("\n") else line
        else:
            user = line
        self._stop = False
        decoder, pieces = StreamDecoder(self.surfaces), []
        with self._sigint_stops_the_reply():
            try:
                prompt = self._fit(user, err)
                for token in self.stream_ids(prompt):
                    piece = decoder.push(token)
                    if piece:
                        out.write(piece)
                        out.flush()
                        pieces.append(piece)  # printed: part of the reply
                    if self._stop:
                        break
            except chat_template.ChatTemplateError as e:
                _note(err, f"[not answered: {e}]", newline_first=bool(pieces))
                return ""
            except KeyboardInterrupt:  # raised inside (not through `_on_sigint`)
                self._forget_cache()  # it may hold a half-written step
                self._stop = True
            stopped, self._stop = self._stop, False
            if stopped:
                _note(err, "[reply stopped]", newline_first=True)
            tail = decoder.finish()
            if tail:
                pieces.append(tail)
                out.write(tail)
            out.flush()
            text = "".join(pieces)
            self.turns.append((user, text))
            return text

    # -- the loop -------------------------------------------------------------------
    def run(self, stdin: TextIO, out: TextIO, err: TextIO | None = None,
            interactive: bool = False, banner: str = "") -> int:
        """Reads lines from `stdin` and answers each on `out` (the reply, then a newline)
        until /exit or the end of input; /reset clears the history. Ctrl-C stops a reply
        and keeps the session; at the prompt it drops the line, twice in a row it leaves.

        Args:
          interactive: a person at a terminal: a banner and a `>>> ` prompt.
          banner: the first line shown when interactive.

        Returns:
          0 (/exit or end of input), or 130 (two Ctrl-C in a row at the prompt).
        """
        if interactive:
            out.write((banner + "\n" if banner else "") +
                      f"{RESET} clears the history, {EXIT} or Ctrl-D leaves, Ctrl-C stops a "
                      "reply\n")
        interrupts = 0  # Ctrl-C at the prompt since the last line
        with self._sigint_stops_the_reply():
            while True:
                try:
                    self._at_prompt = True
                    line = _read_line(stdin, out, interactive)
                    self._at_prompt = False
                except KeyboardInterrupt:
                    self._at_prompt = False
                    interrupts += 1
                    out.write("\n")
                    out.flush()
                    if interrupts > 1:
                        return 130
                    _note(err, f"[line dropped; Ctrl-C again, {EXIT} or Ctrl-D leaves]")
                    continue
                interrupts = 0
                if not line:  # end of input (Ctrl-D)
                    if interactive:
                        out.write("\n")
                        out.flush()
                    return 0
                line = line.rstrip("\r\n")
                command = line.strip()
                if command == EXIT:
                    return 0
                if command == RESET:
                    self.reset()
                    _note(err, "[history cleared]")
                    continue
                if self.chat_prompt is not None and not command:
                    continue  # a chat model answers something
                self.reply(line, out, err)
                out.write("\n")
                out.flush()


def _read_line(stdin: TextIO, out: TextIO, interactive: bool) -> str:
    """The next line with its newline, "" at the end of input. A person at this process's
    own terminal gets `input()` with line editing (readline), after a `>>> ` prompt."""
    if not interactive:
        return stdin.readline()
    if stdin is sys.stdin and out is sys.stdout:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
        try:
            return input(">>> ") + "\n"
        except EOFError:
            return ""
    out.write(">>> ")
    out.flush()
    return stdin.readline()


def _note(err: TextIO | None, message: str, newline_first: bool = False) -> None:
    if err is not None:
        err.write(("\n" if newline_first else "") + message + "\n")
        err.flush()
