"""Transform's preprocessing_fn on DPO and GRPO records (issue 29; tf.Transform's Beam
implementation, no TFX): the contract features against Hugging Face `tokenizers`.

DPO:
  input_ids          = encode(prompt) ++ encode(chosen) ++ [eos_id]
  rejected_ids       = encode(prompt) ++ encode(rejected) ++ [eos_id]
  prompt_length      = len(encode(prompt))
  num_bytes          = UTF-8 bytes of chosen;  rejected_num_bytes = of rejected
GRPO: exactly the SFT features, the answer in the response's place (its Transform runs in
tests/e2e/test_preference_e2e.py).
"""

from __future__ import annotations

import json

import pytest
import tensorflow as tf
import tft_runs
from sft_records import shakespeare_pairs

from components.transform import preprocessing as P
from config import get_config
from corpus import documents as D
from tokenization import tokenizer
from tokenization.chat_template import DEFAULT_CHAT_TEMPLATE

# Slow: each run is tf.Transform's Beam pipeline (about 15 s on 2 cores).
pytestmark = pytest.mark.slow


def _read(path, records, config):
    """Writes JSONL records, reads them as `config.data.task` records (none rejected)."""
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    docs = list(D.read_documents(str(path), "r.jsonl", config.data))
    assert not [d.reject_reason for d in docs if d.reject_reason]
    return docs


def _hf(transform_dir):
    import tokenizers

    return tokenizers.Tokenizer.from_file(tokenizer.find_asset(
        transform_dir, tokenizer.TOKENIZER_ASSET_PREFIX))


def _encode(hf, text):
    return hf.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def dpo(shakespeare, chinese_poems, tmp_path_factory):
    """Shakespeare line pairs with the next pair's response as the rejected one, Chinese
    poem lines with a wrong line as the rejected one, and a chat prompt; tokenizer learned."""
    config = get_config("tiny", {"data.task": "dpo", "tokenizer.vocab_size": 600})
    pairs = shakespeare_pairs(shakespeare, 151)
    records = [{"context": a["context"], "chosen": a["response"], "rejected": b["response"]}
               for a, b in zip(pairs, pairs[1:], strict=False)
               if a["response"] != b["response"]]
    for poem in chinese_poems[:20]:
        lines = [x for x in poem.splitlines() if x.strip()]
        records += [{"prompt": a, "chosen": b, "rejected": "不知道。"}  # TRL's prompt key
                    for a, b in zip(lines, lines[1:], strict=False) if b != "不知道。"]
    records.append({"messages": [{"role": "system", "content": "你是诗人。"},
                                 {"role": "user", "content": "静夜思"},
                                 {"role": "assistant", "content": "床前明月光"},
                                 {"role": "user", "content": "下一句？"}],
                    "chosen": "疑是地上霜", "rejected": "举头望明月"})
    temp = tmp_path_factory.mktemp("tft_dpo")
    docs = _read(temp / "r.jsonl", records, config)
    rows, transform_dir = tft_runs.run_transform(
        config, [{P.PROMPT_KEY: d.prompt, P.TEXT_KEY: d.text, P.REJECTED_KEY: d.rejected}
                 for d in docs], temp, desired_batch_size=32)
    return config, docs, rows, transform_dir


def test_dpo_features_are_hugging_face_ids(dpo):
    _, docs, rows, transform_dir = dpo
    hf = _hf(transform_dir)
    expected = []
    for d in docs:
        p = _encode(hf, d.prompt)
        expected.append((p + _encode(hf, d.text) + [tokenizer.EOS_ID],
                         p + _encode(hf, d.rejected) + [tokenizer.EOS_ID], len(p),
                         len(d.text.encode("utf-8")), len(d.rejected.encode("utf-8"))))
    got = [(list(r[P.INPUT_IDS_KEY]), list(r[P.REJECTED_IDS_KEY]), int(r[P.PROMPT_LENGTH_KEY]),
            int(r[P.NUM_BYTES_KEY]), int(r[P.REJECTED_NUM_BYTES_KEY])) for r in rows]
    assert len(rows) == len(docs) > 150
    assert sorted(got) == sorted(expected)
    assert set(rows[0]) == {P.INPUT_IDS_KEY, P.REJECTED_IDS_KEY, P.PROMPT_LENGTH_KEY,
                            P.NUM_BYTES_KEY, P.REJECTED_NUM_BYTES_KEY, P.SOURCE_NAME_KEY}
    for r in rows:
        chosen, rejected = list(r[P.INPUT_IDS_KEY]), list(r[P.REJECTED_IDS_KEY])
        n = int(r[P.PROMPT_LENGTH_KEY])
        assert chosen[:n] == rejected[:n] and chosen[0] == tokenizer.BOS_ID
        assert chosen[-1] == rejected[-1] == tokenizer.EOS_ID
        assert r[P.SOURCE_NAME_KEY] == b"default"
    # The Chinese chat: its bytes are counted as UTF-8 (5 characters, 15 bytes each).
    (chat,) = [r for r in rows if tokenizer.EOS_ID in list(r[P.INPUT_IDS_KEY])[:-1]]
    assert (int(chat[P.NUM_BYTES_KEY]), int(chat[P.REJECTED_NUM_BYTES_KEY])) == (15, 15)


def test_dpo_learns_from_prompts_and_both_responses_and_records_the_template(dpo):
    from tokenization.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer

    config, docs, _, transform_dir = dpo
    with open(tokenizer.find_asset(transform_dir, tokenizer.TOKENIZER_CONFIG_ASSET_PREFIX),
              encoding="utf-8") as f:
        assert json.load(f) == {"chat_template": DEFAULT_CHAT_TEMPLATE}
    stripped = [d.prompt.replace(tokenizer.BOS_TOKEN, "").replace(tokenizer.EOS_TOKEN, "")
                for d in docs]
    texts = stripped + [d.text for d in docs] + [d.rejected for d in docs]
    units = tokenizer.units(tf.constant(texts), PreTokenizer(PRE_TOKENIZERS["deepseek_v3"]))
    counts: dict = {}
    for u in units.flat_values.numpy().tolist():
        counts[u] = counts.get(u, 0) + 1
    expected = tokenizer.learn(counts, config.tokenizer.vocab_size)
    assert tokenizer.load_tokenizer(transform_dir).json == expected.json


@pytest.mark.parametrize("task, inputs, missing", [
    ("dpo", {P.TEXT_KEY: "a", P.PROMPT_KEY: "p"}, "'rejected'"),
    ("dpo", {P.TEXT_KEY: "a"}, "'prompt' or 'rejected'"),
    ("grpo", {P.TEXT_KEY: "a"}, "'prompt'"),
    ("sft", {P.TEXT_KEY: "a"}, "'prompt'"),
    ("pretrain", {P.TEXT_KEY: "a", P.REJECTED_KEY: "b"}, "'prompt'"),
])
def test_examples_without_the_tasks_features_are_refused(task, inputs, missing):
    config = get_config("tiny", {"data.task": task})
    with pytest.raises(ValueError, match=rf"data\.task={task}, but the examples have no "
                                         rf"{missing} feature"):
        P.preprocessing_fn({k: tf.constant([[v]]) for k, v in inputs.items()},
                           {"pipeline_config": config.to_json()})
