"""Where a command's text comes from: the default corpus (Tiny Shakespeare) and
`--data PATH` split into ExampleGen's (input_base, pattern)."""

from __future__ import annotations

import fnmatch
import os
import urllib.request
from pathlib import Path

from cli import console
from common.files import shown, special_file_kind

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

    Nothing is opened: a PATH, or a file it covers (a directory's entries, a glob's
    matches; subdirectories are skipped, as ExampleGen does), that is not a regular file
    (a FIFO, a device, a socket; `common.files.special_file_kind`) or whose name is not
    UTF-8 is refused by name, since reading it would block or its name cannot be
    recorded (ML Metadata and TensorFlow take UTF-8 paths).

    Raises:
      SystemExit: PATH is neither a file, a directory nor a glob, or covers such a file
        (one line, the names shown with undecodable bytes as `\\xNN`).
    """
    path = os.path.abspath(data)
    if os.path.isdir(path):
        base, pattern = path, "*"
    elif any(ch in os.path.basename(path) for ch in "*?["):
        base, pattern = os.path.dirname(path), os.path.basename(path)
    elif os.path.lexists(path) and special_file_kind(path):
        raise SystemExit(f"error: --data '{shown(data)}' is {special_file_kind(path)}, not a "
                         "regular file or directory; refused (nothing was read)")
    elif not os.path.isfile(path):
        raise SystemExit(f"error: --data '{shown(data)}': no such file or directory")
    else:
        return os.path.dirname(path), os.path.basename(path)
    refused = []
    try:
        names = sorted(n for n in os.listdir(base) if fnmatch.fnmatch(n, pattern))
    except OSError as e:
        raise SystemExit(f"error: --data '{shown(data)}': cannot list {shown(base)} "
                         f"({e.strerror})") from e
    for name in names:
        kind = special_file_kind(os.path.join(base, name))
        if kind == "a directory":
            continue
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            kind = kind or "a file whose name is not UTF-8"
        if kind:
            refused.append(f"'{shown(name)}' is {kind}")
    if refused:
        more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
        raise SystemExit(f"error: --data '{shown(data)}': {'; '.join(refused[:3])}{more}; "
                         "refused, nothing was read: move or rename them, or point --data at "
                         "the regular files (a glob)")
    return base, pattern
