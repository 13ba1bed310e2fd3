"""Benchmark tasks in the run summary and the run report, on a fake run (a metrics.json in
a temporary directory, no pipeline): each task's primary scores with the chance level
beside them, "near chance", the baseline's scores, the candidate-vs-baseline comparison,
and metrics.json without tasks (runs from before tasks) or without a baseline."""

from __future__ import annotations

import json

import pytest
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from reporting import report, report_data, run_summary
from reporting.run_summary import ComponentRun

ARC = {"type": "multiple_choice", "acc": 0.26, "acc_stderr": 0.0441, "acc_norm": 0.31,
       "acc_norm_stderr": 0.0465, "acc_bytes": 0.3, "acc_bytes_stderr": 0.046, "chance": 0.25,
       "n": 100, "num_fewshot": 0, "truncated": 3, "examples_per_second": 120.0}
POEM = {"type": "multiple_choice", "acc": 0.62, "acc_stderr": 0.05, "acc_norm": 0.60,
        "acc_norm_stderr": 0.05, "chance": 0.25, "n": 100, "num_fewshot": 1, "truncated": 0}
GEN = {"type": "generation", "exact_match": 0.0, "exact_match_stderr": None, "chance": 0.0,
       "n": 1, "num_fewshot": 0}
CANDIDATE = {"bits_per_byte": 3.7560, "perplexity": 187.85, "loss": 5.2, "tokens": 50836,
             "bytes": 102232, "tasks": {"arc_easy": ARC, "诗_next_line_zh": POEM, "gen": GEN}}
BASELINE = {"bits_per_byte": 3.9006, "perplexity": 240.1, "loss": 5.5, "tokens": 50836,
            "bytes": 102232,
            "tasks": {"arc_easy": {**ARC, "acc": 0.24, "acc_norm": 0.33},
                      "诗_next_line_zh": {**POEM, "acc": 0.25, "acc_norm": 0.26}}}


def _metrics(baseline=BASELINE, candidate=CANDIDATE) -> dict:
    return {"candidate": candidate, "baseline": baseline, "blessed": True,
            "message": "bits_per_byte 3.7560 <= 8.0000"}


def _fake_run(tmp_path, metrics: dict) -> report_data.RunData:
    """A RunData whose LmEvaluator wrote `metrics` (an in-memory store, no executions)."""
    evaluation = tmp_path / "evaluation"
    evaluation.mkdir()
    (evaluation / "metrics.json").write_text(json.dumps(metrics, ensure_ascii=False),
                                             encoding="utf-8")
    config = metadata_store_pb2.ConnectionConfig()
    config.fake_database.SetInParent()
    components = {"LmEvaluator": ComponentRun("LmEvaluator", "COMPLETE", 1.0, {
        "ModelEvaluation": {"uri": str(evaluation), "bits_per_byte": 3.756,
                            "perplexity": 187.85, "eval_tokens": 50836, "eval_bytes": 102232},
        "ModelBlessing": {"blessed": 1, "blessing_message": "ok"}})}
    return report_data.RunData({"output_dir": str(tmp_path)},
                               metadata_store.MetadataStore(config), [], components)


# ----------------------------------------------------------------------------- run summary


def test_the_run_summary_lists_each_tasks_scores_with_chance_and_the_baseline():
    lines = run_summary.task_lines(_metrics())
    assert lines[0] == "tasks:"
    arc, poem, gen = lines[1:]
    # names padded to one width in terminal columns (诗 is two columns wide)
    assert arc.startswith("  arc_easy         acc 0.2600 ±0.0441, acc_norm 0.3100 ±0.0465;")
    assert poem.startswith("  诗_next_line_zh  acc 0.6200 ±0.0500, acc_norm 0.6000 ±0.0500;")
    # 0.26 and 0.31 are within 2 x stderr of 0.25: near chance; 0.62 is not
    assert "; chance 0.2500 (near chance); n 100; baseline acc 0.2400, acc_norm 0.3300" in arc
    assert "; chance 0.2500; n 100; baseline acc 0.2500, acc_norm 0.2600" in poem
    # one example: no stderr; 0 is at chance; no baseline for this task
    assert gen == "  gen              exact_match 0.0000; chance 0.0000 (near chance); n 1"


def test_the_run_summary_has_no_task_lines_for_old_metrics_or_none():
    old = {"candidate": {"bits_per_byte": 3.9, "perplexity": 200.0}, "baseline": None}
    assert run_summary.task_lines(old) == []
    assert run_summary.task_lines({}) == []
    lines = run_summary.task_lines(_metrics(baseline=None))
    assert len(lines) == 4 and not any("baseline" in line for line in lines)


