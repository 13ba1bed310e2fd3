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

Preference optimization (`data.task = "dpo"`) and GRPO (`data.task = "grpo"`) read
records the same way, from the same formats (`dpo_document`, `grpo_document`). The
prompt is `data.prompt_field` or, when the record has no such key, the key "prompt"
(TRL's name for it), one user turn; or `data.messages_field`, a chat that is the
whole prompt (at least one turn, the last one not the assistant's). A DPO record
adds the responses `data.chosen_field` and `data.rejected_field`: the `Document`
holds the chosen response as `text`, the rejected one as `rejected`. A GRPO record
adds the reference answer `data.answer_field`, held as `text`. Both are normalized
like an SFT response. Their reject reasons are the prompt's (`missing_prompt_field`,
`prompt_not_string`, `empty_prompt`, `invalid_messages`, `chat_template_error`,
`chat_template_limit`, `record_not_object`) and, for DPO, `missing_chosen_field`,
`missing_rejected_field`, `chosen_not_string`, `rejected_not_string`,
`empty_chosen`, `empty_rejected`, `chosen_equals_rejected` (equal after
normalization); for GRPO, `missing_answer_field`, `answer_not_string`, `empty_answer`.

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
# Preference (DPO) records.
REJECT_MISSING_CHOSEN_FIELD = "missing_chosen_field"
REJECT_MISSING_REJECTED_FIELD = "missing_rejected_field"
REJECT_CHOSEN_NOT_STRING = "chosen_not_string"
REJECT_REJECTED_NOT_STRING = "rejected_not_string"
REJECT_EMPTY_CHOSEN = "empty_chosen"
REJECT_EMPTY_REJECTED = "empty_rejected"
REJECT_CHOSEN_EQUALS_REJECTED = "chosen_equals_rejected"
# GRPO records.
REJECT_MISSING_ANSWER_FIELD = "missing_answer_field"
REJECT_ANSWER_NOT_STRING = "answer_not_string"
REJECT_EMPTY_ANSWER = "empty_answer"

# The tasks whose records have a prompt (read by `read_documents` as records, never as
# plain text); a DPO or GRPO record without `data.prompt_field` has it here (TRL's key).
RECORD_TASKS = ("sft", "dpo", "grpo")
TRL_PROMPT_FIELD = "prompt"

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
      prompt: None for a pretraining document; for an SFT, DPO or GRPO record, the
        rendered prompt ("" when rejected), and `text` is the response (SFT), the
        chosen response (DPO) or the reference answer (GRPO).
      source_name: the mixture source it belongs to (`data.sources`), "default" in
        the one-source case; a document is identified by (source_name, source, record).
      rejected: None but for a DPO record: its rejected response ("" when rejected).
    """

    text: str
    source: str
    record: int
    reject_reason: str = ""
    repairs: tuple[str, ...] = ()
    prompt: str | None = None
    source_name: str = DEFAULT_SOURCE
    rejected: str | None = None


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


def read_documents(path: str, source: str, config: DataConfig | None = None,
                   chat: ChatFormat | None = None,
                   source_name: str = DEFAULT_SOURCE) -> Iterator[Document]:
    """Streams the documents (or, with `data.task` "sft", "dpo" or "grpo", the records)
    of one file.

    Args:
      path: file to read (local or any tf.io.gfile filesystem).
      source: the name recorded in each document (e.g. path relative to the input).
      config: the data section of the pipeline config (boundary, text fields,
        invalid-UTF-8 policy, max_chars, task); defaults to `DataConfig()`.
      chat: the chat template and special tokens of an SFT, DPO or GRPO run; default
        `chat_template.chat_format(config)` (the learned tokenizer's tokens).
      source_name: the mixture source the file belongs to, set on every document
        (`config` is then that source's `data.for_source(source_name)`).

    Yields:
      Document, in file order; at least one per file (`empty_file`); one
      `not_a_regular_file` record, without opening it, for a FIFO, device or socket. SFT,
      DPO and GRPO records have `prompt` set (a string, "" when rejected), DPO records
      `rejected` too.

    Raises:
      OSError: the file cannot be opened or read (the message names it).
      ValueError: a CSV/Parquet file has no such column (names file and column);
        an SFT, DPO or GRPO run given a plain-text file (names it).
    """
    config = config or DataConfig()
    records = config.task in RECORD_TASKS
    named = functools.partial(_named, source_name=source_name)
    if special_file_kind(path):  # os.stat only: a FIFO's open() would wait for a writer
        yield named(_reject_for(config, source, 0, REJECT_NOT_REGULAR_FILE))
        return
    fmt = "jsonl" if config.document_boundary == "jsonl" else file_format(path)
    if records and fmt == "text":
        raise ValueError(
            f"{path}: data.task={config.task} reads records from JSONL, CSV or Parquet files "
            f"(with {_record_fields(config)}), not plain text; remove the file or rename it")
    if records:
        chat = chat or chat_format(config)
        readers = {"jsonl": _read_jsonl_records, "csv": _read_csv_records,
                   "parquet": _read_parquet_records}
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
        yield named(_reject_for(config, source, 0, REJECT_EMPTY_FILE))


def _reject_for(config: DataConfig, source: str, record: int, reason: str) -> Document:
    """A rejected record of `config.task`'s form: a document, or a record with `prompt`
    "" (and `rejected` "" for DPO), so that every example has the schema's features."""
    if config.task not in RECORD_TASKS:
        return Document("", source, record, reason)
    return _record_reject(config.task, source, record, reason)


def _record_fields(config: DataConfig) -> str:
    """The fields a record of `config.task` needs, as an error message names them."""
    if config.task == "sft":
        return (f"'{config.prompt_field}'/'{config.response_field}' or "
                f"'{config.messages_field}'")
    prompt = (f"'{config.prompt_field}' (or '{TRL_PROMPT_FIELD}') or "
              f"'{config.messages_field}'")
    if config.task == "dpo":
        return f"{prompt}, '{config.chosen_field}' and '{config.rejected_field}'"
    return f"{prompt} and '{config.answer_field}'"


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


def _record_reject(task: str, source: str, record: int, reason: str) -> Document:
    """A rejected SFT/GRPO record (`prompt` ""), or DPO record (`prompt`, `rejected` "")."""
    return Document("", source, record, reason, prompt="",
                    rejected="" if task == "dpo" else None)


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


# ----------------------------------------------------------------------------- DPO and GRPO records


def _prompt_turns(obj: dict, config: DataConfig) -> tuple[list[dict], list[str], str]:
    """The prompt of a DPO or GRPO record: (normalized turns, their raw contents, "") or
    ([], [], reject reason). `config.messages_field` (the whole chat) wins when present;
    else `config.prompt_field`, or "prompt" when the record has no such key."""
    from corpus.cleaning import normalize

    form = config.normalization
    messages = obj.get(config.messages_field)
    if messages is not None:
        if not (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                        and isinstance(m.get("content"), str) for m in messages)
                and messages[-1]["role"] != "assistant"):
            return [], [], REJECT_INVALID_MESSAGES
        turns = [dict(m, content=normalize(m["content"], form)) for m in messages]
        return turns, [m["content"] for m in messages], ""
    field = config.prompt_field if config.prompt_field in obj else TRL_PROMPT_FIELD
    prompt = obj.get(field)
    if prompt is None:
        return [], [], REJECT_MISSING_PROMPT_FIELD
    if not isinstance(prompt, str):
        return [], [], REJECT_PROMPT_NOT_STRING
    if not prompt.strip():
        return [], [], REJECT_EMPTY_PROMPT
    return [{"role": "user", "content": normalize(prompt, form)}], [prompt], ""


def _responses(obj: dict, config: DataConfig,
               fields: tuple[tuple[str, str, str, str], ...]) -> tuple[list[str], list[str], str]:
    """The response strings of a record: (normalized, raw, "") or ([], [], reason).
    `fields`: (field, missing reason, not-a-string reason, empty reason) per response,
    each check over all of them before the next."""
    from corpus.cleaning import normalize

    values = [obj.get(field) for field, _, _, _ in fields]
    for value, (_, missing, _, _) in zip(values, fields, strict=True):
        if value is None:
            return [], [], missing
    for value, (_, _, not_string, _) in zip(values, fields, strict=True):
        if not isinstance(value, str):
            return [], [], not_string
    normalized = [normalize(v, config.normalization) for v in values]
    for value, (_, _, _, empty) in zip(normalized, fields, strict=True):
        if not value.strip():
            return [], [], empty
    return normalized, values, ""


def _rendered(turns: list[dict], chat: ChatFormat) -> tuple[str, str]:
    """(the prompt rendered by the chat template, "") or ("", reject reason)."""
    try:
        return chat.render(turns), ""
    except ChatTemplateLimitError:
        return "", REJECT_CHAT_TEMPLATE_LIMIT
    except ChatTemplateError:
        return "", REJECT_CHAT_TEMPLATE


def dpo_document(obj: Any, source: str, record: int, config: DataConfig,
                 chat: ChatFormat) -> Document:
    """One DPO record (a parsed JSON object, CSV row or Parquet row) -> Document.

    The prompt is `config.messages_field` (a chat whose last turn is not the
    assistant's), else `config.prompt_field` (or "prompt", TRL's key, when the record
    has no such key) as one user turn; `config.chosen_field` and
    `config.rejected_field` are the two responses. Contents are normalized
    (`config.normalization`) before the turns are rendered with `chat`.

    Returns:
      `Document(text=chosen, prompt=rendered prompt, rejected=rejected)`, or a
      rejected one (`text`, `prompt`, `rejected` all "") with one of the DPO reject
      reasons of this module (the chosen and rejected responses equal after
      normalization: `chosen_equals_rejected`).
    """
    if not isinstance(obj, dict):
        return _record_reject("dpo", source, record, REJECT_NOT_AN_OBJECT)
    turns, raw, reason = _prompt_turns(obj, config)
    responses, raw_responses, rendered = [], [], ""
    if not reason:
        responses, raw_responses, reason = _responses(obj, config, (
            (config.chosen_field, REJECT_MISSING_CHOSEN_FIELD, REJECT_CHOSEN_NOT_STRING,
             REJECT_EMPTY_CHOSEN),
            (config.rejected_field, REJECT_MISSING_REJECTED_FIELD, REJECT_REJECTED_NOT_STRING,
             REJECT_EMPTY_REJECTED)))
    if not reason and responses[0] == responses[1]:
        reason = REJECT_CHOSEN_EQUALS_REJECTED
    if not reason:
        rendered, reason = _rendered(turns, chat)
    if reason:
        return _record_reject("dpo", source, record, reason)
    chosen, rejected = responses
    changed = [m["content"] for m in turns] + responses != raw + raw_responses
    return Document(chosen, source, record, repairs=(REPAIR_NORMALIZED,) if changed else (),
                    prompt=rendered, rejected=rejected)


def grpo_document(obj: Any, source: str, record: int, config: DataConfig,
                  chat: ChatFormat) -> Document:
    """One GRPO record (a parsed JSON object, CSV row or Parquet row) -> Document.

    The prompt as in `dpo_document`; `config.answer_field` is the reference answer,
    normalized like a response.

    Returns:
      `Document(text=answer, prompt=rendered prompt)`, or a rejected one (`prompt=""`)
      with one of the GRPO reject reasons of this module.
    """
    if not isinstance(obj, dict):
        return _record_reject("grpo", source, record, REJECT_NOT_AN_OBJECT)
    turns, raw, reason = _prompt_turns(obj, config)
    answers, raw_answers, rendered = [], [], ""
    if not reason:
        answers, raw_answers, reason = _responses(obj, config, (
            (config.answer_field, REJECT_MISSING_ANSWER_FIELD, REJECT_ANSWER_NOT_STRING,
             REJECT_EMPTY_ANSWER),))
    if not reason:
        rendered, reason = _rendered(turns, chat)
    if reason:
        return _record_reject("grpo", source, record, reason)
    changed = [m["content"] for m in turns] + answers != raw + raw_answers
    return Document(answers[0], source, record,
                    repairs=(REPAIR_NORMALIZED,) if changed else (), prompt=rendered)


# ----------------------------------------------------------------------------- record files


_RECORD_DOCUMENTS = {"sft": sft_document, "dpo": dpo_document, "grpo": grpo_document}


def _read_jsonl_records(path: str, source: str, config: DataConfig,
                        chat: ChatFormat) -> Iterator[Document]:
    document = _RECORD_DOCUMENTS[config.task]
    for i, obj, reason in _jsonl_objects(path, config):
        yield (_record_reject(config.task, source, i, reason) if reason
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
                         f"{_record_fields(config)} (it has {names[:20]}; set {settings})")
    return have


def _read_csv_records(path: str, source: str, config: DataConfig,
                      chat: ChatFormat) -> Iterator[Document]:
    """CSV rows; a messages column holds the chat as JSON text."""
    columns: list[str] = []
    document = _RECORD_DOCUMENTS[config.task]

    def check_header(header: list[str]) -> None:
        columns.extend(_record_columns(path, header, config, "CSV header"))

    for row_number, header, row, reason in _csv_rows(path, config, check_header):
        if reason:
            yield _record_reject(config.task, source, row_number, reason)
            continue
        obj = {c: row[header.index(c)] for c in columns if header.index(c) < len(row)}
        if obj.get(config.messages_field, "") == "":
            obj.pop(config.messages_field, None)
        else:
            try:
                obj[config.messages_field] = json.loads(obj[config.messages_field])
            except json.JSONDecodeError:
                yield _record_reject(config.task, source, row_number, REJECT_INVALID_MESSAGES)
                continue
        yield document(obj, source, row_number, config, chat)


def _read_parquet_records(path: str, source: str, config: DataConfig,
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
    is not None, and a `rejected` feature when `doc.rejected` is not None (DPO)."""
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
    if doc.rejected is not None:
        feature["rejected"] = _bytes_feature(doc.rejected.encode("utf-8"))
    return tf.train.Example(features=tf.train.Features(feature=feature))


def _bytes_feature(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
