"""Document cleaning rules, one function each, free of Beam and TFX.

`clean_document` applies, in order: the upstream reject reason (from ExampleGen),
Unicode normalization, control-character removal (NUL bytes counted on their
own), optional redaction of e-mail addresses, phone numbers and IP addresses,
the empty / length filters, and the optional Gopher quality rules. Exact and
near-duplicate removal need the whole corpus and live in the Beam pipeline
(`executor.py`), keyed by `content_key` and by the MinHash bands of
`minhash_signature` / `lsh_bands`.

Supervised fine-tuning records (a rendered prompt and a response) go through
`clean_sft_record`: both fields are cleaned alike, the length filters apply to the
whole example, the quality rules to the response, and duplicates are keyed on the
pair (`sft_content_key`, `sft_dedup_text`). GRPO records (a prompt and a reference
answer) are SFT records here. Preference (DPO) records go through `clean_dpo_record`:
the prompt and both responses are cleaned alike, and duplicates are keyed on the
triple (`dpo_content_key`, `dpo_dedup_text`).

Every decision has a reason name; the executor counts them so that
records read = records kept + records dropped, per split and in total. Repairs
(changes to a kept document) are counted per kind as well.

References: Gopher quality rules, Rae et al. 2021 (arXiv 2112.11446) appendix
A.1.1; MinHash (Broder 1997) with LSH banding (Leskovec et al., Mining of
Massive Datasets ch. 3), computed with the `datasketch` library.
"""

from __future__ import annotations

import functools
import hashlib
import re
import struct
import unicodedata
import zlib

import numpy as np

from config import DataConfig
from corpus.words import is_no_space_unit, shingle_units, word_units

KEPT = "kept"
DROP_EMPTY = "empty"
DROP_EMPTY_RESPONSE = "empty_response"  # = text_example_gen.documents.REJECT_EMPTY_RESPONSE
# DPO records; = corpus.documents.REJECT_EMPTY_CHOSEN, _EMPTY_REJECTED, _CHOSEN_EQUALS_REJECTED
DROP_EMPTY_CHOSEN = "empty_chosen"
DROP_EMPTY_REJECTED = "empty_rejected"
DROP_CHOSEN_EQUALS_REJECTED = "chosen_equals_rejected"
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
# Category Cc is exactly U+0000-U+001F and U+007F-U+009F; tab and newline stay.
_REMOVED_CONTROL_CHARS = re.compile("[" + "".join(
    re.escape(chr(c)) for c in [*range(0x20), *range(0x7F, 0xA0)]
    if chr(c) not in _KEPT_CONTROL_CHARS) + "]")
assert all(unicodedata.category(chr(c)) == "Cc" for c in [*range(0x20), *range(0x7F, 0xA0)])


