"""The HTML of each section of `report.html` (pipeline, data, training, moe, eval,
sources, tasks, samples, lineage): `section_<name>(run, ...)` builds it from
`report_data.py`'s values, or raises `report_data.Unavailable` saying why it cannot;
`reporting/report.py` puts the sections on the page.
"""

from __future__ import annotations

import contextlib
import html
import re

from reporting import report_data
from reporting.report_data import SAMPLE_NEW_TOKENS, RunData, Unavailable


def escape(value) -> str:
    return html.escape(str(value))


def unavailable_html(what: str, why: str) -> str:
    return f'<p class="missing">{escape(what)} not available: {escape(why)}</p>'


def _table(header: list[str], rows: list[list], cls: str = "") -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _breakable(name: str) -> str:
    """`name` escaped, with line-break opportunities after "_" and before a capital that
    follows a small letter (ExampleValidator, latest_blessed_model_resolver)."""
    return re.sub(r"(_|(?<=[a-z])(?=[A-Z]))", r"\1<wbr>", escape(name))


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


_STATUS = {"COMPLETE": "done", "CACHED": "cached", "FAILED": "failed", "RUNNING": "running",
           "NEW": "not run", "CANCELED": "canceled"}


def section_pipeline(run: RunData) -> str:
    """The components as columns of boxes (status, duration, producers) and the verdict.

    Raises:
      Unavailable: ML Metadata records no run.
    """
    if not run.executions:
        raise Unavailable("ML Metadata records no pipeline run")
    columns = report_data.pipeline_graph(run.store, run.executions)
    cols = []
    for column in columns:
        boxes = []
        for e in column:
            status = _STATUS.get(e["state"], e["state"].lower())
            after = f'<div class="after">after {escape(", ".join(e["after"]))}</div>' if e["after"] else ""
            boxes.append(f'<div class="node {status.replace(" ", "-")}"><b>{_breakable(e["component"])}</b>'
                         f'<div>{escape(status)} · {e["duration_s"]:.1f} s</div>{after}</div>')
        cols.append('<div class="col">' + "".join(boxes) + "</div>")
    total = sum(e["duration_s"] for e in run.executions)
    failed = [e["component"] for e in run.executions if e["state"] not in ("COMPLETE", "CACHED")]
    verdict = (f'<p class="bad">not finished: {escape(", ".join(failed))}</p>' if failed
               else "<p>every component done or cached.</p>")
    return (f'<div class="flow">{"<span class=arrow>→</span>".join(cols)}</div>{verdict}'
            f"<p>sum of component durations {total:.1f} s (from the executions' create and "
            "last-update times in ML Metadata).</p>")


def section_data(run: RunData) -> str:
    """The cleaning counts, the TFDV anomalies and the drift findings; a part whose
    component did not run says so in place (never raises Unavailable)."""
    return _records(run) + _anomalies(run) + _drift(run)


def _records(run: RunData) -> str:
    try:
        report = report_data.cleaning_report(run)
    except Unavailable as e:
        return unavailable_html("records", str(e))
    total = report["total"]
    rows = [["read", total["read"], ""], ["kept", total["kept"], ""],
            ["dropped", total["dropped"], ""]]
    for reason, n in sorted(total["dropped_by_reason"].items(), key=lambda kv: -kv[1]):
        where = ", ".join(f"{src} record {rec}"
                          for src, rec in report.get("rejected_samples", {}).get(reason, [])[:3])
        rows.append([f"dropped: {reason}", n, where])
    for repair, n in sorted(total.get("repaired", {}).items(), key=lambda kv: -kv[1]):
        rows.append([f"repaired: {repair}", n, ""])
    splits = [[s, v["read"], v["kept"], v["dropped"]]
              for s, v in sorted(report.get("splits", {}).items())]
    return ("<h3>Records (TextCleaner)</h3>" + _table(["", "records", "e.g."], rows)
            + _table(["split", "read", "kept", "dropped"], splits))


def _anomalies(run: RunData) -> str:
    try:
        rows = report_data.anomaly_rows(run)
    except Unavailable as e:
        return unavailable_html("TFDV anomalies", str(e))
    if not rows:
        return "<h3>TFDV anomalies (ExampleValidator)</h3><p>none: every split matches the schema.</p>"
    return ("<h3>TFDV anomalies (ExampleValidator)</h3>"
            + _table(["split", "feature", "anomaly", "description"], rows))


