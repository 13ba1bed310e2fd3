"""Reading raw files into documents: formats, boundaries, bad input of every kind."""

from __future__ import annotations

import gzip
import json
import os

import pytest

from config import DataConfig
from corpus import documents as D


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
    line, file = DataConfig(document_boundary="line"), DataConfig(document_boundary="file")
    assert [d.text for d in D.read_documents(p, "a", line)] == ["one\n", "two\n"]
    assert [d.text for d in D.read_documents(p, "a", file)] == ["one\ntwo\n"]


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


def test_invalid_utf8_is_replaced_or_rejected_by_policy(tmp_path):
    p = tmp_path / "b.txt"
    p.write_bytes(b"caf\xe9\n\nfine\n")
    first, second = D.read_documents(str(p), "b.txt")
    assert (first.text, first.repairs) == ("caf\ufffd\n", (D.REPAIR_INVALID_UTF8,))
    assert (second.text, second.repairs) == ("fine\n", ())
    first, second = D.read_documents(str(p), "b.txt", DataConfig(invalid_utf8="reject"))
    assert (first.text, first.reject_reason) == ("", D.REJECT_INVALID_UTF8)
    assert second.text == "fine\n" and not second.reject_reason
    # Inside JSON too (a bad byte in a string value).
    j = tmp_path / "b.jsonl"
    j.write_bytes(b'{"text": "caf\xe9"}\n')
    (doc,) = D.read_documents(str(j), "b.jsonl", DataConfig(invalid_utf8="reject"))
    assert doc.reject_reason == D.REJECT_INVALID_UTF8


def test_empty_files_are_counted(tmp_path):
    for name in ("empty.txt", "blank.txt", "empty.jsonl"):
        (tmp_path / name).write_text("" if name != "blank.txt" else "\n\n\n")
        (doc,) = D.read_documents(str(tmp_path / name), name)
        assert (doc.record, doc.reject_reason) == (0, D.REJECT_EMPTY_FILE)


def test_long_lines_are_split_never_held_whole(tmp_path):
    cfg = DataConfig(max_chars=10, min_chars=1)
    p = _write(tmp_path / "long.txt", "a" * 25 + "\nshort\n\nnext\n")
    docs = list(D.read_documents(p, "long.txt", cfg))
    # The 25-char line is cut at 10; "aaaaa\n" + "short\n" would pass 10, so the
    # paragraph is cut again; every piece of a cut paragraph is marked.
    assert [d.text for d in docs] == ["a" * 10, "a" * 10, "aaaaa\n", "short\n", "next\n"]
    assert [d.repairs == (D.REPAIR_SPLIT,) for d in docs] == [True, True, True, True, False]
    line = DataConfig(max_chars=10, document_boundary="line")
    assert [d.text for d in D.read_documents(p, "l", line)] == [
        "a" * 10, "a" * 10, "aaaaa\n", "short\n", "\n", "next\n"]
    whole = DataConfig(max_chars=10, document_boundary="file")
    texts = [d.text for d in D.read_documents(p, "f", whole)]
    assert "".join(texts) == "a" * 25 + "\nshort\n\nnext\n" and max(map(len, texts)) == 10
    # A JSONL line longer than 2 * max_chars + 1 KiB is rejected; the next line is read.
    j = tmp_path / "long.jsonl"
    j.write_text(json.dumps({"text": "x" * 5000}) + "\n" + json.dumps({"text": "ok"}) + "\n")
    docs = list(D.read_documents(str(j), "long.jsonl", DataConfig(max_chars=100)))
    assert [(d.record, d.reject_reason, d.text) for d in docs] == [
        (0, D.REJECT_LINE_TOO_LONG, ""), (1, "", "ok")]


def test_csv_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    c = tmp_path / "a.csv"
    c.write_text('id,body\n1,"first, with comma"\n2,"multi\nline"\n3\n')
    cfg = DataConfig(csv_text_column="body")
    docs = list(D.read_documents(str(c), "a.csv", cfg))
    assert [(d.record, d.text, d.reject_reason) for d in docs] == [
        (0, "first, with comma", ""), (1, "multi\nline", ""),
        (2, "", D.REJECT_MISSING_TEXT_FIELD)]
    with pytest.raises(ValueError, match="no column 'text'.*a.csv|a.csv.*no column 'text'"):
        list(D.read_documents(str(c), "a.csv"))
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": ["one", None, "three"], "n": [1, 2, 3]}), p)
    docs = list(D.read_documents(str(p), "a.parquet"))
    assert [(d.record, d.text, d.reject_reason) for d in docs] == [
        (0, "one", ""), (1, "", D.REJECT_MISSING_TEXT_FIELD), (2, "three", "")]
    with pytest.raises(ValueError, match="no column 'body'"):
        list(D.read_documents(str(p), "a.parquet", DataConfig(parquet_text_column="body")))


