"""The WordPiece tokenizer: lossless round trips and compression on real text."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from components.transform import tokenizer


def _learn(text: str, vocab_size: int) -> list[str]:
    docs = text.split("\n\n")
    return tokenizer.learn_vocabulary(tokenizer.count_pieces(docs), vocab_size)


def _roundtrip(vocab: list[str], texts: list[str], tmp_path) -> tuple[list[str], np.ndarray]:
    path = str(tmp_path / "vocab.txt")
    tokenizer.write_vocabulary(vocab, path)
    wp = tokenizer.make_wordpiece_tokenizer(path)
    ids = tokenizer.encode(tf.constant(texts), wp)
    dense = ids.to_tensor(default_value=tokenizer.PAD_ID)
    decoded = tokenizer.decode_ids(dense, tf.constant(tokenizer.surface_forms(vocab)))
    return [d.decode("utf-8") for d in decoded.numpy()], ids.flat_values.numpy()


def test_pretokenize_is_a_partition():
    text = "Hello,  world!\n\n\tIt's 2024 -- caf\u00e9 \u00fcber\r\nend "
    pieces = tokenizer.pretokenize(tf.constant([text])).flat_values.numpy()
    pieces = [p.decode("utf-8") for p in pieces]
    assert "<ws10>" in pieces and "<ws9>" in pieces and "<ws13>" in pieces
    restored = "".join(
        chr(int(p[3:-1])) if p.startswith("<ws") and p.endswith(">") else p for p in pieces
    )
    assert restored == text
    assert " world" in pieces and " caf\u00e9" in pieces


def test_vocabulary_has_exact_size_and_specials_first(shakespeare):
    vocab = _learn(shakespeare[:200_000], 1000)
    assert len(vocab) == 1000
    assert vocab[:3] == ["[PAD]", "[UNK]", "[EOS]"]
    assert len(set(vocab)) == len(vocab)
    assert all("\n" not in t for t in vocab)


def test_lossless_on_held_out_text(shakespeare, tmp_path):
    vocab = _learn(shakespeare[:300_000], 2000)
    held_out = shakespeare[-20_000:]
    decoded, ids = _roundtrip(vocab, [held_out, "", "  two  spaces\n\n\nand lines"], tmp_path)
    assert decoded[0] == held_out
    assert decoded[1] == ""
    assert decoded[2] == "  two  spaces\n\n\nand lines"
    assert tokenizer.UNK_ID not in ids


def test_unseen_characters_become_unk(shakespeare, tmp_path):
    vocab = _learn(shakespeare[:100_000], 800)
    decoded, ids = _roundtrip(vocab, ["snow \u2603 man"], tmp_path)
    assert tokenizer.UNK_ID in ids
    assert decoded[0] != "snow \u2603 man"


@pytest.mark.slow
def test_compression_at_8k_on_tiny_shakespeare(shakespeare, tmp_path):
    """Issue 2: >= 2.8 bytes per token on held-out text at an 8K vocabulary."""
    cut = 1_003_854
    vocab = _learn(shakespeare[:cut], 8192)
    held_out = shakespeare[cut:]
    decoded, ids = _roundtrip(vocab, [held_out], tmp_path)
    assert decoded[0] == held_out
    bytes_per_token = len(held_out.encode("utf-8")) / len(ids)
    print(f"held-out bytes/token at 8192: {bytes_per_token:.3f}")
    assert bytes_per_token >= 2.8


def test_learn_vocabulary_rejects_empty():
    with pytest.raises(ValueError, match="no text"):
        tokenizer.learn_vocabulary({}, 500)


def test_vocab_too_small_for_alphabet():
    counts = {chr(0x4E00 + i): 5 for i in range(400)}
    with pytest.raises(ValueError, match="too small"):
        tokenizer.learn_vocabulary(counts, 500)


def test_learned_vocabulary_is_deterministic(shakespeare):
    # Without registering the continuation symbols up front, tokenizers'
    # WordPieceTrainer gives a different vocabulary almost every time
    # (huggingface/tokenizers#1794).
    counts = tokenizer.count_pieces(shakespeare[:300_000].split("\n\n"))
    vocabularies = {tuple(tokenizer.learn_vocabulary(counts, 2000)) for _ in range(4)}
    assert len(vocabularies) == 1


def test_unit_counts_give_the_pre_token_counts(shakespeare):
    # Pre-tokens never cross a space except a leading one: counting units cut at
    # spaces and pre-tokenizing each distinct unit gives exactly count_pieces.
    import collections

    docs = shakespeare[:150_000].split("\n\n") + [
        "", " ", "  lead", "trail  ", "a  b", "x\n y", " \n\tz", "caf\u00e9 \u00fcber 12ab ,b",
        "tab\there  \u3000wide\u00a0nbsp", "\r\n \r\n", "!!! ?? 3.14 -- end ",
    ]
    units = tokenizer.split_at_spaces(tf.constant(docs)).flat_values.numpy().tolist()
    got = tokenizer.count_unit_pieces(collections.Counter(units), batch_size=100)
    assert got == tokenizer.count_pieces(docs)
