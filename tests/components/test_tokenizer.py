"""The learned byte-level BPE: deterministic, lossless, and as compact as BpeTrainer.

Compression is held-out UTF-8 bytes per token: learned on the first 90% of a
corpus, measured on the last 10%, at a vocabulary of 8,192. The reference is
Hugging Face `tokenizers`' BpeTrainer given the same documents whole, with the same
settings (DeepSeek-V3's pre-tokenizer): the pipeline counts units in Beam instead
of handing the trainer the text, and must lose nothing by it.
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf

from tokenization import tokenizer
from tokenization.byte_pair_encoder import BytePairEncoder
from tokenization.pre_tokenizer import DEEPSEEK_V3_PRE_TOKENIZER, PreTokenizer

PRE = PreTokenizer(DEEPSEEK_V3_PRE_TOKENIZER)


def unit_counts(docs: list[str]) -> dict:
    counts: dict = {}
    for start in range(0, len(docs), 512):
        flat = tokenizer.units(tf.constant(docs[start:start + 512]), PRE).flat_values
        for u in flat.numpy().tolist():
            counts[u] = counts.get(u, 0) + 1
    return counts


def trainer_on_documents(docs: list[str], vocab_size: int):
    """BpeTrainer given the documents whole (the reference)."""
    import tokenizers
    from tokenizers import pre_tokenizers, trainers

    spec = tokenizer.learn({"a": 1}, 300)  # any learned tokenizer.json as the template
    empty = json.loads(json.dumps(spec.json))
    empty["model"]["vocab"], empty["model"]["merges"], empty["added_tokens"] = {}, [], []
    model = tokenizers.Tokenizer.from_str(json.dumps(empty))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=list(tokenizer.SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    model.train_from_iterator(docs, trainer)
    return model


def bytes_per_token(spec, texts: list[str]) -> float:
    encoder = BytePairEncoder(spec.pre_tokenizer_config, spec.added_tokens, spec)
    tokens = sum(int(tf.size(encoder.encode(tf.constant(texts[i:i + 256])).flat_values))
                 for i in range(0, len(texts), 256))
    return sum(len(t.encode("utf-8")) for t in texts) / tokens


def split_90_10(docs: list[str]) -> tuple[list[str], list[str]]:
    cut = len(docs) * 9 // 10
    return docs[:cut], docs[cut:]


@pytest.fixture(scope="module")
def shakespeare_docs(shakespeare) -> list[str]:
    return [d for d in shakespeare.split("\n\n") if d]


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_compression_at_8k_on_tiny_shakespeare(shakespeare_docs):
    train, held_out = split_90_10(shakespeare_docs)
    spec = tokenizer.learn(unit_counts(train), 8192)
    assert spec.vocab_size == 8192
    ours = bytes_per_token(spec, held_out)
    reference = trainer_on_documents(train, 8192)
    ref_tokens = sum(len(e.ids) for e in reference.encode_batch(held_out,
                                                                add_special_tokens=False))
    ref = sum(len(t.encode()) for t in held_out) / ref_tokens
    print(f"Tiny Shakespeare held-out bytes/token at 8,192: {ours:.3f} (BpeTrainer on the "
          f"documents: {ref:.3f})")
    assert ours >= 3.45
    assert ours >= ref * 0.97


def test_compression_on_chinese_matches_bpe_trainer(chinese_poems):
    train, held_out = split_90_10(chinese_poems)
    spec = tokenizer.learn(unit_counts(train), 8192)
    ours = bytes_per_token(spec, held_out)
    reference = trainer_on_documents(train, 8192)
    ref_tokens = sum(len(e.ids) for e in reference.encode_batch(held_out,
                                                                add_special_tokens=False))
    ref = sum(len(t.encode()) for t in held_out) / ref_tokens
    print(f"Tang/Song poems held-out bytes/token at 8,192: {ours:.3f} (BpeTrainer: {ref:.3f})")
    assert ours >= ref * 0.97


def test_learning_is_deterministic(shakespeare_docs, chinese_poems):
    docs = shakespeare_docs[:2000] + chinese_poems[:100]
    counts = unit_counts(docs)
    first = tokenizer.learn(counts, 3000).to_json_string()
    # Same counts in another order, twice more: the same file, byte for byte.
    for reverse in (True, False):
        again = tokenizer.learn(dict(sorted(counts.items(), reverse=reverse)), 3000)
        assert again.to_json_string() == first


def test_round_trip_of_text_never_seen(shakespeare_docs):
    """Learned on English alone: every script, emoji and control character survives."""
    spec = tokenizer.learn(unit_counts(shakespeare_docs[:1500]), 1000)
    encoder = BytePairEncoder(spec.pre_tokenizer_config, spec.added_tokens, spec,
                              spec.surfaces())
    texts = ["Ünïcödé naïve café — “quotes” 😀 emoji; Ελληνικά; русский текст; 日本語のテキスト",
             "你好，世界", "\x00\x01\t\r\n \u3000 👨‍👩‍👧‍👦", ""]
    decoded = encoder.decode(encoder.encode(tf.constant(texts))).numpy()
    assert [d.decode("utf-8") for d in decoded] == texts


def test_learned_added_tokens_are_deepseeks_first_three(shakespeare_docs):
    spec = tokenizer.learn(unit_counts(shakespeare_docs[:500]), 600)
    assert [(t.content, t.id, t.special) for t in spec.added_tokens] == [
        (t, i, True) for i, t in enumerate(tokenizer.SPECIAL_TOKENS)]
    assert (spec.eos_id, spec.pad_id) == (tokenizer.EOS_ID, tokenizer.PAD_ID)
    with pytest.raises(ValueError, match="no text"):
        tokenizer.learn({}, 600)
    with pytest.raises(ValueError, match="256 byte tokens"):
        tokenizer.learn({"a": 1}, 200)
