"""Functions longer than a screen: every `def` of the product's packages whose source,
from its `def` line (decorators not counted) to its last line, spans more than 80 lines,
and every module file longer than 500 lines. tests/test_code_shape.py runs it; by hand:

    python -m tools.long_functions            # prints the offenders, exit 1 if any
    python -m tools.long_functions --max-lines 60 --max-file-lines 400

Tests and benchmarks are not product code and are not counted.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "models", "tokenization", "config", "savedmodel", "corpus", "evaluation", "components",
            "serving", "pipeline", "reporting", "cli", "tools")
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 500
# Files allowed past MAX_FILE_LINES, each with its reason. All of models/ waits for the
# split into a shared kit and its families (issue 51, step 4), which moves these files'
# shared halves out.
FILE_EXCEPTIONS: dict[str, str] = {
    "models/deepseek_v4/memory_plan.py": "V4's inventory for the planner core "
                                         "(models/planning): weights, caches, attended keys "
                                         "and FLOPs of its three attention kinds",
    "models/formats/fp8.py": "FP8 block dequantization and its scale names read together; "
                             "read_dequantized and check_weight call each other, so a "
                             "sibling module would make a cycle",
    "models/deepseek/mla_attention.py": "MLA's train, prefill and absorbed-decode paths read "
                                        "together; the cache helpers go with the kit (issue 51)",
    "models/deepseek_v4/attention.py": "V4's attention keeps only what V4 changes once the "
                                       "kit exists (issue 51)",
    "components/trainer/data.py": "the input pipeline's pretraining, SFT and preference "
                                  "datasets share their packing helpers",
}


def product_files(root: Path = ROOT) -> list[Path]:
    """The product's Python files (tests and benchmarks excluded), sorted."""
    return sorted(p for pkg in PACKAGES for p in (root / pkg).rglob("*.py"))


def long_functions(path: Path, max_lines: int = MAX_FUNCTION_LINES,
                   source: str | None = None) -> list[tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of each function in `path` (or in
    `source`, its text when already read) longer than `max_lines`, nested functions and
    methods included.

    Raises:
      SyntaxError: `path` is not valid Python.
    """
    if source is None:
        source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1
                    if length > max_lines:
                        found.append((name, child.lineno, length))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def offenders(root: Path = ROOT, max_lines: int = MAX_FUNCTION_LINES,
              max_file_lines: int = MAX_FILE_LINES) -> list[str]:
    """One line per function over `max_lines` and per file over `max_file_lines` (outside
    FILE_EXCEPTIONS): `path:line name (N lines)`."""
    lines = []
    for path in product_files(root):
        rel = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        for name, lineno, length in long_functions(path, max_lines, source):
            lines.append(f"{rel}:{lineno} {name} ({length} lines > {max_lines})")
        n = len(source.splitlines())
        if n > max_file_lines and rel not in FILE_EXCEPTIONS:
            lines.append(f"{rel} ({n} lines > {max_file_lines})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.long_functions",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--max-lines", type=int, default=MAX_FUNCTION_LINES)
    parser.add_argument("--max-file-lines", type=int, default=MAX_FILE_LINES)
    args = parser.parse_args(argv)
    found = offenders(ROOT, args.max_lines, args.max_file_lines)
    print("\n".join(found) if found else "no function or file over its limit")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
