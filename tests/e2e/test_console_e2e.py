"""End to end: the console of `deepseek-tfx run` (the shared tiny run, in a subprocess)
shows the project's own lines only; the libraries' output is in the run's log file."""

from __future__ import annotations

import os
import re

# What the libraries print on this machine without the quiet console.
FORBIDDEN = ("Warning", "WARNING", "FutureWarning", "E0000", "cuFFT", "cuDNN", "cuBLAS",
             "BatchElements", "oneDNN")


def _log_file(run) -> str:
    logs = os.path.join(run["output_dir"], "logs")
    (name,) = os.listdir(logs)
    assert re.fullmatch(r"run-\d{8}-\d{6}\.log", name)
    return os.path.join(logs, name)


def test_no_library_lines_on_the_console(run):
    for word in FORBIDDEN:
        lines = [line for line in run["console"].splitlines() if word in line]
        assert not lines, f"{word!r} on the console:\n" + "\n".join(lines)


def test_progress_lines_and_summary_on_the_console(run):
    from cli import component_order
    from reporting.run_summary import latest_run

    console = run["console"]
    ran = {r.component for r in latest_run(run["metadata_path"])}
    for component in component_order():
        if component in ran:
            assert re.search(rf"\] {component} +running$", console, re.M), component
            assert re.search(rf"\] {component} +done \(\d+\.\d s\)$", console, re.M), component
    assert re.search(r"^component +status +seconds$", console, re.M)
    assert re.search(r"^total wall time +\d+\.\d$", console, re.M)
    assert f"ML Metadata: {run['metadata_path']}" in console


def test_the_log_path_is_printed_at_start_and_end(run):
    lines = run["console"].splitlines()
    path = _log_file(run)
    assert lines.count(f"log: {path}") == 2
    assert lines[0] == lines[-1] == f"log: {path}"


def test_the_log_holds_what_was_filtered(run):
    with open(_log_file(run), encoding="utf-8") as f:
        text = f.read()
    # Each of these was on the console before the log file.
    assert "FutureWarning: You are using a non-supported Python version" in text  # google.api_core
    assert "INFO root: BatchElements statistics" in text  # Beam
    assert "WARNING absl: ArtifactQuery.property_predicate is not supported." in text  # TFX
    assert re.search(r"Unable to register cu(FFT|DNN|BLAS) factory", text)  # TF C++ on fd 2
    assert "INFO components.trainer.train_loop: step" in text  # the Trainer's log lines
