"""The weight initializer of every DeepSeek layer, and a scope that skips drawing it.

Every matrix and the embedding start from N(0, initializer_range²) (HF
`DeepseekV3PreTrainedModel._init_weights`). A model that is about to receive every
weight from a checkpoint (hf-import, a base model, a SavedModel read back) need not
draw them: inside `weights_from_checkpoint()` the layers create those weights as
zeros. Drawing normals costs a float32 temporary per weight and the time to fill it
(1.36B parameters: about 18 s and 1.1 GB of RSS the allocator keeps, measured by
benchmarks/hf_checkpoint_memory.py's import), and a checkpoint overwrites them anyway.
The readers check that every weight was assigned, so none stays zero unnoticed.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import keras

_FROM_CHECKPOINT = contextvars.ContextVar("deepseek_weights_from_checkpoint", default=False)


@contextlib.contextmanager
def weights_from_checkpoint() -> Iterator[None]:
    """Within it, `normal(...)` gives zeros: build a model here only to assign every
    weight right after (the callers check that none is left unassigned)."""
    token = _FROM_CHECKPOINT.set(True)
    try:
        yield
    finally:
        _FROM_CHECKPOINT.reset(token)


def normal(stddev: float) -> keras.initializers.Initializer:
    """N(0, stddev²) (`keras.initializers.RandomNormal`), or zeros inside
    `weights_from_checkpoint()`."""
    if _FROM_CHECKPOINT.get():
        return keras.initializers.Zeros()
    return keras.initializers.RandomNormal(stddev=stddev)
