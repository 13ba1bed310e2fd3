"""How DeepSeek-V4 may use V2/V3 (issue 51): as transformers' modular files do, through
V3's public names only (inherit a V3 class and change what V4 changes). What both
families share lives in the kit (`models.layers`, `models.formats`, `models.planning`),
which imports no family (import-linter contracts in pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
V3 = "models.deepseek"


def _is_v3(module: str | None) -> bool:
    return module is not None and (module == V3 or module.startswith(V3 + "."))


def private_uses(source: str) -> list[str]:
    """`from models.deepseek... import _x`, `import models.deepseek._m`, and `m._x` where
    `m` names a module imported from models.deepseek, in `source`."""
    tree = ast.parse(source)
    found, aliases = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _is_v3(node.module):
            for alias in node.names:
                if alias.name.startswith("_") or any(
                        part.startswith("_") for part in node.module.split(".")):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_v3(alias.name) and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"line {node.lineno}: import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_v4_uses_no_private_name_of_v3():
    found = [f"{path.relative_to(ROOT)} {use}"
             for path in sorted((ROOT / "models" / "deepseek_v4").glob("*.py"))
             for use in private_uses(path.read_text(encoding="utf-8"))]
    assert not found, ("V4 uses V3's private names; make them public in the kit "
                       "(models/layers, models/formats, models/planning):\n" + "\n".join(found))


def uninherited_imports(source: str) -> list[str]:
    """Names `source` imports from models.deepseek that no class in it inherits."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name: node.lineno for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and _is_v3(node.module)
                for alias in node.names}
    imported.update({(alias.asname or alias.name): node.lineno for node in ast.walk(tree)
                     if isinstance(node, ast.Import) for alias in node.names
                     if _is_v3(alias.name)})
    bases = {base.id for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
             for base in node.bases if isinstance(base, ast.Name)}
    return [f"line {line}: {name}" for name, line in imported.items() if name not in bases]


def test_v4_takes_from_v3_only_the_classes_it_inherits():
    found = [f"{path.relative_to(ROOT)} {use}"
             for path in sorted((ROOT / "models" / "deepseek_v4").glob("*.py"))
             for use in uninherited_imports(path.read_text(encoding="utf-8"))]
    assert not found, ("V4 imports from V3 what it does not inherit; what both families "
                       "use belongs in the kit:\n" + "\n".join(found))


def test_the_check_finds_a_private_import_and_attribute():
    source = ("from models.deepseek.config import _check_int, check_keep_range\n"
              "from models.deepseek import memory_plan as base\n"
              "x = base._min_devices\n"
              "y = base.plan\n")
    assert private_uses(source) == [
        "line 1: from models.deepseek.config import _check_int", "line 3: base._min_devices"]


def test_the_check_finds_an_import_that_is_not_a_base_class():
    source = ("from models.deepseek.router import DeepSeekTopKRouter\n"
              "from models.deepseek.moe import expert_counts\n"
              "class V4Router(DeepSeekTopKRouter):\n"
              "    pass\n")
    assert uninherited_imports(source) == ["line 2: expert_counts"]
