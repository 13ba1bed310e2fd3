"""Document cleaning rules, one function each, free of Beam and TFX.

`clean_document` applies, in order: the upstream reject reason (from ExampleGen),
Unicode normalization, control-character removal, the empty / length filters.
Exact de-duplication needs the whole corpus and lives in the Beam pipeline
(`executor.py`), keyed by `content_key`.

Every decision has a reason name; the executor counts them so that
records read = records kept + records dropped, per split and in total.
"""

from __future__ import annotations

import hashlib
import unicodedata

from pipeline.configs import DataConfig

KEPT = "kept"
DROP_EMPTY = "empty"
DROP_TOO_SHORT = "too_short"
DROP_TOO_LONG = "too_long"
DROP_EXACT_DUPLICATE = "exact_duplicate"

# Control characters (Unicode category Cc) other than these are removed.
_KEPT_CONTROL_CHARS = frozenset("\n\t")


def remove_control_characters(text: str) -> str:
    """Drops category-Cc characters except newline and tab (so NUL, \\r, \\x1b... go)."""
    if text.isprintable():
        return text
    return "".join(
        ch for ch in text if ch in _KEPT_CONTROL_CHARS or unicodedata.category(ch) != "Cc"
    )


def normalize(text: str, form: str) -> str:
    """Unicode normalization (`NFC`, `NFKC`, or `none`)."""
    return text if form == "none" else unicodedata.normalize(form, text)


def clean_document(text: str, reject_reason: str, config: DataConfig) -> tuple[str, str]:
    """Cleans one document.

    Args:
      text: the document as read.
      reject_reason: "" or the reason ExampleGen could not use the record.
      config: the data section of the pipeline config.

    Returns:
      `(cleaned_text, KEPT)` or `("", reason)`.
    """
    if reject_reason:
        return "", reject_reason
    text = remove_control_characters(normalize(text, config.normalization))
    if not text.strip():
        return "", DROP_EMPTY
    n = len(text)
    if n < config.min_chars:
        return "", DROP_TOO_SHORT
    if n > config.max_chars:
        return "", DROP_TOO_LONG
    return text, KEPT


def content_key(text: str) -> bytes:
    """Exact-duplicate key of a cleaned document."""
    return hashlib.sha256(text.encode("utf-8")).digest()
