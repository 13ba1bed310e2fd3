"""The range and choice checks the config sections run on construction."""

from __future__ import annotations


def check_positive(name: str, value: float) -> None:
    """Raises ValueError naming `name` and `value` unless value > 0."""
    if value <= 0:
        raise ValueError(f"{name}={value} must be > 0")


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """Raises ValueError naming `name`, `value` and `choices` unless value is one of them."""
    if value not in choices:
        raise ValueError(f"{name}='{value}' must be one of {list(choices)}")