def _drift(run: RunData) -> str:
    try:
        anomalies = run.output("DriftValidator", "ExampleAnomalies")
    except Unavailable as e:
        return unavailable_html("drift", str(e))
    head = "<h3>Drift (DriftValidator, Jensen-Shannon divergence)</h3>"
    if not anomalies.get("baseline_statistics"):
        return head + "<p>no blessed run to compare with (the text profile is recorded).</p>"
    verdict = "DRIFT" if anomalies.get("drift_detected") else "no drift"
    accepted = " (accepted)" if anomalies.get("drift_accepted") else ""
    rows = [[k[len("drift_"):], f"{v:.4f}"] for k, v in sorted(anomalies.items())
            if k.startswith("drift_") and isinstance(v, float)]
    return (head + f"<p>vs. the latest blessed run: <b>{verdict}</b>{accepted}; baseline "
            f"{escape(anomalies['baseline_statistics'])}</p>"
            + _table(["split / feature", "divergence"], rows))


# The figures DPO and GRPO log (`preference_objectives.py`), one panel per line.
PREFERENCE_PANELS = (
    ("GRPO reward (mean; std within groups)", ("reward_mean", "reward_std")),
    ("GRPO groups with zero reward variance; clip fraction",
     ("zero_variance_groups", "clip_fraction")),
    ("KL to the reference (k3, per token)", ("kl",)),
    ("GRPO completion length (tokens)", ("completion_length",)),
    ("DPO reward accuracy (train)", ("reward_accuracy",)),
    ("DPO implicit rewards (beta log pi/pi_ref)",
     ("reward_margin", "chosen_reward", "rejected_reward")),
)


def section_training(run: RunData, events) -> str:
    """The `train/*` curves of `events` (`report_data.read_events`) and the figures of
    training_summary.json.

    Raises:
      Unavailable: no train/* scalars, or the Trainer did not run to the end.
    """
    from reporting import report_plots

    scalars, _ = events
    train = {tag[len("train/"):]: series for tag, series in scalars.items()
             if tag.startswith("train/")}
    if not train:
        raise Unavailable("the Trainer's events hold no train/* scalars")
    losses = {k: train[k] for k in ("loss", "lm_loss", "mtp_loss", "distill_loss")
              if k in train and any(v != 0 for v in train[k][1])}
    panels = [("loss terms (nats/token)", losses)] if losses else []
    for key, title, scale in (
            ("balance_loss", "balance loss (MoE)", 1), ("learning_rate", "learning rate", 1),
            ("grad_norm", "grad norm", 1), ("tokens_per_second", "tokens / s", 1),
            ("mfu", "MFU (%)", 100), ("moe_dropped_fraction", "MoE pairs dropped (%)", 100)):
        if key in train and any(train[key][1]):  # a term that is 0 throughout is left out
            steps, values = train[key]
            panels.append((title, {key: (steps, [scale * v for v in values])}))
    for title, keys in PREFERENCE_PANELS:  # DPO and GRPO (issue 29): the reward curves
        series = {k: train[k] for k in keys if k in train}
        if series:
            panels.append((title, series))
    out = report_plots.training_curves(panels)
    summary = report_data.training_summary(run)
    if summary is not None:
        keys = ("train_steps", "resumed_from_step", "tokens_seen", "train_wall_s",
                "tokens_per_second", "steady_tokens_per_second", "mfu", "steady_mfu",
                "final_loss", "strategy", "num_replicas", "precision", "global_batch_size",
                "trainable_params", "total_params", "jit_compile", "skipped_steps", "restarts",
                "n_routed_experts_before", "pruned_experts_kept", "pruning_tokens",
                "trainer_eval_loss", "trainer_eval_loss_before_pruning", "base_model",
                "teacher_model")
        cells = "".join(f"<div><span>{escape(k)}</span> {escape(_fmt(summary[k]))}</div>"
                        for k in keys if k in summary)
        out += f'<h3>training_summary.json</h3><div class="figures">{cells}</div>'
        out += restarts_table(summary.get("restart_log") or [])
    return out


