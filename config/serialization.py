"""A `PipelineConfig` to and from its dict and JSON forms.

The JSON text is what `create_pipeline(...)` hands each component (`custom_config` /
execution properties) and what a trained model records. The dict form is
`{"preset": name, section: {field: value}}`, one entry per field of the config in
field order; a section may be left out of a dict read back (it takes its defaults).
Values read back are parsed into their fields' declared types (`overrides.coerce`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import typing
from typing import Any

from config.overrides import typed_section


def section_types(config_cls: type) -> dict[str, type]:
    """The dataclass of each section field of `config_cls` (`model`, `data`, ...), in
    field order."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_cls)
            if dataclasses.is_dataclass(hints[f.name])}


def to_dict(config: Any) -> dict[str, Any]:
    """A JSON-serializable dict of every field of `config`, sections as dicts."""
    out = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if hasattr(value, "to_dict"):
            value = value.to_dict()
        elif dataclasses.is_dataclass(value):
            # JSON's forms (a tuple field as a list), as `from_json(to_json(...))` reads it
            value = json.loads(json.dumps(dataclasses.asdict(value)))
        out[field.name] = value
    return out


def to_json(config: Any) -> str:
    """`to_dict(config)` as JSON text with sorted keys."""
    return json.dumps(to_dict(config), sort_keys=True)


def from_dict(config_cls: type, d: dict[str, Any],
              section_classes: dict[str, type] | None = None) -> Any:
    """A `config_cls` from its dict form.

    `section_classes` names the class of a section whose declared type is a union
    (`PipelineConfig.model`); its dict's `model_type` key is dropped before parsing.

    Raises:
      KeyError: a field without a default (`model`, `preset`) is missing.
      ValueError: an unknown section or key, or a value of the wrong type (named by
        `SECTION.FIELD`), or one the config rejects.
    """
    fields = dataclasses.fields(config_cls)
    unknown = set(d) - {f.name for f in fields}
    if unknown:
        raise ValueError(f"unknown config sections: {sorted(unknown)}")
    sections = {**section_types(config_cls), **(section_classes or {})}
    sections = {f.name: sections[f.name] for f in fields if f.name in sections}  # field order
    required = {f.name for f in fields
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
    kwargs = {name: _section_from_dict(name, section_cls, d[name])
              for name, section_cls in sections.items() if name in d or name in required}
    kwargs.update({f.name: d[f.name] for f in fields
                   if f.name not in sections and (f.name in d or f.name in required)})
    return config_cls(**kwargs)


def from_json(config_cls: type, s: str) -> Any:
    """A `config_cls` from `to_json` text (see `from_dict`)."""
    return from_dict(config_cls, json.loads(s))


def _section_from_dict(name: str, section_cls: type, values: Any) -> Any:
    if hasattr(section_cls, "from_dict"):
        # The model config: it fills missing keys and names unknown ones itself.
        if isinstance(values, dict):
            values = {k: v for k, v in values.items() if k != "model_type"}
            known = {f.name for f in dataclasses.fields(section_cls)}
            values = {**values, **typed_section(
                name, section_cls, {k: v for k, v in values.items() if k in known})}
        try:
            return section_cls.from_dict(values)
        except ValueError as e:  # "hidden_size=0 must be ..." -> "model.hidden_size=0 ..."
            field = re.match(r"\w*", str(e)).group()
            known = {f.name for f in dataclasses.fields(section_cls)}
            raise ValueError(f"{name}.{e}" if field in known else f"{name}: {e}") from None
    unknown = set(values) - {f.name for f in dataclasses.fields(section_cls)}
    if unknown:
        raise ValueError(f"unknown keys in config section '{name}': {sorted(unknown)}")
    return section_cls(**typed_section(name, section_cls, values))
