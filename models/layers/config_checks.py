"""The field checks both families' configs run in `__post_init__`.

`DeepSeekConfig` (V2/V3/V3.2) and `DeepSeekV4Config` validate their fields with these, so
a bad value raises the same `ValueError`, naming the field and the value, in either family.
"""

from __future__ import annotations

import numbers
from typing import Any


def check_int(name: str, value: Any, minimum: int) -> None:
    """Checks that `value` is an int (not a bool) >= `minimum`.

    Raises:
      ValueError: `"{name}={value!r} must be an integer >= {minimum}"`.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def check_float(name: str, value: Any, positive: bool) -> None:
    """Checks that `value` is a number (not a bool), > 0 if `positive`, else >= 0.

    Raises:
      ValueError: naming `name` and the value: not a number, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name}={value!r} must be a number")
    if positive and value <= 0:
        raise ValueError(f"{name}={value!r} must be > 0")
    if not positive and value < 0:
        raise ValueError(f"{name}={value!r} must be >= 0")


def check_keep_range(keep: Any, num_experts_per_tok: int, n_routed_experts: int,
                     name: str = "keep") -> int:
    """`keep` as an int if it is a number of routed experts a MoE layer can be pruned to:
    an integer in [num_experts_per_tok, n_routed_experts] (every token routes to
    num_experts_per_tok distinct experts). V2/V3 and V4 configs share this rule.

    Raises:
      ValueError: naming `name` and the value.
    """
    if isinstance(keep, bool) or not isinstance(keep, numbers.Integral):  # numpy ints too
        raise ValueError(f"{name}={keep!r} must be an integer")
    keep = int(keep)
    k, n_experts = num_experts_per_tok, n_routed_experts
    if not k <= keep <= n_experts:
        raise ValueError(f"{name}={keep} must be in [num_experts_per_tok={k}, "
                         f"n_routed_experts={n_experts}]: every token routes to {k} "
                         "distinct experts")
    return keep
