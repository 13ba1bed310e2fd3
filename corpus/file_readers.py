"""The readers of each file format (plain text, JSONL, CSV, Parquet), as documents or as
records of a task with a prompt: streamed in bounded pieces, with the invalid-UTF-8
policy applied (the formats and their limits: `corpus/documents.py`).
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import json
from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from config import DataConfig
from corpus.chat_records import dpo_document, grpo_document, record_reject, sft_document
from corpus.document_record import (
    RECORD_TASKS,
    REJECT_INVALID_CSV,
    REJECT_INVALID_JSON,
    REJECT_INVALID_MESSAGES,
    REJECT_INVALID_UTF8,
    REJECT_LINE_TOO_LONG,
    REJECT_MISSING_TEXT_FIELD,
    REJECT_TEXT_NOT_STRING,
    REPAIR_INVALID_UTF8,
    REPAIR_SPLIT,
    TRL_PROMPT_FIELD,
    Document,
)
from tokenization.chat_template import ChatFormat

_SURROGATE_LOW, _SURROGATE_HIGH = "\udc80", "\udcff"  # undecodable bytes (surrogateescape)


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


def apply_utf8_policy(doc: Document, policy: str) -> Document:
    if doc.reject_reason or not any(text and _has_invalid_bytes(text)
                                    for text in (doc.text, doc.prompt, doc.rejected)):
        return doc
    if policy == "reject":
        return dataclasses.replace(doc, text="", reject_reason=REJECT_INVALID_UTF8,
                                   prompt=None if doc.prompt is None else "",
                                   rejected=None if doc.rejected is None else "")

    def replaced(text: str | None) -> str | None:
        if text is None:
            return None
        return "".join("\ufffd" if _SURROGATE_LOW <= ch <= _SURROGATE_HIGH else ch
                       for ch in text)

    return dataclasses.replace(
        doc, text=replaced(doc.text), repairs=doc.repairs + (REPAIR_INVALID_UTF8,),
        prompt=replaced(doc.prompt), rejected=replaced(doc.rejected))


def reject_for(config: DataConfig, source: str, record: int, reason: str) -> Document:
    """A rejected record of `config.task`'s form: a document, or a record with `prompt`
    "" (and `rejected` "" for DPO), so that every example has the schema's features."""
    if config.task not in RECORD_TASKS:
        return Document("", source, record, reason)
    return record_reject(config.task, source, record, reason)


def record_fields(config: DataConfig) -> str:
    """The fields a record of `config.task` needs, as an error message names them."""
    if config.task == "sft":
        return (f"'{config.prompt_field}'/'{config.response_field}' or "
                f"'{config.messages_field}'")
    prompt = (f"'{config.prompt_field}' (or '{TRL_PROMPT_FIELD}') or "
              f"'{config.messages_field}'")
    if config.task == "dpo":
        return f"{prompt}, '{config.chosen_field}' and '{config.rejected_field}'"
    return f"{prompt} and '{config.answer_field}'"


def with_source_name(doc: Document, source_name: str) -> Document:
    return doc if doc.source_name == source_name else dataclasses.replace(
        doc, source_name=source_name)


def _bounded_lines(f, limit: int) -> Iterator[tuple[str, bool]]:
    """Yields (piece, ends_line) with pieces of at most `limit` characters."""
    while True:
        piece = f.readline(limit)
        if not piece:
            return
        yield piece, piece.endswith("\n")


def read_text(path: str, source: str, config: DataConfig) -> Iterator[Document]:
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


def read_jsonl(path: str, source: str, config: DataConfig) -> Iterator[Document]:
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


def read_csv(path: str, source: str, config: DataConfig) -> Iterator[Document]:
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


def read_parquet(path: str, source: str, config: DataConfig) -> Iterator[Document]:
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


_RECORD_DOCUMENTS = {"sft": sft_document, "dpo": dpo_document, "grpo": grpo_document}


def read_jsonl_records(path: str, source: str, config: DataConfig,
                        chat: ChatFormat) -> Iterator[Document]:
    document = _RECORD_DOCUMENTS[config.task]
    for i, obj, reason in _jsonl_objects(path, config):
        yield (record_reject(config.task, source, i, reason) if reason
               else document(obj, source, i, config, chat))


def _record_columns(path: str, names: list[str], config: DataConfig, kind: str) -> list[str]:
    """The record columns a CSV header / Parquet schema has (of `config.task`'s
    fields); raises ValueError if unusable."""
    if config.task == "sft":
        wanted = [config.prompt_field, config.response_field, config.messages_field]
        have = [c for c in wanted if c in names]
        if config.messages_field not in have and len(have) < 2:
            raise ValueError(
                f"{path}: the {kind} has neither the columns '{config.prompt_field}' and "
                f"'{config.response_field}' nor '{config.messages_field}' (it has "
                f"{names[:20]}; set data.prompt_field, data.response_field or "
                "data.messages_field)")
        return have
    prompts = list(dict.fromkeys([config.prompt_field, TRL_PROMPT_FIELD, config.messages_field]))
    responses = ([config.chosen_field, config.rejected_field] if config.task == "dpo"
                 else [config.answer_field])
    have = [c for c in dict.fromkeys(prompts + responses) if c in names]
    if not any(c in have for c in prompts) or not all(c in have for c in responses):
        settings = "data.prompt_field, data.messages_field, " + (
            "data.chosen_field, data.rejected_field" if config.task == "dpo"
            else "data.answer_field")
        raise ValueError(f"{path}: the {kind} lacks the columns of a {config.task} record: "
                         f"{record_fields(config)} (it has {names[:20]}; set {settings})")
    return have


def read_csv_records(path: str, source: str, config: DataConfig,
                      chat: ChatFormat) -> Iterator[Document]:
    """CSV rows; a messages column holds the chat as JSON text."""
    columns: list[str] = []
    document = _RECORD_DOCUMENTS[config.task]

    def check_header(header: list[str]) -> None:
        columns.extend(_record_columns(path, header, config, "CSV header"))

    for row_number, header, row, reason in _csv_rows(path, config, check_header):
        if reason:
            yield record_reject(config.task, source, row_number, reason)
            continue
        obj = {c: row[header.index(c)] for c in columns if header.index(c) < len(row)}
        if obj.get(config.messages_field, "") == "":
            obj.pop(config.messages_field, None)
        else:
            try:
                obj[config.messages_field] = json.loads(obj[config.messages_field])
            except json.JSONDecodeError:
                yield record_reject(config.task, source, row_number, REJECT_INVALID_MESSAGES)
                continue
        yield document(obj, source, row_number, config, chat)


def read_parquet_records(path: str, source: str, config: DataConfig,
                          chat: ChatFormat) -> Iterator[Document]:
    """Parquet rows; a messages column is a list of {role, content} structs."""
    import pyarrow.parquet as pq

    document = _RECORD_DOCUMENTS[config.task]
    parquet = pq.ParquetFile(path if "://" not in path else tf.io.gfile.GFile(path, "rb"))
    try:
        columns = _record_columns(path, parquet.schema_arrow.names, config, "Parquet schema")
        row = 0
        for batch in parquet.iter_batches(batch_size=1024, columns=columns):
            for obj in batch.to_pylist():
                yield document(obj, source, row, config, chat)
                row += 1
    finally:
        parquet.close()

