"""A data mixture per source in the run summary and report.html, on a fake run (artifact
properties and a metrics.json made here, no pipeline): records per source (the
TextCleaner's `by_source`), the realized token share vs the weight (the Model's
`source_*` properties), bits per byte before and after per source (metrics.json
`by_source`, `baseline_by_source`), and nothing more for a one-source run."""

from __future__ import annotations

import json
import os

import pytest
from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from reporting import mixture_report, report, report_data, run_summary
from reporting.run_summary import ComponentRun

MODEL = {"train_steps": 100, "source_weights": json.dumps({"poems": 0.1, "web": 0.9}),
         "source_token_shares": json.dumps({"poems": 0.113, "web": 0.887}),
         "source_tokens": json.dumps({"poems": 11_571, "web": 90_829}),
         "source_epochs": json.dumps({"poems": 2.5, "web": 0.31})}
CLEANER = {"records_read": 130, "records_kept": 120, "records_dropped": 10,
           "by_source": json.dumps({
               "poems": {"records_read": 30, "records_kept": 22, "records_dropped": 8,
                         "dropped": {"too_short": 6, "duplicate": 2}},
               "web": {"records_read": 100, "records_kept": 98, "records_dropped": 2,
                       "dropped": {"duplicate": 2}}})}


def _source(bpb, documents=5):
    return {"bits_per_byte": bpb, "perplexity": 2 ** bpb, "tokens": 1000, "bytes": 2000,
            "documents": documents}


METRICS = {"candidate": {"bits_per_byte": 2.4, "perplexity": 5.0, "tokens": 3000, "bytes": 6000},
           "baseline": {"bits_per_byte": 2.5, "perplexity": 5.6, "tokens": 3000, "bytes": 6000},
           "by_source": {"poems": _source(3.1), "replay": _source(2.2), "web": _source(1.9)},
           "baseline_by_source": {"poems": _source(3.6), "replay": _source(2.0),
                                  "web": _source(1.95)},
           "blessed": True, "message": "ok"}


