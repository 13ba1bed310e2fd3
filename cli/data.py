"""Where a command's text comes from: the default corpus (Tiny Shakespeare) and
`--data PATH` split into ExampleGen's (input_base, pattern)."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

from cli import console

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS_NAME = "tinyshakespeare.txt"
DEFAULT_CORPUS_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)


def default_corpus() -> Path:
    """Tiny Shakespeare: `../shared/corpora/` beside the project when present,
    else `data/tinyshakespeare.txt`, fetched from its public source on first use.

    Raises:
      SystemExit: the fetch failed (no network); the message asks for `--data PATH`.
    """
    for candidate in (
        PROJECT_ROOT.parent / "shared" / "corpora" / DEFAULT_CORPUS_NAME,
        Path.cwd().parent / "shared" / "corpora" / DEFAULT_CORPUS_NAME,
    ):
        if candidate.is_file():
            return candidate
    local = PROJECT_ROOT / "data" / DEFAULT_CORPUS_NAME
    if not local.is_file():
        print(f"fetching Tiny Shakespeare from {DEFAULT_CORPUS_URL} -> {local}",
              file=console.stderr())
        tmp = local.with_suffix(".part")
        try:
            urllib.request.urlretrieve(DEFAULT_CORPUS_URL, tmp)
        except OSError as e:
            raise SystemExit(
                f"error: cannot fetch the default corpus ({e}); pass --data PATH to a text file"
            ) from e
        tmp.rename(local)
    return local


def split_data_path(data: str) -> tuple[str, str]:
    """PATH -> (input_base, pattern) for ExampleGen: a file, a directory or a glob.

    Raises:
      SystemExit: PATH is neither a file, a directory nor a glob.
    """
    path = os.path.abspath(data)
    if os.path.isdir(path):
        return path, "*"
    if any(ch in os.path.basename(path) for ch in "*?["):
        return os.path.dirname(path), os.path.basename(path)
    if not os.path.isfile(path):
        raise SystemExit(f"error: --data {data}: no such file or directory")
    return os.path.dirname(path), os.path.basename(path)
