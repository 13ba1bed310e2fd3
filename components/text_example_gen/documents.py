"""Raw files -> documents: the reading half of TextExampleGen, free of Beam and TFX.

Formats, chosen by file name (a `.gz` suffix means gzip):
  `*.jsonl`, `*.json`   one JSON object per line; the text is in `data.jsonl_text_field`.
  `*.csv`               a header row, then one document per row, text in `data.csv_text_column`.
  `*.parquet`           one document per row, text in `data.parquet_text_column`.
  anything else         plain UTF-8 text (`*.txt`), cut into documents at
                        `data.document_boundary` (blank line, line, or whole file).
Reading streams: no file is held whole, and no line either. Plain text longer
than `data.max_chars` (a document, a line, a file) is cut into pieces of at
most `data.max_chars` characters, each its own record, marked with the repair
`split_long_document`. A JSONL/CSV record whose line is longer than that
(twice, plus 1 KiB of slack for JSON escapes and other fields) is rejected as
`line_too_long`, read past in bounded chunks.

Bytes that are not valid UTF-8 are replaced by U+FFFD (repair
`invalid_utf8_replaced`) or reject their record (`invalid_utf8`), by
`data.invalid_utf8`. A file with no record at all gives one `empty_file` record,
so that it is counted too.

Every record read becomes a `Document`; records that cannot be used carry a
`reject_reason`, repairs made while reading are listed in `repairs`; the cleaner
counts both, so nothing is silently lost. A file that cannot be opened or read
raises `OSError` naming it: the run stops.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
from collections.abc import Iterator

import tensorflow as tf

from pipeline.configs import DataConfig

REJECT_INVALID_JSON = "invalid_json"
REJECT_INVALID_CSV = "invalid_csv"
REJECT_MISSING_TEXT_FIELD = "missing_text_field"
REJECT_TEXT_NOT_STRING = "text_not_string"
REJECT_INVALID_UTF8 = "invalid_utf8"
REJECT_LINE_TOO_LONG = "line_too_long"
REJECT_EMPTY_FILE = "empty_file"

REPAIR_INVALID_UTF8 = "invalid_utf8_replaced"
REPAIR_SPLIT = "split_long_document"

_SURROGATE_LOW, _SURROGATE_HIGH = "\udc80", "\udcff"  # undecodable bytes (surrogateescape)


@dataclasses.dataclass(frozen=True)
class Document:
    """One input record.

    Attributes:
      text: the document text ("" when rejected).
      source: the file it came from.
      record: 0-based record number within the file (document or piece number
        for plain text, line number for JSONL, row number for CSV/Parquet).
      reject_reason: "" when usable, else why not.
      repairs: what reading changed (`invalid_utf8_replaced`, `split_long_document`).
    """

    text: str
    source: str
    record: int
    reject_reason: str = ""
    repairs: tuple[str, ...] = ()


def file_format(path: str) -> str:
    """`jsonl`, `csv`, `parquet` or `text`, from the file name."""
    name = path[:-3] if path.endswith(".gz") else path
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def is_jsonl(path: str) -> bool:
    return file_format(path) == "jsonl"


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


def _open_binary(path: str):
    raw = io.BufferedReader(_GFileRaw(path), buffer_size=1 << 20)
    return gzip.GzipFile(fileobj=raw, mode="rb") if path.endswith(".gz") else raw


def _open_text(path: str) -> io.TextIOBase:
    # surrogateescape keeps undecodable bytes visible (U+DC80..U+DCFF) so the
    # invalid-UTF-8 policy can count, replace or reject them.
    return io.TextIOWrapper(_open_binary(path), encoding="utf-8", errors="surrogateescape",
                            newline="")


def _has_invalid_bytes(text: str) -> bool:
    return any(_SURROGATE_LOW <= ch <= _SURROGATE_HIGH for ch in text)


def _apply_utf8_policy(doc: Document, policy: str) -> Document:
    if doc.reject_reason or not _has_invalid_bytes(doc.text):
        return doc
    if policy == "reject":
        return Document("", doc.source, doc.record, REJECT_INVALID_UTF8, doc.repairs)
    text = "".join("\ufffd" if _SURROGATE_LOW <= ch <= _SURROGATE_HIGH else ch
                   for ch in doc.text)
    return Document(text, doc.source, doc.record, "", doc.repairs + (REPAIR_INVALID_UTF8,))


def read_documents(path: str, source: str, config: DataConfig | None = None) -> Iterator[Document]:
    """Streams the documents of one file.

    Args:
      path: file to read (local or any tf.io.gfile filesystem).
      source: the name recorded in each document (e.g. path relative to the input).
      config: the data section of the pipeline config (boundary, text fields,
        invalid-UTF-8 policy, max_chars); defaults to `DataConfig()`.

    Yields:
      Document, in file order; at least one per file (`empty_file`).

    Raises:
      OSError: the file cannot be opened or read (the message names it).
      ValueError: a Parquet file has no such text column (names file and column).
    """
    config = config or DataConfig()
    fmt = "jsonl" if config.document_boundary == "jsonl" else file_format(path)
    readers = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet,
               "text": _read_text}
    count = 0
    try:
        for doc in readers[fmt](path, source, config):
            count += 1
            yield _apply_utf8_policy(doc, config.invalid_utf8)
    except (OSError, tf.errors.OpError, EOFError, gzip.BadGzipFile) as e:
        raise OSError(f"{path}: cannot read: {e}") from e
    if count == 0:
        yield Document("", source, 0, REJECT_EMPTY_FILE)


def _bounded_lines(f, limit: int) -> Iterator[tuple[str, bool]]:
    """Yields (piece, ends_line) with pieces of at most `limit` characters."""
    while True:
        piece = f.readline(limit)
        if not piece:
            return
        yield piece, piece.endswith("\n")


def _read_text(path: str, source: str, config: DataConfig) -> Iterator[Document]:
    limit = config.max_chars
    record = 0

    def emit(text: str, split: bool) -> Document:
        nonlocal record
        doc = Document(text, source, record, "", (REPAIR_SPLIT,) if split else ())
        record += 1
        return doc

    with _open_text(path) as f:
        boundary = config.document_boundary
        if boundary == "file":
            first = f.read(limit)
            rest = f.read(limit)
            if first:
                yield emit(first, bool(rest))
            while rest:
                yield emit(rest, True)
                rest = f.read(limit)
        elif boundary == "line":
            split = False  # is the current line already cut?
            for piece, ends_line in _bounded_lines(f, limit):
                yield emit(piece, split or not ends_line)
                split = not ends_line
        elif boundary == "blank_line":
            buffer, size, split, mid_line = [], 0, False, False
            for piece, ends_line in _bounded_lines(f, limit):
                is_blank_line = not mid_line and ends_line and piece.strip("\r\n") == ""
                mid_line = not ends_line
                if is_blank_line:  # a blank line ends the paragraph
                    if buffer:
                        yield emit("".join(buffer), split)
                        buffer, size, split = [], 0, False
                    continue
                if buffer and size + len(piece) > limit:
                    yield emit("".join(buffer), True)
                    buffer, size, split = [], 0, True
                buffer.append(piece)
                size += len(piece)
            if buffer:
                yield emit("".join(buffer), split)
        else:
            raise ValueError(f"unknown document_boundary '{boundary}'")


def _skip_rest_of_line(f, limit: int) -> None:
    for _, ends_line in _bounded_lines(f, limit):
        if ends_line:
            return


def _read_jsonl(path: str, source: str, config: DataConfig) -> Iterator[Document]:
    limit = 2 * config.max_chars + 1024
    field = config.jsonl_text_field
    with _open_text(path) as f:
        i = -1
        for line, ends_line in _bounded_lines(f, limit):
            i += 1
            if not ends_line and len(line) == limit:
                _skip_rest_of_line(f, limit)
                yield Document("", source, i, REJECT_LINE_TOO_LONG)
                continue
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                # Undecodable bytes inside a JSON line show up as lone surrogates,
                # which json accepts; a line json rejects is not JSON.
                yield Document("", source, i, REJECT_INVALID_JSON)
                continue
            if not isinstance(obj, dict) or field not in obj or obj[field] is None:
                yield Document("", source, i, REJECT_MISSING_TEXT_FIELD)
                continue
            text = obj[field]
            if not isinstance(text, str):
                yield Document("", source, i, REJECT_TEXT_NOT_STRING)
                continue
            yield Document(text, source, i)


def _read_csv(path: str, source: str, config: DataConfig) -> Iterator[Document]:
    column = config.csv_text_column
    limit = 2 * config.max_chars + 1024
    csv.field_size_limit(max(csv.field_size_limit(), limit))
    with _open_text(path) as f:
        reader = csv.reader(f)
        try:
            header = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise ValueError(f"{path}: the CSV header cannot be parsed ({e})") from e
        if column not in header:
            raise ValueError(
                f"{path}: no column '{column}' in the CSV header {header[:20]} "
                "(set data.csv_text_column)")
        index = header.index(column)
        row_number = -1
        while True:
            row_number += 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                reason = REJECT_LINE_TOO_LONG if "field larger" in str(e) else REJECT_INVALID_CSV
                yield Document("", source, row_number, reason)
                continue
            if not row:
                row_number -= 1  # csv skips nothing: an empty line is no record
                continue
            if index >= len(row):
                yield Document("", source, row_number, REJECT_MISSING_TEXT_FIELD)
                continue
            yield Document(row[index], source, row_number)


def _read_parquet(path: str, source: str, config: DataConfig) -> Iterator[Document]:
    import pyarrow.parquet as pq

    column = config.parquet_text_column
    # pyarrow reads local paths itself (seekable, memory-mapped row groups) and
    # remote ones through tf.io.gfile.
    parquet = pq.ParquetFile(path if "://" not in path else tf.io.gfile.GFile(path, "rb"))
    try:
        names = parquet.schema_arrow.names
        if column not in names:
            raise ValueError(
                f"{path}: no column '{column}' in the Parquet schema {names[:20]} "
                "(set data.parquet_text_column)")
        row = 0
        for batch in parquet.iter_batches(batch_size=1024, columns=[column]):
            for value in batch.column(0).to_pylist():
                if value is None:
                    yield Document("", source, row, REJECT_MISSING_TEXT_FIELD)
                elif not isinstance(value, str):
                    yield Document("", source, row, REJECT_TEXT_NOT_STRING)
                else:
                    yield Document(value, source, row)
                row += 1
    finally:
        parquet.close()


def split_text(text: str, document_boundary: str = "blank_line") -> list[str]:
    """Cuts an in-memory text into documents the way `read_documents` does."""
    if document_boundary == "file":
        return [text]
    lines = text.splitlines(keepends=True)
    if document_boundary == "line":
        return lines
    docs, buffer = [], []
    for line in lines:
        if line.strip("\r\n") == "":
            if buffer:
                docs.append("".join(buffer))
                buffer = []
            continue
        buffer.append(line)
    if buffer:
        docs.append("".join(buffer))
    return docs
