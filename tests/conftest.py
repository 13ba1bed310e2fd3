"""Shared test fixtures: the real corpus and small slices of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CORPUS = PROJECT_ROOT.parent / "shared" / "corpora" / "tinyshakespeare.txt"


@pytest.fixture(scope="session")
def shakespeare() -> str:
    """Tiny Shakespeare (real text). Tests that need it skip loudly when absent."""
    if not CORPUS.is_file():
        pytest.skip(f"corpus not found at {CORPUS}")
    return CORPUS.read_text(encoding="utf-8")