def _fake_run(tmp_path, metrics=METRICS, model=MODEL, cleaner=CLEANER):
    evaluation = tmp_path / "evaluation"
    evaluation.mkdir(exist_ok=True)
    (evaluation / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
    config = metadata_store_pb2.ConnectionConfig()
    config.fake_database.SetInParent()
    components = {
        "TextCleaner": ComponentRun("TextCleaner", "COMPLETE", 1.0, {"Examples": cleaner}),
        "Trainer": ComponentRun("Trainer", "COMPLETE", 1.0, {"Model": model}),
        "LmEvaluator": ComponentRun("LmEvaluator", "COMPLETE", 1.0, {
            "ModelEvaluation": {"uri": str(evaluation), "bits_per_byte": 2.4,
                                "perplexity": 5.0, "eval_tokens": 3000, "eval_bytes": 6000},
            "ModelBlessing": {"blessed": 1, "blessing_message": "ok"}})}
    return report_data.RunData({"output_dir": str(tmp_path)},
                               metadata_store.MetadataStore(config), [], components)


def test_rows_per_source_from_the_artifacts_properties():
    tokens = mixture_report.token_share_rows(MODEL)
    assert tokens == [{"source": "poems", "weight": 0.1, "share": 0.113, "tokens": 11_571,
                       "epochs": 2.5},
                      {"source": "web", "weight": 0.9, "share": 0.887, "tokens": 90_829,
                       "epochs": 0.31}]
    evaluation = mixture_report.eval_source_rows(METRICS, {"poems": 3.5})
    assert [r["source"] for r in evaluation] == ["poems", "replay", "web"]
    assert evaluation[1]["change"] == pytest.approx(0.2)  # replay got worse: forgetting
    assert evaluation[0]["threshold"] == 3.5 and evaluation[1]["threshold"] is None
    cleaning = mixture_report.cleaning_source_rows(CLEANER)
    assert cleaning[0] == {"source": "poems", "read": 30, "kept": 22, "dropped": 8,
                           "reasons": {"too_short": 6, "duplicate": 2}}


def test_a_one_source_run_or_one_from_before_mixtures_has_no_rows():
    one = {"by_source": {"default": _source(2.0)}, "baseline_by_source": None}
    assert mixture_report.eval_source_rows(one) == []
    assert mixture_report.eval_source_rows({"candidate": {}}) == []
    assert mixture_report.token_share_rows({"source_weights": '{"default": 1.0}'}) == []
    assert mixture_report.token_share_rows({"train_steps": 3}) == []
    assert mixture_report.cleaning_source_rows({"by_source": "{not json"}) == []
    assert mixture_report.summary_lines({}, one, {}) == []


def test_print_summary_shows_each_sources_figures(tmp_path, monkeypatch, capsys):
    run = _fake_run(tmp_path)
    monkeypatch.setattr(run_summary, "latest_run", lambda path: list(run.components.values()))
    run_summary.print_summary("metadata.db", 12.0)
    out = capsys.readouterr().out.splitlines()
    at = out.index("records by source:")
    assert out[at + 1].split() == ["source", "read", "kept", "dropped", "dropped", "by",
                                   "reason"]
    assert out[at + 2].split() == ["poems", "30", "22", "8", "too_short", "6,", "duplicate", "2"]
    at = out.index("trained tokens by source:")
    assert out[at + 2].split() == ["poems", "10.0%", "11.3%", "+1.3", "points", "11,571", "2.50"]
    assert out[at + 3].split() == ["web", "90.0%", "88.7%", "-1.3", "points", "90,829", "0.31"]
    at = out.index("eval by source:")
    assert out[at + 2].split()[:4] == ["poems", "3.6000", "3.1000", "-0.5000"]
    assert out[at + 3].split()[:5] == ["replay", "2.0000", "2.2000", "+0.2000", "(worse)"]


def test_print_summary_of_a_one_source_run_is_as_before(tmp_path, monkeypatch, capsys):
    one = {**METRICS, "by_source": {"default": _source(2.4)}, "baseline_by_source": None}
    run = _fake_run(tmp_path, one, {"train_steps": 3}, {"records_read": 3})
    monkeypatch.setattr(run_summary, "latest_run", lambda path: list(run.components.values()))
    run_summary.print_summary("metadata.db", 12.0)
    out = capsys.readouterr().out
    assert "by source" not in out and "blessed: True" in out


def test_the_report_shows_each_sources_rows_and_plots(tmp_path):
    html = report.section_sources(_fake_run(tmp_path))
    assert "<td>poems</td><td>30</td><td>22</td><td>8</td><td>too_short 6, duplicate 2</td>" \
        in html
    assert "<td>poems</td><td>10.0%</td><td>11.3%</td><td>+1.3 points</td><td>11,571</td>" \
           "<td>2.50</td>" in html
    assert "<td>replay</td><td>2.0000</td><td>2.2000</td><td>+0.2000 (worse)</td><td>—</td>" \
        in html
    assert html.count('<img alt="') == 2
    assert 'alt="realized token share per source vs its weight"' in html


def test_the_report_of_a_one_source_run_says_so_in_one_line(tmp_path):
    one = {**METRICS, "by_source": {"default": _source(2.4)}, "baseline_by_source": None}
    html = report.section_sources(_fake_run(tmp_path, one, {"train_steps": 3}, {}))
    assert html.startswith("<p>one source (") and "<table" not in html
    run = _fake_run(tmp_path)
    run.components.clear()
    with pytest.raises(report_data.Unavailable, match="did not run"):
        report.section_sources(run)


def test_a_run_without_a_baseline_has_no_before(tmp_path):
    no_baseline = {**METRICS, "baseline": None, "baseline_by_source": None}
    html = report.section_sources(_fake_run(tmp_path, no_baseline))
    assert "<td>web</td><td>—</td><td>1.9000</td><td>—</td>" in html


@pytest.mark.slow
def test_the_sources_section_in_a_browser(tmp_path, monkeypatch):
    """report.html of the fake mixture run in headless Chromium: no errors, the figures
    decode, no horizontal scrolling."""
    from report_browser import chromium, inspect

    if chromium() is None and not os.environ.get("CI"):
        pytest.skip("no system chromium (apt-get install chromium)")
    run = _fake_run(tmp_path)
    monkeypatch.setattr(report_data, "load_run", lambda output_dir: run)
    path = tmp_path / "report.html"
    path.write_text(report.build_html(str(tmp_path)), encoding="utf-8")
    facts = inspect(str(path), str(tmp_path / "report.png"))
    assert facts["errors"] == [] and facts["requests"] == []
    assert facts["sections"]["sources"] > 400
    sources = [(alt, w) for alt, w in facts["images"] if "source" in alt]
    assert len(sources) == 2 and all(w > 0 for _, w in sources)
    assert facts["width"] <= 1366
