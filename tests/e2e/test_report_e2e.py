"""End to end: the shared tiny run leaves report.html; `deepseek-tfx report` rebuilds it; in
headless Chromium at a laptop's viewport it loads without errors or requests, shows all
seven sections with content, and every figure decodes. The full-page screenshot is saved
(path printed, and copied to `<output>/report.png`).
"""

from __future__ import annotations

import os
import re
import shutil

import pytest
from report_browser import chromium, inspect

import cli
from reporting.report import REPORT_FILE, SECTIONS


@pytest.fixture(scope="module")
def report_path(run):
    path = os.path.join(run["output_dir"], REPORT_FILE)
    assert os.path.isfile(path), "run did not write report.html"
    os.remove(path)
    assert cli.main(["report", "--output", run["output_dir"]]) == 0
    assert os.path.isfile(path), "deepseek-tfx report did not rebuild report.html"
    return path


def test_report_is_self_contained(report_path):
    with open(report_path, encoding="utf-8") as f:
        page = f.read()
    assert not re.search(r"https?://", page)
    for name in SECTIONS:
        assert f'<section id="{name}">' in page
    # the tiny run trains, is blessed and pushed: no section is missing
    assert "not available" not in page


# CI installs Debian's chromium (.ci/run): there a missing browser fails the test.
@pytest.mark.skipif(chromium() is None and not os.environ.get("CI"),
                    reason="no system chromium (apt-get install chromium)")
def test_report_in_a_browser(report_path, run, tmp_path):
    screenshot = str(tmp_path / "report.png")

    facts = inspect(report_path, screenshot)

    shutil.copy(screenshot, os.path.join(run["output_dir"], "report.png"))
    print(f"screenshot: {screenshot} (and {run['output_dir']}/report.png)")
    assert facts["errors"] == []
    assert facts["requests"] == []
    assert set(SECTIONS) <= set(facts["sections"])
    assert all(facts["sections"][name] > 40 for name in SECTIONS), facts["sections"]
    assert facts["images"] and all(width > 0 for _, width in facts["images"]), facts["images"]
    assert facts["width"] <= 1366  # no horizontal scrolling on a laptop
