"""Running a test module in a child pytest process, so that the memory it holds (SavedModels,
DeepSeek's 129K-id tokenizer tables, in-process pipeline runs: TensorFlow returns little of
it to the OS) is returned when the module is done instead of staying in the worker.

The parent (a pytest-xdist worker, or a plain pytest) runs the module's selected tests in
`python -m pytest -n 0 NODEIDS` and replays the child's reports as its own, phase by phase,
so the terminal summary, `-ra`, `--durations` and the exit status read as if the tests ran
in the parent. tests/conftest.py decides which modules (CHILD_PROCESS_MODULES) and calls
this from its `pytest_runtest_protocol`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

# Set in the child: where it writes its reports (one JSON line per test phase).
REPORTS_ENV = "DEEPSEEK_TFX_CHILD_REPORTS"


def in_child() -> bool:
    """True in a child started by `run_module` (which never starts another)."""
    return bool(os.environ.get(REPORTS_ENV))


def record(report: pytest.TestReport) -> None:
    """In the child: appends one phase's report to the parent's file."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        longrepr = list(longrepr)
    elif longrepr is not None:
        longrepr = str(longrepr)
    line = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
            "longrepr": longrepr, "duration": report.duration, "sections": report.sections,
            "wasxfail": getattr(report, "wasxfail", None)}
    with open(os.environ[REPORTS_ENV], "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def plain_nodeid(nodeid: str) -> str:
    """The node id pytest takes on its command line (without pytest-xdist's `@group`)."""
    head, sep, group = nodeid.rpartition("@")
    return head if sep and "]" not in group and "::" in head else nodeid


def run_module(items: list[pytest.Item], root: str) -> dict[str, list[dict]]:
    """Runs `items` (one module's selected tests) in a child pytest; returns each item's
    phase reports by its plain node id. A child that dies leaves items without reports
    (`phases_of` fails them)."""
    with tempfile.TemporaryDirectory(prefix="child-pytest-") as tmp:
        reports = os.path.join(tmp, "reports.jsonl")
        env = {**os.environ, REPORTS_ENV: reports}
        env.pop("PYTEST_XDIST_WORKER", None)
        command = [sys.executable, "-m", "pytest", "-n", "0", "-q", "-p", "no:cacheprovider",
                   "--basetemp", os.path.join(tmp, "basetemp"),
                   *[plain_nodeid(item.nodeid) for item in items]]
        done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
        by_node: dict[str, list[dict]] = {}
        if os.path.exists(reports):
            with open(reports, encoding="utf-8") as f:
                for line in f:
                    r = json.loads(line)
                    by_node.setdefault(r["nodeid"], []).append(r)
        by_node["__output__"] = [{"returncode": done.returncode,
                                  "tail": (done.stdout + done.stderr)[-6000:]}]
        return by_node


def replay(item: pytest.Item, phases: list[dict]) -> None:
    """Reports the child's phases of `item` as the parent's own."""
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for r in phases:
        longrepr = tuple(r["longrepr"]) if isinstance(r["longrepr"], list) else r["longrepr"]
        report = pytest.TestReport(
            nodeid=item.nodeid, location=item.location, keywords=dict.fromkeys(item.keywords, 1),
            outcome=r["outcome"], longrepr=longrepr, when=r["when"],
            sections=[tuple(s) for s in r["sections"]], duration=r["duration"])
        if r["wasxfail"] is not None:
            report.wasxfail = r["wasxfail"]
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def phases_of(item: pytest.Item, results: dict[str, list[dict]]) -> list[dict]:
    """The child's phase reports of `item`; when the child died in it (no teardown
    report), a failed call phase with the end of the child's output is added."""
    phases = list(results.get(plain_nodeid(item.nodeid), []))
    if any(p["when"] == "teardown" for p in phases):
        return phases
    output = results["__output__"][0]
    text = (f"the child pytest process of {item.path.name} ended in this test without its "
            f"reports (exit status {output['returncode']}); the end of its output:\n"
            f"{output['tail']}")
    return [p for p in phases if p["when"] == "setup"] + [
        {"when": "call", "outcome": "failed", "longrepr": text, "duration": 0.0,
         "sections": [], "wasxfail": None}]