def test_print_summary_prints_the_tasks_under_eval(tmp_path, monkeypatch, capsys):
    run = _fake_run(tmp_path, _metrics())
    monkeypatch.setattr(run_summary, "latest_run", lambda path: list(run.components.values()))
    run_summary.print_summary("metadata.db", 12.0)
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("eval: bits_per_byte 3.7560"))
    assert out[at + 1] == "tasks:" and out[at + 2].startswith("  arc_easy ")
    assert out[at + 5].startswith("blessed: True")


def test_print_summary_of_an_old_run_or_unreadable_metrics_prints_no_tasks(tmp_path,
                                                                           monkeypatch, capsys):
    run = _fake_run(tmp_path, {"candidate": {"bits_per_byte": 3.9}, "baseline": None})
    monkeypatch.setattr(run_summary, "latest_run", lambda path: list(run.components.values()))
    run_summary.print_summary("metadata.db", 1.0)
    assert "tasks:" not in capsys.readouterr().out
    (tmp_path / "evaluation" / "metrics.json").write_text("{not json", encoding="utf-8")
    run_summary.print_summary("metadata.db", 1.0)
    out = capsys.readouterr().out
    assert "tasks:" not in out and "blessed: True" in out


# ----------------------------------------------------------------------------- report


def test_the_report_shows_benchmark_tasks_with_chance_and_the_baseline(tmp_path):
    html = report.section_tasks(_fake_run(tmp_path, _metrics()))
    assert "<td>arc_easy</td><td>acc</td><td>0.2600 ±0.0441</td><td>0.2500</td>" \
           "<td>+0.0100 (near chance)</td><td>0.2400</td><td>100</td><td>0</td><td>3</td>" in html
    assert "<td>诗_next_line_zh</td><td>acc</td><td>0.6200 ±0.0500</td><td>0.2500</td>" \
           "<td>+0.3700</td><td>0.2500</td>" in html
    assert "<td>gen</td><td>exact_match</td><td>0.0000</td>" in html
    assert html.count("<tr>") == 1 + 5  # header + arc (2) + poem (2) + gen (1)


def test_the_eval_section_with_a_baseline_shows_the_comparisons_quality_rows(tmp_path):
    html = report.section_eval(_fake_run(tmp_path, _metrics()))
    assert "Candidate vs baseline" in html
    head = ("<th>metric</th><th>baseline</th><th>candidate</th>"
            "<th>delta (candidate - baseline)</th><th>better</th><th>chance</th>")
    assert head in html
    # bits per byte: 3.7560 - 3.9006 = -0.1446, lower is better: the candidate
    assert ("<td>bits per byte</td><td>3.9006</td><td>3.7560</td><td>-0.1446</td>"
            "<td>candidate</td>") in html
    assert ("<td>arc_easy acc_norm</td><td>0.3300 ±0.0465</td><td>0.3100 ±0.0465</td>"
            "<td>-0.0200</td><td>(baseline)</td><td>0.2500</td>") in html
    # 0.62 vs 0.25 with stderr 0.05: significant, no parentheses
    assert "<td>+0.3700</td><td>candidate</td>" in html
    assert "within noise at this number of examples" in html
    assert "<td>诗_next_line_zh acc</td>" in html and "<td>gen exact_match</td>" in html
    assert "latency" not in html  # quality rows only


def test_the_eval_section_without_a_baseline_has_no_comparison(tmp_path):
    html = report.section_eval(_fake_run(tmp_path, _metrics(baseline=None)))
    assert "Candidate vs baseline" not in html and "3.756" in html


def test_old_metrics_without_tasks_keep_the_report_working(tmp_path):
    old = {"candidate": {"bits_per_byte": 3.7, "perplexity": 180.0},
           "baseline": {"bits_per_byte": 3.9, "perplexity": 240.0}, "blessed": True,
           "message": "ok"}
    run = _fake_run(tmp_path, old)
    tasks = report.section_tasks(run)
    assert "none: the LmEvaluator scored no benchmark tasks" in tasks
    html = report.section_eval(run)  # the comparison of bits per byte and perplexity only
    assert "<td>bits per byte</td><td>3.9000</td><td>3.7000</td>" in html
    assert "acc" not in html


def test_the_tasks_section_is_unavailable_when_the_evaluator_did_not_run(tmp_path):
    run = _fake_run(tmp_path, _metrics())
    run.components.clear()
    with pytest.raises(report_data.Unavailable, match="LmEvaluator did not run"):
        report.section_tasks(run)