def remove_control_characters(text: str) -> str:
    """Drops category-Cc characters except newline and tab (so NUL, \\r, \\x1b... go)."""
    return _REMOVED_CONTROL_CHARS.sub("", text)


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

    Words are whitespace-separated, and each character of a script written without
    spaces (Chinese, Japanese, Thai, ...) is a word of its own (`words.word_units`);
    rules: word count in [min_words, max_words]; mean word length in
    [min_mean_word_length, max_mean_word_length], over the space-delimited words with a
    letter or digit only (a character of Chinese is one "word" of length 1, which the
    English bounds would reject; the rule is skipped when there are none); ('#' + '...' + '…') / words <=
    max_symbol_word_ratio; duplicated lines / lines <= max_duplicate_line_fraction;
    words with a letter / words >= min_alpha_word_fraction.
    """
    units = word_units(text)
    n = len(units)
    if not config.min_words <= n <= config.max_words:
        return DROP_QUALITY_WORD_COUNT
    spaced = [w for w in units if not is_no_space_unit(w) and any(ch.isalnum() for ch in w)]
    if spaced:
        mean_length = sum(len(w) for w in spaced) / len(spaced)
        if not config.min_mean_word_length <= mean_length <= config.max_mean_word_length:
            return DROP_QUALITY_MEAN_WORD_LENGTH
    symbols = text.count("#") + text.count("...") + text.count("\u2026")
    if symbols / n > config.max_symbol_word_ratio:
        return DROP_QUALITY_SYMBOL_RATIO
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and (len(lines) - len(set(lines))) / len(lines) > config.max_duplicate_line_fraction:
        return DROP_QUALITY_DUPLICATE_LINES
    alpha = sum(1 for w in units if any(ch.isalpha() for ch in w))
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
    text, scrubbed = _scrub(normalized, config.redact_pii)
    repairs += scrubbed
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


def _scrub(text: str, redact_pii: bool) -> tuple[str, list[str]]:
    """`text` without control characters (but newline and tab) and, with `redact_pii`,
    without PII; and the repairs that made."""
    cleaned = remove_control_characters(text)
    repairs = []
    nul_bytes, removed = text.count("\x00"), len(text) - len(cleaned)
    if nul_bytes:
        repairs.append(REPAIR_NUL_BYTES)
    if removed > nul_bytes:
        repairs.append(REPAIR_CONTROL_CHARACTERS)
    if redact_pii:
        cleaned, found = redact(cleaned)
        repairs += found
    return cleaned, repairs


def clean_sft_record(prompt: str, response: str, reject_reason: str,
                     config: DataConfig) -> tuple[str, str, str, list[str]]:
    """Cleans one SFT record (the prompt as rendered by the chat template, the response).

    Both fields lose their control characters (but newline and tab) and, with
    `redact_pii`, their e-mail addresses, IP addresses and phone numbers. The
    response is normalized (`config.normalization`); the prompt is not, as its
    contents were normalized before the chat template rendered them
    (`text_example_gen.documents.sft_document`) and normalizing the rendered text
    could change the template's tokens (NFKC maps DeepSeek's `｜` to `|`). The
    length filters count the characters of prompt + response; the quality rules
    (with `quality_filter`) judge the response.

    Returns:
      `(prompt, response, KEPT, repairs)` or `("", "", reason, repairs)`; reasons
      as `clean_document`'s, with `empty_response` for a response left empty.
    """
    if reject_reason:
        return "", "", reject_reason, []
    repairs: list[str] = []
    normalized = normalize(response, config.normalization)
    if normalized != response:
        repairs.append(REPAIR_NORMALIZED)
    (prompt, prompt_repairs), (response, response_repairs) = (
        _scrub(text, config.redact_pii) for text in (prompt, normalized))
    repairs += prompt_repairs + response_repairs
    repairs = list(dict.fromkeys(repairs))  # each kind once per record
    if not response.strip():
        return "", "", DROP_EMPTY_RESPONSE, repairs
    n = len(prompt) + len(response)
    if n < config.min_chars:
        return "", "", DROP_TOO_SHORT, repairs
    if n > config.max_chars:
        return "", "", DROP_TOO_LONG, repairs
    if config.quality_filter:
        reason = quality_reason(response, config)
        if reason:
            return "", "", reason, repairs
    return prompt, response, KEPT, repairs


def clean_dpo_record(prompt: str, chosen: str, rejected: str, reject_reason: str,
                     config: DataConfig) -> tuple[str, str, str, str, list[str]]:
    """Cleans one DPO record (the rendered prompt, the chosen and the rejected response).

    As `clean_sft_record`, with two responses: both are normalized (the prompt is not:
    its contents were normalized before rendering), all three fields lose their control
    characters (and, with `redact_pii`, their PII). Each of the two sequences the
    Trainer sees, prompt + chosen and prompt + rejected, must be within
    [min_chars, max_chars]; the quality rules judge the chosen response only (a
    rejected response may be poor on purpose).

    Returns:
      `(prompt, chosen, rejected, KEPT, repairs)` or `("", "", "", reason, repairs)`;
      reasons as `clean_document`'s, with `empty_chosen` / `empty_rejected` for a
      response left empty and `chosen_equals_rejected` when cleaning made them equal.
    """
    if reject_reason:
        return "", "", "", reject_reason, []
    repairs: list[str] = []
    normalized = [normalize(text, config.normalization) for text in (chosen, rejected)]
    if normalized != [chosen, rejected]:
        repairs.append(REPAIR_NORMALIZED)
    scrubbed = [_scrub(text, config.redact_pii) for text in (prompt, *normalized)]
    (prompt, chosen, rejected) = (text for text, _ in scrubbed)
    repairs = list(dict.fromkeys(repairs + [r for _, rs in scrubbed for r in rs]))
    for text, reason in ((chosen, DROP_EMPTY_CHOSEN), (rejected, DROP_EMPTY_REJECTED)):
        if not text.strip():
            return "", "", "", reason, repairs
    if chosen == rejected:
        return "", "", "", DROP_CHOSEN_EQUALS_REJECTED, repairs
    lengths = (len(prompt) + len(chosen), len(prompt) + len(rejected))
    if min(lengths) < config.min_chars:
        return "", "", "", DROP_TOO_SHORT, repairs
    if max(lengths) > config.max_chars:
        return "", "", "", DROP_TOO_LONG, repairs
    if config.quality_filter:
        reason = quality_reason(chosen, config)
        if reason:
            return "", "", "", reason, repairs
    return prompt, chosen, rejected, KEPT, repairs


def dpo_dedup_text(prompt: str, chosen: str, rejected: str) -> str:
    """The text whose MinHash signature finds near-duplicate DPO records: all three."""
    return prompt + "\n" + chosen + "\n" + rejected


def dpo_content_key(prompt: str, chosen: str, rejected: str) -> bytes:
    """Exact-duplicate key of a cleaned DPO record: the (prompt, chosen, rejected) triple
    (NUL, which cleaning removes from all three, separates them)."""
    return content_key(prompt + "\x00" + chosen + "\x00" + rejected)


def sft_dedup_text(prompt: str, response: str) -> str:
    """The text whose MinHash signature finds near-duplicate SFT records: both fields."""
    return prompt + "\n" + response


def sft_content_key(prompt: str, response: str) -> bytes:
    """Exact-duplicate key of a cleaned SFT record: the (prompt, response) pair (NUL,
    which cleaning removes from both, separates them)."""
    return content_key(prompt + "\x00" + response)


def content_key(text: str) -> bytes:
    """Exact-duplicate key of a cleaned document."""
    return hashlib.sha256(text.encode("utf-8")).digest()


# ----------------------------------------------------------------------------- near duplicates


def shingles(text: str, ngram: int) -> set[bytes]:
    """Lower-cased word n-grams (the whole text if it has fewer than n words); in
    scripts written without spaces, character n-grams (`words.shingle_units`)."""
    words = shingle_units(text)
    if len(words) < ngram:
        return {" ".join(words).encode("utf-8")}
    return {" ".join(words[i:i + ngram]).encode("utf-8") for i in range(len(words) - ngram + 1)}


def minhash_signature(text: str, num_perm: int, ngram: int) -> np.ndarray:
    """MinHash signature (datasketch, fixed seed; shingles hashed with CRC-32), uint32 [num_perm]."""
    from datasketch import MinHash

    m = MinHash(num_perm=num_perm, seed=1, hashfunc=zlib.crc32, scheme="affine32",
                permutations=_permutations(num_perm))
    m.update_batch(list(shingles(text, ngram)))
    return m.hashvalues.astype(np.uint32)


@functools.lru_cache(maxsize=4)
def _permutations(num_perm: int):
    """datasketch's random permutations for seed 1 (made once, not per document)."""
    from datasketch import MinHash

    return MinHash(num_perm=num_perm, seed=1).permutations


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


