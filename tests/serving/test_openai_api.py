"""The OpenAI-compatible endpoints (`serving/openai_api.py`) answer the `openai` client:
completions with `echo` and `logprobs` (equal to a log_softmax of the `logits` signature
on the same ids), the log-likelihood form (`max_tokens: 0`), stop sequences, chat
completions, a streamed Chinese reply in whole characters, and errors in OpenAI's shape.

Subject: one tiny chat model (one dense block, no MTP, 64 positions; a 300-token
vocabulary learned from a few English and Chinese units, so most Chinese characters are
split into byte tokens; DeepSeek's chat template in its tokenizer_config.json), exported by
`save_text_model` with the template's affixes and served by a `ModelServer` behind
`fastapi.FastAPI()` + `make_openai_router`, by uvicorn in a background thread on a free
loopback port (module-scoped: tracing and loading take most of this file's time). The
real `openai` client talks HTTP to it, with retries off so a 503 shows as one.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest
import tensorflow as tf
from tiny_text_model import openai_app, save_tiny_text_model

# Slow tier: the module's fixture exports a tiny chat SavedModel (about 30 s on 2 cores).
pytestmark = pytest.mark.slow

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "ROMEO": 6, ":": 9, "\n": 30, "你好": 6, "世界": 5, "。": 10, "，": 20, "明月": 4}
VOCAB, CONTEXT, NEW = 300, 64, 8  # tokenizer size = vocab_size; max_position_embeddings
NAME = "tiny-chat"
POEM = "床前明月光，疑是地上霜。举头望明月，低头思故乡。"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny chat SavedModel (`save_text_model` with DeepSeek's template's affixes)."""
    from tokenization import chat_template
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    template = chat_template.DEFAULT_CHAT_TEMPLATE
    tokenizer = ByteLevelBpe(learn(UNITS, VOCAB).json,
                             tokenizer_config={"chat_template": template})
    assert len(tokenizer.surfaces()) == VOCAB
    affixes = chat_template.prompt_affixes(template, *chat_template.special_tokens(tokenizer))
    return save_tiny_text_model(tmp_path_factory.mktemp("openai") / "saved", tokenizer,
                                context=CONTEXT, max_new_tokens=NEW, vocab_size=VOCAB, seed=3,
                                chat_prompt=affixes)


@pytest.fixture(scope="module")
def served(chat_model):
    """(base URL, ModelServer) of the router under uvicorn on a free loopback port."""
    from config import ServeConfig
    from serving.server import ModelServer

    server = ModelServer(str(chat_model), NAME, ServeConfig(max_batch_size=4,
                                                            batch_timeout_micros=1000))
    with openai_app(server, NAME) as url:
        yield url, server


@pytest.fixture(scope="module")
def client(served):
    import openai

    return openai.OpenAI(base_url=served[0], api_key="x", max_retries=0, timeout=120)


def _tokenize(server, text: str) -> list[int]:
    out = server.signatures["tokenize"](text=tf.constant([text]))
    return out["input_ids"][0, :int(out["lengths"][0])].numpy().tolist()


def _log_softmax(server, ids: list[int]) -> np.ndarray:
    """float64 [T, V]: the logits signature on `ids`, called directly."""
    logits = server.signatures["logits"](input_ids=tf.constant([ids], tf.int32))["logits"]
    x = logits[0].numpy().astype(np.float64)
    return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(
        -1, keepdims=True)


def _eos(server) -> int:
    from savedmodel.layout import read_tokenizer

    return read_tokenizer(server.path).eos_id


def test_models_lists_the_model(client):
    models = client.models.list().data
    assert [(m.id, m.object, m.owned_by) for m in models] == [(NAME, "model", "deepseek-tfx")]
    assert models[0].created > 1_600_000_000


