"""The fixed inputs of `compare`'s load run without a model (serving/compare.py): prompts
from the data's documents or the built-in English and Chinese ones, cut to fit a model's
context in tokens; strict-JSON results; loopback only."""

from __future__ import annotations

import json
import math

import pytest

from serving import compare


def test_prompts_are_the_starts_of_documents_spread_over_the_data(tmp_path):
    path = tmp_path / "text.txt"
    docs = [f"doc {i} " + "word " * 20 for i in range(20)] + ["床前明月光，疑是地上霜。" * 5]
    path.write_text("\n\n".join(docs), encoding="utf-8")
    prompts = compare.load_prompts([str(path)], n=4, chars=16)
    # documents 0, 6, 13, 20 of 21 (evenly spread); cut after the last space within 16
    assert prompts == ["doc 0 word word ", "doc 6 word word ", "doc 13 word ",
                       "床前明月光，疑是地上霜。床前明月"]
    assert compare.load_prompts([str(path)], n=4, chars=16) == prompts  # fixed


def test_no_data_or_no_text_gives_the_built_in_english_and_chinese_prompts(tmp_path):
    assert compare.load_prompts(None) == list(compare.BUILTIN_PROMPTS)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    assert compare.load_prompts([str(empty)]) == list(compare.BUILTIN_PROMPTS)
    assert any("床前明月光" in p for p in compare.BUILTIN_PROMPTS)


def test_prompts_are_cut_to_fit_the_room_in_tokens():
    class OneTokenPerByte:  # the worst case of a byte-level BPE
        def encode(self, text, add_special_tokens=False):
            assert add_special_tokens is False
            return type("Encoding", (), {"ids": list(text.encode("utf-8"))})()

    fitted = compare.fit_prompts(["abcdef", "床前明月光", "ab"], OneTokenPerByte(), room=4)
    assert fitted == ["abcd", "床", "ab"]  # 床 is 3 bytes; 床前 would be 6


def test_results_are_strict_json():
    value = {"a": math.nan, "b": [1.0, math.inf, {"c": -math.inf}], "d": "x", "e": 2}
    safe = compare.json_safe(value)
    assert safe == {"a": None, "b": [1.0, None, {"c": None}], "d": "x", "e": 2}
    json.dumps(safe, allow_nan=False)


def test_the_load_run_only_targets_the_loopback_interface():
    with pytest.raises(ValueError, match="loopback"):
        compare.completion_load("http://example.com/v1/completions", [{}], 1, 1)