# ----------------------------------------------------------------------------- Bloom filters


def key_hashes(keys: list[bytes]) -> np.ndarray:
    """64-bit hashes (blake2b) of byte strings, uint64 [len(keys)]."""
    return np.array([int.from_bytes(hashlib.blake2b(k, digest_size=8).digest(), "little")
                     for k in keys], dtype=np.uint64)


class SeenTwiceFilter:
    """Two Bloom filters over 64-bit hashes: `seen` (added at least once) and
    `repeated` (added at least twice, up to false positives), so that only keys
    that may repeat need an exact, memory-hungry grouping.

    `num_bits` bits each (a power of two), `num_hashes` positions per key by
    double hashing (Kirsch & Mitzenmacher 2006): position_i = h1 + i·h2 mod m,
    with h1, h2 the low and high 32 bits of the key's hash. The false-positive
    rate of `may_repeat` is about (1 - exp(-k·n/m))^k for n keys.
    Filters built over parts of the data merge exactly (`merge`).
    """

    def __init__(self, num_bits: int, num_hashes: int = 4):
        if num_bits < 8 or num_bits & (num_bits - 1):
            raise ValueError(f"num_bits={num_bits} must be a power of two >= 8")
        self.num_bits, self.num_hashes = num_bits, num_hashes
        self.seen = np.zeros(num_bits // 8, dtype=np.uint8)
        self.repeated = np.zeros(num_bits // 8, dtype=np.uint8)

    def _positions(self, hashes: np.ndarray) -> np.ndarray:
        h1 = (hashes & np.uint64(0xFFFFFFFF)).astype(np.uint64)
        h2 = (hashes >> np.uint64(32)) | np.uint64(1)
        i = np.arange(self.num_hashes, dtype=np.uint64)
        return (h1[:, None] + i[None, :] * h2[:, None]) & np.uint64(self.num_bits - 1)

    @staticmethod
    def _test(bits: np.ndarray, pos: np.ndarray) -> np.ndarray:
        return np.all(bits[pos >> np.uint64(3)] & (1 << (pos & np.uint64(7))).astype(np.uint8),
                      axis=-1)

    @staticmethod
    def _set(bits: np.ndarray, pos: np.ndarray) -> None:
        pos = pos.ravel()
        np.bitwise_or.at(bits, pos >> np.uint64(3), (1 << (pos & np.uint64(7))).astype(np.uint8))

    def add(self, hashes: np.ndarray) -> None:
        """Adds keys (uint64 hashes); keys equal within one call count as repeated."""
        if not len(hashes):
            return
        unique, counts = np.unique(hashes, return_counts=True)
        pos = self._positions(unique)
        again = self._test(self.seen, pos) | (counts > 1)
        self._set(self.repeated, pos[again])
        self._set(self.seen, pos)

    def merge(self, other: SeenTwiceFilter) -> None:
        self.repeated |= other.repeated | (self.seen & other.seen)
        self.seen |= other.seen

    def may_repeat(self, hashes: np.ndarray) -> np.ndarray:
        """bool [n]: False means the key was added at most once (certain)."""
        if not len(hashes):
            return np.zeros(0, dtype=bool)
        return self._test(self.repeated, self._positions(hashes))
