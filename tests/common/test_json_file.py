"""`common.json_file`: one reader of JSON object files, whose errors name the file."""

from __future__ import annotations

import json
import re

import pytest

from common.json_file import JsonFileError, read_json, write_json


def test_an_object_reads_back_as_written(tmp_path):
    path = tmp_path / "sub" / "config.json"
    value = {"b": [1, 2.5, None], "a": "你好 <｜end▁of▁sentence｜>"}
    write_json(str(path), value)
    assert read_json(str(path)) == value
    assert path.read_text(encoding="utf-8") == json.dumps(
        value, ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    write_json(str(path), value, ensure_ascii=True)
    assert path.read_text(encoding="ascii") == json.dumps(value, indent=2, sort_keys=True) + "\n"


def test_a_missing_file_is_named(tmp_path):
    path = tmp_path / "missing.json"
    with pytest.raises(FileNotFoundError, match=rf"^{re.escape(str(path))}: no such file \(the model's config\)$"):
        read_json(str(path), "the model's config")


def test_invalid_json_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "a": 1,\n  "b": oops\n}\n')
    with pytest.raises(JsonFileError, match=rf"^{re.escape(str(path))}: not a JSON file \(the metrics\): line 3 "
                                            r"column 8: Expecting value$"):
        read_json(str(path), "the metrics")
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}: not a JSON file: byte 7 is not UTF-8$"):
        read_json(str(path))


@pytest.mark.parametrize("text, kind", [("[1, 2]", "list"), ('"x"', "str"), ("3", "int"),
                                        ("null", "NoneType")])
def test_a_value_that_is_not_an_object_is_refused(tmp_path, text, kind):
    path = tmp_path / "value.json"
    path.write_text(text)
    with pytest.raises(JsonFileError, match=rf"^{re.escape(str(path))}: not a JSON object: it holds a {kind}$"):
        read_json(str(path))
