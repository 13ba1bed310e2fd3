"""The (de)serialization both families' frozen config dataclasses share.

`DeepSeekConfig` and `DeepSeekV4Config` inherit `ModelConfig`: `to_dict` (every field,
JSON-serializable), `from_dict` (its inverse, naming unknown keys) and `replace` (a
validated copy). The config itself stays a `@dataclasses.dataclass(frozen=True)`, the
model's single source of truth; this base adds no fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, TypeVar

_Config = TypeVar("_Config", bound="ModelConfig")


class ModelConfig:
    """Base of a frozen config dataclass: `to_dict`, `from_dict` and `replace`.

    Attributes:
      list_fields: names of tuple fields `to_dict` writes as lists (JSON has no tuples).
    """

    list_fields: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable dict of every field (`list_fields` as lists)."""
        d = dataclasses.asdict(self)
        for name in self.list_fields:
            d[name] = list(getattr(self, name))
        return d

    @classmethod
    def from_dict(cls: type[_Config], d: dict[str, Any]) -> _Config:
        """Builds a config from `to_dict()` output (missing keys take defaults).

        Raises:
          ValueError: if `d` has keys that are not fields, naming them.
        """
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} keys: {unknown}")
        return cls(**d)

    def replace(self: _Config, **changes: Any) -> _Config:
        """A copy with `changes` applied and validated (dataclasses.replace)."""
        return dataclasses.replace(self, **changes)