def restarts_table(restarts: list[dict]) -> str:
    """The worker group's restarts (`launcher.Restart` dicts) as a table; "" for none."""
    if not restarts:
        return ""
    rows = "".join(
        f"<tr><td>{r['restart']}</td><td>{escape(r['cause'])}</td><td>{escape(r['reason'])}</td>"
        f"<td>{r['resumed_from_step']}</td><td>{r['workers_before']} → {r['workers_after']}"
        f"</td><td>{r['grad_accum_steps']}</td></tr>" for r in restarts)
    return ("<h3>restarts of the worker group</h3><table><tr><th>restart</th><th>cause</th>"
            "<th>reason</th><th>resumed from step</th><th>workers</th>"
            f"<th>micro-batches</th></tr>{rows}</table>")


def section_moe(run: RunData, events) -> str:
    """The expert-load heatmaps and router-bias spread from `events`
    (`report_data.read_events`).

    Raises:
      Unavailable: the events hold no MoE summaries.
    """
    from reporting import report_plots

    scalars, tensors = events
    layers = report_data.expert_load(tensors)
    bias = report_data.router_bias(scalars)
    if not layers and not bias:
        raise Unavailable("no MoE summaries in the Trainer's events (no MoE layer, or a run "
                          "from before the expert load was logged)")
    out = ""
    if layers:
        out += ("<p>Each panel: one MoE layer; a cell is an expert's share of the routed "
                "(token, expert) pairs in a logging window over the mean share (1.0 = "
                "balanced).</p>" + report_plots.expert_load_heatmaps(layers))
    else:
        out += unavailable_html("expert load", "no moe/*/expert_load summaries")
    complete = [(layer, s) for layer, s in sorted(bias.items())
                if {"min", "max", "mean_abs"} <= set(s)]
    if complete:
        out += report_plots.router_bias(complete)
    return out


def section_eval(run: RunData) -> str:
    """The LmEvaluator's metrics against the baseline, the blessing and the threshold.

    Raises:
      Unavailable: the LmEvaluator did not run, or wrote no metrics.json.
    """
    from reporting import report_plots

    metrics = report_data.eval_metrics(run)
    config = report_data.execution_config(run, "LmEvaluator")
    candidate, baseline = metrics["candidate"], metrics.get("baseline")
    keys = [k for k in ("bits_per_byte", "perplexity", "loss", "response_bits_per_byte",
                        "response_perplexity", "reward_accuracy", "reward_margin", "pairs",
                        "pass_at_1", "pass_at_1_stderr", "mean_reward", "prompts", "tokens",
                        "bytes") if k in candidate]
    rows = [[k, _fmt(candidate[k]), _fmt(baseline[k]) if baseline and k in baseline else "—"]
            for k in keys]
    verdict = "blessed" if metrics.get("blessed") else "NOT blessed"
    out = (f'<p class="{"good" if metrics.get("blessed") else "bad"}"><b>{verdict}</b>: '
           f'{escape(metrics.get("message", ""))}</p>'
           + _table(["metric", "candidate", "baseline (last blessed)"], rows, "narrow"))
    if config:
        ev = config.get("eval", {})
        task = config.get("data", {}).get("task")
        gates = {"dpo": f", eval.min_reward_accuracy = {escape(ev.get('min_reward_accuracy'))}",
                 "grpo": f", eval.min_pass_at_1 = {escape(ev.get('min_pass_at_1'))}"}.get(task, "")
        out += (f"<p>thresholds: eval.max_bits_per_byte = {escape(ev.get('max_bits_per_byte'))}, "
                f"eval.baseline_tolerance = {escape(ev.get('baseline_tolerance'))}{gates}</p>")
        summary = report_data.training_summary(run) or {}
        if task in ("dpo", "grpo") and summary.get("base_model"):
            out += (f"<p>reference policy (the frozen base model): "
                    f"<code>{escape(summary['base_model'])}</code></p>")
        bars = {"candidate": candidate["bits_per_byte"]}
        if baseline:
            bars["baseline"] = baseline["bits_per_byte"]
        if ev.get("max_bits_per_byte") is not None:
            out += report_plots.bits_per_byte(bars, float(ev["max_bits_per_byte"]))
    if baseline:
        out += comparison_html(baseline, candidate)
    return out


