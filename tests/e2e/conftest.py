"""Shared e2e fixtures: one whole-pipeline run (tiny preset) for every e2e module."""

from __future__ import annotations

import time

import pytest

SLICE_BYTES = 60_000


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, shakespeare):
    d = tmp_path_factory.mktemp("corpus")
    path = d / "shakespeare_slice.txt"
    # Whole paragraphs, plus one exact duplicate and one whitespace-only paragraph.
    text = shakespeare[:SLICE_BYTES]
    text = text[: text.rfind("\n\n") + 2]
    first = text.split("\n\n")[1]
    path.write_text(text + first + "\n\n \t \n\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def run(tmp_path_factory, corpus):
    from pipeline import cli

    out = tmp_path_factory.mktemp("run")
    start = time.perf_counter()
    code = cli.main(["run", "--data", str(corpus), "--preset", "tiny", "--output", str(out)])
    assert code == 0
    from pipeline.local_runner import run_paths

    return {**run_paths(str(out)), "wall_seconds": time.perf_counter() - start}


@pytest.fixture(scope="session")
def slice_path(tmp_path_factory, shakespeare):
    """The first SLICE_BYTES of Tiny Shakespeare, cut at a paragraph."""
    text = shakespeare[:SLICE_BYTES]
    path = tmp_path_factory.mktemp("slice") / "slice.txt"
    path.write_text(text[: text.rfind("\n\n") + 2], encoding="utf-8")
    return path
