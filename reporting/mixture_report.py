"""A data mixture's figures per source (issue 28), as rows for the run summary and
report.html, from plain values (artifact custom properties, metrics.json):

  tokens    the Model artifact's JSON properties `source_weights` ({name: normalized
            weight}), `source_token_shares` ({name: realized share of the trained
            tokens}), `source_tokens` ({name: trained tokens}), `source_epochs` ({name:
            epochs drawn}): the share each source got against its weight
  eval      metrics.json's `by_source` and `baseline_by_source` ({name:
            {"bits_per_byte", "perplexity", "tokens", "bytes", "documents"}}): bits per
            byte before (the baseline: the last blessed model, or the base model of a
            continued run) and after (the candidate) on each source's eval documents,
            so forgetting on the replayed source ("replay") shows as a rise
  cleaning  the TextCleaner's Examples property `by_source` ({name: {records_read,
            records_kept, records_dropped, dropped: {reason: n}}})

A one-source run (only the source "default", or no per-source figures: a run from before
mixtures) has no rows: its overall figures, shown as before, are the same numbers.
"""

from __future__ import annotations

import json

from config import DEFAULT_SOURCE

TOKEN_PROPERTIES = ("source_weights", "source_token_shares", "source_tokens", "source_epochs")


def _json_property(props: dict, key: str) -> dict:
    """The JSON object of a custom property (a JSON string, or a JSON value property as
    read back), {} when absent or not a JSON object (a report never fails on a property)."""
    value = props.get(key)
    if isinstance(value, dict):
        return value
    if not isinstance(value, str):
        return {}
    try:
        parsed = json.loads(value)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def is_mixture(names) -> bool:
    """Whether per-source figures say more than the overall ones: some source other
    than "default"."""
    return bool(set(names) - {DEFAULT_SOURCE})


def token_share_rows(model_props: dict) -> list[dict]:
    """[{"source", "weight", "share", "tokens", "epochs"}] by source name, from the
    Model's properties (`TOKEN_PROPERTIES`); a figure the Trainer did not write is None.
    [] for a one-source run."""
    values = {key: _json_property(model_props, key) for key in TOKEN_PROPERTIES}
    names = sorted(set().union(*values.values()))
    if not is_mixture(names):
        return []
    return [{"source": name, "weight": values["source_weights"].get(name),
             "share": values["source_token_shares"].get(name),
             "tokens": values["source_tokens"].get(name),
             "epochs": values["source_epochs"].get(name)} for name in names]


def eval_source_rows(metrics: dict, thresholds: dict | None = None) -> list[dict]:
    """[{"source", "before", "after", "change", "threshold", "documents", "tokens",
    "bytes"}] by source name from metrics.json: bits per byte of the baseline ("before",
    None without a baseline or when it has no figure for the source) and of the
    candidate ("after"), change = after - before (positive = worse: forgetting), the
    source's `eval.max_bits_per_byte_by_source` threshold or None, and the candidate's
    counts. [] for a one-source run."""
    by_source = metrics.get("by_source") or {}
    baseline = metrics.get("baseline_by_source") or {}
    if not is_mixture(by_source):
        return []
    rows = []
    for name in sorted(by_source):
        after = by_source[name].get("bits_per_byte")
        before = (baseline.get(name) or {}).get("bits_per_byte")
        rows.append({"source": name, "before": before, "after": after,
                     "change": after - before if None not in (before, after) else None,
                     "threshold": (thresholds or {}).get(name),
                     **{k: by_source[name].get(k) for k in ("documents", "tokens", "bytes")}})
    return rows


def cleaning_source_rows(cleaner_props: dict) -> list[dict]:
    """[{"source", "read", "kept", "dropped", "reasons": {reason: n}}] by source name from
    the TextCleaner's `by_source` property. [] for a one-source run or without it."""
    by_source = _json_property(cleaner_props, "by_source")
    if not is_mixture(by_source):
        return []
    # A JSON value property reads back its numbers as floats: counts are ints.
    return [{"source": name, "read": _count(v.get("records_read")),
             "kept": _count(v.get("records_kept")), "dropped": _count(v.get("records_dropped")),
             "reasons": {k: _count(n) for k, n in (v.get("dropped") or {}).items()}}
            for name, v in sorted(by_source.items()) if isinstance(v, dict)]


def _count(value):
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _num(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _percent(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def token_share_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) of `token_share_rows` for a table."""
    header = ["source", "weight", "realized share", "share - weight", "tokens", "epochs"]
    cells = [[r["source"], _percent(r["weight"]), _percent(r["share"]),
              "—" if None in (r["share"], r["weight"])
              else f"{100 * (r['share'] - r['weight']):+.1f} points",
              _num(r["tokens"], ","), _num(r["epochs"], ".2f")] for r in rows]
    return header, cells


def eval_source_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) of `eval_source_rows` for a table."""
    header = ["source", "bits/byte before (baseline)", "bits/byte after (candidate)",
              "change", "threshold", "documents", "tokens", "bytes"]
    cells = []
    for r in rows:
        change = "—" if r["change"] is None else (
            f"{r['change']:+.4f}" + (" (worse)" if r["change"] > 0 else ""))
        cells.append([r["source"], _num(r["before"], ".4f"), _num(r["after"], ".4f"), change,
                      _num(r["threshold"], ".4f"), _num(r["documents"], ","),
                      _num(r["tokens"], ","), _num(r["bytes"], ",")])
    return header, cells


def cleaning_source_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) of `cleaning_source_rows` for a table."""
    header = ["source", "read", "kept", "dropped", "dropped by reason"]
    cells = [[r["source"], _num(r["read"], ","), _num(r["kept"], ","), _num(r["dropped"], ","),
              ", ".join(f"{k} {v}" for k, v in sorted(r["reasons"].items(),
                                                      key=lambda kv: -kv[1])) or "—"]
             for r in rows]
    return header, cells


def summary_lines(model_props: dict, metrics: dict, cleaner_props: dict,
                  thresholds: dict | None = None) -> list[str]:
    """The run summary's lines per source (records, token share vs weight, bits per byte
    before and after); [] for a one-source run."""
    lines = []
    for title, (header, cells) in (
            ("records by source", cleaning_source_cells(cleaning_source_rows(cleaner_props))),
            ("trained tokens by source", token_share_cells(token_share_rows(model_props))),
            ("eval by source", eval_source_cells(eval_source_rows(metrics, thresholds)))):
        if not cells:
            continue
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]
        lines.append(f"{title}:")
        for row in [header, *cells]:
            lines.append("  " + "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip())
    return lines
