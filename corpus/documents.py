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

This module picks the reader and names the outcomes; the `Document` and its reasons are
`corpus/document_record.py`'s, the readers of each format `corpus/file_readers.py`'s, the
SFT, DPO and GRPO records `corpus/chat_records.py`'s.
"""

from __future__ import annotations

import functools
import gzip
from collections.abc import Iterator

import tensorflow as tf

from common.files import special_file_kind
from config import DEFAULT_SOURCE, DataConfig
from corpus.chat_records import dpo_document, grpo_document, sft_document
from corpus.document_record import (
    RECORD_TASKS,
    REJECT_ANSWER_NOT_STRING,
    REJECT_CHAT_TEMPLATE,
    REJECT_CHAT_TEMPLATE_LIMIT,
    REJECT_CHOSEN_EQUALS_REJECTED,
    REJECT_CHOSEN_NOT_STRING,
    REJECT_EMPTY_ANSWER,
    REJECT_EMPTY_CHOSEN,
    REJECT_EMPTY_FILE,
    REJECT_EMPTY_PROMPT,
    REJECT_EMPTY_REJECTED,
    REJECT_EMPTY_RESPONSE,
    REJECT_INVALID_CSV,
    REJECT_INVALID_JSON,
    REJECT_INVALID_MESSAGES,
    REJECT_INVALID_UTF8,
    REJECT_LINE_TOO_LONG,
    REJECT_MISSING_ANSWER_FIELD,
    REJECT_MISSING_CHOSEN_FIELD,
    REJECT_MISSING_PROMPT_FIELD,
    REJECT_MISSING_REJECTED_FIELD,
    REJECT_MISSING_RESPONSE_FIELD,
    REJECT_MISSING_TEXT_FIELD,
    REJECT_NOT_AN_OBJECT,
    REJECT_NOT_REGULAR_FILE,
    REJECT_PROMPT_NOT_STRING,
    REJECT_REJECTED_NOT_STRING,
    REJECT_RESPONSE_NOT_STRING,
    REJECT_TEXT_NOT_STRING,
    REPAIR_INVALID_UTF8,
    REPAIR_NORMALIZED,
    REPAIR_SPLIT,
    TRL_PROMPT_FIELD,
    Document,
)
from corpus.file_readers import (
    apply_utf8_policy,
    read_csv,
    read_csv_records,
    read_jsonl,
    read_jsonl_records,
    read_parquet,
    read_parquet_records,
    read_text,
    record_fields,
    reject_for,
    with_source_name,
)
from tokenization.chat_template import ChatFormat, chat_format

# The names of this room, with those it re-exports from its siblings (the record and
# its reasons: `document_record`; the SFT, DPO and GRPO records: `chat_records`).
__all__ = [
    "REJECT_INVALID_JSON", "REJECT_INVALID_CSV", "REJECT_MISSING_TEXT_FIELD",
    "REJECT_TEXT_NOT_STRING", "REJECT_INVALID_UTF8", "REJECT_LINE_TOO_LONG",
    "REJECT_EMPTY_FILE", "REJECT_NOT_REGULAR_FILE", "REJECT_NOT_AN_OBJECT",
    "REJECT_MISSING_PROMPT_FIELD", "REJECT_MISSING_RESPONSE_FIELD", "REJECT_PROMPT_NOT_STRING",
    "REJECT_RESPONSE_NOT_STRING", "REJECT_EMPTY_PROMPT", "REJECT_EMPTY_RESPONSE",
    "REJECT_INVALID_MESSAGES", "REJECT_CHAT_TEMPLATE", "REJECT_CHAT_TEMPLATE_LIMIT",
    "REJECT_MISSING_CHOSEN_FIELD", "REJECT_MISSING_REJECTED_FIELD", "REJECT_CHOSEN_NOT_STRING",
    "REJECT_REJECTED_NOT_STRING", "REJECT_EMPTY_CHOSEN", "REJECT_EMPTY_REJECTED",
    "REJECT_CHOSEN_EQUALS_REJECTED", "REJECT_MISSING_ANSWER_FIELD", "REJECT_ANSWER_NOT_STRING",
    "REJECT_EMPTY_ANSWER", "RECORD_TASKS", "TRL_PROMPT_FIELD", "REPAIR_INVALID_UTF8",
    "REPAIR_NORMALIZED", "REPAIR_SPLIT", "Document", "dpo_document", "grpo_document",
    "sft_document", "file_format", "is_jsonl", "read_documents", "split_text",
    "document_to_example",
]


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
    named = functools.partial(with_source_name, source_name=source_name)
    if special_file_kind(path):  # os.stat only: a FIFO's open() would wait for a writer
        yield named(reject_for(config, source, 0, REJECT_NOT_REGULAR_FILE))
        return
    fmt = "jsonl" if config.document_boundary == "jsonl" else file_format(path)
    if records and fmt == "text":
        raise ValueError(
            f"{path}: data.task={config.task} reads records from JSONL, CSV or Parquet files "
            f"(with {record_fields(config)}), not plain text; remove the file or rename it")
    if records:
        chat = chat or chat_format(config)
        readers = {"jsonl": read_jsonl_records, "csv": read_csv_records,
                   "parquet": read_parquet_records}
        read = functools.partial(readers[fmt], chat=chat)
    else:
        read = {"jsonl": read_jsonl, "csv": read_csv, "parquet": read_parquet,
                "text": read_text}[fmt]
    count = 0
    try:
        for doc in read(path, source, config):
            count += 1
            yield named(apply_utf8_policy(doc, config.invalid_utf8))
    except (OSError, tf.errors.OpError, EOFError, gzip.BadGzipFile) as e:
        raise OSError(f"{path}: cannot read: {e}") from e
    if count == 0:
        yield named(reject_for(config, source, 0, REJECT_EMPTY_FILE))


# ----------------------------------------------------------------------------- SFT records


# ----------------------------------------------------------------------------- DPO and GRPO records


# ----------------------------------------------------------------------------- record files


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
