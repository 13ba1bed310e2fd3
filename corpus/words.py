"""Word units for the data stages, in any script: words where text has spaces,
characters where it has none.

Chinese and Japanese (and Thai, Lao, Khmer, Myanmar) are written without spaces
between words, so "split at whitespace" makes a whole clause one word: near-duplicate
shingles, the Gopher word rules and the drift profile would then see one rare "word"
per clause. As DataTrove and NeMo Curator do for such text, each character of these
scripts is a unit of its own (character n-grams for shingles); runs of other characters
stay words. Korean is written with spaces and keeps its words. Mixed text works: in
"GPT模型很大 ok" the units are "GPT", "模", "型", "很", "大", "ok".

References: NeMo Curator, fuzzy deduplication and heuristic filters for
non-space-delimited languages (character n-grams); DataTrove, word tokenization per
language (`datatrove.utils.word_tokenizers`); Gopher rules, Rae et al. 2021, A.1.1.
"""

from __future__ import annotations

import re

# Scripts written without spaces between words: CJK radicals and symbols' ideographic
# marks, Hiragana, Katakana (and halfwidth), CJK ideographs (Extension A, the main
# block, compatibility ideographs, Extensions B-H), Thai, Lao, Myanmar, Khmer.
NO_SPACE_SCRIPTS = (
    "\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3038-\u303c"
    "\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
    "\U00020000-\U0003134f"
    "\u0e00-\u0e7f\u0e80-\u0eff\u1000-\u109f\u1780-\u17ff"
)
_ONE = f"[{NO_SPACE_SCRIPTS}]"
# Whitespace-separated units (the Gopher rules' "words"); punctuation right after a
# character of a no-space script stays with it, as it stays with a word before a space.
_UNIT = re.compile(f"{_ONE}[^\\s\\w{NO_SPACE_SCRIPTS}]*|[^\\s{NO_SPACE_SCRIPTS}]+")
# Word-character units (shingles): \w runs, cut into characters in no-space scripts.
_WORD = re.compile(f"{_ONE}|(?:(?!{_ONE})\\w)+")
# ... plus each punctuation or symbol character (the drift profile's tokens).
_TOKEN = re.compile(f"{_ONE}|(?:(?!{_ONE})\\w)+|[^\\w\\s]")


def is_no_space_unit(unit: str) -> bool:
    """Whether `unit` (of `word_units`) is a character of a script written without spaces."""
    return re.match(_ONE, unit) is not None


def word_units(text: str) -> list[str]:
    """Whitespace-separated words, with each character of a no-space script its own unit
    (with the punctuation that follows it: "好，" as "good," in English)."""
    return _UNIT.findall(text)


def shingle_units(text: str) -> list[str]:
    """Lower-cased `\\w` words, with each character of a no-space script its own unit."""
    return _WORD.findall(text.lower())


def token_units(text: str) -> list[str]:
    """`shingle_units` plus each punctuation or symbol character, in text order."""
    return _TOKEN.findall(text.lower())
