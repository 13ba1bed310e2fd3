"""End to end: BeamDagRunner with the DirectRunner in multi-processing mode (2 worker
processes), and the Beam components through Beam's PortableRunner (an embedded job
server with LOOPBACK workers: the portable translation Flink and Spark receive), give the
same ingestion, cleaning and Transform outputs as LocalDagRunner with the DirectRunner.

The runs use the `tiny` preset on the same slice of Tiny Shakespeare and stop after
Transform (`--until Transform`). Compared: records per split of TextExampleGen,
TextCleaner and Transform, and the tokenizer.json in the transform graph's assets.
Run with `-s` to see the figures (record counts, tokenizer size, wall times).
"""

from __future__ import annotations

import glob
import json
import os
import time

import pytest
from until_transform import COMPARED, compared_outputs, run_args

MULTI_PROCESSING = ["--beam-arg=--direct_running_mode=multi_processing",
                    "--beam-arg=--direct_num_workers=2"]
# Beam's portable path, offline: the job server runs in this process (`embed`) and the SDK
# workers are this process's threads (LOOPBACK); no Java, no Maven jar.
PORTABLE = ["--beam-arg=--runner=PortableRunner", "--beam-arg=--job_endpoint=embed",
            "--beam-arg=--environment_type=LOOPBACK"]


def _run(out, corpus, *extra) -> float:
    import cli

    start = time.perf_counter()
    assert cli.main([*run_args(corpus, out), *extra]) == 0
    return time.perf_counter() - start


@pytest.fixture(scope="module")
def runs(tmp_path_factory, slice_path, until_transform):
    """(LocalDagRunner, BeamDagRunner multi-processing) outputs. The LocalDagRunner run is
    the e2e tier's `until_transform` (tests/e2e/conftest.py: the same arguments on a copy of
    `slice_path`), shared with test_caching_e2e.py."""
    beam_dir = tmp_path_factory.mktemp("beam")
    local_s = until_transform["seconds"]
    beam_s = _run(beam_dir, slice_path, "--runner", "beam", *MULTI_PROCESSING)
    local, beam = until_transform["outputs"], compared_outputs(beam_dir)
    vocab_size = len(json.loads(local["tokenizer"])["model"]["vocab"])
    print(f"\nrecords per split: {local['counts']}\ntokenizer: {vocab_size} tokens\n"
          f"wall time: LocalDagRunner {local_s:.1f} s, BeamDagRunner + DirectRunner "
          f"multi_processing x2 {beam_s:.1f} s")
    return local, beam


@pytest.fixture(scope="module")
def portable(tmp_path_factory, slice_path):
    """LocalDagRunner whose Beam components run through PortableRunner: (outputs, the run's
    log text, wall seconds)."""
    out = tmp_path_factory.mktemp("portable")
    seconds = _run(out, slice_path, *PORTABLE)
    (log,) = glob.glob(os.path.join(out, "logs", "run-*.log"))
    with open(log, encoding="utf-8") as f:
        text = f.read()
    print(f"\nwall time: LocalDagRunner + PortableRunner (embed, LOOPBACK) {seconds:.1f} s")
    return compared_outputs(out), text, seconds


def test_the_portable_runner_ran_the_beam_components(portable):
    """The Beam pipelines went through the portable job service (not the DirectRunner)."""
    _, log, _ = portable
    assert "apache_beam.runners.portability.portable_runner" in log
    assert log.count("Job state changed to DONE") >= len(COMPARED)


def test_the_portable_runner_gives_the_same_records_and_tokenizer(runs, portable):
    local, _ = runs
    outputs, _, _ = portable
    assert outputs["counts"] == local["counts"]
    assert outputs["tokenizer"] == local["tokenizer"]  # byte for byte


def test_beam_multi_processing_gives_the_same_record_counts(runs):
    local, beam = runs
    assert beam["counts"] == local["counts"]
    cleaned = local["counts"]["TextCleaner"]
    assert set(cleaned) == {"train", "eval"} and cleaned["train"] > cleaned["eval"] > 0
    # Transform keeps every cleaned record.
    assert local["counts"]["Transform"] == cleaned


def test_beam_multi_processing_gives_the_same_tokenizer(runs):
    from config import get_config

    local, beam = runs
    assert beam["tokenizer"] == local["tokenizer"]  # byte for byte
    assert len(json.loads(local["tokenizer"])["model"]["vocab"]) == get_config(
        "tiny").tokenizer.vocab_size
