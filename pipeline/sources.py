"""The source fingerprint of a module-file entry point: the project code it runs.

TFX fingerprints a `module_file` into a component's cache key, but not a function given
by its import path (`preprocessing_fn=`, `run_fn=`). `create_pipeline` puts this
fingerprint into the component's custom_config instead, so an edit of the code the
component runs re-runs it, and an edit of anything else (the HTTP server, the CLI, the
report) keeps its cache. The code is found the way import-linter finds it: every
`import` statement of the entry module and, transitively, of each project module it
imports (those inside functions too), with the `__init__.py` of each package on the way.
"""

from __future__ import annotations

import ast
import hashlib
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module_file(module: str, root: str) -> str | None:
    """`root/a/b.py` or `root/a/b/__init__.py` for module `a.b`; None outside the project."""
    base = os.path.join(root, *module.split("."))
    for path in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(path):
            return path
    return None


def _imported_modules(path: str, module: str) -> set[str]:
    """Dotted names that `path` (module `module`) imports, `from a import b` giving both
    `a` and `a.b` (b may be a submodule)."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    names: set[str] = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, `level - 1` packages up
                parts = package.split(".")
                stem = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{stem}.{node.module}" if node.module else stem
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def source_files(entry_modules: tuple[str, ...], root: str = ROOT) -> list[str]:
    """The project's `.py` files that `entry_modules` import, transitively, sorted, paths
    relative to `root` (the entry modules' own files and their packages' `__init__.py`
    included). Modules that are not files under `root` (libraries) are left out.

    Raises:
      ModuleNotFoundError: an entry module is not a file under `root`.
    """
    todo, seen = [], {}
    for module in entry_modules:
        if _module_file(module, root) is None:
            raise ModuleNotFoundError(f"{module}: no such module under {root}")
        todo.append(module)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__
            name = ".".join(parts[:i])
            path = _module_file(name, root)
            if path is None or name in seen:
                continue
            seen[name] = path
            todo.extend(_imported_modules(path, name))
    return sorted(os.path.relpath(p, root) for p in set(seen.values()))


def source_fingerprint(entry_modules: tuple[str, ...], root: str = ROOT) -> str:
    """SHA-256 (hex) over `source_files(entry_modules)`: each file's relative path and its
    bytes, in sorted order.

    Raises:
      ModuleNotFoundError: as `source_files`.
    """
    digest = hashlib.sha256()
    for rel in source_files(entry_modules, root):
        digest.update(rel.encode("utf-8") + b"\0")
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()
