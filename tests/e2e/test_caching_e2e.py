"""End to end: the cache of the components before the Trainer.

Four runs into one output directory (`tiny` preset, a slice of Tiny Shakespeare,
`--until Transform`):
  1. first run: every component executes;
  2. the same run again: every component is CACHED in ML Metadata;
  3. only `train.*` settings changed: still all CACHED (each upstream component
     gets only the config sections it reads);
  4. the corpus edited: TextExampleGen and what depends on its examples run again.

And the whole pipeline (the shared blessed e2e run) run again unchanged: every
component before the Trainer is CACHED, the DriftValidator included, although a
blessed run's text profile now exists (its baseline would be this very data).
Wall times are printed, not asserted (benchmarks check time).
"""

from __future__ import annotations

import shutil
import time

import pytest
from shared_run import run_args
from until_transform import UNTIL
from until_transform import component_states as _states


@pytest.fixture(scope="module")
def runs(until_transform):
    """Runs 2 to 4 into the output of run 1, the e2e tier's `until_transform` (tests/e2e/
    conftest.py, shared with test_runners_e2e.py); run 4 edits that run's own copy of the
    corpus. The states of runs 1 to 4."""
    import cli
    from pipeline.pipeline import COMPONENT_ORDER

    out, base = until_transform["output"], until_transform["args"]
    states, seconds = [until_transform["states"]], [until_transform["seconds"]]
    for extra in ([], ["--set", "train.learning_rate=0.01", "--train-steps", "7"], "edit"):
        if extra == "edit":
            with open(until_transform["data"], "a", encoding="utf-8") as f:
                f.write("NEW SPEAKER:\nA paragraph that was not in the corpus before.\n\n")
            extra = []
        start = time.perf_counter()
        assert cli.main(base + extra) == 0
        seconds.append(time.perf_counter() - start)
        states.append(_states(out))
    print("\nwall times (s): first {:.1f}, identical {:.1f}, train.* changed {:.1f}, "
          "corpus edited {:.1f}".format(*seconds))
    for label, s in zip(("first", "identical", "train changed", "corpus edited"), states, strict=True):
        print(f"{label}: {s}")
    expected = {c for c in COMPONENT_ORDER[: COMPONENT_ORDER.index(UNTIL) + 1]
                if "resolver" not in c}
    assert set(states[0]) == expected, states[0]
    return states


def test_first_run_executes_every_component(runs):
    assert set(runs[0].values()) == {"COMPLETE"}, runs[0]


def test_identical_run_is_cached_up_to_the_trainer(runs):
    assert set(runs[1]) == set(runs[0])
    assert set(runs[1].values()) == {"CACHED"}, runs[1]


def test_train_settings_keep_ingestion_and_transform_cached(runs):
    assert set(runs[2]) == set(runs[0])
    assert set(runs[2].values()) == {"CACHED"}, runs[2]


def test_edited_corpus_reruns_example_gen_onward(runs):
    edited = runs[3]
    for component in ("TextExampleGen", "StatisticsGen", "ExampleValidator", "TextCleaner",
                      "Transform"):
        assert edited[component] == "COMPLETE", edited
    # The curated schema does not depend on the corpus.
    assert edited["ImportSchemaGen"] == "CACHED", edited


@pytest.fixture(scope="module")
def full_rerun(run, corpus, tmp_path_factory):
    """The main e2e run (whole pipeline, blessed and pushed) run again, unchanged up to
    Transform, on a copy of its ML Metadata: now the latest blessed run's text profile
    exists, and the DriftValidator must still be cached."""
    import cli

    out = tmp_path_factory.mktemp("rerun")
    shutil.copy(run["metadata_path"], out / "metadata.db")
    start = time.perf_counter()
    # Up to Transform: the components asserted on are all before the Trainer, so the
    # Trainer, LmEvaluator and Pusher need not run again.
    assert cli.main([*run_args(corpus, out), "--until", UNTIL]) == 0
    seconds = time.perf_counter() - start
    print(f"\nwhole pipeline: first run {run['wall_seconds']:.1f} s, identical re-run {seconds:.1f} s")
    return _states(out), seconds


def test_identical_full_run_is_cached_before_the_trainer(full_rerun):
    from pipeline.pipeline import COMPONENT_ORDER

    states, seconds = full_rerun
    before_trainer = [c for c in COMPONENT_ORDER[: COMPONENT_ORDER.index("Trainer")]
                      if "resolver" not in c]
    assert {c: states[c] for c in before_trainer} == dict.fromkeys(before_trainer, "CACHED"), states