def test_echo_and_logprobs_equal_a_log_softmax_of_the_logits(client, served):
    server = served[1]
    prompt = "the quick brown fox 你好"
    r = client.completions.create(model=NAME, prompt=prompt, max_tokens=5, echo=True,
                                  logprobs=3, temperature=0.8, seed=7)
    choice = r.choices[0]
    assert choice.text.startswith(prompt) and r.object == "text_completion"
    assert r.model == NAME and choice.finish_reason in ("stop", "length")
    prompt_ids = _tokenize(server, prompt)
    completion_ids = _tokenize(server, choice.text[len(prompt):])
    if choice.finish_reason == "stop":  # the model ended it: [EOS] is its last token
        completion_ids.append(_eos(server))
    ids = [_eos(server), *prompt_ids, *completion_ids]  # what the model saw: [EOS] first
    lp = _log_softmax(server, ids)
    lps = choice.logprobs
    assert len(lps.tokens) == len(prompt_ids) + len(completion_ids)
    assert lps.token_logprobs[0] is None and lps.top_logprobs[0] is None  # as OpenAI
    expected = [lp[t - 1, ids[t]] for t in range(2, len(ids))]
    np.testing.assert_allclose(lps.token_logprobs[1:], expected, atol=1e-5)
    assert all(v <= 0 for v in lps.token_logprobs[1:])
    for t, top in enumerate(lps.top_logprobs[1:], start=2):  # the 3 most likely
        assert 1 <= len(top) <= 3  # fewer when two ids share a token string
        assert max(top.values()) == pytest.approx(lp[t - 1].max(), abs=1e-5)
    # each whole token's text is in the text at its offset; offsets never go back
    assert lps.text_offset[0] == 0 and lps.text_offset == sorted(lps.text_offset)
    whole = [(o, t) for o, t in zip(lps.text_offset, lps.tokens, strict=True)
             if not t.startswith("bytes:")]
    assert whole and all(choice.text[o:o + len(t)] == t for o, t in whole)
    # usage: [EOS] + prompt tokens; the completion tokens that were generated
    assert r.usage.prompt_tokens == 1 + len(prompt_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_max_tokens_0_with_echo_scores_the_prompt(client, served):
    """lm-evaluation-harness's log-likelihood request: the prompt's logprobs, nothing
    generated; their sum is the log-probability of the prompt after its first token."""
    server = served[1]
    prompt = "ROMEO: the quick brown fox。"
    r = client.completions.create(model=NAME, prompt=[prompt, "你好世界"], max_tokens=0,
                                  echo=True, logprobs=1)
    assert [c.text for c in r.choices] == [prompt, "你好世界"]
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.completion_tokens == 0
    ids = [_eos(server), *_tokenize(server, prompt)]
    lp = _log_softmax(server, ids)
    values = r.choices[0].logprobs.token_logprobs
    assert len(values) == len(ids) - 1 and values[0] is None
    total = sum(lp[t - 1, ids[t]] for t in range(2, len(ids)))
    assert sum(values[1:]) == pytest.approx(total, abs=1e-4)
    assert -sum(values[1:]) / (len(values) - 1) > 0  # a mean negative log-likelihood
    # token ids in: scored on exactly those ids
    by_ids = client.completions.create(model=NAME, prompt=ids[1:], max_tokens=0, echo=True,
                                       logprobs=0)
    np.testing.assert_allclose(by_ids.choices[0].logprobs.token_logprobs[1:], values[1:],
                               atol=1e-9)


def test_the_text_is_cut_at_the_first_stop_sequence(client):
    kwargs = dict(model=NAME, prompt="the", max_tokens=20, temperature=1.0, seed=11)
    full = client.completions.create(**kwargs).choices[0].text
    assert len(full) >= 2, f"the model generated too little to test stops: {full!r}"
    stop = full[1:3]  # occurs at 1 (or earlier)
    # six stops, more than OpenAI's 4: lm-evaluation-harness sends a task's whole `until`
    never = ["never seen ⊥", "⊥⊥", "⊤⊤", "∅∅", "⊥⊤"]
    cut = client.completions.create(**kwargs, stop=[stop, *never]).choices[0]
    assert cut.text == full[:full.find(stop)] and cut.finish_reason == "stop"


def test_a_chat_completion_answers_in_the_template(client, served):
    from savedmodel.layout import read_tokenizer
    from tokenization import chat_template

    server = served[1]
    messages = [{"role": "user", "content": "你好"}, {"role": "assistant", "content": "世界。"},
                {"role": "user", "content": "the quick brown fox"}]
    r = client.chat.completions.create(model=NAME, messages=messages, max_tokens=6,
                                       temperature=0.7, seed=3, logprobs=True, top_logprobs=2)
    choice = r.choices[0]
    assert r.object == "chat.completion" and choice.message.role == "assistant"
    assert r.usage.completion_tokens <= 6
    tokenizer = read_tokenizer(server.path)
    rendered = chat_template.render_prompt(chat_template.DEFAULT_CHAT_TEMPLATE, messages,
                                           *chat_template.special_tokens(tokenizer))
    context = _tokenize(server, rendered)
    assert r.usage.prompt_tokens == len(context)  # the rendered ids, no [EOS] before
    reply_ids = _tokenize(server, choice.message.content)
    lp = _log_softmax(server, context + reply_ids)
    got = [c.logprob for c in choice.logprobs.content]
    expected = [lp[len(context) + i - 1, t] for i, t in enumerate(reply_ids)]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert all(len(c.top_logprobs) == 2 for c in choice.logprobs.content)
    # the same single user turn through `generate` (the model's own wrapping)
    single = client.chat.completions.create(model=NAME, messages=[messages[0]], max_tokens=6,
                                            temperature=0.7, seed=3)
    out = server.signatures["generate"](
        prompt=tf.constant(["你好"]), max_new_tokens=tf.constant([6]),
        temperature=tf.constant([0.7]), top_k=tf.constant([0]), top_p=tf.constant([1.0]),
        seed=tf.constant([3]))
    assert single.choices[0].message.content == out["completion"][0].numpy().decode()


def test_a_streamed_chinese_reply_is_whole_characters(client):
    messages = [{"role": "system", "content": "中文。"}, {"role": "user", "content": "明月"}]
    kwargs = dict(model=NAME, messages=messages, max_tokens=24, temperature=1.0, seed=5)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(**kwargs, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and
              c.choices[0].delta.content]
    assert "".join(pieces) == whole
    assert len(pieces) > 1 and any(ord(ch) > 0x2E80 for ch in whole), whole
    assert all("\ufffd" not in p for p in pieces) or "\ufffd" in whole
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].usage is not None and chunks[-1].choices == []


