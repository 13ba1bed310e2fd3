"""Document cleaning rules, one function each, free of Beam and TFX.

`clean_document` applies, in order: the upstream reject reason (from ExampleGen),
Unicode normalization, control-character removal (NUL bytes counted on their
own), optional redaction of e-mail addresses, phone numbers and IP addresses,
the empty / length filters, and the optional Gopher quality rules. Exact and
near-duplicate removal need the whole corpus and live in the Beam pipeline
(`executor.py`), keyed by `content_key` and by the MinHash bands of
`minhash_signature` / `lsh_bands`.

Every decision has a reason name; the executor counts them so that
records read = records kept + records dropped, per split and in total. Repairs
(changes to a kept document) are counted per kind as well.

References: Gopher quality rules, Rae et al. 2021 (arXiv 2112.11446) appendix
A.1.1; MinHash (Broder 1997) with LSH banding (Leskovec et al., Mining of
Massive Datasets ch. 3), computed with the `datasketch` library.
"""

from __future__ import annotations

import hashlib
import re
import struct
import unicodedata

import numpy as np

from pipeline.configs import DataConfig

KEPT = "kept"
DROP_EMPTY = "empty"
DROP_TOO_SHORT = "too_short"
DROP_TOO_LONG = "too_long"
DROP_EXACT_DUPLICATE = "exact_duplicate"
DROP_NEAR_DUPLICATE = "near_duplicate"
DROP_QUALITY_WORD_COUNT = "quality_word_count"
DROP_QUALITY_MEAN_WORD_LENGTH = "quality_mean_word_length"
DROP_QUALITY_SYMBOL_RATIO = "quality_symbol_word_ratio"
DROP_QUALITY_DUPLICATE_LINES = "quality_duplicate_lines"
DROP_QUALITY_ALPHA_WORDS = "quality_alphabetic_words"

REPAIR_NUL_BYTES = "nul_bytes_removed"
REPAIR_CONTROL_CHARACTERS = "control_characters_removed"
REPAIR_NORMALIZED = "unicode_normalized"

# Control characters (Unicode category Cc) other than these are removed.
_KEPT_CONTROL_CHARS = frozenset("\n\t")

# Redaction patterns: (repair name, placeholder, regex).
_REDACTIONS = (
    ("redacted_email", "<EMAIL>", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}")),
    ("redacted_ip_address", "<IP_ADDRESS>", re.compile(
        r"\b(?:(?:25[0-5]|2[0-4]\d|1?\d?\d)\.){3}(?:25[0-5]|2[0-4]\d|1?\d?\d)\b")),
    ("redacted_phone_number", "<PHONE_NUMBER>", re.compile(
        r"(?<![\w+])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?|\d{2,4}[\s.-])\d{3,4}[\s.-]\d{3,4}\b")),
)
_WORD = re.compile(r"\S+")
_SHINGLE_WORD = re.compile(r"\w+")


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


def redact(text: str) -> tuple[str, list[str]]:
    """Replaces e-mail addresses, IP addresses and phone numbers by placeholders.

    Returns:
      (text, the repair names of the kinds that were found).
    """
    found = []
    for name, placeholder, pattern in _REDACTIONS:
        text, n = pattern.subn(placeholder, text)
        if n:
            found.append(name)
    return text, found


def quality_reason(text: str, config: DataConfig) -> str:
    """The first Gopher rule the document fails, or "" (Rae et al. 2021, A.1.1).

    Words are whitespace-separated; rules: word count in [min_words, max_words];
    mean word length in [min_mean_word_length, max_mean_word_length]; ('#' +
    '...' + '…') / words <= max_symbol_word_ratio; duplicated lines / lines <=
    max_duplicate_line_fraction; words with a letter / words >= min_alpha_word_fraction.
    """
    words = _WORD.findall(text)
    n = len(words)
    if not config.min_words <= n <= config.max_words:
        return DROP_QUALITY_WORD_COUNT
    mean_length = sum(len(w) for w in words) / n
    if not config.min_mean_word_length <= mean_length <= config.max_mean_word_length:
        return DROP_QUALITY_MEAN_WORD_LENGTH
    symbols = text.count("#") + text.count("...") + text.count("\u2026")
    if symbols / n > config.max_symbol_word_ratio:
        return DROP_QUALITY_SYMBOL_RATIO
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and (len(lines) - len(set(lines))) / len(lines) > config.max_duplicate_line_fraction:
        return DROP_QUALITY_DUPLICATE_LINES
    alpha = sum(1 for w in words if any(ch.isalpha() for ch in w))
    if alpha / n < config.min_alpha_word_fraction:
        return DROP_QUALITY_ALPHA_WORDS
    return ""


def clean_document(text: str, reject_reason: str, config: DataConfig) -> tuple[str, str, list[str]]:
    """Cleans one document.

    Args:
      text: the document as read.
      reject_reason: "" or the reason ExampleGen could not use the record.
      config: the data section of the pipeline config.

    Returns:
      `(cleaned_text, KEPT, repairs)` or `("", reason, repairs)`; `repairs` names
      what was changed (NUL bytes / control characters removed, redactions).
    """
    if reject_reason:
        return "", reject_reason, []
    repairs = []
    normalized = normalize(text, config.normalization)
    if normalized != text:
        repairs.append(REPAIR_NORMALIZED)
    text = remove_control_characters(normalized)
    nul_bytes, removed = normalized.count("\x00"), len(normalized) - len(text)
    if nul_bytes:
        repairs.append(REPAIR_NUL_BYTES)
    if removed > nul_bytes:
        repairs.append(REPAIR_CONTROL_CHARACTERS)
    if config.redact_pii:
        text, found = redact(text)
        repairs += found
    if not text.strip():
        return "", DROP_EMPTY, repairs
    n = len(text)
    if n < config.min_chars:
        return "", DROP_TOO_SHORT, repairs
    if n > config.max_chars:
        return "", DROP_TOO_LONG, repairs
    if config.quality_filter:
        reason = quality_reason(text, config)
        if reason:
            return "", reason, repairs
    return text, KEPT, repairs


def content_key(text: str) -> bytes:
    """Exact-duplicate key of a cleaned document."""
    return hashlib.sha256(text.encode("utf-8")).digest()


# ----------------------------------------------------------------------------- near duplicates


def shingles(text: str, ngram: int) -> set[bytes]:
    """Lower-cased word n-grams (the whole text if it has fewer than n words)."""
    words = _SHINGLE_WORD.findall(text.lower())
    if len(words) < ngram:
        return {" ".join(words).encode("utf-8")}
    return {" ".join(words[i:i + ngram]).encode("utf-8") for i in range(len(words) - ngram + 1)}


def minhash_signature(text: str, num_perm: int, ngram: int) -> np.ndarray:
    """MinHash signature (datasketch, fixed seed), uint32 [num_perm]."""
    from datasketch import MinHash

    m = MinHash(num_perm=num_perm, seed=1)
    m.update_batch(list(shingles(text, ngram)))
    return m.hashvalues.astype(np.uint32)


def lsh_parameters(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands b, rows r) minimizing false positives + negatives at `threshold` (datasketch)."""
    from datasketch import MinHashLSH

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return lsh.b, lsh.r


def lsh_bands(signature: np.ndarray, bands: int, rows: int) -> list[bytes]:
    """One bucket key per band: band index + the band's rows."""
    return [struct.pack("<I", b) + signature[b * rows:(b + 1) * rows].tobytes()
            for b in range(bands)]


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Fraction of equal MinHash values: an unbiased estimate of Jaccard similarity."""
    return float(np.mean(a == b))
