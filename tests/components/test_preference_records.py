"""DPO and GRPO records (issue 29): reading JSONL, CSV and Parquet (the prompt field, TRL's
"prompt" fallback, a chat prompt), every reject reason, Chinese text byte for byte, and the
ExampleGen tf.Example with its `rejected` feature."""

from __future__ import annotations

import json

import pytest

from config import DataConfig
from corpus import documents as D
from tokenization.chat_template import DEFAULT_CHAT_TEMPLATE, ChatFormat

DPO = DataConfig(task="dpo")
GRPO = DataConfig(task="grpo")
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
CHAT = ChatFormat(DEFAULT_CHAT_TEMPLATE, BOS, EOS)


def _prompt(user: str) -> str:
    return BOS + "User: " + user + "\n\nAssistant: "


def _jsonl(path, records) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)
                              for r in records) + "\n", encoding="utf-8")
    return str(path)


def _read(path, config):
    return list(D.read_documents(path, path.rsplit("/", 1)[-1], config, CHAT))


def test_dpo_records_and_every_reject_reason(tmp_path):
    records = [
        {"context": "Who art thou?", "chosen": "A friend.", "rejected": "Go away.",
         "score": 3},                                                                 # 0
        {"prompt": "床前明月光", "chosen": "疑是地上霜", "rejected": "举头望明月"},          # 1 TRL
        {"chosen": "a", "rejected": "b"},                                             # 2
        {"context": "q", "rejected": "b"},                                            # 3
        {"context": "q", "chosen": "a"},                                              # 4
        {"context": 3, "chosen": "a", "rejected": "b"},                               # 5
        {"context": "q", "chosen": ["a"], "rejected": "b"},                           # 6
        {"context": "q", "chosen": "a", "rejected": 2},                               # 7
        {"context": " \n", "chosen": "a", "rejected": "b"},                           # 8
        {"context": "q", "chosen": "\t ", "rejected": "b"},                           # 9
        {"context": "q", "chosen": "a", "rejected": "  "},                            # 10
        {"context": "q", "chosen": "same", "rejected": "same"},                       # 11
        "{not json",                                                                  # 12
        "[1, 2]",                                                                     # 13
        {"context": None, "prompt": "ignored: the record has the key", "chosen": "a",
         "rejected": "b"},                                                            # 14
    ]
    docs = _read(_jsonl(tmp_path / "p.jsonl", records), DPO)
    assert [(d.record, d.reject_reason) for d in docs] == [
        (0, ""), (1, ""), (2, D.REJECT_MISSING_PROMPT_FIELD),
        (3, D.REJECT_MISSING_CHOSEN_FIELD), (4, D.REJECT_MISSING_REJECTED_FIELD),
        (5, D.REJECT_PROMPT_NOT_STRING), (6, D.REJECT_CHOSEN_NOT_STRING),
        (7, D.REJECT_REJECTED_NOT_STRING), (8, D.REJECT_EMPTY_PROMPT),
        (9, D.REJECT_EMPTY_CHOSEN), (10, D.REJECT_EMPTY_REJECTED),
        (11, D.REJECT_CHOSEN_EQUALS_REJECTED), (12, D.REJECT_INVALID_JSON),
        (13, D.REJECT_NOT_AN_OBJECT), (14, D.REJECT_MISSING_PROMPT_FIELD)]
    assert (docs[0].prompt, docs[0].text, docs[0].rejected) == (
        _prompt("Who art thou?"), "A friend.", "Go away.")
    assert docs[0].repairs == ()
    # Chinese survives byte for byte (NFC changes none of it).
    assert (docs[1].prompt, docs[1].text, docs[1].rejected) == (
        _prompt("床前明月光"), "疑是地上霜", "举头望明月")
    assert docs[1].prompt.encode("utf-8") == _prompt("床前明月光").encode("utf-8")
    # Every rejected record has the three fields, empty: every example has the schema's.
    assert all((d.text, d.prompt, d.rejected) == ("", "", "")
               for d in docs if d.reject_reason)


def test_dpo_chosen_equal_to_rejected_after_normalization(tmp_path):
    config = DataConfig(task="dpo", normalization="NFKC")
    path = _jsonl(tmp_path / "n.jsonl", [
        {"context": "q", "chosen": "ｆｕｌｌ", "rejected": "full"},
        {"context": "\ufb01ne", "chosen": "ｆｕｌｌ", "rejected": "empty"}])
    equal, normalized = _read(path, config)
    assert equal.reject_reason == D.REJECT_CHOSEN_EQUALS_REJECTED
    assert (normalized.prompt, normalized.text, normalized.rejected) == (
        _prompt("fine"), "full", "empty")
    assert normalized.repairs == (D.REPAIR_NORMALIZED,)
    # NFC leaves the fullwidth letters alone: the two responses differ.
    (kept, _) = _read(path, DPO)
    assert (kept.reject_reason, kept.text) == ("", "ｆｕｌｌ")