def test_unreadable_file_names_the_file(tmp_path):
    broken = tmp_path / "gone.txt"
    os.symlink(tmp_path / "missing-target.txt", broken)
    with pytest.raises(OSError, match="gone.txt"):
        list(D.read_documents(str(broken), "gone.txt"))
    bad_gzip = tmp_path / "bad.txt.gz"
    bad_gzip.write_bytes(b"not gzip at all")
    with pytest.raises(OSError, match="bad.txt.gz"):
        list(D.read_documents(str(bad_gzip), "bad.txt.gz"))


def test_split_text_matches_reader(tmp_path, shakespeare):
    text = shakespeare[:5000]
    p = _write(tmp_path / "s.txt", text)
    assert D.split_text(text) == [d.text for d in D.read_documents(p, "s")]


@pytest.mark.slow
def test_a_300mb_line_streams_in_bounded_memory(tmp_path):
    """A single 300 MB line becomes 1 MB pieces; peak memory grows by far less than 300 MB."""
    import subprocess
    import sys

    path = tmp_path / "one_line.txt"
    chunk = ("0123456789abcdef" * 4096).encode()  # 64 KiB, no newline
    with open(path, "wb") as f:
        for _ in range(300 * 16):  # 300 MiB
            f.write(chunk)
        f.write(b"\n")
    script = f"""
import resource
from corpus import documents as D
from config import DataConfig
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
pieces = chars = 0
for doc in D.read_documents({str(path)!r}, "one_line.txt", DataConfig(max_chars=1_000_000)):
    pieces += 1
    chars += len(doc.text)
    assert len(doc.text) <= 1_000_000 and doc.repairs == (D.REPAIR_SPLIT,)
grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(pieces, chars, round(grown_mb))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300, cwd=os.path.dirname(os.path.dirname(D.__file__)))
    assert out.returncode == 0, out.stderr[-2000:]
    pieces, chars, grown_mb = map(int, out.stdout.split())
    assert chars == 300 * 16 * 65536 + 1 and pieces == -(-chars // 1_000_000)
    assert grown_mb < 100, f"peak RSS grew by {grown_mb} MB reading a 300 MB line"


@pytest.mark.parametrize("task", ["pretrain", "sft"])
def test_a_fifo_is_one_rejected_record_never_opened(tmp_path, task):
    """Its open() would wait for a writer forever; read in a thread so that a regression
    fails the test instead of hanging it (the FIFO is then opened for writing to free it)."""
    import threading

    fifo = str(tmp_path / "pipe.jsonl")
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.extend(
        D.read_documents(fifo, "pipe.jsonl", DataConfig(task=task))), daemon=True)
    reader.start()
    reader.join(30)
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # EOF for the blocked reader
        pytest.fail("read_documents opened the FIFO")
    assert [(d.reject_reason, d.text, d.source) for d in got] == [
        (D.REJECT_NOT_REGULAR_FILE, "", "pipe.jsonl")]
    assert got[0].prompt == ("" if task == "sft" else None)


def test_documents_carry_their_source_name_into_the_example(tmp_path):
    p = _write(tmp_path / "诗.txt", "床前明月光\n\n疑是地上霜\n")
    docs = list(D.read_documents(p, "诗.txt", source_name="poems"))
    assert [d.source_name for d in docs] == ["poems", "poems"]
    empty = list(D.read_documents(_write(tmp_path / "e.txt", ""), "e.txt", source_name="web"))
    assert [(d.reject_reason, d.source_name) for d in empty] == [(D.REJECT_EMPTY_FILE, "web")]
    assert {d.source_name for d in D.read_documents(p, "诗.txt")} == {"default"}
    feature = D.document_to_example(docs[1]).features.feature
    assert feature["source_name"].bytes_list.value == [b"poems"]
    assert feature["source"].bytes_list.value == ["诗.txt".encode()]
    assert feature["text"].bytes_list.value == ["疑是地上霜\n".encode()]