def comparison_html(baseline: dict, candidate: dict) -> str:
    """The quality rows of `deepseek-tfx compare`'s table, baseline (A) vs candidate (B):
    bits per byte, perplexity and each task's primary scores, delta = candidate -
    baseline, which is better, and each task's chance level."""
    from reporting.comparison import NOT_SIGNIFICANT_NOTE, comparison_rows, table_cells

    rows = [r for r in comparison_rows(baseline, candidate) if r.group == "quality"]
    header, cells = table_cells(rows, ("baseline", "candidate"))
    note = (f"<p>{escape(NOT_SIGNIFICANT_NOTE)}; ± is the standard error.</p>"
            if any(r.significant is False for r in rows) else "")
    return ("<h3>Candidate vs baseline (the quality rows of <code>deepseek-tfx compare</code>)"
            "</h3>" + _table(header, cells) + note)


def section_sources(run: RunData) -> str:
    """A data mixture's figures per source (`sources_html`); for a one-source run, a line
    saying its figures are the overall ones.

    Raises:
      Unavailable: none of the TextCleaner, the Trainer and the LmEvaluator ran.
    """
    from reporting import mixture_report

    found = {}
    for key, component, artifact_type in (("cleaner", "TextCleaner", "Examples"),
                                          ("model", "Trainer", "Model")):
        with contextlib.suppress(Unavailable):
            found[key] = run.output(component, artifact_type)
    with contextlib.suppress(Unavailable):
        found["metrics"] = report_data.eval_metrics(run)
    if not found:
        raise Unavailable("the TextCleaner, the Trainer and the LmEvaluator did not run")
    thresholds = report_data.execution_config(run, "LmEvaluator").get("eval", {}).get(
        "max_bits_per_byte_by_source") or {}
    return sources_html(mixture_report.cleaning_source_rows(found.get("cleaner", {})),
                        mixture_report.token_share_rows(found.get("model", {})),
                        mixture_report.eval_source_rows(found.get("metrics", {}), thresholds))


def sources_html(cleaning: list[dict], tokens: list[dict], evaluation: list[dict]) -> str:
    """The sources section's HTML from `mixture_report`'s rows: records per source, the
    realized token share vs the weight (table and plot), bits per byte before and after
    per source; a line for a one-source run (all three empty)."""
    from reporting import mixture_report, report_plots

    if not (cleaning or tokens or evaluation):
        return ("<p>one source (\"default\"): its records, tokens and bits per byte are "
                "the overall figures of the sections above.</p>")
    out = ""
    if cleaning:
        out += ("<h3>Records by source (TextCleaner)</h3>"
                + _table(*mixture_report.cleaning_source_cells(cleaning)))
    if tokens:
        out += ("<h3>Trained tokens by source: realized share vs weight (Trainer)</h3>"
                + _table(*mixture_report.token_share_cells(tokens)))
        if all(r["weight"] is not None and r["share"] is not None for r in tokens):
            out += report_plots.token_shares(
                {r["source"]: (r["weight"], r["share"]) for r in tokens})
    if evaluation:
        out += ("<h3>Bits per byte by source: before (baseline) and after (candidate)</h3>"
                "<p>each source's own eval documents, packed on their own; a rise on the "
                "replayed source (\"replay\") is forgetting of the base model's data.</p>"
                + _table(*mixture_report.eval_source_cells(evaluation)))
        out += report_plots.source_bits_per_byte(
            {r["source"]: (r["before"], r["after"]) for r in evaluation})
    return out


def section_tasks(run: RunData) -> str:
    """The benchmark tasks of metrics.json (`tasks_html`).

    Raises:
      Unavailable: the LmEvaluator did not run, or wrote no metrics.json.
    """
    tasks, baseline = report_data.eval_tasks(run)
    if not tasks:
        return ("<p>none: the LmEvaluator scored no benchmark tasks (eval.tasks is empty, or "
                "the run is from before tasks). <code>deepseek-tfx evaluate --tasks FILE</code> "
                "scores a pushed model.</p>")
    config = report_data.execution_config(run, "LmEvaluator").get("eval", {})
    return tasks_html(tasks, baseline, config.get("min_scores"))


