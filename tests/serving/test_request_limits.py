"""A predict body is checked against the signature's specs in Python, before any tensor:
no model, no server."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from serving.request_limits import (
    BadRequest,
    PredictRequest,
    columns_to_arrays,
    parse_json_body,
    rows_to_columns,
)

GENERATE = {"prompt": tf.TensorSpec([None], tf.string), "max_new_tokens": tf.TensorSpec(
    [None], tf.int32), "temperature": tf.TensorSpec([None], tf.float32)}
LOGITS = {"input_ids": tf.TensorSpec([None, None], tf.int32)}


def test_good_columns_become_arrays_of_the_signatures_dtypes():
    arrays, rows = columns_to_arrays(
        {"prompt": ["ROMEO:", "你好"], "max_new_tokens": 8, "temperature": [0, 0.5]},
        GENERATE, max_rows=4)
    assert rows == 2
    assert arrays["prompt"].tolist() == [b"ROMEO:", "你好".encode()]
    assert arrays["max_new_tokens"].dtype == np.int32 and arrays["max_new_tokens"].tolist() == [8, 8]
    assert arrays["temperature"].dtype == np.float32
    arrays, rows = columns_to_arrays({"input_ids": [[1, 2, 3]]}, LOGITS, max_rows=4)
    assert arrays["input_ids"].shape == (1, 3) and rows == 1


@pytest.mark.parametrize("columns,specs,message", [
    ({"input_ids": [[[[[1]]]]]}, LOGITS,
     "input 'input_ids' is nested deeper than its 2 dimensions (int32 [None, None])"),
    ({"prompt": ["a"], "max_new_tokens": 2**31, "temperature": 0.0}, GENERATE,
     "input 'max_new_tokens' must be int32 in [-2147483648, 2147483647]; "
     "max_new_tokens = 2147483648"),
    ({"prompt": ["a"], "max_new_tokens": [-2**31 - 1], "temperature": 0.0}, GENERATE,
     "input 'max_new_tokens' must be int32 in [-2147483648, 2147483647]; "
     "max_new_tokens[0] = -2147483649"),
    ({"prompt": ["a"], "max_new_tokens": [True], "temperature": 0.0}, GENERATE,
     "input 'max_new_tokens' takes numbers (int32), not booleans; max_new_tokens[0] = true"),
    ({"prompt": ["a"], "max_new_tokens": 1, "temperature": [float("nan")]}, GENERATE,
     "input 'temperature' must be a finite float32 (|x| <= 3.403e+38); temperature[0] = nan"),
    ({"prompt": ["a"], "max_new_tokens": 1, "temperature": 10**400}, GENERATE,
     "input 'temperature' must be a finite float32"),
    ({"prompt": ["a"], "max_new_tokens": 1.5, "temperature": 0.0}, GENERATE,
     "input 'max_new_tokens' takes integers (int32); max_new_tokens = 1.5"),
    ({"input_ids": [[1, 2], [3]]}, LOGITS, "input 'input_ids' is ragged: input_ids[1] has "
     "1 elements, expected a list of 2 (int32 [None, None])"),
    ({"input_ids": [[1, 2], 3]}, LOGITS, "input 'input_ids' is ragged: input_ids[1] has the "
     "value 3, expected a list of 2"),
    ({"input_ids": [[1]] * 5}, LOGITS, "a request may have at most max_batch_size=4 rows"),
    ({"input_ids": []}, LOGITS, "input 'input_ids' has 1 dimensions [0], expected"),
    ({"prompt": "ROMEO:", "max_new_tokens": 1, "temperature": 0.0}, GENERATE,
     "input 'prompt' takes one value per prompt (string [None]): give a list"),
    ({"prompt": [], "max_new_tokens": 1, "temperature": 0.0}, GENERATE,
     "the request has no rows"),
    ({"prompt": ["a"], "max_new_tokens": 1, "temperature": 0.0, "top_q": 1}, GENERATE,
     "unknown input 'top_q'"),
])
def test_bad_columns_are_refused_by_name_before_any_tensor(columns, specs, message, monkeypatch):
    def no_tensor(*args, **kwargs):
        raise AssertionError("a tensor was built")

    monkeypatch.setattr(tf, "constant", no_tensor)
    with pytest.raises(BadRequest) as error:
        columns_to_arrays(columns, specs, max_rows=4)
    assert str(error.value).startswith(message), str(error.value)


def test_255_deep_is_refused_at_the_first_extra_level():
    value = "x"
    for _ in range(255):
        value = [value]
    with pytest.raises(BadRequest, match="nested deeper than its 1 dimensions"):
        columns_to_arrays(rows_to_columns(value, {"prompt": tf.TensorSpec([None], tf.string)}),
                          {"prompt": tf.TensorSpec([None], tf.string)}, max_rows=8)


def test_the_envelope_and_instances_refuse_unknown_keys_by_name():
    with pytest.raises(BadRequest, match="^unknown key 'max_tokens' in the request"):
        PredictRequest.from_json({"instances": ["a"], "max_tokens": 3})
    with pytest.raises(BadRequest, match="^'signature_name': Input should be a valid string"):
        PredictRequest.from_json({"instances": ["a"], "signature_name": 5})
    with pytest.raises(BadRequest, match="give exactly one of"):
        PredictRequest.from_json({"instances": ["a"], "inputs": ["b"]})
    with pytest.raises(BadRequest, match=r"^unknown key 'tmp' in instances\[1\]"):
        rows_to_columns([{"prompt": "a"}, {"prompt": "b", "tmp": 1}], GENERATE)


def test_json_nested_too_deep_for_the_parser_is_a_bad_request():
    with pytest.raises(BadRequest, match="nested too deep"):
        parse_json_body(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(BadRequest, match="not JSON"):
        parse_json_body(b'{"a": "\xff"}')
    assert parse_json_body(b'{"t": Infinity}') == {"t": float("inf")}  # refused per input
