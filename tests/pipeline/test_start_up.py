"""A run's start-up imports TFX's own modules, never `tfx.v1`.

`tfx/v1/__init__.py` imports `tfx.v1.extensions`, which imports the Vertex AI and BigQuery
clients: ~6 s of every `deepseek-tfx run` on a 2-core machine (docs/development.md). Only
the Kubeflow runner, which compiles with KFP's own API, may import it.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PRODUCT = ("common", "models", "tokenization", "config", "savedmodel", "corpus", "evaluation",
           "components", "serving", "pipeline", "reporting", "cli")
ALLOWED = {"pipeline/kubeflow_runner.py"}


def tfx_v1_imports(path: pathlib.Path) -> list[int]:
    """Line numbers of `import tfx.v1...`, `from tfx.v1... import` and `from tfx import v1`."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        if any(n == "tfx.v1" or n.startswith("tfx.v1.") for n in names):
            lines.append(node.lineno)
    return lines


def test_no_product_module_imports_tfx_v1():
    found = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel not in ALLOWED and (lines := tfx_v1_imports(path)):
                found[rel] = lines
    assert not found, f"tfx.v1 imported (adds ~6 s to every run's start-up): {found}"


def test_the_scan_finds_each_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\nfrom tfx import v1 as tfx\nimport tfx.v1.dsl\n"
                    "from tfx.v1.orchestration import experimental\nfrom tfx import types\n")
    assert tfx_v1_imports(path) == [2, 3, 4]
