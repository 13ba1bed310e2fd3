"""Several served models and an A/B split of traffic between them (`deepseek-tfx serve`).

Flags:
- `--model DIR` (with `--model-name NAME`, default "deepseek") serves one model, as before.
- `--model NAME=DIR`, repeatable, serves several, each under its NAME. A bare `--model
  DIR` may sit beside them and is named by `--model-name`. Names are unique and match
  `[A-Za-z0-9._-]{1,128}` (not "." or ".."): they appear in URLs (`/v1/models/NAME`) and
  metric labels.
- A DIR may itself contain "=": a value is read as NAME=DIR only when the part before
  its first "=" is a valid name and the whole value is not an existing path. So
  `--model runs/lr=3e-4` (an existing directory) is one unnamed model, and
  `--model A=runs/lr=3e-4` is model A in `runs/lr=3e-4`.
- `--split A=90,B=10` sends a route's traffic to the named models in these shares.
  Weights are percentages: positive decimal numbers (`33.4`) that sum to 100 (within
  1e-6), every name a served model, each once. Models left out of the split get no
  split traffic (they are still served by name).

A request that carries a user or session id (OpenAI's `user` field, say) is sticky: the
id's SHA-256 (not Python's `hash()`, which changes per process) gives a point in [0, 1),
and the model whose cumulative share covers that point answers, in every process and
after every restart. Changing 90/10 to 80/20 moves only the ids in [0.8, 0.9) from A to B.
Requests without an id are assigned at random in the same shares.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import math
import os
import random
import re
from collections.abc import Iterable

NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")
NAME_RULE = "1-128 characters of A-Z a-z 0-9 . _ -, not '.' or '..'"


def valid_name(name: str) -> bool:
    """Whether `name` may name a served model (`NAME_RULE`)."""
    return bool(NAME_PATTERN.fullmatch(name)) and name not in (".", "..")


def parse_models(values: list[str], default_name: str) -> dict[str, str]:
    """The served models of `--model` values: {name: dir}, in the order given.

    Args:
      values: every `--model` value (argparse `action="append"`): `DIR` or `NAME=DIR`.
      default_name: the name of a bare `DIR` (`--model-name`).

    Returns:
      {name: dir}; the dirs are as given (not checked here: loading reports a missing
      one). The first entry is the first `--model`.

    Raises:
      ValueError (one line, naming the value): no values, an empty value or DIR, an
        invalid name (or `--model-name`), two bare DIRs, or a name given twice.
    """
    if not values:
        raise ValueError("--model: no model given (--model DIR or --model NAME=DIR)")
    models: dict[str, str] = {}
    bare = None
    for value in values:
        if not value:
            raise ValueError("--model '': empty; give DIR or NAME=DIR")
        name, sep, path = value.partition("=")
        if sep and not os.path.exists(value):
            if not valid_name(name):
                raise ValueError(
                    f"--model {value!r}: {name!r} is not a valid model name ({NAME_RULE}), "
                    f"and {value!r} is not an existing path")
            if not path:
                raise ValueError(f"--model {value!r}: no directory after '{name}='")
        else:  # a bare DIR, named by --model-name
            if bare is not None:
                raise ValueError(
                    f"--model {value!r}: a second model without a name (after {bare!r}); "
                    "name each with --model NAME=DIR")
            if not valid_name(default_name):
                raise ValueError(
                    f"--model-name {default_name!r} is not a valid model name ({NAME_RULE})")
            bare, name, path = value, default_name, value
        if name in models:
            named_by = " (--model-name)" if value == bare else ""
            raise ValueError(
                f"--model {value!r}: the name {name!r}{named_by} is given twice "
                f"(also for {models[name]!r})")
        models[name] = path
    return models


@dataclasses.dataclass(frozen=True)
class ModelSplit:
    """Shares of traffic per served model (`--split`); `choose` picks one per request.

    Attributes:
      weights: (name, percent) pairs in the order given, percents > 0 summing to 100.
      seed: seeds the random choice of requests without an id (None: from the OS).
    """

    weights: tuple[tuple[str, float], ...]
    seed: int | None = None
    _bounds: tuple[float, ...] = dataclasses.field(init=False, repr=False, compare=False)
    _rng: random.Random = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.weights:
            raise ValueError("a split needs at least one model")
        names = [name for name, _ in self.weights]
        if len(set(names)) != len(names):
            raise ValueError(f"split {self.weights}: a model is given twice")
        if not all(isinstance(w, (int, float)) and 0 < w < math.inf for _, w in self.weights):
            raise ValueError(f"split {self.weights}: weights must be finite numbers > 0")
        total = math.fsum(w for _, w in self.weights)
        bounds, running = [], 0.0
        for _, weight in self.weights:
            running += weight
            bounds.append(running / total)
        bounds[-1] = 1.0  # no gap at the top from rounding
        object.__setattr__(self, "_bounds", tuple(bounds))
        object.__setattr__(self, "_rng", random.Random(self.seed))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.weights)

    def shares(self) -> dict[str, float]:
        """{name: fraction of traffic}, fractions in (0, 1] summing to 1."""
        total = math.fsum(w for _, w in self.weights)
        return {name: w / total for name, w in self.weights}

    def __str__(self) -> str:
        return ",".join(f"{name}={weight:g}" for name, weight in self.weights)

    @staticmethod
    def point(user: str) -> float:
        """The sticky point in [0, 1) of a user or session id: the first 8 bytes of the
        SHA-256 of its UTF-8 bytes (lone surrogates of undecodable bytes kept), / 2**64."""
        digest = hashlib.sha256(user.encode("utf-8", "surrogatepass")).digest()
        return int.from_bytes(digest[:8], "big") / 2.0**64

    def choose(self, user: str | None = None) -> str:
        """The model for one request: sticky by `user` (a user or session id, any
        string; the same id always gets the same model), random when it is None or "".
        Thread-safe."""
        point = self.point(user) if user else self._rng.random()
        return self.weights[bisect.bisect_right(self._bounds, point)][0]


_WEIGHT = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def parse_split(text: str, names: Iterable[str], seed: int | None = None) -> ModelSplit:
    """The `--split` value `NAME=PERCENT,...`, e.g. "A=90,B=10".

    Args:
      text: comma-separated NAME=PERCENT items (spaces around items and "=" allowed).
      names: the served model names (`parse_models(...)` keys).
      seed: seeds the random choice for requests without an id (tests).

    Raises:
      ValueError (one line, naming the value): an empty value or item, an item without
        "=", a name that is not served or given twice, a weight that is not a positive
        decimal number, or weights that do not sum to 100.
    """
    served = list(names)
    if not text or not text.strip():
        raise ValueError("--split '': empty; give NAME=PERCENT,..., e.g. A=90,B=10")
    weights: list[tuple[str, float]] = []
    for item in text.split(","):
        name, sep, weight = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise ValueError(f"--split {text!r}: {item.strip()!r} is not NAME=PERCENT "
                             "(e.g. A=90,B=10)")
        if name not in served:
            raise ValueError(f"--split {text!r}: {name!r} is not a served model "
                             f"(served: {', '.join(served)})")
        if name in (n for n, _ in weights):
            raise ValueError(f"--split {text!r}: {name!r} is given twice")
        if not _WEIGHT.fullmatch(weight) or float(weight) <= 0:
            raise ValueError(f"--split {text!r}: the weight {weight!r} of {name!r} is not "
                             "a positive number (a percent, e.g. 90 or 12.5)")
        weights.append((name, float(weight)))
    total = math.fsum(w for _, w in weights)
    if abs(total - 100.0) > 1e-6:
        raise ValueError(f"--split {text!r}: the weights sum to {total:g}, not 100 "
                         "(they are percents)")
    return ModelSplit(tuple(weights), seed)
