"""The serving engine (`serving/engine.py`) on tiny V3 and V4 SavedModels: the tokens of the
`generate` signature (greedy, and sampled for a seed) for requests that join and leave a
running batch, stop strings that stop generation, cancels that free a slot within one
step, a short request that overtakes long ones, logit_bias and a token bitmask applied in
the graph, and the waiting queue's limit."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import tensorflow as tf
from tiny_text_model import tiny_causal_lm

# Slow tier: the module exports a tiny V3 and a tiny V4 SavedModel (~30 s together).
pytestmark = pytest.mark.slow

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "你好": 6, "世界": 5, "。": 10, "，": 20, "明月": 4, "\n": 30}
VOCAB, CONTEXT = 300, 160
PROMPTS = ["the", "the quick brown fox jumps over the", "床前明月光，疑是地上霜。"]
NEW = [12, 5, 70]  # the third needs > 64 positions: the running rows' cache grows


def _export(out, family: str):
    from config import GenerationConfig
    from savedmodel.export import save_text_model
    from tokenization.tokenizer import learn

    model = tiny_causal_lm(family, VOCAB, CONTEXT, seed=7,
                           num_hidden_layers=2 if family == "v3" else None)
    save_text_model(model, learn(UNITS, VOCAB), GenerationConfig(), str(out))
    return out


@pytest.fixture(scope="module", params=["v3", "v4"])
def saved(request, tmp_path_factory):
    """(the loaded SavedModel, its tokenizer, its context) of a tiny V3 or V4 model."""
    from savedmodel.layout import read_model_config, read_tokenizer

    out = _export(tmp_path_factory.mktemp(request.param) / "saved", request.param)
    return (tf.saved_model.load(str(out)), read_tokenizer(str(out)),
            read_model_config(str(out)).max_position_embeddings)


@pytest.fixture()
def engine(saved):
    from serving.engine import Engine

    module, tokenizer, context = saved
    e = Engine(module, tokenizer.surfaces(), tokenizer.eos_id, context, slots=4,
               max_waiting=8, vocab_size=VOCAB)
    yield e
    e.close()


class Collector:
    """A request's sink: its text pieces and its `Finished`."""

    def __init__(self):
        self.pieces, self.finished, self.done = [], None, threading.Event()
        self.first = threading.Event()

    def __call__(self, event):
        from serving.engine import Finished

        if isinstance(event, Finished):
            self.finished = event
            self.done.set()
        else:
            self.pieces.append(event.text)
            self.first.set()

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def wait(self):
        assert self.done.wait(120), "the engine did not finish the request"
        return self


def _ids(module, tokenizer, prompt: str) -> list[int]:
    """What `generate` reads: [EOS] + the tokenize signature's ids."""
    out = module.signatures["tokenize"](text=tf.constant([prompt]))
    return [tokenizer.eos_id, *out["input_ids"][0, :int(out["lengths"][0])].numpy().tolist()]


def _generate(module, knobs: dict, prompts=PROMPTS, new=NEW) -> dict:
    out = module.signatures["generate"](
        prompt=tf.constant(prompts), max_new_tokens=tf.constant(new, tf.int32),
        temperature=tf.constant(knobs["temperature"], tf.float32),
        top_k=tf.constant(knobs["top_k"], tf.int32),
        top_p=tf.constant(knobs["top_p"], tf.float32), seed=tf.constant(knobs["seed"], tf.int32))
    return {"text": [c.decode("utf-8", "replace") for c in out["completion"].numpy()],
            "n": out["num_generated"].numpy().tolist()}


@pytest.mark.parametrize("knobs", [
    dict(temperature=[0.0] * 3, top_k=[0] * 3, top_p=[1.0] * 3, seed=[0] * 3),
    dict(temperature=[1.0, 0.7, 1.3], top_k=[0, 20, 0], top_p=[1.0, 1.0, 0.8], seed=[5, 6, 7]),
], ids=["greedy", "sampled"])
def test_tokens_equal_the_generate_signature_as_rows_join_and_leave(saved, engine, knobs):
    from serving.engine import Request, Sampling

    module, tokenizer, _ = saved
    expected = _generate(module, knobs)
    sinks = [Collector() for _ in PROMPTS]
    for b, prompt in enumerate(PROMPTS):  # each joins the running batch after a token
        engine.submit(Request(_ids(module, tokenizer, prompt), NEW[b], Sampling(
            knobs["temperature"][b], knobs["top_k"][b], knobs["top_p"][b], knobs["seed"][b]),
            sinks[b]))
        sinks[b].first.wait(60)
    assert engine.stats()["cache_len"] == 128  # grown from 64 when the third joined
    for b, sink in enumerate(sinks):
        sink.wait()
        assert sink.text == expected["text"][b], b
        assert sink.finished.completion_tokens == expected["n"][b]
        assert sink.finished.reason == ("length" if expected["n"][b] == NEW[b] else "stop")
    assert engine.stats()["running"] == 0 and engine.stats()["cache_len"] == 0


