"""Raw files -> documents: the reading half of TextExampleGen, free of Beam and TFX.

Formats, chosen by file name:
  `*.jsonl`, `*.jsonl.gz`, `*.json`  one JSON object per line; the text is in
                                      `text_field`. Always one document per record.
  anything else (`*.txt`, `*.txt.gz`) plain UTF-8 text, cut into documents at the
                                      configured boundary.
A `.gz` suffix means gzip. Reading is streaming: a file is never held whole.

Every record read becomes a `Document`; records that cannot be used carry a
`reject_reason` (they are counted, never silently skipped, by the cleaner).
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
from collections.abc import Iterator

import tensorflow as tf

REJECT_INVALID_JSON = "invalid_json"
REJECT_MISSING_TEXT_FIELD = "missing_text_field"
REJECT_TEXT_NOT_STRING = "text_not_string"


@dataclasses.dataclass(frozen=True)
class Document:
    """One input record.

    Attributes:
      text: the document text ("" when rejected).
      source: the file it came from.
      record: 0-based record number within the file (document number for text,
        line number for JSONL).
      reject_reason: "" when usable, else why not.
    """

    text: str
    source: str
    record: int
    reject_reason: str = ""


def is_jsonl(path: str) -> bool:
    name = path[:-3] if path.endswith(".gz") else path
    return name.endswith((".jsonl", ".json"))


class _GFileRaw(io.RawIOBase):
    """tf.io.gfile.GFile as a raw binary stream (so any TF filesystem streams)."""

    def __init__(self, path: str):
        self._f = tf.io.gfile.GFile(path, "rb")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._f.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._f.close()
        super().close()


def _open_text(path: str) -> io.TextIOBase:
    raw = io.BufferedReader(_GFileRaw(path), buffer_size=1 << 20)
    if path.endswith(".gz"):
        raw = gzip.GzipFile(fileobj=raw, mode="rb")
    # Invalid UTF-8 is replaced by U+FFFD rather than failing the whole file.
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")


def read_documents(
    path: str,
    source: str,
    document_boundary: str = "blank_line",
    text_field: str = "text",
) -> Iterator[Document]:
    """Streams the documents of one file.

    Args:
      path: file to read (local or any tf.io.gfile filesystem).
      source: the name recorded in each document (e.g. path relative to the input).
      document_boundary: `blank_line`, `line` or `file` for plain text; ignored for
        JSONL files, which are one document per record.
      text_field: JSON field with the text.

    Yields:
      Document, in file order.

    Raises:
      OSError / tf.errors.NotFoundError: the file cannot be read.
    """
    if is_jsonl(path) or document_boundary == "jsonl":
        yield from _read_jsonl(path, source, text_field)
        return
    with _open_text(path) as f:
        if document_boundary == "file":
            yield Document(f.read(), source, 0)
        elif document_boundary == "line":
            for i, line in enumerate(f):
                yield Document(line, source, i)
        elif document_boundary == "blank_line":
            yield from _split_paragraphs(f, source)
        else:
            raise ValueError(f"unknown document_boundary '{document_boundary}'")


def _split_paragraphs(lines, source: str) -> Iterator[Document]:
    """Documents end at blank lines; the blank lines themselves are separators."""
    record, buffer = 0, []
    for line in lines:
        if line.strip("\r\n") == "":
            if buffer:
                yield Document("".join(buffer), source, record)
                record, buffer = record + 1, []
            continue
        buffer.append(line)
    if buffer:
        yield Document("".join(buffer), source, record)


def _read_jsonl(path: str, source: str, text_field: str) -> Iterator[Document]:
    with _open_text(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                yield Document("", source, i, REJECT_INVALID_JSON)
                continue
            if not isinstance(obj, dict) or text_field not in obj:
                yield Document("", source, i, REJECT_MISSING_TEXT_FIELD)
                continue
            text = obj[text_field]
            if not isinstance(text, str):
                yield Document("", source, i, REJECT_TEXT_NOT_STRING)
                continue
            yield Document(text, source, i)


def split_text(text: str, document_boundary: str = "blank_line") -> list[str]:
    """Cuts an in-memory text into documents the way `read_documents` does."""
    if document_boundary == "file":
        return [text]
    lines = text.splitlines(keepends=True)
    if document_boundary == "line":
        return lines
    return [d.text for d in _split_paragraphs(lines, "")]
