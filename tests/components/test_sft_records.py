"""Supervised fine-tuning records: reading (JSONL, CSV, Parquet, every reject reason),
the chat-rendered prompt, and the ExampleGen tf.Example with its `prompt` feature."""

from __future__ import annotations

import json

import pytest
from sft_records import shakespeare_pairs, shakespeare_sft_jsonl

from config import DataConfig
from corpus import documents as D
from tokenization.chat_template import DEFAULT_CHAT_TEMPLATE, ChatFormat

SFT = DataConfig(task="sft")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
CHAT = ChatFormat(DEFAULT_CHAT_TEMPLATE, BOS, EOS)


def _prompt(user: str) -> str:
    return BOS + "User: " + user + "\n\nAssistant: "


def _jsonl(path, records) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)
                              for r in records) + "\n", encoding="utf-8")
    return str(path)


def test_prompt_response_records_and_every_reject_reason(tmp_path):
    records = [
        {"context": "Who art thou?", "response": "A friend.", "metadata": {"id": 7}},  # 0
        {"response": "no prompt"},                                                  # 1
        {"context": "no response"},                                                 # 2
        {"context": "q", "response": "   \n\t"},                                    # 3
        {"context": "  ", "response": "a"},                                         # 4
        {"context": 3, "response": "a"},                                            # 5
        {"context": "q", "response": ["a"]},                                        # 6
        "{not json",                                                                # 7
        "[1, 2]",                                                                   # 8
        {"context": "床前明月光", "response": "疑是地上霜"},                          # 9
        {"context": None, "response": "null prompt"},                               # 10
    ]
    docs = list(D.read_documents(_jsonl(tmp_path / "a.jsonl", records), "a.jsonl", SFT, CHAT))
    assert [(d.record, d.reject_reason) for d in docs] == [
        (0, ""), (1, D.REJECT_MISSING_PROMPT_FIELD), (2, D.REJECT_MISSING_RESPONSE_FIELD),
        (3, D.REJECT_EMPTY_RESPONSE), (4, D.REJECT_EMPTY_PROMPT),
        (5, D.REJECT_PROMPT_NOT_STRING), (6, D.REJECT_RESPONSE_NOT_STRING),
        (7, D.REJECT_INVALID_JSON), (8, D.REJECT_NOT_AN_OBJECT), (9, ""),
        (10, D.REJECT_MISSING_PROMPT_FIELD)]
    assert (docs[0].prompt, docs[0].text) == (_prompt("Who art thou?"), "A friend.")
    assert (docs[9].prompt, docs[9].text) == (_prompt("床前明月光"), "疑是地上霜")
    assert all(d.prompt == "" and d.text == "" for d in docs if d.reject_reason)


def test_messages_records(tmp_path):
    good = {"messages": [{"role": "system", "content": "Speak as a poet."},
                         {"role": "user", "content": "静夜思?"},
                         {"role": "assistant", "content": "床前明月光"},
                         {"role": "user", "content": "And then?"},
                         {"role": "assistant", "content": "疑是地上霜"}]}
    bad = [
        {"messages": "not a list"},
        {"messages": [{"role": "assistant", "content": "alone"}]},               # < 2 turns
        {"messages": [{"role": "user", "content": "q"}, {"role": "user", "content": "q"}]},
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]},  # no content
        {"messages": [{"role": "user", "content": 1}, {"role": "assistant", "content": "a"}]},
        {"messages": [{"role": "user", "content": "q"}, "a"]},
    ]
    template_refuses = {"messages": [{"role": "tool", "content": "x"},
                                     {"role": "assistant", "content": "a"}]}
    empty = {"messages": [{"role": "user", "content": "q"},
                          {"role": "assistant", "content": " "}]}
    path = _jsonl(tmp_path / "m.jsonl", [good, *bad, template_refuses, empty])
    docs = list(D.read_documents(path, "m.jsonl", SFT, CHAT))
    assert docs[0].reject_reason == ""
    assert docs[0].text == "疑是地上霜"
    assert docs[0].prompt == (BOS + "Speak as a poet.\n\nUser: 静夜思?\n\nAssistant: 床前明月光"
                              + EOS + "User: And then?\n\nAssistant: ")
    assert [d.reject_reason for d in docs[1:]] == [D.REJECT_INVALID_MESSAGES] * len(bad) + [
        D.REJECT_CHAT_TEMPLATE, D.REJECT_EMPTY_RESPONSE]


def test_contents_are_normalized_before_rendering(tmp_path):
    """NFKC on the contents (counted as a repair), never on the template's tokens:
    DeepSeek's `｜` (U+FF5C) would become `|` and the BOS text would no longer be a token."""
    config = DataConfig(task="sft", normalization="NFKC")
    path = _jsonl(tmp_path / "n.jsonl", [{"context": "\ufb01ne", "response": "ｆｕｌｌ"},
                                         {"context": "plain", "response": "text"}])
    first, second = D.read_documents(path, "n.jsonl", config, CHAT)
    assert (first.prompt, first.text) == (_prompt("fine"), "full")
    assert first.repairs == (D.REPAIR_NORMALIZED,)
    assert first.prompt.startswith(BOS)
    assert second.repairs == ()


