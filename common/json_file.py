"""JSON object files: one reader and one writer for the project's `.json` files.

A local path is read and written with Python's `open` (UTF-8, whatever the locale); a
URL (`gs://...`, anything with `://`) with `tf.io.gfile`, imported only then, so this
module needs only the standard library.

Errors name the file and say what is wrong (WHAT: the caller's name for the file,
when it gives one):

  FileNotFoundError  "PATH: no such file (WHAT)"
  JsonFileError      "PATH: not a JSON file (WHAT): line L column C: MESSAGE"
                     (invalid JSON, or bytes that are not UTF-8), or
                     "PATH: not a JSON object (WHAT): it holds a list" (an array,
                     a string, a number...).
"""

from __future__ import annotations

import json
import os
from typing import Any


class JsonFileError(ValueError):
    """A file that is not valid UTF-8 JSON, or whose value is not a JSON object."""


def _is_url(path: str) -> bool:
    return "://" in path


def exists(path: str) -> bool:
    """Whether `path` exists (local, or a URL through `tf.io.gfile`)."""
    if _is_url(path):
        import tensorflow as tf

        return tf.io.gfile.exists(path)
    return os.path.exists(path)


def read_json(path: str, what: str | None = None) -> dict[str, Any]:
    """The JSON object in the file at `path`.

    Args:
      path: a local path or a URL (`tf.io.gfile`).
      what: what the file is, for the messages (e.g. "the SavedModel's pipeline
        config"); None leaves it out.

    Returns:
      The parsed object (a dict; nested values as `json.loads` gives them).

    Raises:
      FileNotFoundError: no file at `path`.
      JsonFileError: the bytes are not UTF-8 JSON (with the line and column of the
        first error), or the value is not an object.
    """
    about = f" ({what})" if what else ""
    if not exists(path):
        raise FileNotFoundError(f"{path}: no such file{about}")
    if _is_url(path):
        import tensorflow as tf

        with tf.io.gfile.GFile(path, "rb") as f:
            raw = f.read()
    else:
        with open(path, "rb") as f:
            raw = f.read()
    try:
        value = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise JsonFileError(f"{path}: not a JSON file{about}: byte {e.start} is not "
                            f"UTF-8") from None
    except json.JSONDecodeError as e:
        raise JsonFileError(f"{path}: not a JSON file{about}: line {e.lineno} column "
                            f"{e.colno}: {e.msg}") from None
    if not isinstance(value, dict):
        raise JsonFileError(f"{path}: not a JSON object{about}: it holds a "
                            f"{type(value).__name__}")
    return value


def write_json(path: str, value: dict[str, Any], ensure_ascii: bool = False) -> None:
    """Writes `value` to `path` as indented JSON (2 spaces, sorted keys, final newline),
    creating the parent directories.

    Args:
      path: a local path or a URL (`tf.io.gfile`).
      value: a JSON-serializable object.
      ensure_ascii: write non-ASCII characters as `\\uXXXX` escapes (the same value).

    Raises:
      TypeError: `value` holds something JSON cannot represent.
    """
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=2, sort_keys=True) + "\n"
    parent = os.path.dirname(path)
    if _is_url(path):
        import tensorflow as tf

        if parent:
            tf.io.gfile.makedirs(parent)
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(text)
        return
    if parent:
        os.makedirs(parent, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