def test_dpo_and_grpo_chat_prompts(tmp_path):
    chat = [{"role": "system", "content": "你是诗人。"},
            {"role": "user", "content": "静夜思?"},
            {"role": "assistant", "content": "床前明月光"},
            {"role": "user", "content": "下一句？"}]
    bad = [
        "not a list",
        [],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],  # ends so
        [{"role": "user"}],
        [{"role": "user", "content": 1}],
        ["q"],
    ]
    path = _jsonl(tmp_path / "m.jsonl",
                  [{"messages": chat, "chosen": "疑是地上霜", "rejected": "不知道",
                    "answer": "疑是地上霜"}]
                  + [{"messages": m, "chosen": "a", "rejected": "b", "answer": "a"} for m in bad]
                  + [{"messages": [{"role": "tool", "content": "x"}], "chosen": "a",
                      "rejected": "b", "answer": "a"}])
    rendered = (BOS + "你是诗人。\n\nUser: 静夜思?\n\nAssistant: 床前明月光" + EOS
                + "User: 下一句？\n\nAssistant: ")
    for config in (DPO, GRPO):
        docs = _read(path, config)
        assert (docs[0].reject_reason, docs[0].prompt, docs[0].text) == (
            "", rendered, "疑是地上霜")
        assert [d.reject_reason for d in docs[1:]] == (
            [D.REJECT_INVALID_MESSAGES] * len(bad) + [D.REJECT_CHAT_TEMPLATE])
    assert _read(path, DPO)[0].rejected == "不知道"
    assert _read(path, GRPO)[0].rejected is None


def test_grpo_records_and_every_reject_reason(tmp_path):
    records = [
        {"context": "What is 12 + 30?", "answer": "42"},       # 0
        {"prompt": "一加一等于几？", "answer": "二"},              # 1 TRL's prompt key
        {"answer": "42"},                                       # 2
        {"context": "q"},                                       # 3
        {"context": ["q"], "answer": "a"},                      # 4
        {"context": "q", "answer": 42},                         # 5
        {"context": "", "answer": "a"},                         # 6
        {"context": "q", "answer": " "},                        # 7
        "7",                                                    # 8
    ]
    docs = _read(_jsonl(tmp_path / "g.jsonl", records), GRPO)
    assert [(d.record, d.reject_reason) for d in docs] == [
        (0, ""), (1, ""), (2, D.REJECT_MISSING_PROMPT_FIELD),
        (3, D.REJECT_MISSING_ANSWER_FIELD), (4, D.REJECT_PROMPT_NOT_STRING),
        (5, D.REJECT_ANSWER_NOT_STRING), (6, D.REJECT_EMPTY_PROMPT),
        (7, D.REJECT_EMPTY_ANSWER), (8, D.REJECT_NOT_AN_OBJECT)]
    assert (docs[0].prompt, docs[0].text) == (_prompt("What is 12 + 30?"), "42")
    assert (docs[1].prompt, docs[1].text) == (_prompt("一加一等于几？"), "二")
    assert all(d.rejected is None for d in docs)
    assert all((d.text, d.prompt) == ("", "") for d in docs if d.reject_reason)


def test_custom_field_names(tmp_path):
    config = DataConfig(task="dpo", prompt_field="question", chosen_field="good",
                        rejected_field="bad")
    path = _jsonl(tmp_path / "c.jsonl", [{"question": "q", "good": "yes", "bad": "no"}])
    (doc,) = _read(path, config)
    assert (doc.prompt, doc.text, doc.rejected) == (_prompt("q"), "yes", "no")
    config = DataConfig(task="grpo", answer_field="solution")
    path = _jsonl(tmp_path / "s.jsonl", [{"context": "q", "solution": "4"}])
    (doc,) = _read(path, config)
    assert (doc.prompt, doc.text) == (_prompt("q"), "4")