def test_pieces_never_split_a_character(served):
    """Every Chinese character of the poem is split into byte tokens by this tokenizer;
    the pieces carry each character whole, in the piece of its last byte."""
    from savedmodel.layout import read_tokenizer
    from serving.openai_model import token_pieces

    server = served[1]
    surfaces = read_tokenizer(server.path).surfaces()
    ids = _tokenize(server, POEM)
    split = [s for s in (surfaces[i] for i in ids) if s.decode("utf-8", "replace") != s.decode(
        "utf-8", "ignore") or "\ufffd" in s.decode("utf-8", "replace")]
    assert split, "the tokenizer keeps every character whole: the test would not test"
    pieces = token_pieces([surfaces[i] for i in ids])
    assert "".join(pieces) == POEM and len(pieces) == len(ids)
    assert all(p.encode("utf-8").decode("utf-8") == p and "\ufffd" not in p for p in pieces)


# ----------------------------------------------------------------------------- errors


def _post(served, path: str, body) -> httpx.Response:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(served[0] + path, content=raw, timeout=60,
                      headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("body, param, words", [
    ({"model": NAME, "prompt": "x", "max_tokens": 2**32 + 8}, "max_tokens", "2147483647"),
    ({"model": NAME, "prompt": "x", "max_tokens": True}, "max_tokens", "integer"),
    ({"model": NAME, "prompt": "x", "temperature": "1"}, "temperature", "number"),
    ({"model": NAME, "prompt": "x", "temperature": 3}, "temperature", "2"),
    ({"model": NAME, "prompt": "x", "top_p": 0}, "top_p", "greater than 0"),
    ({"model": NAME, "prompt": "x", "n": 129}, "n", "[1, 128]"),
    ({"model": NAME, "prompt": "x", "n": 33}, "n", "decode slots"),
    ({"model": NAME, "prompt": "x", "logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ({"model": NAME, "prompt": "x", "logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ({"model": NAME, "prompt": "x", "logprobs": 6}, "logprobs", "5"),
    ({"model": NAME, "prompt": "x", "stop": [str(i) for i in range(33)]}, "stop", "at most 32"),
    ({"model": NAME, "prompt": "x", "stop": ["a" * 1025]}, "stop", "1024 characters"),
    ({"model": NAME, "prompt": "x", "seed": 2**31}, "seed", "2147483647"),
    ({"model": NAME, "prompt": "x", "frobnicate": 1}, "frobnicate", "unknown field"),
    ({"model": NAME, "prompt": [[1, 2], "x"]}, "prompt", "token ids"),
    ({"model": NAME, "prompt": [VOCAB + 5]}, "prompt", "vocab_size"),
    ({"model": NAME}, "prompt", "required"),
    ({"model": NAME, "prompt": "x", "max_tokens": CONTEXT}, "max_tokens", "at most"),
])
def test_bad_completion_params_are_400_naming_the_param(served, body, param, words):
    r = _post(served, "/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"] and "\n" not in error["message"]


@pytest.mark.parametrize("body, param, words", [
    ({"model": NAME, "messages": []}, "messages", "at least 1"),
    ({"model": NAME, "messages": [{"role": "function", "content": "x"}]}, "messages[0].role",
     "system"),
    ({"model": NAME, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role",
     "tool messages"),
    ({"model": NAME, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content", "text"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x", "extra": 1}]},
     "messages[0].extra", "unknown field"),
    ({"model": NAME, "messages": [{"role": "assistant", "content": "x"}]}, "messages",
     "assistant"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}], "tools": [
        {"type": "function", "function": {"name": "f"}}]}, "tools", "renders none"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}],
      "thinking": {"type": "enabled"}}, "thinking", "no thinking mode"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}],
      "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
     "response_format.json_schema.schema", "schema"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}, {
        "role": "assistant", "content": "y", "prefix": True}, {"role": "user", "content": "z"}]},
     "messages[1].prefix", "last message"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}], "stream": True,
      "logprobs": True}, "logprobs", "stream"),
    ({"model": NAME, "messages": [{"role": "user", "content": "x"}],
      "max_completion_tokens": CONTEXT}, "max_tokens", "at most"),
])
def test_bad_chat_params_are_400_naming_the_param(served, body, param, words):
    r = _post(served, "/chat/completions", body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert words in error["message"], error["message"]


def test_an_unknown_model_is_404_and_bad_json_400(served, client):
    import openai

    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"
    for raw in (b"{", b"[" * 100_000, b'{"model": "tiny-chat", "prompt": "x", '
                b'"temperature": Infinity}', b"[]"):
        r = _post(served, "/completions", raw)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_ignored_openai_fields_are_accepted(client):
    r = client.completions.create(model=NAME, prompt="the", max_tokens=1, temperature=0,
                                  user="u1", extra_body={"store": False, "metadata": {"a": "b"}})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_prompt_may_fill_the_context_when_only_scored(client, served):
    ids = (_tokenize(served[1], "the quick brown fox jumps over " * 20))[:CONTEXT - 1]
    assert len(ids) == CONTEXT - 1  # + [EOS] = the whole context
    r = client.completions.create(model=NAME, prompt=ids, max_tokens=0, echo=True, logprobs=0)
    assert len(r.choices[0].logprobs.token_logprobs) == CONTEXT - 1
    for max_tokens, prompt, param in ((1, ids, "prompt"), (0, ids + ids[:1], "prompt")):
        body = {"model": NAME, "prompt": prompt, "max_tokens": max_tokens, "echo": True}
        r = _post(served, "/completions", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_harness_request_may_fill_the_context(client, served):
    """echo, max_tokens 1, temperature 0 on a prompt that fills the context (the harness's
    log-likelihood request at max_length = the context): the prompt is scored as with
    max_tokens 0 and the one token is the last position's argmax; 2 tokens do not fit."""
    server = served[1]
    ids = (_tokenize(server, "the quick brown fox jumps over " * 20))[:CONTEXT - 1]
    scored = client.completions.create(model=NAME, prompt=ids, max_tokens=0, echo=True,
                                       logprobs=1).choices[0].logprobs
    r = client.completions.create(model=NAME, prompt=ids, max_tokens=1, temperature=0,
                                  echo=True, logprobs=1).choices[0].logprobs
    assert len(r.token_logprobs) == CONTEXT  # the prompt's CONTEXT - 1 tokens and one more
    assert r.token_logprobs[0] is None
    assert r.token_logprobs[1:-1] == pytest.approx(scored.token_logprobs[1:], abs=1e-6)
    lp = _log_softmax(server, [_eos(server), *ids])
    assert r.token_logprobs[-1] == pytest.approx(lp[-1].max(), abs=1e-5)
    body = {"model": NAME, "prompt": ids, "max_tokens": 2, "temperature": 0, "echo": True}
    assert _post(served, "/completions", body).status_code == 400


def test_prompts_scored_together_equal_prompts_scored_alone(client, served):
    """The prompts of one request go through `logits` in batched calls, right-padded: each
    choice's logprobs and greedy token are those of the prompt sent alone, and the greedy
    token is what `generate` picks."""
    server = served[1]
    prompts = [_tokenize(server, t) for t in ("the quick brown fox", "床前明月光，疑是",
                                              "ROMEO:", "the")]
    together = client.completions.create(model=NAME, prompt=prompts, max_tokens=1,
                                         temperature=0, echo=True, logprobs=2).choices
    for prompt, choice in zip(prompts, together, strict=True):
        alone = client.completions.create(model=NAME, prompt=prompt, max_tokens=1,
                                          temperature=0, echo=True, logprobs=2).choices[0]
        assert choice.text == alone.text and choice.logprobs.tokens == alone.logprobs.tokens
        assert choice.logprobs.token_logprobs[1:] == pytest.approx(
            alone.logprobs.token_logprobs[1:], abs=1e-5)
        generated = client.completions.create(model=NAME, prompt=prompt, max_tokens=2,
                                              temperature=0).choices[0].text
        first = choice.text[len(_decode_ids(server, prompt)):]  # echo: prompt + token
        if "\ufffd" not in first:  # a byte token of a character is U+FFFD as text
            assert generated.startswith(first), (first, generated)


def _decode_ids(server, ids) -> str:
    from serving.openai_model import decode_ids, text_of

    return decode_ids(text_of(server), ids)


class _Stub:
    """A ModelServer's surface over the real one, with `run` of generate signatures or of
    every signature replaced (`generate`, `everything`: functions of (name, inputs, rows))."""

    def __init__(self, real, name, generate=None, everything=None, **changes):
        for key in ("path", "signatures", "context", "vocab_size", "default_max_new_tokens",
                    "has_tokenizer", "chat_prompt"):
            setattr(self, key, changes.get(key, getattr(real, key)))
        self.name, self._real, self._generate, self._everything = name, real, generate, everything

    def run(self, name, inputs, rows):
        if self._everything:
            return self._everything(name, inputs, rows)
        if self._generate and name.startswith("generate"):
            return self._generate(name, inputs, rows)
        return self._real.run(name, inputs, rows)


@pytest.fixture(scope="module")
def stubbed(served):
    """A TestClient of a router over three stubs of the served model: `plain` (no chat
    template), `busy` (every call: a full batch queue), `ends` (generate returns "the"
    and says 3 tokens were generated of 5 asked: the model ended with [EOS])."""
    import fastapi
    from fastapi.testclient import TestClient

    from serving.batcher import Unavailable
    from serving.openai_api import StaticModels, make_openai_router

    real = served[1]

    def full(name, inputs, rows):
        raise Unavailable("the batch queue is full (512 rows queued)")

    def ends(name, inputs, rows):
        return {"completion": np.array([b"the"] * rows, object),
                "num_generated": np.full([rows], 3, np.int32)}

    app = fastapi.FastAPI()
    app.include_router(make_openai_router(StaticModels({
        "plain": _Stub(real, "plain", chat_prompt=None),
        "busy": _Stub(real, "busy", everything=full),
        "ends": _Stub(real, "ends", generate=ends)})))
    return TestClient(app)


def test_a_plain_language_model_has_no_chat(stubbed):
    r = stubbed.post("/v1/chat/completions", json={
        "model": "plain", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    assert "/v1/completions" in r.json()["error"]["message"]


def test_a_full_queue_is_503(stubbed):
    r = stubbed.post("/v1/completions", json={"model": "busy", "prompt": "x"})
    assert r.status_code == 503
    assert r.json()["error"]["type"] == "server_error" and "queue" in r.json()["error"]["message"]


def test_a_completion_ended_by_eos_lists_it_last(stubbed, served):
    """As OpenAI lists <|endoftext|>: [EOS] is the last token, not in the text."""
    server = served[1]
    r = stubbed.post("/v1/completions", json={"model": "ends", "prompt": "ROMEO:",
                                               "max_tokens": 5, "logprobs": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == "the" and choice["finish_reason"] == "stop"
    lps = choice["logprobs"]
    eos = _eos(server)
    ids = [eos, *_tokenize(server, "ROMEO:"), *_tokenize(server, "the"), eos]
    lp = _log_softmax(server, ids)
    n = len(lps["tokens"])
    assert n == len(_tokenize(server, "the")) + 1
    assert lps["tokens"][-1] == _eos_text(server)
    np.testing.assert_allclose(lps["token_logprobs"],
                               [lp[t - 1, ids[t]] for t in range(len(ids) - n, len(ids))],
                               atol=1e-5)
    assert lps["text_offset"][0] == len("ROMEO:")  # offsets count the prompt's characters


def _eos_text(server) -> str:
    from savedmodel.layout import read_tokenizer

    return read_tokenizer(server.path).eos_token


def test_lm_eval_loglikelihood_requests_get_one_completion_token(client, served):
    """lm-evaluation-harness's local-completions request: token-id prompts, max_tokens 1,
    temperature 0, echo, logprobs 1; it reads token_logprobs[ctxlen:-1], so each choice
    must list the prompt's tokens and exactly one more: the greedy one, also when it is a
    byte token of a character (its text alone is U+FFFD, which tokenizes to 3 tokens)."""
    server = served[1]
    texts = ["明", "月光", "床前", "地上霜", "举头", "望明月", "低头", "思故乡", "你好", "世界。",
             "the", "ROMEO:"]
    byte_tokens = 0
    for start in range(0, len(texts), 4):
        prompts = [_tokenize(server, t) for t in texts[start:start + 4]]
        r = client.completions.create(model=NAME, prompt=prompts, max_tokens=1, temperature=0,
                                      echo=True, logprobs=1, seed=1234)
        for prompt, choice in zip(prompts, r.choices, strict=True):
            lps = choice.logprobs
            assert len(lps.token_logprobs) == len(prompt) + 1, (prompt, lps.tokens)
            last, top = lps.token_logprobs[-1], lps.top_logprobs[-1]
            assert last == pytest.approx(max(top.values()), abs=1e-9)  # greedy
            ids = [_eos(server), *prompt]
            lp = _log_softmax(server, ids)
            assert last == pytest.approx(lp[-1].max(), abs=1e-5)
            byte_tokens += lps.tokens[-1].startswith("bytes:")
    assert byte_tokens, "no greedy byte token among the prompts: the re-derivation is untested"


def test_a_streamed_completion_joins_to_the_completion(client):
    kwargs = dict(model=NAME, prompt="你好", max_tokens=12, temperature=1.0, seed=9)
    whole = client.completions.create(**kwargs).choices[0]
    chunks = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.text
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason


def test_too_many_prompts_are_400_naming_prompt(served):
    r = _post(served, "/completions", {"model": NAME, "prompt": ["a"] * 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    assert "max_batch_size=4" in r.json()["error"]["message"]


def test_a_token_id_prompt_generates_as_its_text(client, served):
    ids = _tokenize(served[1], "ROMEO: 你好")
    kwargs = dict(model=NAME, max_tokens=6, temperature=1.0, seed=21)
    by_ids = client.completions.create(prompt=ids, **kwargs).choices[0].text
    assert by_ids == client.completions.create(prompt="ROMEO: 你好", **kwargs).choices[0].text


# ----------------------------------------------------------------------------- the context


def test_a_prompt_longer_than_the_context_is_400_context_length_exceeded(served):
    """The prompt alone over the 64 positions: OpenAI's `context_length_exceeded`, naming the
    prompt (completions) or the messages (chat), the tokens counted and the limit; a prompt
    that fits with a max_tokens that does not names max_tokens, with the same code."""
    server = served[1]
    long = POEM * 4
    prefix, suffix = server.chat_prompt
    cases = [
        ("/completions", {"model": NAME, "prompt": long, "max_tokens": 4}, "prompt",
         f"the prompt takes {1 + len(_tokenize(server, long))} tokens"),
        ("/chat/completions", {"model": NAME, "messages": [{"role": "user", "content": long}]},
         "messages", f"the messages take {len(_tokenize(server, prefix + long + suffix))} tokens"),
        ("/completions", {"model": NAME, "prompt": "the", "max_tokens": CONTEXT}, "max_tokens",
         f"max_tokens={CONTEXT} must be at most"),
    ]
    for path, body, param, words in cases:
        r = _post(served, path, body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error == {"message": error["message"], "type": "invalid_request_error",
                         "param": param, "code": "context_length_exceeded"}
        assert words in error["message"] and "\n" not in error["message"], error["message"]
        assert (f"{CONTEXT}-token context (max_position_embeddings) of model '{NAME}'"
                in error["message"])


def test_cli_generate_takes_a_prompt_file_byte_for_byte(chat_model, served, tmp_path, capsys):
    """`deepseek-tfx generate --prompt-file` on this model: the file's bytes are the prompt
    (its tokens decode to them), the tokens are counted on stderr, and a file too long for
    the context is refused in one line naming the count, the limit and the model."""
    import cli

    server, poem = served[1], "床前明月光，疑是地上霜。"
    (tmp_path / "静夜思.txt").write_bytes(poem.encode("utf-8"))
    args = ["generate", "--model", str(chat_model), "--max-new-tokens", "4", "--temperature",
            "0", "--log-dir", str(tmp_path / "logs")]
    assert cli.main([*args, "--prompt-file", str(tmp_path / "静夜思.txt")]) == 0
    out = capsys.readouterr()
    ids = _tokenize(server, poem)
    decoded = server.signatures["detokenize"](input_ids=tf.constant([ids]))["text"][0]
    assert decoded.numpy() == poem.encode("utf-8")  # the tokens are the file's bytes
    assert out.out.startswith(poem)  # `text`: the prompt as given + the completion
    assert f"prompt: {len(ids)} tokens ({tmp_path / '静夜思.txt'}, 36 bytes)" in out.err
    (tmp_path / "long.txt").write_bytes((POEM * 4).encode("utf-8"))
    with pytest.raises(SystemExit) as e:
        cli.main([*args, "--prompt-file", str(tmp_path / "long.txt")])
    message = str(e.value.code)
    assert message.startswith(f"error: generate: the prompt is {len(_tokenize(server, POEM * 4))} "
                              "tokens (") and "\n" not in message
    assert f"over the {CONTEXT}-position context (max_position_embeddings) of the model " \
           f"{chat_model}" in message


# ----------------------------------------------------------------------------- the engine


def test_a_stream_sends_tokens_as_they_are_made(served):
    engine = served[1].engine
    body = {"model": NAME, "prompt": "the", "max_tokens": 40, "seed": 4, "stream": True,
            "logit_bias": {str(_eos(served[1])): -100}}  # no early [EOS]: 40 tokens
    running_at_first, pieces = None, []
    with httpx.stream("POST", served[0] + "/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                if choice["text"] and running_at_first is None:
                    running_at_first = engine.stats()["running"]
                pieces.append(choice["text"])
    assert running_at_first == 1  # the first piece came while the reply was being made
    whole = _post(served, "/completions", {**body, "stream": False}).json()
    assert "".join(pieces) == whole["choices"][0]["text"]
    assert whole["usage"]["completion_tokens"] == 40


def test_a_client_that_disconnects_frees_its_slot(served):
    engine = served[1].engine
    body = {"model": NAME, "prompt": "the", "max_tokens": 60, "seed": 5, "stream": True,
            "logit_bias": {str(_eos(served[1])): -100}}
    with httpx.stream("POST", served[0] + "/completions", json=body, timeout=60) as r:
        next(line for line in r.iter_lines() if line.startswith('data: {"'))
        steps = engine.stats()["steps"]
    for _ in range(200):  # the server sees the disconnect, then the engine's next call
        if engine.stats()["running"] == 0:
            break
        time.sleep(0.02)
    assert engine.stats()["running"] == 0
    assert engine.stats()["steps"] - steps < 50  # cancelled, not run to its 60 tokens


def test_n_choices_and_logit_bias(client, served):
    kwargs = dict(model=NAME, prompt="the quick", max_tokens=6, seed=9)
    three = client.completions.create(**kwargs, n=3)
    assert [c.index for c in three.choices] == [0, 1, 2]
    alone = [client.completions.create(**{**kwargs, "seed": 9 + j}).choices[0].text
             for j in range(3)]
    assert [c.text for c in three.choices] == alone  # choice j samples with seed + j
    forced = client.completions.create(model=NAME, prompt="the", max_tokens=5, temperature=0,
                                       logit_bias={"40": 100})
    assert forced.usage.completion_tokens == 5
    assert forced.choices[0].text == _decode_ids(served[1], [40] * 5)