def test_csv_and_parquet_records(tmp_path):
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(tmp_path / "r.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "context", "response"])
        w.writerows([[1, "Hi, there", "Hello,\nfriend"], [2, "举头望明月", ""], [3, "only"]])
    docs = list(D.read_documents(str(tmp_path / "r.csv"), "r.csv", SFT, CHAT))
    assert [(d.prompt, d.text, d.reject_reason) for d in docs] == [
        (_prompt("Hi, there"), "Hello,\nfriend", ""), ("", "", D.REJECT_EMPTY_RESPONSE),
        ("", "", D.REJECT_MISSING_RESPONSE_FIELD)]

    chat = [{"role": "user", "content": "低头思故乡"}, {"role": "assistant", "content": "好诗"}]
    table = pa.table({"context": ["q1", None, None], "response": ["a1", "a2", None],
                      "messages": [None, None, chat]})
    pq.write_table(table, tmp_path / "r.parquet")
    docs = list(D.read_documents(str(tmp_path / "r.parquet"), "r.parquet", SFT, CHAT))
    assert [(d.prompt, d.text, d.reject_reason) for d in docs] == [
        (_prompt("q1"), "a1", ""), ("", "", D.REJECT_MISSING_PROMPT_FIELD),
        (_prompt("低头思故乡"), "好诗", "")]


def test_files_sft_cannot_read_are_refused_by_name(tmp_path):
    (tmp_path / "plain.txt").write_text("To be or not to be\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"plain\.txt: data\.task=sft reads records"):
        list(D.read_documents(str(tmp_path / "plain.txt"), "plain.txt", SFT, CHAT))
    (tmp_path / "t.csv").write_text("text\nhello\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.csv: the CSV header has neither the columns "
                                         r"'context' and 'response' nor 'messages'"):
        list(D.read_documents(str(tmp_path / "t.csv"), "t.csv", SFT, CHAT))


def test_empty_sft_file_is_counted_with_a_prompt_feature(tmp_path):
    (tmp_path / "e.jsonl").write_text("", encoding="utf-8")
    (doc,) = D.read_documents(str(tmp_path / "e.jsonl"), "e.jsonl", SFT, CHAT)
    assert (doc.reject_reason, doc.prompt) == (D.REJECT_EMPTY_FILE, "")


def test_invalid_utf8_in_the_prompt(tmp_path):
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"context": "bad \xff byte", "response": "fine"}\n')
    (doc,) = D.read_documents(str(path), "u.jsonl", SFT, CHAT)
    assert doc.prompt == _prompt("bad \ufffd byte")
    assert D.REPAIR_INVALID_UTF8 in doc.repairs
    strict = DataConfig(task="sft", invalid_utf8="reject")
    (doc,) = D.read_documents(str(path), "u.jsonl", strict, CHAT)
    assert (doc.reject_reason, doc.prompt, doc.text) == (D.REJECT_INVALID_UTF8, "", "")


def test_default_chat_format_is_the_learned_tokenizers(tmp_path):
    """Without `chat`, the default template with DeepSeek's BOS/EOS (the learned tokenizer's)."""
    path = _jsonl(tmp_path / "d.jsonl", [{"context": "q", "response": "a"}])
    (doc,) = D.read_documents(path, "d.jsonl", SFT)
    assert doc.prompt == _prompt("q")


def test_pretraining_documents_have_no_prompt(tmp_path):
    path = _jsonl(tmp_path / "p.jsonl", [{"text": "hello"}])
    (doc,) = D.read_documents(path, "p.jsonl", DataConfig())
    assert doc.prompt is None


def test_shakespeare_sft_jsonl(shakespeare, tmp_path):
    records = shakespeare_sft_jsonl(tmp_path / "s.jsonl", 50)
    assert records == shakespeare_pairs(shakespeare, 50)
    # The corpus opens "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    # "All:\nSpeak, speak.\n\n..."
    assert records[0] == {"context": "First Citizen:",
                          "response": "Before we proceed any further, hear me speak."}
    # a blank line follows: no pair across it
    assert records[1] == {"context": "All:", "response": "Speak, speak."}
    docs = list(D.read_documents(str(tmp_path / "s.jsonl"), "s.jsonl", SFT, CHAT))
    assert len(docs) == 50 and not any(d.reject_reason for d in docs)
    assert all(d.text.strip() and d.prompt.startswith(BOS) for d in docs)


def test_example_has_a_prompt_feature_only_for_sft():
    import tensorflow as tf

    from corpus.documents import document_to_example

    sft = document_to_example(D.Document("a", "s", 0, prompt=_prompt("q")))
    assert sft.features.feature["prompt"].bytes_list.value == [_prompt("q").encode()]
    plain = document_to_example(D.Document("a", "s", 0))
    assert "prompt" not in plain.features.feature
    assert isinstance(plain, tf.train.Example)


def test_a_template_past_its_limits_rejects_the_record_with_its_reason(tmp_path):
    """A user's template that would take 2 GB (issue 24): the record is counted as
    `chat_template_limit`, the others are read."""
    greedy = ChatFormat("{{ 'a' * 2000000000 if messages[0]['content'] == 'boom' else "
                        "messages[0]['content'] }}", BOS, EOS)
    path = _jsonl(tmp_path / "g.jsonl", [{"context": "boom", "response": "r"},
                                         {"context": "你好", "response": "r"}])
    first, second = D.read_documents(path, "g.jsonl", SFT, greedy)
    assert (first.reject_reason, first.prompt) == (D.REJECT_CHAT_TEMPLATE_LIMIT, "")
    assert (second.reject_reason, second.prompt) == ("", "你好")
