"""Lazy public names of a model package (PEP 562), shared by `models.deepseek` and
`models.deepseek_v4`: `import models.deepseek` stays light (no TensorFlow); the first
access to a layer or model class imports its module."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """The package's `__getattr__`, `__dir__` and `__all__` for `exports`.

    Args:
      package: the package's `__name__`.
      exports: public name -> the module defining it: a module of the package
        (`"config"`) or a full dotted path (`"models.layers.rms_norm"`).

    Returns:
      (__getattr__, __dir__, __all__). `__getattr__` raises AttributeError for a name
      not in `exports`, as a module does.
    """
    names = sorted(exports)

    def __getattr__(name: str) -> object:
        if name in exports:
            path = exports[name]
            module = importlib.import_module(path if "." in path else f"{package}.{path}")
            return getattr(module, name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return names

    return __getattr__, __dir__, names
