"""Two models' figures side by side: the rows of `deepseek-tfx compare`'s table and of the
run report's candidate-vs-baseline comparison, and the plain-text table.

`comparison_rows(a, b)` takes two result dicts of the shape

    {"bits_per_byte": float | None, "perplexity": float | None,
     "tasks": {task: metrics (evaluation/task_scoring.py: acc, acc_norm, exact_match,
               *_stderr, chance, type, n, ...)},
     "latency": {"p50_ms", "p99_ms", "tokens_per_second", ...}}     (optional)

(a `compare` model entry, or metrics.json's "candidate" / "baseline") and gives one `Row`
per figure: bits per byte, perplexity; per task its primary metrics (multiple choice:
acc, acc_norm; generation: exact_match) with the task's chance level; then p50 and p99
request latency (ms) and generated tokens/s when both have "latency". Each row holds
A, B, the delta B - A and which is better given the metric's direction (lower is better
for bits per byte, perplexity and latency; higher for the task scores and tokens/s).
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata

PRIMARY_METRICS = {"multiple_choice": ("acc", "acc_norm"), "generation": ("exact_match",)}
# (key in "latency", row name, lower is better, decimals)
LATENCY_ROWS = (("p50_ms", "p50 latency (ms)", True, 1), ("p99_ms", "p99 latency (ms)", True, 1),
                ("tokens_per_second", "tokens/s", False, 1))


@dataclasses.dataclass(frozen=True)
class Row:
    """One figure of two models.

    name: what is measured ("bits per byte", "arc_easy acc", "p50 latency (ms)").
    a, b: the two values (None: that model has no such figure).
    delta: b - a (None when either is missing).
    better: "a", "b", "=" (equal) or "" (a value is missing, or NaN).
    lower_is_better: the metric's direction.
    chance: the task's chance level (task rows), else None.
    a_stderr, b_stderr: standard errors of a and b (task rows), else None.
    significant: whether |delta| exceeds two standard errors of the difference,
      2 sqrt(a_stderr^2 + b_stderr^2) (None without both standard errors); a difference
      within them is noise at this n (e.g. 100 examples: about +-0.06 near 0.25).
    decimals: how many decimals the table shows.
    group: "quality" or "latency".
    """
    name: str
    a: float | None
    b: float | None
    delta: float | None
    better: str
    lower_is_better: bool
    chance: float | None = None
    a_stderr: float | None = None
    b_stderr: float | None = None
    significant: bool | None = None
    decimals: int = 4
    group: str = "quality"


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _row(name: str, a, b, lower_is_better: bool, **kw) -> Row:
    a, b = _number(a), _number(b)
    delta = better = significant = None
    if a is not None and b is not None:
        delta = b - a
        se_a, se_b = kw.get("a_stderr"), kw.get("b_stderr")
        if se_a is not None and se_b is not None and math.isfinite(se_a + se_b):
            significant = abs(delta) > 2 * math.sqrt(se_a ** 2 + se_b ** 2)
        if math.isnan(delta):
            better = ""
        elif delta == 0:
            better = "="
        else:
            better = "b" if (delta < 0) == lower_is_better else "a"
    return Row(name, a, b, delta, better or "", lower_is_better, significant=significant, **kw)


def task_type(metrics: dict) -> str:
    """A task's type from its metrics: their "type", else "generation" when they hold
    exact_match, else "multiple_choice"."""
    if metrics.get("type") in PRIMARY_METRICS:
        return metrics["type"]
    return "generation" if "exact_match" in metrics else "multiple_choice"


def primary_metrics(metrics: dict) -> tuple[str, ...]:
    """The metric names reported for a task (multiple choice: acc, acc_norm; generation:
    exact_match), those present in `metrics`."""
    return tuple(m for m in PRIMARY_METRICS[task_type(metrics)] if m in metrics)


def comparison_rows(a: dict, b: dict) -> list[Row]:
    """The rows of the comparison of `a` and `b` (module docstring). A task only one of
    them has gets a row with the other value None; a model without "tasks" (an old
    metrics.json) has none."""
    rows = [_row("bits per byte", a.get("bits_per_byte"), b.get("bits_per_byte"), True),
            _row("perplexity", a.get("perplexity"), b.get("perplexity"), True, decimals=2)]
    tasks_a, tasks_b = a.get("tasks") or {}, b.get("tasks") or {}
    for task in [*tasks_a, *(t for t in tasks_b if t not in tasks_a)]:
        ma, mb = tasks_a.get(task, {}), tasks_b.get(task, {})
        known = ma or mb
        chance = _number(known.get("chance"))
        for metric in primary_metrics({**mb, **ma, "type": task_type(known)}):
            rows.append(_row(f"{task} {metric}", ma.get(metric), mb.get(metric), False,
                             chance=chance, a_stderr=_number(ma.get(f"{metric}_stderr")),
                             b_stderr=_number(mb.get(f"{metric}_stderr"))))
    la, lb = a.get("latency"), b.get("latency")
    if la and lb:
        for key, name, lower, decimals in LATENCY_ROWS:
            rows.append(_row(name, la.get(key), lb.get(key), lower, decimals=decimals,
                             group="latency"))
    return rows


def display_width(text: str) -> int:
    """Terminal columns of `text`: East Asian wide and fullwidth characters (Chinese) take
    two, combining marks none, the rest one."""
    return sum(0 if unicodedata.combining(c) else
               2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * max(width - display_width(text), 0)
    return fill + text if right else text + fill


def format_value(value: float | None, decimals: int, stderr: float | None = None,
                 signed: bool = False) -> str:
    """`value` with `decimals` decimals (and ` ±stderr`), "—" for None."""
    if value is None:
        return "—"
    text = f"{value:+.{decimals}f}" if signed else f"{value:.{decimals}f}"
    return text + (f" ±{stderr:.{decimals}f}" if stderr is not None else "")


NOT_SIGNIFICANT_NOTE = ("(label): better by less than two standard errors of the "
                        "difference, i.e. within noise at this number of examples")


def table_cells(rows: list[Row], labels: tuple[str, str]) -> tuple[list[str], list[list[str]]]:
    """(header, cells) of the table: metric, label A, label B, delta (label B - label A;
    "B - A" when the labels are long), better (the label of the better model, in
    parentheses when the difference is not significant, "=" or "—"), chance."""
    la, lb = labels
    delta = f"{lb} - {la}" if display_width(la + lb) <= 20 else "B - A"
    header = ["metric", la, lb, f"delta ({delta})", "better", "chance"]
    cells = []
    for r in rows:
        better = {"a": la, "b": lb, "=": "="}.get(r.better, "—")
        if r.significant is False and r.better in ("a", "b"):
            better = f"({better})"
        cells.append([r.name, format_value(r.a, r.decimals, r.a_stderr),
                      format_value(r.b, r.decimals, r.b_stderr),
                      format_value(r.delta, r.decimals, signed=True), better,
                      format_value(r.chance, r.decimals) if r.chance is not None else ""])
    return header, cells


def format_table(rows: list[Row], labels: tuple[str, str]) -> str:
    """The rows as an aligned plain-text table (columns as `table_cells`; names left,
    numbers right, widths in terminal columns so Chinese names align too), a rule under
    the header, and `NOT_SIGNIFICANT_NOTE` under it when a row needs it; no trailing
    spaces."""
    header, cells = table_cells(rows, labels)
    widths = [max(display_width(line[i]) for line in [header, *cells])
              for i in range(len(header))]

    def line(values: list[str]) -> str:
        return "  ".join(_pad(v, w, right=0 < i < 4)
                         for i, (v, w) in enumerate(zip(values, widths, strict=True))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    note = [NOT_SIGNIFICANT_NOTE] if any(r.significant is False and r.better in ("a", "b")
                                         for r in rows) else []
    return "\n".join([line(header), rule, *(line(c) for c in cells), *note])
