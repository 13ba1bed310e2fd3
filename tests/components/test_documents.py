"""Reading raw files into documents: boundaries, JSONL, gzip, bad records."""

from __future__ import annotations

import gzip
import json

from components.text_example_gen import documents as D


def _write(path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_blank_line_boundary(tmp_path):
    p = _write(tmp_path / "a.txt", "A:\nhello\n\n\nB:\nbye\n")
    docs = list(D.read_documents(p, "a.txt"))
    assert [d.text for d in docs] == ["A:\nhello\n", "B:\nbye\n"]
    assert [d.record for d in docs] == [0, 1]
    assert all(d.source == "a.txt" and not d.reject_reason for d in docs)


def test_line_and_file_boundaries(tmp_path):
    p = _write(tmp_path / "a.txt", "one\ntwo\n")
    assert [d.text for d in D.read_documents(p, "a", "line")] == ["one\n", "two\n"]
    assert [d.text for d in D.read_documents(p, "a", "file")] == ["one\ntwo\n"]


def test_jsonl_with_bad_records(tmp_path):
    lines = [json.dumps({"text": "good"}), "{not json", json.dumps({"body": "x"}),
             json.dumps({"text": 3}), "", json.dumps({"text": "also good"})]
    p = tmp_path / "c.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    docs = list(D.read_documents(str(p), "c.jsonl.gz"))
    assert [(d.record, d.text, d.reject_reason) for d in docs] == [
        (0, "good", ""),
        (1, "", D.REJECT_INVALID_JSON),
        (2, "", D.REJECT_MISSING_TEXT_FIELD),
        (3, "", D.REJECT_TEXT_NOT_STRING),
        (5, "also good", ""),
    ]


def test_invalid_utf8_is_replaced(tmp_path):
    p = tmp_path / "b.txt"
    p.write_bytes(b"caf\xe9\n")
    (doc,) = list(D.read_documents(str(p), "b.txt"))
    assert doc.text == "caf\ufffd\n"


def test_split_text_matches_reader(tmp_path, shakespeare):
    text = shakespeare[:5000]
    p = _write(tmp_path / "s.txt", text)
    assert D.split_text(text) == [d.text for d in D.read_documents(p, "s")]