def test_a_stop_string_stops_generation(saved, engine):
    from serving.engine import Request, Sampling

    module, tokenizer, _ = saved
    knobs = dict(temperature=[1.0], top_k=[0], top_p=[1.0], seed=[11])
    whole = _generate(module, knobs, PROMPTS[:1], [40])["text"][0]
    stop = next(c for c in whole[3:] if c.strip())  # a character the reply makes later
    cut = whole.index(stop)
    sink = Collector()
    engine.submit(Request(_ids(module, tokenizer, PROMPTS[0]), 40, Sampling(1.0, 0, 1.0, 11),
                          sink, stop=[stop]))
    sink.wait()
    assert sink.text == whole[:cut] and sink.finished.reason == "stop"
    # generation ended at the token that completed the stop string
    tokens = sink.finished.token_ids
    text_before = b"".join(tokenizer.surfaces()[t] for t in tokens[:-1]).decode("utf-8", "replace")
    assert stop not in text_before and len(tokens) < 40


def test_a_cancel_frees_the_slot_within_one_step(saved, engine):
    from serving.engine import Request, Sampling

    module, tokenizer, context = saved
    sink = Collector()
    request = engine.submit(Request(_ids(module, tokenizer, "the"), context - 4,
                                    Sampling(1.0, seed=1), sink))
    assert sink.first.wait(60)
    calls = engine.stats()["calls"]
    request.cancel()
    sink.wait()
    assert sink.finished.reason == "cancelled"
    assert engine.stats()["calls"] <= calls + 1 and engine.stats()["running"] == 0


def test_a_short_request_overtakes_long_ones(saved, engine):
    from serving.engine import Request, Sampling

    module, tokenizer, context = saved
    ids = _ids(module, tokenizer, "the quick")
    longs = [Collector(), Collector()]
    for i, sink in enumerate(longs):
        engine.submit(Request(ids, context - len(ids), Sampling(1.0, seed=i), sink,
                              stop_at_eos=False))
    longs[1].first.wait(60)
    short = Collector()
    engine.submit(Request(ids, 3, Sampling(1.0, seed=9), short, stop_at_eos=False))
    short.wait()
    assert short.finished.completion_tokens == 3
    assert not any(sink.done.is_set() for sink in longs)  # it did not wait for them
    for sink in longs:
        sink.wait()
        assert sink.finished.completion_tokens == context - len(ids)


class OneToken:
    """A grammar `Constraint` that allows one token, always."""

    def __init__(self, token: int, words: int):
        self.token, self.words, self.seen = token, words, []

    def fill_mask(self, out):
        out[:] = 0
        out[self.token // 32] = np.int32(np.uint32(1 << (self.token % 32)).view(np.int32))

    def advance(self, token):
        self.seen.append(token)

    def done(self):
        return False


@pytest.mark.parametrize("token", [37, 31, VOCAB - 1])
def test_a_bitmask_and_logit_bias_steer_tokens_in_the_graph(saved, engine, token):
    from serving.engine import Request, Sampling

    module, tokenizer, _ = saved
    ids = _ids(module, tokenizer, "the")
    forced, biased, free = Collector(), Collector(), Collector()
    constraint = OneToken(token, engine.mask_words)
    engine.submit(Request(ids, 6, Sampling(1.0, seed=3), forced, constraint=constraint,
                          stop_at_eos=False))
    engine.submit(Request(ids, 6, Sampling(0.0, logit_bias={token: 100.0}), biased,
                          stop_at_eos=False))
    engine.submit(Request(ids, 6, Sampling(1.0, seed=3), free, stop_at_eos=False))
    for sink in (forced, biased, free):
        sink.wait()
    assert forced.finished.token_ids == [token] * 6 == constraint.seen
    assert biased.finished.token_ids == [token] * 6
    assert free.finished.token_ids != [token] * 6  # the mask was that row's only


def test_the_waiting_queue_is_bounded(saved):
    from serving.engine import Engine, EngineOverloaded, Request, Sampling

    module, tokenizer, context = saved
    engine = Engine(module, tokenizer.surfaces(), tokenizer.eos_id, context, slots=1,
                    max_waiting=1, vocab_size=VOCAB)
    try:
        ids = _ids(module, tokenizer, "the")
        first = Collector()
        engine.submit(Request(ids, context - len(ids), Sampling(1.0), first, stop_at_eos=False))
        first.first.wait(60)  # running: the slot is taken
        engine.submit(Request(ids, 2, Sampling(1.0), Collector()))  # waits
        with pytest.raises(EngineOverloaded, match="waiting"):
            engine.submit(Request(ids, 2, Sampling(1.0), Collector()))
        with pytest.raises(ValueError, match="exceeds"):
            engine.submit(Request(ids, context, Sampling(1.0), Collector()))
    finally:
        engine.close()
