"""Shared test fixtures (the real corpus and small slices of it) and the suite's tiers.

Tiers (markers, docs/development.md): everything under tests/e2e/ is `e2e` (this hook marks
it); heavy unit tests carry `slow`. The fast tier is `pytest -m "not e2e and not slow"`.

The suite runs in two pytest-xdist worker processes (`-n 2 --dist loadgroup` in
pyproject.toml): each test module is one work unit, kept in one worker, so its module
fixtures are made once; the modules that use the e2e tier's shared pipeline runs
(tests/e2e/conftest.py `run` and `until_transform`) form one unit, so each is made once. Units are handed
out heaviest first (`pytest_collection_modifyitems`), which keeps both workers busy.
The modules that hold the most memory once done (CHILD_PROCESS_MODULES) run in a child
pytest process of their worker (tests/child_process.py), so no worker grows past a few GB.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest
from child_process import in_child, phases_of, record, replay, run_module

TESTS = Path(__file__).resolve().parent
E2E = TESTS / "e2e"

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CORPUS = PROJECT_ROOT.parent / "shared" / "corpora" / "tinyshakespeare.txt"


@pytest.fixture(scope="module", autouse=True)
def collect_garbage_after_each_module():
    """A full garbage collection when a test module is done: traced tf.functions, models
    and SavedModels sit in reference cycles, and the suite runs in one process. Then what
    survived it (imports, TensorFlow's runtime, session fixtures: long-lived) is frozen
    (`gc.freeze`), so that later collections, this one's and Python's own, walk only the
    objects made since. Unfrozen, each module's collection walked them all again: 0.2 s
    in a fresh process, up to 7 s in a worker that had run the heavy modules. The suite's
    teardowns (`--durations`) took 7.85 worker-minutes before, 0.65 after (2026-12-07)."""
    yield
    gc.collect()
    gc.freeze()


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


# The e2e tier's shared pipeline runs (tests/e2e/conftest.py `run` and `until_transform`):
# their users form one xdist work unit.
SHARED_RUN_GROUP = "e2e_shared_run"
SHARED_RUN_FIXTURES = {"run", "until_transform"}
# Work units in the order they are handed out, heaviest first (minutes on 2 cores, as
# measured by `pytest --durations`); the rest follow in collection order.
HEAVIEST_FIRST = (
    SHARED_RUN_GROUP,
    "tests/e2e/test_preference_e2e.py",
    "tests/components/test_trainer_distributed.py",
    "tests/e2e/test_trainer_distributed_e2e.py",
    "tests/components/test_trainer_v4.py",
    "tests/components/test_trainer_v4_distributed.py",
    "tests/e2e/test_v4_e2e.py",
    "tests/e2e/test_bad_input_e2e.py",
    "tests/e2e/test_notebook.py",
    "tests/serving/test_v4_text.py",
)
# Modules that run in a child pytest process (tests/child_process.py): what they leave
# behind in a process, measured with `--durations` and per-test RSS on 2 cores:
# DeepSeek's 129K-id tokenizer in SavedModel exports (+3.4 GB), two tokenizers' tables
# (+1.9 GB), in-process pipeline runs (+1.5 GB), batched generate exports (+1.2 GB),
# V4 imports with DeepSeek-V4's tokenizer and their SavedModels (+2.0 GB).
CHILD_PROCESS_MODULES = (
    "tests/serving/test_hf_tokenizer.py",
    "tests/serving/test_v4_text.py",
    "tests/components/test_scoring.py",
    "tests/e2e/test_bad_input_e2e.py",
    "tests/serving/test_batched_export.py",
)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """Marks tests/e2e/ `e2e`; puts each test in its xdist work unit (its module, or the
    shared run's group) and orders the units heaviest first."""
    modules_using_run = {str(item.path) for item in items if E2E in item.path.parents
                         and SHARED_RUN_FIXTURES & set(item.fixturenames)}
    for item in items:
        if E2E in item.path.parents:
            item.add_marker(pytest.mark.e2e)
        module = item.path.relative_to(TESTS.parent).as_posix()
        group = SHARED_RUN_GROUP if str(item.path) in modules_using_run else module
        item.add_marker(pytest.mark.xdist_group(group))
        item.stash[_GROUP] = group
        item.stash[_MODULE] = module
    rank = {name: i for i, name in enumerate(HEAVIEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.stash[_GROUP], len(rank)))  # stable


_GROUP = pytest.StashKey[str]()
_MODULE = pytest.StashKey[str]()
_CHILD_RESULTS: dict[str, dict] = {}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """The tests of CHILD_PROCESS_MODULES: the module's selected tests run together in a
    child pytest (at its first test), and each test's reports are replayed here."""
    module = item.stash.get(_MODULE, None)
    if in_child() or module not in CHILD_PROCESS_MODULES:
        return None
    if module not in _CHILD_RESULTS:
        items = [i for i in item.session.items if i.stash.get(_MODULE, None) == module]
        _CHILD_RESULTS[module] = run_module(items, str(PROJECT_ROOT))
    replay(item, phases_of(item, _CHILD_RESULTS[module]))
    # What the default protocol's teardown would do: tear down the collectors (and their
    # fixtures) that `nextitem` does not share. pytest has no public call for it (its own
    # teardown hook expects a set-up item); `teardown_exact` has been there since pytest 7.
    setup_state = getattr(item.session, "_setupstate", None)
    assert setup_state is not None and hasattr(setup_state, "teardown_exact"), (
        "pytest changed Session._setupstate.teardown_exact: adapt tests/conftest.py's "
        "pytest_runtest_protocol (CHILD_PROCESS_MODULES)")
    setup_state.teardown_exact(nextitem)
    return True


def pytest_runtest_logreport(report):
    """In a child pytest: each phase's report goes to the parent (tests/child_process.py)."""
    if in_child():
        record(report)


def pytest_collection_finish(session):
    """Fails loudly when pytest-xdist ignores the work units (e.g. a pytest it does not
    support): the shared pipeline run and every module fixture would be made twice."""
    if getattr(session.config.option, "loadgroup", False) and session.items \
            and "@" not in session.items[0].nodeid:
        raise pytest.UsageError(
            "pytest-xdist's loadgroup did not tag the tests with their work unit: check the "
            "pytest / pytest-xdist versions (pyproject.toml pins pytest<9 for this)")
