"""`deepseek-tfx generate --prompt-file PATH`: the whole file, byte for byte, is one prompt;
`--prompt` and `--prompt-file` exclude each other; a bad file and a prompt that does not fit
the model's context are refused in one line.

The file errors are refused before TensorFlow is imported. The rest runs `cmd_generate` on a
stand-in for the loaded SavedModel whose `tokenize` gives one token per byte (so the tokens
are the file's bytes) and whose `generate` records the prompt it was given, with a context
of 64 positions: no SavedModel is exported (a real one: tests/serving/test_openai_api.py).
"""

from __future__ import annotations

import os
import stat

import pytest

import cli
from cli import text

POEM = "床前明月光，\r\n疑是地上霜。\n"  # 39 bytes; CRLF and the final newline kept
CONTEXT = 64


def _generate(tmp_path, *args):
    return cli.main(["generate", "--model", str(tmp_path / "model"), "--log-dir",
                     str(tmp_path / "logs"), *map(str, args)])


# ----------------------------------------------------------------------------- arguments


@pytest.mark.parametrize("args, words", [
    (["--prompt", "x", "--prompt-file", "p.txt"], "not allowed with argument"),
    ([], "one of the arguments --prompt --prompt-file is required"),
])
def test_prompt_and_prompt_file_exclude_each_other(capsys, args, words):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["generate", "--model", "m", *args])
    assert e.value.code == 2
    assert words in capsys.readouterr().err


def test_either_one_parses():
    parser = cli.build_parser()
    args = parser.parse_args(["generate", "--model", "m", "--prompt-file", "p.txt"])
    assert (args.prompt, args.prompt_file) == (None, "p.txt")
    args = parser.parse_args(["generate", "--model", "m", "--prompt", "ROMEO:"])
    assert (args.prompt, args.prompt_file) == ("ROMEO:", None)


# ----------------------------------------------------------------------------- the file


def test_the_file_is_read_byte_for_byte(tmp_path):
    path = tmp_path / "静夜思.txt"
    data = "\ufeff".encode() + POEM.encode("utf-8")  # a BOM too: kept, as every byte
    path.write_bytes(data)
    assert text.read_prompt_file(str(path)) == data


def _refusal(tmp_path, path) -> str:
    with pytest.raises(SystemExit) as e:
        _generate(tmp_path, "--prompt-file", path)
    message = str(e.value.code)
    assert message.startswith(f"error: --prompt-file '{path}': ") and "\n" not in message
    return message[len(f"error: --prompt-file '{path}': "):]


def test_a_missing_file_directory_or_fifo_is_refused_by_name(tmp_path):
    assert _refusal(tmp_path, tmp_path / "nope.txt") == "no such file"
    assert _refusal(tmp_path, tmp_path).startswith("is a directory, not a regular file")
    os.mkfifo(tmp_path / "pipe")  # open() would wait for a writer: never opened
    assert _refusal(tmp_path, tmp_path / "pipe") == (
        "is a FIFO (named pipe), not a regular file; refused (nothing was read)")


def test_an_empty_file_is_refused(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    assert _refusal(tmp_path, tmp_path / "empty.txt") == (
        "the file is empty (0 bytes); a prompt needs text")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused(tmp_path):
    path = tmp_path / "secret.txt"
    path.write_text(POEM, encoding="utf-8")
    path.chmod(0)
    try:
        assert _refusal(tmp_path, path) == "cannot be read (Permission denied)"
    finally:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_a_file_that_is_not_utf8_names_the_byte_offset(tmp_path):
    latin1 = "床前 café!".encode().replace("é".encode(), b"\xe9")  # 床前 = 6 bytes, " caf" 4
    (tmp_path / "latin1.txt").write_bytes(latin1)
    assert _refusal(tmp_path, tmp_path / "latin1.txt") == (
        "not UTF-8 (byte 0xe9 at offset 10 of 12: invalid continuation byte); save it as UTF-8")
    cut = POEM.encode()[:4]  # 床 (3 bytes) and the first byte of 前
    (tmp_path / "cut.txt").write_bytes(cut)
    assert _refusal(tmp_path, tmp_path / "cut.txt") == (
        "not UTF-8 (byte 0xe5 at offset 3 of 4: a character cut off at the end of the "
        "file); save it as UTF-8")


# ----------------------------------------------------------------------------- generation


class _Signature:
    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __call__(self, **inputs):
        self.calls.append(inputs)
        return self.fn(**inputs)


@pytest.fixture
def model(tmp_path, monkeypatch):
    """A stand-in for the loaded SavedModel: `tokenize` gives each byte as its token id,
    `generate` answers the prompt + "!"; the model's context is 64 positions."""
    import tensorflow as tf

    def tokenize(text):
        rows = [list(t) for t in text.numpy()]
        width = max(map(len, rows))
        return {"input_ids": tf.constant([r + [0] * (width - len(r)) for r in rows]),
                "lengths": tf.constant([len(r) for r in rows])}

    def generate(prompt, **knobs):
        return {"text": tf.strings.join([prompt, "!"])}

    class Loaded:
        signatures = {"tokenize": _Signature(tokenize), "generate": _Signature(generate)}

    loaded = Loaded()
    monkeypatch.setattr(text, "resolve_model_dir", lambda model: model)
    monkeypatch.setattr(text, "require_text_model", lambda *a: None)
    monkeypatch.setattr(text, "model_context", lambda model_dir: CONTEXT)
    monkeypatch.setattr(tf.saved_model, "load", lambda model_dir: loaded)
    return loaded


def test_the_prompt_file_is_the_prompt_byte_for_byte(tmp_path, model, capsys):
    data = POEM.encode("utf-8")
    (tmp_path / "poem.txt").write_bytes(data)
    assert _generate(tmp_path, "--prompt-file", tmp_path / "poem.txt",
                     "--max-new-tokens", CONTEXT - 1 - len(data)) == 0  # fills the context
    [tokenized] = model.signatures["tokenize"].calls
    assert tokenized["text"].numpy().tolist() == [data]  # the tokens are the file's bytes
    [call] = model.signatures["generate"].calls
    assert call["prompt"].numpy().tolist() == [data]
    out = capsys.readouterr()
    assert out.out.encode("utf-8") == data + b"!\n"
    assert (f"prompt: {len(data)} tokens ({tmp_path / 'poem.txt'}, {len(data)} bytes); "
            f"{len(data) + 1} of the model's {CONTEXT} positions with [EOS] first") in out.err


def test_a_prompt_that_does_not_fit_the_context_is_refused_in_one_line(tmp_path, model):
    data = POEM.encode("utf-8")  # 39 bytes: 40 positions with [EOS]
    (tmp_path / "poem.txt").write_bytes(data)
    with pytest.raises(SystemExit) as e:
        _generate(tmp_path, "--prompt-file", tmp_path / "poem.txt", "--max-new-tokens", 25)
    assert str(e.value.code) == (
        f"error: generate: the prompt is 39 tokens (40 positions with the [EOS] separator "
        f"first); with --max-new-tokens 25 that is 65 positions, over the 64-position context "
        f"(max_position_embeddings) of the model {tmp_path / 'model'}; the prompt may have at "
        "most 38 tokens with --max-new-tokens 25: shorten it or lower --max-new-tokens")
    assert model.signatures["generate"].calls == []  # refused before generating
    with pytest.raises(SystemExit, match=r"the prompt is 80 tokens .* over the 64-position"):
        _generate(tmp_path, "--prompt", "x" * 80, "--max-new-tokens", 1)
