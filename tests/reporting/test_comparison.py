"""The comparison table shared by `deepseek-tfx compare` and the run report
(reporting/comparison.py): rows, deltas and directions, tasks only one model has, old
metrics without tasks, and alignment with Chinese names and labels. No TensorFlow."""

from __future__ import annotations

import math

import pytest

from reporting.comparison import (
    NOT_SIGNIFICANT_NOTE,
    comparison_rows,
    display_width,
    format_table,
    primary_metrics,
    table_cells,
)

A = {"bits_per_byte": 2.5, "perplexity": 40.0,
     "tasks": {"arc_easy": {"type": "multiple_choice", "acc": 0.25, "acc_stderr": 0.04,
                            "acc_norm": 0.30, "acc_norm_stderr": 0.05, "acc_bytes": 0.2,
                            "chance": 0.25, "n": 100},
               "gen": {"type": "generation", "exact_match": 0.5, "exact_match_stderr": 0.1,
                       "chance": 0.0, "n": 20}},
     "latency": {"p50_ms": 100.0, "p99_ms": 300.0, "tokens_per_second": 50.0}}
B = {"bits_per_byte": 2.25, "perplexity": 45.0,
     "tasks": {"arc_easy": {"type": "multiple_choice", "acc": 0.35, "acc_stderr": 0.05,
                            "acc_norm": 0.30, "acc_norm_stderr": 0.05, "chance": 0.25,
                            "n": 100},
               "诗句_zh": {"acc": 0.5, "acc_norm": 0.25, "chance": 0.25, "n": 8}},
     "latency": {"p50_ms": 80.0, "p99_ms": 400.0, "tokens_per_second": 40.0}}


def _by_name(rows):
    return {r.name: r for r in rows}


def test_rows_have_deltas_b_minus_a_and_the_better_side_by_direction():
    rows = _by_name(comparison_rows(A, B))
    # bits per byte: lower is better; 2.25 - 2.5 = -0.25 -> B
    assert rows["bits per byte"].delta == pytest.approx(-0.25)
    assert rows["bits per byte"].better == "b" and rows["bits per byte"].lower_is_better
    assert rows["perplexity"].better == "a"  # 45 > 40
    assert rows["arc_easy acc"].delta == pytest.approx(0.10) and rows["arc_easy acc"].better == "b"
    assert rows["arc_easy acc_norm"].better == "="
    assert rows["arc_easy acc"].chance == 0.25
    assert (rows["arc_easy acc"].a_stderr, rows["arc_easy acc"].b_stderr) == (0.04, 0.05)
    assert rows["p50 latency (ms)"].better == "b"  # 80 < 100 ms
    assert rows["p99 latency (ms)"].better == "a"  # 300 < 400 ms
    assert rows["tokens/s"].better == "a"  # 50 > 40: higher is better
    assert {r.group for r in rows.values() if "latency" in r.name or r.name == "tokens/s"} == {
        "latency"}


def test_a_difference_within_two_standard_errors_is_not_significant():
    rows = _by_name(comparison_rows(A, B))
    # |0.35 - 0.25| = 0.10 <= 2 sqrt(0.04^2 + 0.05^2) = 0.128
    assert rows["arc_easy acc"].significant is False
    assert rows["bits per byte"].significant is None  # no standard errors
    sure = {"tasks": {"t": {"acc": 0.30, "acc_stderr": 0.01, "chance": 0.25}}}
    rows = comparison_rows({"tasks": {"t": {"acc": 0.25, "acc_stderr": 0.01}}}, sure)
    # 0.05 > 2 sqrt(2) 0.01 = 0.028
    assert rows[2].significant is True and rows[2].better == "b"
    table = format_table(rows, ("a", "b"))
    assert NOT_SIGNIFICANT_NOTE not in table and "(b)" not in table


def test_long_labels_shorten_the_delta_header():
    header, _ = table_cells(comparison_rows(A, B), ("v1795657906", "v1795658103"))
    assert header[3] == "delta (B - A)"


