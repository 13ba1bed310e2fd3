"""End to end: drift between runs stops training unless accepted.

Continues the ML Metadata of the main e2e run (tests/e2e/test_pipeline_e2e.py's
`run` fixture: a blessed tiny model on a slice of Tiny Shakespeare) in a copy, then
runs the pipeline up to DriftValidator on other data:
  - the next slice of Tiny Shakespeare: no drift, the run goes on;
  - Python source code: drift on lengths and tokens, the run stops before
    Transform with an error naming the features and the baseline;
  - the same code with accept_drift: the run goes on and ML Metadata records
    the accepted drift.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest


def _run_until_drift(out, data_file, accept_drift=False):
    from config import get_config
    from pipeline.local_runner import run_local
    from reporting.run_summary import latest_run

    paths = run_local(get_config("tiny"), str(data_file.parent), data_file.name, str(out),
                      until="DriftValidator", accept_drift=accept_drift)
    return {r.component: r for r in latest_run(paths["metadata_path"])}


@pytest.fixture(scope="module")
def continued(run, tmp_path_factory):
    """A copy of the main e2e run's ML Metadata (its artifacts stay where they are)."""
    out = tmp_path_factory.mktemp("drift")
    shutil.copy(run["metadata_path"], out / "metadata.db")
    return out


def test_similar_data_does_not_drift(continued, corpus, shakespeare, tmp_path):
    start = len(corpus.read_text(encoding="utf-8"))
    text = shakespeare[start:2 * start]
    data = tmp_path / "next_slice.txt"
    data.write_text(text[text.find("\n\n") + 2: text.rfind("\n\n") + 2], encoding="utf-8")
    runs = _run_until_drift(continued, data)
    drift = runs["DriftValidator"]
    assert drift.state == "COMPLETE"
    anomalies = drift.outputs["ExampleAnomalies"]
    assert anomalies["drift_detected"] == 0
    assert anomalies["baseline_statistics"], "the blessed run's profile was not resolved"
    measured = {k: v for k, v in anomalies.items() if k.startswith("drift_train_")}
    assert set(measured) == {"drift_train_num_chars", "drift_train_num_words",
                             "drift_train_tokens"}
    assert 0 <= measured["drift_train_num_chars"] < 0.15, measured
    assert 0 <= measured["drift_train_num_words"] < 0.15, measured
    assert 0 <= measured["drift_train_tokens"] < 0.3, measured


def test_drifted_data_stops_before_training_unless_accepted(continued, tmp_path):
    from cli import failure_message
    from pipeline.pipeline import COMPONENT_ORDER

    root = Path(__file__).resolve().parent.parent.parent
    code = "\n\n".join(p.read_text(encoding="utf-8") for p in sorted(root.glob("components/**/*.py")))
    data = tmp_path / "code.txt"
    data.write_text(code, encoding="utf-8")

    with pytest.raises(Exception) as stopped:
        _run_until_drift(continued, data)
    message = failure_message(stopped.value)
    assert "drifted" in message and "train/tokens" in message and "--accept-drift" in message

    runs = _run_until_drift(continued, data, accept_drift=True)
    anomalies = runs["DriftValidator"].outputs["ExampleAnomalies"]
    assert anomalies["drift_detected"] == 1 and anomalies["drift_accepted"] == 1
    assert anomalies["drift_train_tokens"] > 0.3
    report = json.loads(open(f"{anomalies['uri']}/drift_report.json").read())
    assert report["accepted"] and "train/tokens" in report["drift"]
    assert COMPONENT_ORDER.index("DriftValidator") < COMPONENT_ORDER.index("Transform")
