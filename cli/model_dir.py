"""`--model DIR` of the commands that load a SavedModel: the directory itself, or the
newest numbered version of a serving directory (what Pusher writes)."""

from __future__ import annotations

import os


def resolve_model_dir(model: str) -> str:
    """A SavedModel directory, or a serving directory whose newest version is used
    (`savedmodel.layout.latest_version`, the server's rule too).

    Args:
      model: a directory holding saved_model.pb, or one holding numbered version
        directories (`<serving_dir>/<version>/saved_model.pb`).

    Returns:
      `model` itself, or `model/<the largest numbered version holding a SavedModel>`.

    Raises:
      SystemExit: neither a SavedModel nor any numbered version with one in it.
    """
    from savedmodel.layout import latest_version  # imports TensorFlow: not at `cli` import

    if not os.path.isdir(model):
        raise SystemExit(f"error: --model {model}: no such directory")
    try:
        return latest_version(model)[0]
    except FileNotFoundError:
        raise SystemExit(f"error: --model {model}: no SavedModel and no numbered versions "
                         "in it") from None
