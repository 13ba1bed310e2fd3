"""What reading a file yields: the `Document` (one record, with its reject reason and
repairs) and the names of the reject reasons and repairs that the cleaner counts
(their meaning: `corpus/documents.py`).
"""

from __future__ import annotations

import dataclasses

from config import DEFAULT_SOURCE

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

