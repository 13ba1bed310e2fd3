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

Supervised fine-tuning (`data.task = "sft"`) reads JSONL, CSV and Parquet records
only (plain text is refused, naming the file). A record is either
`{prompt_field: str, response_field: str, ...}` (other keys ignored) or
`{messages_field: [{"role", "content"}, ...]}` whose last message is the
assistant's response; the turns before it are the prompt. Each message's content
and the response are Unicode-normalized (`data.normalization`, repair
`unicode_normalized`), then the prompt turns are rendered by the chat template
(`tokenization/chat_template.py`): normalizing the rendered text instead
would change the template's own tokens (NFKC turns DeepSeek's `｜` into `|`). The
`Document` holds the response as `text` and the rendered prompt as `prompt`.
Rejected SFT records: `record_not_object`, `missing_prompt_field`,
`missing_response_field`, `prompt_not_string`, `response_not_string`,
`empty_prompt`, `empty_response` (whitespace only), `invalid_messages` (not a
list of at least two `{"role": str, "content": str}`, or the last is not the
assistant's), `chat_template_error` (the template refused the turns),
`chat_template_limit` (rendering went past the template's limits on size or time,
`chat_template.RenderLimits`).

Every record read becomes a `Document`; records that cannot be used carry a
`reject_reason`, repairs made while reading are listed in `repairs`; the cleaner
counts both, so nothing is silently lost. A file that cannot be opened or read
raises `OSError` naming it: the run stops. A path that is not a regular file (a
FIFO, a device, a socket: its `open` could block forever) is not opened: it gives
one `not_a_regular_file` record (`common.files.special_file_kind`).
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import gzip
import io
import json
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from common.files import special_file_kind
from config import DEFAULT_SOURCE, DataConfig
from tokenization.chat_template import (
    ChatFormat,
    ChatTemplateError,
    ChatTemplateLimitError,
    chat_format,
)

REJECT_INVALID_JSON = "invalid_json"
REJECT_INVALID_CSV = "invalid_csv"
REJECT_MISSING_TEXT_FIELD = "missing_text_field"
REJECT_TEXT_NOT_STRING = "text_not_string"
REJECT_INVALID_UTF8 = "invalid_utf8"
REJECT_LINE_TOO_LONG = "line_too_long"
REJECT_EMPTY_FILE = "empty_file"
REJECT_NOT_REGULAR_FILE = "not_a_regular_file"

REJECT_NOT_AN_OBJECT = "record_not_object"
REJECT_MISSING_PROMPT_FIELD = "missing_prompt_field"
REJECT_MISSING_RESPONSE_FIELD = "missing_response_field"
REJECT_PROMPT_NOT_STRING = "prompt_not_string"
REJECT_RESPONSE_NOT_STRING = "response_not_string"
REJECT_EMPTY_PROMPT = "empty_prompt"
REJECT_EMPTY_RESPONSE = "empty_response"
REJECT_INVALID_MESSAGES = "invalid_messages"
REJECT_CHAT_TEMPLATE = "chat_template_error"
REJECT_CHAT_TEMPLATE_LIMIT = "chat_template_limit"

REPAIR_INVALID_UTF8 = "invalid_utf8_replaced"
REPAIR_NORMALIZED = "unicode_normalized"  # = text_cleaner.cleaning.REPAIR_NORMALIZED
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
      prompt: None for a pretraining document; for an SFT record, the rendered
        prompt ("" when rejected), and `text` is the response.
      source_name: the mixture source it belongs to (`data.sources`), "default" in
        the one-source case; a document is identified by (source_name, source, record).
    """

    text: str
    source: str
    record: int
    reject_reason: str = ""
    repairs: tuple[str, ...] = ()
    prompt: str | None = None
    source_name: str = DEFAULT_SOURCE


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
    if doc.reject_reason or not (_has_invalid_bytes(doc.text)
                                 or (doc.prompt and _has_invalid_bytes(doc.prompt))):
        return doc
    if policy == "reject":
        return dataclasses.replace(doc, text="", reject_reason=REJECT_INVALID_UTF8,
                                   prompt=None if doc.prompt is None else "")

    def replaced(text: str) -> str:
        return "".join("\ufffd" if _SURROGATE_LOW <= ch <= _SURROGATE_HIGH else ch
                       for ch in text)

    return dataclasses.replace(
        doc, text=replaced(doc.text), repairs=doc.repairs + (REPAIR_INVALID_UTF8,),
        prompt=None if doc.prompt is None else replaced(doc.prompt))


def read_documents(path: str, source: str, config: DataConfig | None = None,
                   chat: ChatFormat | None = None,
                   source_name: str = DEFAULT_SOURCE) -> Iterator[Document]:
    """Streams the documents (or, with `data.task = "sft"`, the SFT records) of one file.

    Args:
      path: file to read (local or any tf.io.gfile filesystem).
      source: the name recorded in each document (e.g. path relative to the input).
      config: the data section of the pipeline config (boundary, text fields,
        invalid-UTF-8 policy, max_chars, task); defaults to `DataConfig()`.
      chat: the chat template and special tokens of an SFT run; default
        `chat_template.chat_format(config)` (the learned tokenizer's tokens).
      source_name: the mixture source the file belongs to, set on every document
        (`config` is then that source's `data.for_source(source_name)`).

    Yields:
      Document, in file order; at least one per file (`empty_file`); one
      `not_a_regular_file` record, without opening it, for a FIFO, device or socket. SFT
      records have `prompt` set (a string, "" when rejected).

    Raises:
      OSError: the file cannot be opened or read (the message names it).
      ValueError: a CSV/Parquet file has no such column (names file and column);
        an SFT run given a plain-text file (names it).
    """
    config = config or DataConfig()
    sft = config.task == "sft"
    named = functools.partial(_named, source_name=source_name)
    if special_file_kind(path):  # os.stat only: a FIFO's open() would wait for a writer
        yield named(Document("", source, 0, REJECT_NOT_REGULAR_FILE, prompt="" if sft else None))
        return
    fmt = "jsonl" if config.document_boundary == "jsonl" else file_format(path)
    if sft and fmt == "text":
        raise ValueError(
            f"{path}: data.task=sft reads records from JSONL, CSV or Parquet files "
            f"(with '{config.prompt_field}'/'{config.response_field}' or "
            f"'{config.messages_field}'), not plain text; remove the file or rename it")
    if sft:
        chat = chat or chat_format(config)
        readers = {"jsonl": _read_jsonl_sft, "csv": _read_csv_sft, "parquet": _read_parquet_sft}
        read = functools.partial(readers[fmt], chat=chat)
    else:
        read = {"jsonl": _read_jsonl, "csv": _read_csv, "parquet": _read_parquet,
                "text": _read_text}[fmt]
    count = 0
    try:
        for doc in read(path, source, config):
            count += 1
            yield named(_apply_utf8_policy(doc, config.invalid_utf8))
    except (OSError, tf.errors.OpError, EOFError, gzip.BadGzipFile) as e:
        raise OSError(f"{path}: cannot read: {e}") from e
    if count == 0:
        yield named(Document("", source, 0, REJECT_EMPTY_FILE, prompt="" if sft else None))


def _named(doc: Document, source_name: str) -> Document:
    return doc if doc.source_name == source_name else dataclasses.replace(
        doc, source_name=source_name)


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


def _jsonl_objects(path: str, config: DataConfig) -> Iterator[tuple[int, Any, str]]:
    """(record, parsed JSON value, "") per non-blank line, or (record, None, reason)."""
    limit = 2 * config.max_chars + 1024
    with _open_text(path) as f:
        i = -1
        for line, ends_line in _bounded_lines(f, limit):
            i += 1
            if not ends_line and len(line) == limit:
                _skip_rest_of_line(f, limit)
                yield i, None, REJECT_LINE_TOO_LONG
                continue
            if not line.strip():
                continue
            try:
                yield i, json.loads(line), ""
            except json.JSONDecodeError:
                # Undecodable bytes inside a JSON line show up as lone surrogates,
                # which json accepts; a line json rejects is not JSON.
                yield i, None, REJECT_INVALID_JSON


def _read_jsonl(path: str, source: str, config: DataConfig) -> Iterator[Document]:
    field = config.jsonl_text_field
    for i, obj, reason in _jsonl_objects(path, config):
        if reason:
            yield Document("", source, i, reason)
        elif not isinstance(obj, dict) or field not in obj or obj[field] is None:
            yield Document("", source, i, REJECT_MISSING_TEXT_FIELD)
        elif not isinstance(obj[field], str):
            yield Document("", source, i, REJECT_TEXT_NOT_STRING)
        else:
            yield Document(obj[field], source, i)


def _csv_rows(path: str, config: DataConfig,
              check_header) -> Iterator[tuple[int, list[str], list | None, str]]:
    """(record, header, row, "") per CSV row, or (record, header, None, reason).
    `check_header(header)` runs once, before any row (it raises on an unusable one).

    Raises:
      ValueError: the header cannot be parsed.
    """
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
        check_header(header)
        row_number = -1
        while True:
            row_number += 1
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                reason = REJECT_LINE_TOO_LONG if "field larger" in str(e) else REJECT_INVALID_CSV
                yield row_number, header, None, reason
                continue
            if not row:
                row_number -= 1  # csv skips nothing: an empty line is no record
                continue
            yield row_number, header, row, ""


def _read_csv(path: str, source: str, config: DataConfig) -> Iterator[Document]:
    column = config.csv_text_column

    def check_header(header: list[str]) -> None:
        if column not in header:
            raise ValueError(
                f"{path}: no column '{column}' in the CSV header {header[:20]} "
                "(set data.csv_text_column)")

    for row_number, header, row, reason in _csv_rows(path, config, check_header):
        if reason:
            yield Document("", source, row_number, reason)
        elif header.index(column) >= len(row):
            yield Document("", source, row_number, REJECT_MISSING_TEXT_FIELD)
        else:
            yield Document(row[header.index(column)], source, row_number)


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


# ----------------------------------------------------------------------------- SFT records


def _sft_reject(source: str, record: int, reason: str) -> Document:
    return Document("", source, record, reason, prompt="")


def _valid_messages(messages: Any) -> bool:
    return (isinstance(messages, list) and len(messages) >= 2
            and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in messages)
            and messages[-1]["role"] == "assistant")


def sft_document(obj: Any, source: str, record: int, config: DataConfig,
                 chat: ChatFormat) -> Document:
    """One SFT record (a parsed JSON object, CSV row or Parquet row) -> Document.

    With `config.messages_field` present (not null), the record is a chat: its
    last message is the response and the turns before it the prompt. Otherwise
    `config.prompt_field` is one user turn and `config.response_field` the
    response. Contents are normalized (`config.normalization`) before the turns
    are rendered with `chat`.

    Returns:
      `Document(text=response, prompt=rendered prompt)`, or a rejected one
      (`prompt=""`) with one of the SFT reject reasons of this module.
    """
    from corpus.cleaning import normalize

    if not isinstance(obj, dict):
        return _sft_reject(source, record, REJECT_NOT_AN_OBJECT)
    form = config.normalization
    messages = obj.get(config.messages_field)
    if messages is not None:
        if not _valid_messages(messages):
            return _sft_reject(source, record, REJECT_INVALID_MESSAGES)
        turns = [dict(m, content=normalize(m["content"], form)) for m in messages]
        turns, response = turns[:-1], turns[-1]["content"]
        raw = [m["content"] for m in messages]
    else:
        prompt, response = obj.get(config.prompt_field), obj.get(config.response_field)
        if prompt is None:
            return _sft_reject(source, record, REJECT_MISSING_PROMPT_FIELD)
        if response is None:
            return _sft_reject(source, record, REJECT_MISSING_RESPONSE_FIELD)
        if not isinstance(prompt, str):
            return _sft_reject(source, record, REJECT_PROMPT_NOT_STRING)
        if not isinstance(response, str):
            return _sft_reject(source, record, REJECT_RESPONSE_NOT_STRING)
        if not prompt.strip():
            return _sft_reject(source, record, REJECT_EMPTY_PROMPT)
        raw = [prompt, response]
        turns = [{"role": "user", "content": normalize(prompt, form)}]
        response = normalize(response, form)
    if not response.strip():
        return _sft_reject(source, record, REJECT_EMPTY_RESPONSE)
    try:
        rendered = chat.render(turns)
    except ChatTemplateLimitError:
        return _sft_reject(source, record, REJECT_CHAT_TEMPLATE_LIMIT)
    except ChatTemplateError:
        return _sft_reject(source, record, REJECT_CHAT_TEMPLATE)
    changed = [m["content"] for m in turns] + [response] != raw
    return Document(response, source, record, repairs=(REPAIR_NORMALIZED,) if changed else (),
                    prompt=rendered)


def _read_jsonl_sft(path: str, source: str, config: DataConfig,
                    chat: ChatFormat) -> Iterator[Document]:
    for i, obj, reason in _jsonl_objects(path, config):
        yield _sft_reject(source, i, reason) if reason else sft_document(obj, source, i, config,
                                                                          chat)


def _sft_columns(path: str, names: list[str], config: DataConfig, kind: str) -> list[str]:
    """The SFT columns a CSV header / Parquet schema has; raises ValueError if unusable."""
    wanted = [config.prompt_field, config.response_field, config.messages_field]
    have = [c for c in wanted if c in names]
    if config.messages_field not in have and len(have) < 2:
        raise ValueError(
            f"{path}: the {kind} has neither the columns '{config.prompt_field}' and "
            f"'{config.response_field}' nor '{config.messages_field}' (it has {names[:20]}; "
            "set data.prompt_field, data.response_field or data.messages_field)")
    return have


def _read_csv_sft(path: str, source: str, config: DataConfig,
                  chat: ChatFormat) -> Iterator[Document]:
    """CSV rows; a messages column holds the chat as JSON text."""
    columns: list[str] = []

    def check_header(header: list[str]) -> None:
        columns.extend(_sft_columns(path, header, config, "CSV header"))

    for row_number, header, row, reason in _csv_rows(path, config, check_header):
        if reason:
            yield _sft_reject(source, row_number, reason)
            continue
        obj = {c: row[header.index(c)] for c in columns if header.index(c) < len(row)}
        if obj.get(config.messages_field, "") == "":
            obj.pop(config.messages_field, None)
        else:
            try:
                obj[config.messages_field] = json.loads(obj[config.messages_field])
            except json.JSONDecodeError:
                yield _sft_reject(source, row_number, REJECT_INVALID_MESSAGES)
                continue
        yield sft_document(obj, source, row_number, config, chat)


def _read_parquet_sft(path: str, source: str, config: DataConfig,
                      chat: ChatFormat) -> Iterator[Document]:
    """Parquet rows; a messages column is a list of {role, content} structs."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(path if "://" not in path else tf.io.gfile.GFile(path, "rb"))
    try:
        columns = _sft_columns(path, parquet.schema_arrow.names, config, "Parquet schema")
        row = 0
        for batch in parquet.iter_batches(batch_size=1024, columns=columns):
            for obj in batch.to_pylist():
                yield sft_document(obj, source, row, config, chat)
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


def document_to_example(doc: Document) -> tf.train.Example:
    """The tf.Example of a document: `text`, `source`, `source_name`, `record`,
    `reject_reason`, `repairs` (one value each); with a `prompt` feature when `doc.prompt`
    is not None."""
    feature = {
        "text": _bytes_feature(doc.text.encode("utf-8")),
        "source": _bytes_feature(doc.source.encode("utf-8")),
        "source_name": _bytes_feature(doc.source_name.encode("utf-8")),
        "record": tf.train.Feature(int64_list=tf.train.Int64List(value=[doc.record])),
        "reject_reason": _bytes_feature(doc.reject_reason.encode("utf-8")),
        "repairs": _bytes_feature(",".join(doc.repairs).encode("utf-8")),
    }
    if doc.prompt is not None:
        feature["prompt"] = _bytes_feature(doc.prompt.encode("utf-8"))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def _bytes_feature(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