def tasks_html(tasks: dict, baseline: dict | None, min_scores=None) -> str:
    """One row per task and primary metric (multiple choice: acc, acc_norm; generation:
    exact_match): the candidate's score ± its standard error, the chance level, the score
    minus chance ("near chance" when within two standard errors), the baseline's score,
    n, few-shot k and the examples whose context was cut to fit the model."""
    from reporting.comparison import format_value, primary_metrics
    from reporting.run_summary import near_chance

    rows = []
    for name, m in tasks.items():
        chance = m.get("chance")
        for metric in primary_metrics(m):
            value, stderr = m[metric], m.get(f"{metric}_stderr")
            stderr = stderr if isinstance(stderr, float) and stderr == stderr else None
            above = "—"
            if isinstance(chance, float | int):
                above = format_value(value - chance, 4, signed=True)
                if near_chance(value, stderr, chance):
                    above += " (near chance)"
            base = (baseline or {}).get(name, {}).get(metric)
            rows.append([name, metric, format_value(value, 4, stderr),
                         format_value(chance, 4) if chance is not None else "—", above,
                         format_value(base, 4) if base is not None else "—",
                         m.get("n", "—"), m.get("num_fewshot", "—"), m.get("truncated", "—")])
    out = ("<p>scored as lm-evaluation-harness scores them: a multiple-choice example by the "
           "log-likelihood of each choice after the context (acc: the likeliest choice; "
           "acc_norm: per character), a generation example by exact match after the stop "
           "strings. ± is the standard error; near chance = within two standard errors of "
           "the chance level.</p>"
           + _table(["task", "metric", "candidate", "chance", "minus chance",
                     "baseline" if baseline is not None else "baseline (none)", "n",
                     "few-shot", "truncated"], rows))
    if min_scores:
        out += f"<p>thresholds: eval.min_scores = {escape(min_scores)}</p>"
    return out


def section_samples(run: RunData) -> str:
    """Greedy generations of the pushed model, made now (`samples_html`).

    Raises:
      Unavailable: nothing pushed, or the SavedModel has no tokenizer.
    """
    return samples_html(*report_data.generate_samples(run))


def samples_html(destination: str, samples: list[tuple[str, str]]) -> str:
    """The samples section's HTML: each (prompt, continuation) with the prompt in bold and
    line breaks shown as ↵, both escaped; `destination` is the SavedModel that wrote them."""
    items = [f'<div class="sample"><span class="prompt">{_newlines(prompt)}</span>'
             f"{_newlines(text)}</div>" for prompt, text in samples]
    return (f"<p>greedy, {SAMPLE_NEW_TOKENS} new tokens, from {escape(destination)} (prompt in "
            f"bold: the start of eval documents; ↵ = a line break)</p>{''.join(items)}")


def _newlines(text: str) -> str:
    return escape(text).replace("\n", '<span class="nl">↵</span> ')


def section_lineage(run: RunData) -> str:
    """The pushed model's lineage back to the input files (`lineage_html`).

    Raises:
      Unavailable: nothing pushed, or ML Metadata has no lineage for it.
    """
    return lineage_html(*report_data.model_lineage(run))


def lineage_html(destination: str, data: dict) -> str:
    """The lineage section's HTML from `mlmd_report.lineage` of the model at `destination`:
    the executions back to the ExampleGen, then the input files (sha256, bytes, path)."""
    rows = []
    for step in data["steps"]:
        e = step["execution"]
        inputs = "; ".join(f"{a['type']} {a['uri']}" for a in step["inputs"]) or "—"
        if "input_base" in e:
            inputs = f"read {e['input_base']} ({e.get('input_fingerprint')})"
        rows.append([e["component"], e["id"], e["state"].lower(), inputs])
    files = [[f.get("sha256"), int(f.get("bytes", 0)), f["path"]] for f in data["input_files"]]
    return (f"<p>{escape(data['model']['type'])} {escape(destination)}, back to the input files:</p>"
            + _table(["component", "execution", "state", "inputs"], rows)
            + _table(["sha256", "bytes", "input file"], files))

