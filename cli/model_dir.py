"""`--model DIR` of the commands that load a SavedModel: the directory itself, or the
newest numbered version of a serving directory (what Pusher writes)."""

from __future__ import annotations

import os


def resolve_model_dir(model: str) -> str:
    """A SavedModel directory, or a serving directory whose newest version is used.

    Args:
      model: a directory holding saved_model.pb, or one holding numbered version
        directories (`<serving_dir>/<version>/saved_model.pb`).

    Returns:
      `model` itself, or `model/<the largest numbered version>`.

    Raises:
      SystemExit: neither a SavedModel nor any numbered version in it.
    """
    if os.path.isfile(os.path.join(model, "saved_model.pb")):
        return model
    versions = [d for d in os.listdir(model) if d.isdigit()] if os.path.isdir(model) else []
    if not versions:
        raise SystemExit(f"error: --model {model}: no SavedModel and no numbered versions in it")
    return os.path.join(model, max(versions, key=int))
