"""Overrides: dotted `SECTION.FIELD` keys set on a config, each value parsed into its
field's declared type (`--set`, config files).

`coerce` is the one rule for turning a value given as text or JSON into the type a
field declares, or refusing it by name; `typed_section` applies it to a section's
values, `apply_overrides` sets dotted keys in a config's dict form.
`--set SECTION.FIELD=VALUE` is split into a key and a JSON-or-text value by `parse_set`.
"""

from __future__ import annotations

import json
import math
import types
import typing
from typing import Any


def parse_set(items: list[str]) -> dict[str, Any]:
    """`--set SECTION.FIELD=VALUE ...` -> {"SECTION.FIELD": value}: a VALUE that parses as
    JSON is that value (number, bool, list, ...), else the string as written. The value's
    type is checked later, against the field (`coerce`).

    Raises:
      ValueError: an item without `=`, naming it.
    """
    overrides: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected SECTION.FIELD=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        overrides[key.strip()] = value
    return overrides


def apply_overrides(d: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Sets each dotted key of `overrides` in `d`, a `PipelineConfig.to_dict()`, in place.

    Values are set as given; `PipelineConfig.from_dict(d)` parses and validates them.
    When `tokenizer.vocab_size` is overridden and `model.vocab_size` is not, the model's
    follows the tokenizer's.

    Args:
      d: a config's dict form: {section: {field: value}} (and `preset`).
      overrides: e.g. `{"train.train_steps": 200, "model.hidden_size": 128}`.

    Returns:
      `d`.

    Raises:
      ValueError: a key that is not SECTION.FIELD of `d` (named).
    """
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if section not in d or not isinstance(d[section], dict) or not field:
            raise ValueError(f"unknown config key '{key}' (expected SECTION.FIELD)")
        if field not in d[section]:
            raise ValueError(f"unknown config key '{key}'")
        d[section][field] = value
    # Keep the tokenizer and model vocabularies in step when only one is overridden.
    if "tokenizer.vocab_size" in overrides and "model.vocab_size" not in overrides:
        d["model"]["vocab_size"] = overrides["tokenizer.vocab_size"]
    return d


def typed_section(name: str, section_cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each one converted to its field's declared type (`coerce`)."""
    hints = typing.get_type_hints(section_cls)
    return {k: coerce(f"{name}.{k}", v, hints[k]) if k in hints else v
            for k, v in values.items()}


def coerce(key: str, value: Any, hint: Any) -> Any:
    """`value` (from --set, parsed as JSON where it parses, or from a config file) as the
    declared type `hint` of the field `key`.

    int: an int, an integral float, or a string of one; float: a finite number or a
    string of one; bool: true/false (any case), 1/0; str: a string, or the JSON text of
    a number or bool given for it (`--set x=123`); `X | None`: None/"none"/"null" or
    an X; dict: a JSON object (or its text); tuple: a list (or its JSON text).

    Raises:
      ValueError: naming the key, the value and the type expected.
    """
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [t for t in typing.get_args(hint) if t is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            if len(options) < len(typing.get_args(hint)):
                return None
        errors = []
        for option in options:
            try:
                return coerce(key, value, option)
            except ValueError as e:
                errors.append(str(e))
        names = " or ".join(_TYPE_NAMES.get(t, getattr(t, "__name__", str(t))) for t in options)
        raise ValueError(f"{key}={value!r}: expected {names} or none")
    expected = _TYPE_NAMES.get(hint) or _TYPE_NAMES.get(typing.get_origin(hint))
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return value.strip().lower() in ("true", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                pass
    elif hint is float:
        number = value
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if (isinstance(number, (int, float)) and not isinstance(number, bool)
                and math.isfinite(number)):
            return float(number)
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (bool, int, float)):
            return json.dumps(value)  # --set data.field=123 meant the text "123"
    elif hint is dict or typing.get_origin(hint) is dict:
        value = _json_text(value)
        if isinstance(value, dict):
            return value
    elif typing.get_origin(hint) is tuple:
        parsed = _json_text(value)
        # a list (or its JSON text); any other text is the section's to parse or refuse
        return tuple(parsed) if isinstance(parsed, (list, tuple)) else value
    else:
        return value  # a type without a rule here: the section validates it
    raise ValueError(f"{key}={value!r}: expected {expected}")


def _json_text(value: Any) -> Any:
    """The JSON value a string holds, else `value` itself."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            pass
    return value


_TYPE_NAMES = {int: "an integer", float: "a finite number (e.g. 3e-4)",
               bool: "true or false", str: "a string", dict: "a JSON object"}

