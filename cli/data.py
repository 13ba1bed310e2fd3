"""Where a command's text comes from: the default corpus (Tiny Shakespeare),
`--data PATH` split into ExampleGen's (input_base, pattern), and `run`'s named sources
(`--data NAME=PATH --weight NAME=W --source-set NAME.FIELD=VALUE`, `config/sources.py`)."""

from __future__ import annotations

import fnmatch
import os
import urllib.request
from pathlib import Path

from cli import console
from common.files import GLOB_CHARACTERS, shown, special_file_kind, split_input_path

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

    A URL (`gs://bucket/dir/*.txt`, anything with `://`) is not checked here (TensorFlow's
    file system reads it in ExampleGen): its last part is the pattern (a file name or a
    glob; a whole directory is `gs://bucket/dir/*`).

    Raises:
      SystemExit: PATH is neither a file, a directory nor a glob, or covers such a file
        (one line, the names shown with undecodable bytes as `\\xNN`).
    """
    if "://" in data:
        base, _, pattern = data.rstrip("/").rpartition("/")
        if not pattern or base.endswith(":/"):
            raise SystemExit(f"error: --data '{shown(data)}': name the files in the bucket "
                             "(gs://bucket/dir/*.txt)")
        return base, pattern
    path = os.path.abspath(data)
    base, pattern = split_input_path(path)
    if base == path or any(ch in pattern for ch in GLOB_CHARACTERS):
        pass  # a directory or a glob: its files are checked below
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


def sources_overrides(args, overrides: dict) -> dict:
    """`overrides` with `data.sources` of `run`'s `--data NAME=PATH ...`, `--weight NAME=W
    ...` and `--source-set NAME.FIELD=VALUE ...` (`config.parse_sources`); unchanged for
    one bare `--data PATH` or none.

    `--data NAME=PATH` whose whole text is also an existing file or directory is refused
    as ambiguous: `./NAME=PATH` is the path, `NAME=./PATH` the source.

    Raises:
      SystemExit: one `error: ...` line naming the argument (`parse_sources`), an
        ambiguous NAME=PATH, or sources given both by --data and by `--set data.sources`.
    """
    from config import parse_sources, split_source_arg

    data = args.data if isinstance(args.data, list) else [args.data] if args.data else []
    for value in data:
        name, path = split_source_arg(value)
        if name is not None and os.path.lexists(value):
            raise SystemExit(f"error: --data '{shown(value)}' is both the source {name!r} at "
                             f"'{shown(path)}' and an existing path: write './{shown(value)}' "
                             f"for the path, or '{name}=./{shown(path)}' for the source")
    try:
        sources = parse_sources(data, getattr(args, "weight", None),
                                getattr(args, "source_set", None))
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if data and "data.sources" in overrides:
        raise SystemExit("error: --data and --set data.sources both give the data; give "
                         "one of them")
    if sources:
        overrides = {**overrides, "data.sources": list(sources)}
    return overrides


def checked_sources(config):
    """`config` with every `data.sources` path checked (`split_data_path`: a file, a
    directory or a glob of regular files) and made absolute (a directory as `DIR/*`).

    Raises:
      SystemExit: a path `split_data_path` refuses, in its one line.
    """
    if not config.data.sources:
        return config
    import dataclasses

    sources = []
    for source in config.data.sources:
        try:
            path = os.path.join(*split_data_path(source.path))
        except SystemExit as e:  # name the source too
            raise SystemExit(f"error: source {source.name!r}: "
                             f"{str(e.code).removeprefix('error: ')}") from None
        sources.append(dataclasses.replace(source, path=path))
    return dataclasses.replace(config, data=dataclasses.replace(config.data,
                                                                sources=tuple(sources)))


def data_lines(config, input_path: str) -> list[str]:
    """What `run` says about its data, after `preset NAME, `: `data PATH` for one source
    given as a path; else `data N sources` and one line per source: its name, its share
    of the training batches (weights normalized to sum to 1), its path and the settings
    it sets for itself."""
    sources = config.data.sources
    if not sources:
        return [f"data {input_path}"]
    shares = config.data.source_weights()
    width = max(len(s.name) for s in sources)
    lines = [f"data {len(sources)} source{'s' if len(sources) > 1 else ''} "
             "(name, share of the training batches, path)"]
    for s in sources:
        own = ", ".join(f"{k}={v}" for k, v in s.settings().items())
        lines.append(f"  {s.name:<{width}}  {shares[s.name]:.3f}  {s.path}"
                     + (f"  ({own})" if own else ""))
    return lines


def corpus_name(args) -> str:
    """The corpus part of `run`'s default output directory: the named sources joined by
    '+', else the file's stem or the directory's name of `--data PATH` (the default
    corpus when none)."""
    from config import split_source_arg

    data = args.data if isinstance(args.data, list) else [args.data] if args.data else []
    names = [name for name, _ in map(split_source_arg, data) if name is not None]
    if names:
        return "+".join(names)
    input_base, pattern = split_data_path(data[-1] if data else str(default_corpus()))
    return Path(pattern).stem if pattern != "*" else Path(input_base).name