def test_rows_are_in_order_with_each_tasks_primary_metrics_only():
    names = [r.name for r in comparison_rows(A, B)]
    assert names == ["bits per byte", "perplexity", "arc_easy acc", "arc_easy acc_norm",
                     "gen exact_match", "诗句_zh acc", "诗句_zh acc_norm", "p50 latency (ms)",
                     "p99 latency (ms)", "tokens/s"]  # acc_bytes is not a primary metric


def test_a_task_only_one_model_has_gets_an_empty_side_and_no_verdict():
    rows = _by_name(comparison_rows(A, B))
    gen, zh = rows["gen exact_match"], rows["诗句_zh acc"]
    assert (gen.a, gen.b, gen.delta, gen.better, gen.chance) == (0.5, None, None, "", 0.0)
    assert (zh.a, zh.b, zh.delta, zh.better) == (None, 0.5, None, "")


def test_old_metrics_without_tasks_or_latency_give_the_quality_rows_only():
    old = {"bits_per_byte": 3.0, "perplexity": 90.0, "loss": 4.5}
    rows = comparison_rows(old, {"bits_per_byte": 2.0, "perplexity": 50.0, "tasks": {}})
    assert [r.name for r in rows] == ["bits per byte", "perplexity"]
    assert comparison_rows(old, B)[-1].name == "诗句_zh acc_norm"  # no latency: one side lacks it


def test_nan_and_missing_values_give_no_verdict():
    rows = comparison_rows({"bits_per_byte": math.nan, "perplexity": None}, B)
    assert rows[0].better == "" and rows[1].delta is None


def test_primary_metrics_follow_the_task_type():
    assert primary_metrics(A["tasks"]["arc_easy"]) == ("acc", "acc_norm")
    assert primary_metrics(A["tasks"]["gen"]) == ("exact_match",)
    assert primary_metrics({"exact_match": 1.0}) == ("exact_match",)  # no "type": inferred


def test_the_table_aligns_columns_with_chinese_names_and_labels():
    table = format_table(comparison_rows(A, B), ("旧版", "v2"))
    lines = table.splitlines()
    assert lines[0].startswith("metric") and "旧版" in lines[0] and "v2" in lines[0]
    assert set(lines[1]) == {"-", " "}
    # every line is as wide as the rule (the last column left-aligned: not padded)
    width = display_width(lines[1])
    assert lines[-1] == NOT_SIGNIFICANT_NOTE  # arc_easy acc: +0.10 within 2 x 0.064
    lines = lines[:-1]
    assert all(display_width(line) <= width for line in lines)
    # the "better" column starts at the same terminal column on every line
    column = display_width(lines[1].rsplit("  ", 2)[0]) + 2
    zh = next(line for line in lines if line.startswith("诗句_zh acc "))
    bpb = next(line for line in lines if line.startswith("bits per byte"))
    for line in (zh, bpb):
        text = line
        cut = next(i for i in range(len(text)) if display_width(text[:i]) == column)
        assert text[cut - 2:cut] == "  " and text[cut] != " "
    assert bpb.split()[3:7] == ["2.5000", "2.2500", "-0.2500", "v2"]
    assert "(v2)" in next(line for line in lines if line.startswith("arc_easy acc "))
    assert "0.2500 ±0.0400" in table and "—" in zh  # A has no 诗句_zh: a dash


def test_table_cells_name_the_better_model_by_its_label():
    header, cells = table_cells(comparison_rows(A, B), ("baseline", "candidate"))
    assert header == ["metric", "baseline", "candidate", "delta (candidate - baseline)",
                      "better", "chance"]
    assert cells[0][4] == "candidate" and cells[1][4] == "baseline"
    assert cells[2][4] == "(candidate)" and cells[3][4] == "="


def test_display_width_counts_wide_characters_twice():
    assert display_width("abc") == 3
    assert display_width("诗句_zh") == 7
    assert display_width("ｆｕｌｌ") == 8  # fullwidth
    assert display_width("e\u0301") == 1  # a combining accent takes no column
