"""Cleaning rules, one reason each."""

from __future__ import annotations

from components.text_cleaner import cleaning as C
from pipeline.configs import DataConfig


def test_control_characters_removed_but_newlines_and_tabs_kept():
    assert C.remove_control_characters("a\x00b\x1bc\r\nd\te") == "abc\nd\te"


def test_normalization_forms():
    decomposed = "cafe\u0301"
    assert C.normalize(decomposed, "NFC") == "caf\u00e9"
    assert C.normalize("\ufb01", "NFKC") == "fi"
    assert C.normalize(decomposed, "none") == decomposed


def test_reasons():
    cfg = DataConfig(min_chars=3, max_chars=10)
    assert C.clean_document("hello", "", cfg) == ("hello", C.KEPT)
    assert C.clean_document(" \n\t", "", cfg) == ("", C.DROP_EMPTY)
    assert C.clean_document("\x00\x01", "", cfg) == ("", C.DROP_EMPTY)
    assert C.clean_document("hi", "", cfg) == ("", C.DROP_TOO_SHORT)
    assert C.clean_document("x" * 11, "", cfg) == ("", C.DROP_TOO_LONG)
    assert C.clean_document("fine text", "invalid_json", cfg) == ("", "invalid_json")


def test_content_key_is_exact():
    assert C.content_key("a b") == C.content_key("a b")
    assert C.content_key("a b") != C.content_key("a  b")
