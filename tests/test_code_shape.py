"""The code's shape (issue 51): no product function longer than 80 lines, no product file
longer than 500 lines outside the named exceptions (`tools/long_functions.py`)."""

from __future__ import annotations

from pathlib import Path

from tools import long_functions

ROOT = Path(__file__).resolve().parent.parent


def test_no_product_function_or_file_is_over_its_limit():
    found = long_functions.offenders()
    assert not found, "split these (tools/long_functions.py):\n" + "\n".join(found)


def test_every_file_exception_still_exists_and_is_still_long():
    for rel in long_functions.FILE_EXCEPTIONS:
        path = ROOT / rel
        assert path.is_file(), f"{rel} is gone: drop it from FILE_EXCEPTIONS"
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines > long_functions.MAX_FILE_LINES, (
            f"{rel} has {lines} lines now: drop it from FILE_EXCEPTIONS")


def test_the_checker_finds_a_long_function(tmp_path):
    body = "\n".join(f"            x{i} = {i}" for i in range(85))
    path = tmp_path / "long.py"
    path.write_text(f"class A:\n    def f(self):\n        def g():\n{body}\n", encoding="utf-8")
    assert [name for name, _, _ in long_functions.long_functions(path)] == ["A.f", "A.f.g"]
