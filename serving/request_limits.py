"""What a TF Serving REST predict body may hold, checked in Python before any tensor
exists.

A request's JSON reaches TensorFlow only as numpy arrays built here, after every
value was checked against the signature's input spec (`tf.TensorSpec`):

- nesting: an input of rank r takes values nested exactly r lists deep (rank-1
  inputs also take one value for every prompt); deeper is a 400 at the first extra
  level, so no request can build a tensor of 255 dimensions (which aborts the process
  inside TensorFlow), and ragged lists are a 400;
- rows: at most `max_rows` (`serve.max_batch_size`) prompts, counted before any
  element is converted;
- numbers: integer inputs take JSON integers within their dtype's range (int32:
  [-2147483648, 2147483647]; nothing wraps), float inputs take finite numbers within
  float32's range (Python's json reads `Infinity` and `NaN`: refused here);
  booleans are refused where numbers belong, numbers where strings belong;
- keys: unknown keys at the top level (`PredictRequest`) and inside instances are
  refused by name.

Bodies are parsed by `parse_json_body`; a nesting too deep for Python's parser (e.g.
100,000 nested lists) is a 400 like any other malformed body. Every refusal is a
`BadRequest` (HTTP 400) with one line naming the field, the value and the range.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictStr, ValidationError

FLOAT32_MAX = float(np.finfo(np.float32).max)


class BadRequest(ValueError):
    """A request the model cannot answer; becomes HTTP 400 with the message."""


class PredictRequest(BaseModel):
    """The body of `POST /v1/models/<name>:predict` (TF Serving's REST API).

    Exactly one of `instances` (row format: a list, one entry per prompt) or `inputs`
    (columnar format: an object of inputs, or the value of a single-input signature).
    Their contents are checked against the signature by `columns_to_arrays`.
    """

    model_config = ConfigDict(extra="forbid")

    signature_name: StrictStr = "serving_default"
    instances: Any = None
    inputs: Any = None

    @classmethod
    def from_json(cls, body: Any) -> PredictRequest:
        """The request from a parsed JSON body.

        Raises:
          BadRequest: not an object, an unknown key (named), a signature_name that is
            not a string, or both or neither of instances and inputs.
        """
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        try:
            request = cls.model_validate(body)
        except ValidationError as e:
            error = e.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            if error["type"] == "extra_forbidden":
                raise BadRequest(f"unknown key '{where}' in the request; a predict request "
                                 "takes signature_name and one of instances or inputs") from e
            raise BadRequest(f"'{where}': {error['msg']}") from e
        if (request.instances is None) == (request.inputs is None):
            raise BadRequest('give exactly one of "instances" (row format) or "inputs" '
                             "(columnar format)")
        return request


def parse_json_body(raw: bytes) -> Any:
    """The JSON value of a request body.

    Raises:
      BadRequest: not UTF-8 JSON, or nested deeper than Python's parser goes (its
        RecursionError), or an integer of more than 4,300 digits.
    """
    try:
        return json.loads(raw)
    except RecursionError as e:
        raise BadRequest("the body is not JSON this server reads: nested too deep") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int digits limit
        raise BadRequest(f"the body is not JSON: {e}") from e


def rows_to_columns(instances: Any, specs: dict) -> dict:
    """Row format (`instances`) to columnar: {input name: [value per instance]}.

    Instances are all objects (keys: the signature's inputs) or, for a signature with
    one per-row input, all bare values. A scalar (rank-0) input must be the same in
    every instance that gives it.

    Raises:
      BadRequest: not a non-empty list, mixed objects and values, an unknown key
        (named), a per-row input missing in an instance, scalars that differ.
    """
    if not isinstance(instances, list) or not instances:
        raise BadRequest('"instances" must be a non-empty list')
    batched = [k for k, s in specs.items() if s.shape.rank and s.shape.rank >= 1]
    if all(not isinstance(x, dict) for x in instances):
        if len(batched) != 1:
            raise BadRequest(f"instances must be objects with keys {sorted(specs)}")
        return {batched[0]: instances}
    if not all(isinstance(x, dict) for x in instances):
        raise BadRequest("instances must be all objects or all values")
    for i, instance in enumerate(instances):
        unknown = sorted(set(instance) - set(specs))
        if unknown:
            raise BadRequest(f"unknown key '{unknown[0]}' in instances[{i}]; the signature "
                             f"takes {sorted(specs)}")
    columns: dict = {}
    for key, spec in specs.items():
        values = [x.get(key) for x in instances]
        if spec.shape.rank == 0:  # a scalar input: the same for the whole batch
            given = [v for v in values if v is not None]
            if any(v != given[0] or type(v) is not type(given[0]) for v in given[1:]):
                raise BadRequest(f"'{key}' is a scalar input: it must be the same "
                                 "in every instance")
            if given:
                columns[key] = given[0]
        else:
            if any(v is None for v in values):
                raise BadRequest(f"every instance needs '{key}'")
            columns[key] = values
    return columns


def columns_to_arrays(columns: dict, specs: dict,
                      max_rows: int) -> tuple[dict[str, np.ndarray], int]:
    """Numpy inputs of the signature's dtypes and shapes, and the number of rows.

    Args:
      columns: {input name: JSON value}; a single value for a rank-1 (per-row) input
        is repeated for every row.
      specs: the signature's inputs, {name: tf.TensorSpec}.
      max_rows: the most rows (prompts) a request may have.

    Returns:
      ({name: array}, rows); strings as bytes (dtype object), per-row inputs [rows, ...].

    Raises:
      BadRequest: unknown or missing inputs, nesting deeper than an input's rank,
        ragged lists, values of the wrong type or out of their dtype's range, more
        than `max_rows` rows, no rows, inputs with different numbers of rows.
    """
    unknown = sorted(set(columns) - set(specs))
    if unknown:
        raise BadRequest(f"unknown input '{unknown[0]}'; the signature takes {sorted(specs)}")
    missing = sorted(set(specs) - set(columns))
    if missing:
        raise BadRequest(f"missing inputs {missing}")
    arrays = {}
    for key, spec in specs.items():
        value, rank = columns[key], spec.shape.rank
        dims = _dims(key, value, spec)
        if not (len(dims) == rank or (rank == 1 and not dims)):
            raise BadRequest(f"input '{key}' has {len(dims)} dimensions {dims}, expected "
                             f"{_spec_text(spec)}")
        if rank and dims and dims[0] > max_rows:
            raise BadRequest(f"a request may have at most max_batch_size={max_rows} rows "
                             f"(prompts); this one has {dims[0]}: split it (or start serve "
                             "with a larger --max-batch-size)")
        converted = _convert(key, value, spec, dims, ())
        np_dtype = object if spec.dtype.name == "string" else spec.dtype.as_numpy_dtype
        array = np.empty(dims, dtype=np_dtype) if 0 in dims else np.array(converted, np_dtype)
        if array.shape != tuple(dims):  # cannot happen after _dims/_convert; never reshape
            raise BadRequest(f"input '{key}' has shape {list(array.shape)}, expected "
                             f"{_spec_text(spec)}")
        arrays[key] = array
    row_counts = {k: a.shape[0] for k, a in arrays.items() if specs[k].shape.rank and a.ndim}
    if len(set(row_counts.values())) > 1:
        raise BadRequest(f"the inputs have different numbers of rows: {row_counts}")
    per_row = [k for k, s in specs.items() if s.shape.rank]
    if per_row and not row_counts:
        raise BadRequest(f"input '{per_row[0]}' takes one value per prompt "
                         f"({_spec_text(specs[per_row[0]])}): give a list, e.g. "
                         f'{{"inputs": {{"{per_row[0]}": [...]}}}} or "instances": [...]')
    rows = next(iter(row_counts.values()), 0)
    if per_row and rows == 0:
        raise BadRequest("the request has no rows (prompts)")
    for key, spec in specs.items():
        if spec.shape.rank == 1 and arrays[key].ndim == 0:
            arrays[key] = np.full([rows], arrays[key], dtype=arrays[key].dtype)
        if not spec.shape.is_compatible_with(arrays[key].shape):
            raise BadRequest(f"input '{key}' has shape {list(arrays[key].shape)}, "
                             f"expected {_spec_text(spec)}")
    return arrays, rows


def _spec_text(spec) -> str:
    dims = ", ".join("None" if d is None else str(d) for d in spec.shape.as_list())
    return f"{spec.dtype.name} [{dims}]"


def _dims(key: str, value: Any, spec) -> list[int]:
    """The shape of `value` read along its first elements; refused at the first level
    past the input's rank (so a 255-deep list is never walked, let alone built)."""
    dims, level = [], value
    while isinstance(level, list):
        if len(dims) == spec.shape.rank:
            raise BadRequest(f"input '{key}' is nested deeper than its {spec.shape.rank} "
                             f"dimensions ({_spec_text(spec)})")
        dims.append(len(level))
        if not level:
            break
        level = level[0]
    return dims


def _convert(key: str, value: Any, spec, dims: list[int], at: tuple[int, ...]):
    """`value` checked against dims and the dtype; strings as UTF-8 bytes. Recursion
    depth is at most the input's rank."""
    where = key + "".join(f"[{i}]" for i in at)
    if len(at) < len(dims):
        if not isinstance(value, list) or len(value) != dims[len(at)]:
            got = f"{len(value)} elements" if isinstance(value, list) else f"the value {value!r:.40}"
            raise BadRequest(f"input '{key}' is ragged: {where} has {got}, expected a list "
                             f"of {dims[len(at)]} ({_spec_text(spec)})")
        return [_convert(key, v, spec, dims, (*at, i)) for i, v in enumerate(value)]
    return _scalar(key, where, value, spec)


def _scalar(key: str, where: str, value: Any, spec):
    dtype = spec.dtype
    if isinstance(value, list):
        raise BadRequest(f"input '{key}' is ragged: {where} is a list, expected "
                         f"{_spec_text(spec)}")
    if dtype.name == "string":
        if not isinstance(value, str):
            raise BadRequest(f"input '{key}' takes strings; {where} = {value!r:.40}")
        return value.encode("utf-8", errors="surrogatepass")
    if dtype.name == "bool":
        if not isinstance(value, bool):
            raise BadRequest(f"input '{key}' takes true or false; {where} = {value!r:.40}")
        return value
    if isinstance(value, bool):
        raise BadRequest(f"input '{key}' takes numbers ({dtype.name}), not booleans; "
                         f"{where} = {json.dumps(value)}")
    if dtype.is_integer:
        if not isinstance(value, int):
            raise BadRequest(f"input '{key}' takes integers ({dtype.name}); "
                             f"{where} = {value!r:.40}")
        if not dtype.min <= value <= dtype.max:
            raise BadRequest(f"input '{key}' must be {dtype.name} in [{dtype.min}, "
                             f"{dtype.max}]; {where} = {value}")
        return value
    if dtype.is_floating:
        if not isinstance(value, (int, float)):
            raise BadRequest(f"input '{key}' takes numbers ({dtype.name}); "
                             f"{where} = {value!r:.40}")
        try:
            number = float(value)
        except OverflowError:  # an integer past 1.8e308
            number = math.inf
        if not math.isfinite(number) or abs(number) > FLOAT32_MAX:
            raise BadRequest(f"input '{key}' must be a finite {dtype.name} (|x| <= "
                             f"{FLOAT32_MAX:.4g}); {where} = {value!r:.40}")
        return number
    raise BadRequest(f"input '{key}' has dtype {dtype.name}, which this server does not "
                     "take over JSON")
