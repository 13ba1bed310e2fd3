"""Shared e2e fixtures: one whole-pipeline run (tiny preset) for every e2e module."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from shared_run import run_args
from until_transform import compared_outputs, component_states
from until_transform import run_args as until_transform_args

PROJECT_ROOT = Path(__file__).resolve().parents[2]

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
    """`deepseek-tfx run` in a subprocess, as a person runs it (tiny preset, the XLA step,
    see tests/shared_run.py); `console` is what it printed (stdout and stderr, merged)."""
    out = tmp_path_factory.mktemp("run")
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *run_args(corpus, out)],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout
    from pipeline.local_runner import run_paths

    return {**run_paths(str(out)), "wall_seconds": time.perf_counter() - start,
            "console": proc.stdout}


@pytest.fixture(scope="session")
def slice_path(tmp_path_factory, shakespeare):
    """The first SLICE_BYTES of Tiny Shakespeare, cut at a paragraph."""
    text = shakespeare[:SLICE_BYTES]
    path = tmp_path_factory.mktemp("slice") / "slice.txt"
    path.write_text(text[: text.rfind("\n\n") + 2], encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def until_transform(tmp_path_factory, slice_path):
    """`deepseek-tfx run --preset tiny --until Transform` on a copy of `slice_path`, in this
    process (tests/until_transform.py): test_caching_e2e.py's first run (it runs again into
    "output" and edits "data", its own copy: `slice_path` stays as it is for the other
    modules) and test_runners_e2e.py's LocalDagRunner reference. Its "states" and
    "outputs" are read at once, before any re-run."""
    import cli

    d = tmp_path_factory.mktemp("until_transform")
    data, out = d / "data" / slice_path.name, d / "out"
    data.parent.mkdir()
    shutil.copyfile(slice_path, data)
    args = until_transform_args(data, out)
    start = time.perf_counter()
    assert cli.main(args) == 0
    seconds = time.perf_counter() - start
    return {"args": args, "data": data, "output": out, "seconds": seconds,
            "states": component_states(out), "outputs": compared_outputs(out)}
