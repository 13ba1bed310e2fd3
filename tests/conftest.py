"""Shared test fixtures: the real corpus and small slices of it."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CORPUS = PROJECT_ROOT.parent / "shared" / "corpora" / "tinyshakespeare.txt"


@pytest.fixture(scope="module", autouse=True)
def collect_garbage_after_each_module():
    """A full garbage collection when a test module is done: traced tf.functions, models
    and SavedModels sit in reference cycles, and the suite runs in one process."""
    yield
    gc.collect()


@pytest.fixture(scope="session", autouse=True)
def cli_log_dir(tmp_path_factory):
    """The CLI's log files of commands without --output go here, not to ~/.cache."""
    os.environ["DEEPSEEK_TFX_LOG_DIR"] = str(tmp_path_factory.mktemp("cli_logs"))


@pytest.fixture(scope="session")
def shakespeare() -> str:
    """Tiny Shakespeare (real text). Tests that need it skip loudly when absent."""
    if not CORPUS.is_file():
        pytest.skip(f"corpus not found at {CORPUS}")
    return CORPUS.read_text(encoding="utf-8")


POEMS = PROJECT_ROOT.parent / "shared" / "corpora" / "tang_song_poems.txt"


@pytest.fixture(scope="session")
def chinese_poems() -> list[str]:
    """Tang and Song poems (real Chinese text), one per entry, ANSI colour codes removed."""
    import re

    if not POEMS.is_file():
        pytest.skip(f"corpus not found at {POEMS}")
    text = re.sub(r"\x1b\[[0-9;]*m", "", POEMS.read_text(encoding="utf-8"))
    return [p.strip("\n") for p in text.split("\n%\n") if p.strip()]
