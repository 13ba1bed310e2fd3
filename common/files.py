"""Files a reader may open: regular files only. A FIFO, a device or a socket in a data
directory would block a reader (a FIFO's `open` waits for a writer) or never end, so
readers refuse them by name before opening anything (`os.stat`, which opens nothing)."""

from __future__ import annotations

import codecs
import os
import posixpath
import stat
from collections.abc import Callable

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


def special_file_kind(path: str) -> str | None:
    """What `path` is when it is not a regular file, e.g. "a FIFO (named pipe)"; None for
    a regular file (links followed), for a path that cannot be stat'ed (its reader's
    `open` fails and names it) and for a remote path (`scheme://...`, no such files)."""
    if "://" in path:
        return None
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


GLOB_CHARACTERS = "*?["


def split_input_path(path: str,
                     isdir: Callable[[str], bool] = os.path.isdir) -> tuple[str, str]:
    """A data path -> (input_base, pattern), as ExampleGen reads it: a directory is
    (path, "*"); a glob (`*?[` in its last part) or a file is (its directory, its last
    part). Local paths are made absolute; a remote one
    (`scheme://...`, e.g. `gs://bucket/dir/*.txt`) is kept as given, split on '/'.

    Nothing is opened or checked but `isdir(path)` (pass `tf.io.gfile.isdir` for
    remote paths); whether the pattern matches any file is the caller's question.
    """
    remote = "://" in path
    if not remote:
        path = os.path.abspath(path)
    elif path.endswith("/") and not path.endswith("://"):
        path = path.rstrip("/")
    split = posixpath.split if remote else os.path.split
    if isdir(path):
        return path, "*"
    return split(path)


def file_sha256(path: str) -> str:
    """SHA-256 (hex) of a file's bytes, read 1 MiB at a time through TensorFlow's file
    system (a local path or a URL such as gs://...; TensorFlow is imported here only).

    Raises:
      tf.errors.NotFoundError: no such file.
    """
    import hashlib

    import tensorflow as tf

    digest = hashlib.sha256()
    with tf.io.gfile.GFile(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def shown(text: str) -> str:
    """`text` printable whatever its bytes: the bytes of a file name or command-line
    argument that are not UTF-8 (which Python holds as lone surrogates, `surrogateescape`)
    as `\\xNN`, other unencodable characters as `\\uNNNN`; UTF-8 text is unchanged."""
    return text.encode("utf-8", ESCAPE_ERRORS).decode("utf-8")


def _escape(error: UnicodeError):
    """A codecs error handler: undecodable bytes (U+DC80..U+DCFF) as `\\xNN`, other
    unencodable characters as backslash escapes."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    pieces = []
    for c in error.object[error.start:error.end]:
        code = ord(c)
        pieces.append(f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF
                      else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return "".join(pieces), error.end


ESCAPE_ERRORS = "deepseek_tfx.shown"  # `_escape`'s name for `errors=` (str.encode, open)
codecs.register_error(ESCAPE_ERRORS, _escape)
