"""`report.html`: one self-contained page about the newest run in an output directory.

`deepseek-tfx run` writes it after the summary; `deepseek-tfx report --output DIR`
rebuilds it. Everything comes from ML Metadata (`run_summary.latest_run`,
`mlmd_report.lineage`) and the artifacts it points to:

  pipeline   each component's status and duration, as a left-to-right graph
             (columns = distance from the first component, from the MLMD events)
  data       cleaning_report.json (read / kept / dropped by reason), the TFDV
             anomalies (ExampleValidator) and the drift findings (DriftValidator)
  training   TensorBoard events of the Trainer (`train/*` scalars) and
             training_summary.json
  moe        the `moe/<layer>/expert_load` tensor summaries (a heatmap per MoE
             layer) and the `router_bias/<layer>/*` scalars
  eval       LmEvaluator's metrics.json against `eval.max_bits_per_byte` and the
             baseline, and the blessing; with a baseline, the quality rows of
             `deepseek-tfx compare`'s table (`reporting/comparison.py`): bits per
             byte, perplexity and each task's scores, baseline vs candidate
  sources    a data mixture per source (`reporting/mixture_report.py`): records read,
             kept and dropped (the TextCleaner's `by_source`), the realized share of
             the trained tokens against the weight (the Model's `source_*`
             properties, plotted) and bits per byte before (baseline) and after
             (candidate) with each source's threshold (metrics.json `by_source`)
  tasks      the benchmark tasks of metrics.json: each task's primary scores (acc,
             acc_norm; exact_match) with their standard error, the chance level and how
             far above it, and the baseline's
  samples    greedy generations of the pushed SavedModel, made now
  lineage    from the pushed model back to the input files

A section whose data does not exist (`--until`, a failed run) says why instead.
The page has no external resources: figures are inline PNGs (`report_plots.py`).
This file is the page; each section's HTML is `report_sections.py`'s, and the values come
from `report_data.py`.
"""

from __future__ import annotations

import contextlib
import os
import time

from reporting import report_data
from reporting.report_data import Unavailable
from reporting.report_sections import (
    PREFERENCE_PANELS,
    comparison_html,
    escape,
    lineage_html,
    restarts_table,
    samples_html,
    section_data,
    section_eval,
    section_lineage,
    section_moe,
    section_pipeline,
    section_samples,
    section_sources,
    section_tasks,
    section_training,
    sources_html,
    tasks_html,
    unavailable_html,
)

# This room's names, with the section builders it re-exports from `report_sections`.
__all__ = ["REPORT_FILE", "SECTIONS", "build_html", "write_report", "write_report_quietly",
           "written_on_failure", "PREFERENCE_PANELS", "comparison_html", "lineage_html",
           "restarts_table", "samples_html", "sources_html", "tasks_html", "section_data",
           "section_eval", "section_lineage", "section_moe", "section_pipeline",
           "section_samples", "section_sources", "section_tasks", "section_training"]

REPORT_FILE = "report.html"
SECTIONS = ("pipeline", "data", "training", "moe", "eval", "sources", "tasks", "samples",
            "lineage")


_TITLES = {"pipeline": "Pipeline", "data": "Data: records, anomalies, drift",
           "training": "Training curves", "moe": "MoE: expert load and router bias",
           "eval": "Evaluation and blessing", "sources": "Data mixture: per source",
           "tasks": "Benchmark tasks",
           "samples": "Sample generations",
           "lineage": "Lineage of the pushed model"}

