"""The report's table of the worker group's restarts (training_summary.json's restart_log)."""

from __future__ import annotations

from reporting import report


def test_restarts_table_names_each_restart_and_escapes_reasons():
    restarts = [
        {"restart": 1, "cause": "lost", "reason": "worker 1 of 2 killed by SIGKILL after step 31",
         "workers_before": 2, "workers_after": 1, "grad_accum_steps": 2,
         "resumed_from_step": 25, "at": 0.0},
        {"restart": 2, "cause": "hung", "reason": "worker 0 of 1 hung <stopped>",
         "workers_before": 1, "workers_after": 1, "grad_accum_steps": 2,
         "resumed_from_step": 40, "at": 0.0},
    ]
    html = report.restarts_table(restarts)
    assert html.count("<tr><td>") == 2
    assert "killed by SIGKILL after step 31" in html and "2 → 1" in html
    assert "&lt;stopped&gt;" in html and "<stopped>" not in html
    assert report.restarts_table([]) == ""
