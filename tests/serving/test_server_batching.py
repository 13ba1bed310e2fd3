"""`serve` validates requests before any work and batches concurrent ones: fewer model
calls, each request its own answer, a failing request alone in its failure.

Three subjects: a tiny language model (`save_text_model` with a learned tokenizer;
context 64, vocab 512; its `generate` takes scalar sampling inputs, one set per call,
as exported today), a small SavedModel whose `generate` and `generate_raw` take every
input per prompt (the newer export's form), echo them and count one token per byte,
with a chat template's affixes, and the `Batcher` itself with a Python function in
place of a model. The language model is built and served once (tracing and loading
its signatures take most of this file's time).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import tensorflow as tf
from tiny_text_model import save_tiny_text_model

from config import ServeConfig
from serving.batcher import Batcher, Unavailable
from serving.http_app import make_app, serving_in_thread
from serving.load_test import post_json
from serving.server import ModelServer

# Slow tier: the module's fixture exports a tiny text SavedModel (about 25 s on 2 cores).
pytestmark = pytest.mark.slow

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "\n\n": 10}
PROMPTS = ["the", "the quick", "", "fox", " brown fox", "the the the", "quick", "\n\nthe"]
CONTEXT, VOCAB, DEFAULT_NEW = 64, 512, 8  # max_position_embeddings, vocab_size, max_new_tokens


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """A tiny plain language model with its text signatures."""
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    return save_tiny_text_model(tmp_path_factory.mktemp("text_model") / "saved",
                                ByteLevelBpe(learn(UNITS, 300).json), context=CONTEXT,
                                max_new_tokens=DEFAULT_NEW, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def served(text_model):
    """(predict URL, ModelServer): 8 rows per call, a 300 ms window to gather them."""
    with _serving(text_model, max_batch_size=8, batch_timeout_micros=300_000,
                  num_batch_threads=1) as served:
        yield served


class _PerRowModule(tf.Module):
    """`generate` with every input per prompt; echoes them and the rows of its call."""

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.string, name="prompt"),
        tf.TensorSpec([None], tf.int32, name="max_new_tokens"),
        tf.TensorSpec([None], tf.float32, name="temperature"),
        tf.TensorSpec([None], tf.int32, name="top_k"),
        tf.TensorSpec([None], tf.float32, name="top_p"),
        tf.TensorSpec([None], tf.int32, name="seed")])
    def generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        tf.debugging.Assert(tf.reduce_all(tf.not_equal(prompt, "boom")), ["a prompt is boom"])
        echo = tf.strings.join([prompt, tf.strings.as_string(max_new_tokens),
                                tf.strings.as_string(temperature, precision=1),
                                tf.strings.as_string(top_k), tf.strings.as_string(seed)],
                               separator="|")
        return {"text": echo, "rows": tf.fill(tf.shape(prompt), tf.shape(prompt)[0])}

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def tokenize(self, text):  # one token per byte
        lengths = tf.strings.length(text)
        return {"input_ids": tf.zeros([tf.size(text), tf.reduce_max(lengths)], tf.int32),
                "lengths": lengths}


@pytest.fixture(scope="module")
def per_row_model(tmp_path_factory):
    """The per-prompt `generate` above (also as `generate_raw`), context 16
    (assets.extra/config.json), a chat template "<U>" + prompt + "<A>" (chat_prompt.json)."""
    out = tmp_path_factory.mktemp("per_row") / "saved"
    module = _PerRowModule()
    tf.saved_model.save(module, str(out), signatures={
        "generate": module.generate, "generate_raw": module.generate,
        "tokenize": module.tokenize})
    (out / "assets.extra").mkdir()
    (out / "assets.extra" / "config.json").write_text(
        json.dumps({"max_position_embeddings": 16, "vocab_size": 32}))
    (out / "assets.extra" / "chat_prompt.json").write_text(
        json.dumps({"prefix": "<U>", "suffix": "<A>"}))
    return out


@contextlib.contextmanager
def _serving(model_dir, **serve):
    """(predict URL, ModelServer) of `model_dir` served by uvicorn from a thread."""
    config = ServeConfig(**serve)
    server = ModelServer(str(model_dir), serve=config)
    try:
        with serving_in_thread(make_app(server), config) as port:
            yield f"http://127.0.0.1:{port}/v1/models/deepseek:predict", server
    finally:
        server.close()


def _generate(prompt: str, max_new_tokens: int = 6, signature: str = "generate",
              **sampling) -> dict:
    """One instance: valid for scalar and per-prompt sampling inputs alike (greedy)."""
    return {"signature_name": signature, "instances": [{
        "prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": 0.0, "top_k": 0,
        "top_p": 1.0, "seed": 0, **sampling}]}


def _concurrently(url: str, bodies: list) -> list[tuple[int, dict]]:
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(lambda b: post_json(url, b), bodies))


def _tokens(server, text: str) -> int:
    return int(server.signatures["tokenize"](text=tf.constant([text]))["lengths"][0])


# ----------------------------------------------------------------------------- validation

BAD_REQUESTS = [  # (body, the 400's message)
    # [EOS] 'the' ' quick' = 3 tokens, so 61 of the 64 positions are left
    (_generate("the quick", 100_000_000),
     r"^max_new_tokens=100000000 must be in \[1, 61\]: the prompt is 3 tokens "
     r"\(with the \[EOS\] separator first\) of the 64-token context \(max_position_embeddings\)"),
    (_generate("the quick", 0), r"^max_new_tokens=0 must be in \[1, 61\]"),
    (_generate("the quick", temperature=-1), r"^temperature=-1.0 must be >= 0 \(0 = greedy\)$"),
    (_generate("the quick", top_k=-5), r"^top_k=-5 must be >= 0 \(0 = no top-k filter\)$"),
    (_generate("the quick", top_p=7), r"^top_p=7.0 must be in \(0, 1\]"),
    (_generate("the quick", top_p=0), r"^top_p=0.0 must be in \(0, 1\]"),
    ({"instances": ["the"] * 1000},
     r"^a request may have at most max_batch_size=8 rows \(prompts\); this one has 1000"),
    ({"signature_name": "logits", "inputs": {"input_ids": [[5, 512, 6]]}},
     r"^input_ids must be in \[0, 512\) \(vocab_size\); input_ids\[0, 1\] = 512$"),
    ({"signature_name": "detokenize", "instances": [[3, 4], [-1, 2]]},
     r"^input_ids must be in \[0, 512\) \(vocab_size\); input_ids\[1, 0\] = -1$"),
    # [EOS] + 60 ' the' = 61 tokens
    (_generate(" the" * 60, 4), r"^max_new_tokens=4 must be in \[1, 3\]: the prompt is 61 tokens"),
    # serving_default: 61 + its default 8 new tokens are over 64
    ({"instances": [" the" * 60]},
     r"^prompt is 61 tokens \(with the \[EOS\] separator first\); serving_default generates "
     r"max_new_tokens=8 \(the model's generation defaults\), so the prompt may have at most 56 "
     r"tokens of the 64-token context"),
    ({"signature_name": "generate", "instances": [{
        "prompt": " the" * 70, "max_new_tokens": 4, "temperature": 0.0, "top_k": 0,
        "top_p": 1.0, "seed": 0}]},
     r"^prompt is 71 tokens \(with the \[EOS\] separator first\); with max_new_tokens=4 it "
     r"may have at most 60 tokens of the 64-token context"),
]


def test_bad_requests_get_an_immediate_400_naming_the_field_and_range(served):
    url, server = served
    calls = server.stats()["calls"]
    start = time.perf_counter()
    for body, message in BAD_REQUESTS:
        code, out = post_json(url, body)
        assert code == 400 and re.search(message, out["error"]), (body, code, out)
    assert time.perf_counter() - start < 10  # before: 13.6 s for max_new_tokens alone
    assert server.stats()["calls"] == calls  # refused before the model ran
    code, out = post_json(url, _generate("the quick"))
    assert code == 200 and out["predictions"][0]["text"].startswith("the quick")


def test_max_new_tokens_may_fill_the_context_left_after_the_prompt(served):
    url, server = served
    # [EOS] 'the' ' quick' = 3 tokens, so 61 of the 64 positions are left.
    assert _tokens(server, "the quick") == 2
    code, out = post_json(url, _generate("the quick", 61))
    assert code == 200 and out["predictions"][0]["num_generated"] <= 61
    code, out = post_json(url, _generate("the quick", 62))
    assert code == 400 and out["error"].startswith("max_new_tokens=62 must be in [1, 61]")


# ----------------------------------------------------------------------------- batching


def test_concurrent_requests_share_calls_and_each_gets_its_own_answer(served):
    url, server = served
    before = server.stats()
    alone = [post_json(url, _generate(p)) for p in PROMPTS]
    assert [code for code, _ in alone] == [200] * 8
    after_alone = server.stats()
    assert after_alone["calls"] - before["calls"] == 8

    together = _concurrently(url, [_generate(p) for p in PROMPTS])  # inside one 300 ms window
    stats = server.stats()
    assert stats["requests"] - after_alone["requests"] == 8
    assert stats["calls"] - after_alone["calls"] < 8 and stats["max_rows"] > 1
    assert together == alone  # greedy: the same text as alone, row for row

    # max_new_tokens 4 and 5: as scalar inputs they are part of the batching key (two
    # calls at least); per prompt they share the bucket 4-7 (one call). Either way each
    # answer is again the one it gets alone.
    bodies = [_generate(p, 4 + i % 2) for i, p in enumerate(PROMPTS)]
    mixed = _concurrently(url, bodies)
    spec = server.signatures["generate"].structured_input_signature[1]["max_new_tokens"]
    calls = server.stats()["calls"] - stats["calls"]
    assert calls >= 2 if spec.shape.rank == 0 else calls == 1
    assert mixed == [post_json(url, b) for b in bodies]
    assert all(out["predictions"][0]["num_generated"] <= 4 + i % 2
               for i, (_, out) in enumerate(mixed))


# ----------------------------------------------------------------------------- per-prompt inputs


def test_per_prompt_inputs_come_from_each_instance_or_are_repeated(per_row_model):
    with _serving(per_row_model, batch_timeout_micros=0) as (url, _):
        code, out = post_json(url, {"signature_name": "generate", "instances": [
            {"prompt": "a", "max_new_tokens": 2, "temperature": 0.5, "top_k": 3, "top_p": 1.0,
             "seed": 7},
            {"prompt": "b", "max_new_tokens": 4, "temperature": 0.0, "top_k": 0, "top_p": 0.5,
             "seed": 8}]})
        assert code == 200
        assert [p["text"] for p in out["predictions"]] == ["a|2|0.5|3|7", "b|4|0.0|0|8"]
        # columnar: one value given for a per-prompt input is every prompt's
        code, out = post_json(url, {"signature_name": "generate", "inputs": {
            "prompt": ["a", "b"], "max_new_tokens": 3, "temperature": 1.0, "top_k": [1, 2],
            "top_p": 1.0, "seed": 0}})
        assert code == 200 and out["outputs"]["text"] == ["a|3|1.0|1|0", "b|3|1.0|2|0"]
        # each prompt is checked with its own values
        code, out = post_json(url, {"signature_name": "generate", "instances": [
            {"prompt": "a", "max_new_tokens": 2, "temperature": 0.5, "top_k": 3, "top_p": 1.0,
             "seed": 0},
            {"prompt": "b", "max_new_tokens": 2, "temperature": 0.5, "top_k": 3, "top_p": 2.0,
             "seed": 0}]})
        assert code == 400 and out["error"] == (
            "top_p=2.0 must be in (0, 1] (1 = no nucleus filter) (prompt 1)")
        code, out = post_json(url, {"signature_name": "generate", "inputs": {
            "prompt": ["a", "b"], "max_new_tokens": [1, 2, 3], "temperature": 1.0, "top_k": 0,
            "top_p": 1.0, "seed": 0}})
        assert code == 400 and "different numbers of rows" in out["error"]


def test_a_chat_models_prompt_is_counted_inside_its_template(per_row_model):
    with _serving(per_row_model, batch_timeout_micros=0) as (url, _):
        # generate: "<U>abc<A>" = 9 of the 16 positions, 7 left
        assert post_json(url, _generate("abc", 7))[0] == 200
        code, out = post_json(url, _generate("abc", 8))
        assert code == 400 and out["error"] == (
            "max_new_tokens=8 must be in [1, 7]: the prompt is 9 tokens (in the chat template) "
            "of the 16-token context (max_position_embeddings)")
        # generate_raw: [EOS] "abc" = 4 positions, 12 left
        assert post_json(url, _generate("abc", 12, "generate_raw"))[0] == 200
        code, out = post_json(url, _generate("abc", 13, "generate_raw"))
        assert code == 400 and out["error"].startswith(
            "max_new_tokens=13 must be in [1, 12]: the prompt is 4 tokens (with the [EOS] "
            "separator first)")


def test_max_new_tokens_buckets_batch_apart(per_row_model):
    # 2 and 3 share a power-of-two bucket; 8 (bucket 8-15) gets a call of its own.
    with _serving(per_row_model, batch_timeout_micros=300_000) as (url, _):
        answers = _concurrently(url, [_generate("a", 2), _generate("b", 3), _generate("c", 8)])
    assert [code for code, _ in answers] == [200] * 3
    assert [out["predictions"][0]["rows"] for _, out in answers] == [2, 2, 1]


def test_one_failing_request_does_not_fail_its_batch_mates(per_row_model):
    with _serving(per_row_model, max_batch_size=4, batch_timeout_micros=300_000) as (url, server):
        warm = server.stats()  # the warm-up's calls
        answers = _concurrently(url, [_generate(p) for p in ("a", "boom", "c", "d")])
        assert [code for code, _ in answers] == [200, 400, 200, 200]
        assert answers[1][1]["error"] == "the model rejected the inputs: assertion failed: " \
            "[a prompt is boom]"
        assert [out["predictions"][0]["text"] for _, out in answers if "predictions" in out] == [
            "a|6|0.0|0|0", "c|6|0.0|0|0", "d|6|0.0|0|0"]
        # one batch of 4 failed; then each ran alone
        stats = server.stats()
        assert {k: stats[k] - warm[k] for k in ("requests", "calls", "rows", "retried_batches",
                                                "refused")} == {
            "requests": 4, "calls": 5, "rows": 8, "retried_batches": 1, "refused": 0}
        assert stats["max_rows"] == 4


# ----------------------------------------------------------------------------- the Batcher


class _Calls:
    """A stand-in model: records (signature, rows) per call; `hold` blocks signature 'slow'."""

    def __init__(self):
        self.log: list[tuple[str, int]] = []
        self.hold = threading.Event()

    def __call__(self, name, inputs):
        self.log.append((name, len(inputs["x"])))
        if name == "slow":
            assert self.hold.wait(10)
        if -1 in inputs["x"]:
            raise RuntimeError("x = -1 breaks the model")
        return {"y": inputs["x"] * 10}


def _submit(batcher, name, *xs):
    import numpy as np

    return batcher.submit((name,), {"x": np.array(xs)}, len(xs))


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_batcher_retries_a_failed_batch_request_by_request():
    calls = _Calls()
    batcher = Batcher(calls, ServeConfig(max_batch_size=4, batch_timeout_micros=1_000_000))
    try:  # 4 rows fill a batch: it runs at once, not after the second's timeout
        futures = [_submit(batcher, "f", 1), _submit(batcher, "f", 2, -1), _submit(batcher, "f", 3)]
        assert futures[0].result(5)["y"].tolist() == [10]
        with pytest.raises(RuntimeError, match="x = -1 breaks the model"):
            futures[1].result(5)
        assert futures[2].result(5)["y"].tolist() == [30]
        assert calls.log == [("f", 4), ("f", 1), ("f", 2), ("f", 1)]
        assert batcher.stats()["retried_batches"] == 1
    finally:
        batcher.close()


def test_batcher_serves_keys_oldest_first_and_a_slow_call_holds_one_thread_and_key():
    calls = _Calls()
    batcher = Batcher(calls, ServeConfig(max_batch_size=4, batch_timeout_micros=0,
                                         num_batch_threads=2))
    try:
        slow = _submit(batcher, "slow", 0)
        _wait_for(lambda: calls.log == [("slow", 1)])
        # The other thread serves other keys while `slow` runs; more 'slow' requests
        # gather until its call ends (a partial batch never runs beside its own key).
        later = [_submit(batcher, "slow", 1), _submit(batcher, "slow", 2)]
        assert _submit(batcher, "fast", 1).result(5)["y"].tolist() == [10]
        assert not slow.done() and calls.log == [("slow", 1), ("fast", 1)]
        calls.hold.set()
        assert [f.result(5)["y"].tolist() for f in [slow, *later]] == [[0], [10], [20]]
        assert calls.log == [("slow", 1), ("fast", 1), ("slow", 2)]
    finally:
        batcher.close()

    calls = _Calls()
    batcher = Batcher(calls, ServeConfig(max_batch_size=4, batch_timeout_micros=0,
                                         num_batch_threads=1, max_enqueued_batches=2))
    try:
        first = _submit(batcher, "slow", 0)
        _wait_for(lambda: calls.log == [("slow", 1)])
        queued = [_submit(batcher, "b", i) for i in range(1, 6)] + [_submit(batcher, "slow", 9)]
        with pytest.raises(Unavailable, match=r"queue is full \(6 rows waiting; "
                                              r"max_enqueued_batches=2 x max_batch_size=4\)"):
            _submit(batcher, "b", 6, 7, 8)  # 6 + 3 > 2 x 4 rows
        calls.hold.set()
        assert [f.result(5)["y"].tolist() for f in [first, *queued]] == [
            [0], [10], [20], [30], [40], [50], [90]]
        # 'b' (oldest waiting) first, split at 4 rows, its rest before the later 'slow'
        assert calls.log == [("slow", 1), ("b", 4), ("b", 1), ("slow", 1)]
        assert batcher.stats()["refused"] == 1
    finally:
        batcher.close()


# ----------------------------------------------------------------------------- readiness


def test_loading_until_warmed_up_then_available(per_row_model):
    config = ServeConfig(batch_timeout_micros=0, max_batch_size=4)
    server = ModelServer(str(per_row_model), serve=config, warm=False)
    try:
        with serving_in_thread(make_app(server), config) as port:
            base = f"http://127.0.0.1:{port}/v1/models/deepseek"
            with urllib.request.urlopen(base) as response:
                assert json.loads(response.read())["model_version_status"][0]["state"] == (
                    "LOADING")
            try:
                urllib.request.urlopen(urllib.request.Request(
                    base + ":predict", data=json.dumps(_generate("a")).encode()))
                raise AssertionError("predict answered while LOADING")
            except urllib.error.HTTPError as e:
                assert e.code == 503 and e.headers["Retry-After"] == "1"
                assert "is LOADING (warming up)" in json.loads(e.read())["error"]
            done = server.warm_up()
            # generate and generate_raw at 1, 2, 4 rows; tokenize at 1, 2, 4
            assert done["requests"] == 9 and done["failed"] == 0
            assert server.batcher.stats()["rows"] == 3 * (1 + 2 + 4)
            assert server.stats()["rows"] == 0  # what serve prints leaves warm-up out
            with urllib.request.urlopen(base) as response:
                assert json.loads(response.read())["model_version_status"][0]["state"] == (
                    "AVAILABLE")
            assert post_json(base + ":predict", _generate("a"))[0] == 200
            assert server.stats()["requests"] == 1
    finally:
        server.close()


def test_an_engine_only_warm_up_of_a_model_without_an_engine_warms_its_signatures(
        per_row_model):
    """`warm_up(signatures=False)` (`serve --warm-up engine`) on a SavedModel without the
    engine's functions: its signatures are its only way to serve, so they are warmed."""
    server = ModelServer(str(per_row_model), serve=ServeConfig(batch_timeout_micros=0,
                                                               max_batch_size=4), warm=False)
    try:
        assert server.engine is None
        done = server.warm_up(signatures=False)
        # generate and generate_raw at 1, 2, 4 rows; tokenize at 1, 2, 4
        assert done["requests"] == 9 and done["failed"] == 0 and done["signatures"]
        assert server.ready and server.batcher.stats()["rows"] == 3 * (1 + 2 + 4)
    finally:
        server.close()