_CSS = """
body{font:14px/1.45 system-ui,"Noto Sans CJK SC","PingFang SC","Microsoft YaHei",sans-serif;margin:0;color:#1d2430;background:#f5f6f8}
header{background:#1d2430;color:#fff;padding:12px 24px}
header h1{font-size:20px;margin:0}header p{margin:2px 0 0;color:#c8cdd6}
nav{padding:6px 24px;background:#e6e9ee;position:sticky;top:0}
nav a{margin-right:14px;color:#1d4f91;text-decoration:none}
main{max-width:1300px;margin:0 auto;padding:8px 24px 40px}
section{background:#fff;border:1px solid #d9dde3;border-radius:6px;margin:14px 0;padding:6px 18px 14px}
h2{font-size:17px;margin:8px 0}h3{font-size:14px;margin:12px 0 4px}
img{max-width:100%;height:auto;display:block;margin:8px 0}
table{border-collapse:collapse;margin:6px 0;font-size:13px}
td,th{border:1px solid #d9dde3;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f0f2f5;white-space:nowrap}td:not(:last-child){white-space:nowrap}
table.narrow{min-width:360px}
.figures{display:grid;grid-template-columns:repeat(4,1fr);gap:2px 16px;font-size:13px}
.figures span{color:#5d6675}
.flow{display:flex;align-items:center;overflow-x:auto;padding:4px 0}
.col{display:flex;flex-direction:column;gap:8px}.arrow{font-size:20px;color:#8a93a3;padding:0 6px}
.node{border:2px solid;border-radius:6px;padding:4px 8px;font-size:12px;min-width:110px;max-width:180px}
.node b{overflow-wrap:normal}.node .after{color:#5d6675;font-size:11px}
.done{border-color:#2e8b57;background:#eaf6ef}.cached{border-color:#4a78b5;background:#eaf0f8}
.failed{border-color:#c0392b;background:#fbeaea}.node.running,.not-run,.canceled{border-color:#999;background:#f2f2f2}
.missing{color:#8a5a00;background:#fff6e0;border-left:4px solid #e0a800;padding:6px 10px}
.bad{color:#a12a1e}.good{color:#1e7a45}
.sample{font-family:ui-monospace,monospace,"Noto Sans Mono CJK SC","Noto Sans CJK SC";white-space:pre-wrap;overflow-wrap:anywhere;background:#f7f7f9;border:1px solid #e1e4e8;padding:6px 10px;margin:6px 0;font-size:13px}
.prompt{font-weight:bold}.nl{color:#9aa3b2}
"""


def build_html(output_dir: str) -> str:
    """The report page of the newest run under `output_dir` (a string of HTML).

    A section whose data is missing, or whose building raises, says so in place.

    Raises:
      FileNotFoundError: no metadata.db under `output_dir`.
    """
    run = report_data.load_run(output_dir)
    events = None

    def trainer_events():
        nonlocal events
        if events is None:
            events = report_data.read_events(report_data.trainer_dirs(run)[0])
        return events

    builders = {
        "pipeline": lambda: section_pipeline(run),
        "data": lambda: section_data(run),
        "training": lambda: section_training(run, trainer_events()),
        "moe": lambda: section_moe(run, trainer_events()),
        "eval": lambda: section_eval(run),
        "sources": lambda: section_sources(run),
        "tasks": lambda: section_tasks(run),
        "samples": lambda: section_samples(run),
        "lineage": lambda: section_lineage(run),
    }
    body = []
    for name in SECTIONS:
        try:
            content = builders[name]()
        except Unavailable as e:
            content = unavailable_html(_TITLES[name], str(e))
        except Exception as e:  # noqa: BLE001 (one section's failure must not lose the page)
            content = unavailable_html(_TITLES[name], f"{type(e).__name__}: {e}")
        body.append(f'<section id="{name}"><h2>{escape(_TITLES[name])}</h2>{content}</section>')
    nav = "".join(f'<a href="#{n}">{escape(_TITLES[n].split(":")[0])}</a>' for n in SECTIONS)
    when = time.strftime("%Y-%m-%d %H:%M:%S")
    run_name = report_data.run_name(run)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>deepseek-tfx run report</title><style>{_CSS}</style></head><body>"
            f"<header><h1>deepseek-tfx run report</h1><p>{escape(run.paths['output_dir'])} · "
            f"run {escape(run_name)} · written {when}</p></header><nav>{nav}</nav>"
            f"<main>{''.join(body)}</main></body></html>")


def write_report(output_dir: str) -> str:
    """Writes `report.html` under `output_dir` (see `build_html`); returns its path.

    Raises:
      FileNotFoundError: no metadata.db under `output_dir`.
      OSError: the file cannot be written.
    """
    path = os.path.join(os.path.abspath(output_dir), REPORT_FILE)
    page = build_html(output_dir)
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
    return path


def write_report_quietly(output_dir: str) -> str | None:
    """`write_report`, printing `report: <path>` or one line with the error; never raises
    (a run's exit code does not depend on its report). Returns the path or None."""
    try:
        path = write_report(output_dir)
    except Exception as e:  # noqa: BLE001 (the report is never a reason for a run to fail)
        print(f"report: not written ({type(e).__name__}: {e})")
        return None
    print(f"report: {path}")
    return path


@contextlib.contextmanager
def written_on_failure(output_dir: str):
    """A context that writes the report (quietly) when its body raises, then re-raises:
    a failed run gets a report of what it did."""
    try:
        yield
    except Exception:
        write_report_quietly(output_dir)
        raise