def test_csv_and_parquet_records(tmp_path):
    import csv

    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(tmp_path / "p.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "prompt", "chosen", "rejected"])  # TRL's column names
        w.writerows([[1, "Hi, there", "Hello,\nfriend", "Bye"], [2, "举头望明月", "低头思故乡", ""],
                     [3, "only"]])
    docs = _read(str(tmp_path / "p.csv"), DPO)
    assert [(d.prompt, d.text, d.rejected, d.reject_reason) for d in docs] == [
        (_prompt("Hi, there"), "Hello,\nfriend", "Bye", ""),
        ("", "", "", D.REJECT_EMPTY_REJECTED), ("", "", "", D.REJECT_MISSING_CHOSEN_FIELD)]

    chat = [{"role": "user", "content": "低头思故乡"}]
    table = pa.table({"context": ["q1", None, None], "answer": ["a1", "a2", "好诗"],
                      "messages": [None, None, chat]})
    pq.write_table(table, tmp_path / "g.parquet")
    docs = _read(str(tmp_path / "g.parquet"), GRPO)
    assert [(d.prompt, d.text, d.reject_reason) for d in docs] == [
        (_prompt("q1"), "a1", ""), ("", "", D.REJECT_MISSING_PROMPT_FIELD),
        (_prompt("低头思故乡"), "好诗", "")]


def test_files_that_cannot_hold_records_are_refused_by_name(tmp_path):
    (tmp_path / "plain.txt").write_text("To be or not to be\n", encoding="utf-8")
    for config in (DPO, GRPO):
        with pytest.raises(ValueError, match=rf"plain\.txt: data\.task={config.task} reads "
                                             "records from JSONL, CSV or Parquet"):
            _read(str(tmp_path / "plain.txt"), config)
    (tmp_path / "t.csv").write_text("prompt,chosen\nq,a\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"t\.csv: the CSV header lacks the columns of a dpo "
                                         r"record: 'context' \(or 'prompt'\) or 'messages', "
                                         r"'chosen' and 'rejected'"):
        _read(str(tmp_path / "t.csv"), DPO)
    (tmp_path / "g.csv").write_text("context,response\nq,a\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"g\.csv: .* and 'answer'"):
        _read(str(tmp_path / "g.csv"), GRPO)


def test_empty_file_and_invalid_utf8(tmp_path):
    (tmp_path / "e.jsonl").write_text("", encoding="utf-8")
    (doc,) = _read(str(tmp_path / "e.jsonl"), DPO)
    assert (doc.reject_reason, doc.prompt, doc.rejected) == (D.REJECT_EMPTY_FILE, "", "")
    (doc,) = _read(str(tmp_path / "e.jsonl"), GRPO)
    assert (doc.reject_reason, doc.prompt, doc.rejected) == (D.REJECT_EMPTY_FILE, "", None)
    path = tmp_path / "u.jsonl"
    path.write_bytes(b'{"context": "q", "chosen": "fine", "rejected": "bad \xff byte"}\n')
    (doc,) = _read(str(path), DPO)
    assert (doc.text, doc.rejected) == ("fine", "bad \ufffd byte")
    assert D.REPAIR_INVALID_UTF8 in doc.repairs
    (doc,) = _read(str(path), DataConfig(task="dpo", invalid_utf8="reject"))
    assert (doc.reject_reason, doc.prompt, doc.text, doc.rejected) == (
        D.REJECT_INVALID_UTF8, "", "", "")


def test_example_has_a_rejected_feature_only_for_dpo():
    from corpus.documents import document_to_example

    dpo = document_to_example(D.Document("疑是地上霜", "s", 0, prompt=_prompt("床前明月光"),
                                         rejected="举头望明月"))
    f = dpo.features.feature
    assert f["rejected"].bytes_list.value == ["举头望明月".encode()]
    assert f["text"].bytes_list.value == ["疑是地上霜".encode()]
    assert f["prompt"].bytes_list.value == [_prompt("床前明月光").encode()]
    grpo = document_to_example(D.Document("42", "s", 0, prompt=_prompt("q")))
    assert "rejected" not in grpo.features.feature


def test_dpo_schema_is_the_sft_schema_plus_rejected_and_matches_the_examples():
    """`data/schema/dpo_schema.pbtxt` (read as a file: importing the pipeline imports TFX)."""
    import pathlib

    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    from corpus.documents import document_to_example

    schemas = pathlib.Path(__file__).resolve().parents[2] / "data" / "schema"

    def features(name):
        schema = text_format.Parse((schemas / name).read_text(encoding="utf-8"),
                                   schema_pb2.Schema())
        return {f.name: f for f in schema.feature}

    sft, dpo = features("sft_schema.pbtxt"), features("dpo_schema.pbtxt")
    assert set(dpo) == set(sft) | {"rejected"}
    assert all(dpo[name] == sft[name] for name in sft)
    assert dpo["rejected"].type == schema_pb2.BYTES
    assert dpo["rejected"].presence.min_fraction == 1.0
    for doc in (D.Document("a", "s", 0, prompt="p", rejected="b"),
                D.Document("", "s", 1, D.REJECT_EMPTY_CHOSEN, prompt="", rejected="")):
        assert set(document_to_example(doc).features.feature) == set(dpo)
    grpo = D.Document("", "s", 1, D.REJECT_EMPTY_ANSWER, prompt="")
    assert set(document_to_example(grpo).features.feature) == set(sft)


@pytest.mark.parametrize("task", ["dpo", "grpo"])
def test_cli_task_sets_data_task(task):
    import cli

    args = cli.build_parser().parse_args(["run", "--preset", "tiny", "--task", task])
    assert cli.config_from_args(args).data.task == task


def test_the_addition_tasks_preference_pairs_read_with_the_default_fields(tmp_path):
    """`corpus.addition.preference_pairs` writes TRL's {"prompt", "chosen", "rejected"}:
    read under `--task dpo` with no field set (prompt_field "context" is absent)."""
    from corpus import addition

    pairs = addition.preference_pairs(limit=20)
    docs = _read(_jsonl(tmp_path / "add.jsonl", pairs), DPO)
    assert [(d.reject_reason, d.prompt, d.text, d.rejected) for d in docs] == [
        ("", _prompt(p["prompt"]), p["chosen"], p["rejected"]) for p in pairs]
