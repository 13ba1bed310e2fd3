"""The LmEvaluator's blessing rule (components/lm_evaluator/blessing.py) with benchmark
task scores, the `eval.tasks` / `eval.min_scores` settings and their checks against the
task files (evaluation/tasks.py `load_tasks`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.lm_evaluator.blessing import decide_blessing
from config import get_config
from evaluation.tasks import TaskFileError, load_tasks

TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def _metrics(bpb=2.0, **tasks):
    out = {"bits_per_byte": bpb, "tasks": {}}
    for name, (acc, acc_norm) in tasks.items():
        out["tasks"][name] = {"type": "multiple_choice", "acc": acc, "acc_norm": acc_norm,
                              "acc_bytes": acc_norm, "chance": 0.25, "n": 100}
    return out


def _config(**eval_settings):
    return get_config("tiny", {f"eval.{k}": v for k, v in eval_settings.items()})


def test_a_threshold_above_the_score_fails_naming_the_task_and_both_numbers():
    candidate = _metrics(arc_easy=(0.35, 0.24), poem_next_line_zh=(0.2, 0.2))
    blessed, message = decide_blessing(candidate, None, _config(min_scores={"arc_easy": 0.3}))
    assert blessed and "task arc_easy acc 0.3500" in message
    blessed, message = decide_blessing(candidate, None, _config(min_scores={
        "arc_easy": 0.36, "poem_next_line_zh/acc_norm": 0.25}))
    assert not blessed
    assert "task arc_easy acc 0.3500 < eval.min_scores['arc_easy'] 0.3600" in message
    assert "task poem_next_line_zh acc_norm 0.2000 < eval.min_scores" in message
    assert "0.2500" in message


def test_task_scores_must_not_be_worse_than_the_baseline_beyond_the_tolerance():
    baseline = _metrics(arc_easy=(0.40, 0.30))
    config = _config(task_tolerance=0.02)
    assert decide_blessing(_metrics(arc_easy=(0.38, 0.10)), baseline, config)[0]  # acc gates
    blessed, message = decide_blessing(_metrics(arc_easy=(0.37, 0.30)), baseline, config)
    assert not blessed
    assert "task arc_easy acc 0.3700 is worse than the last blessed model's 0.4000" in message
    # a metric named in min_scores is gated against the baseline too
    config = _config(task_tolerance=0.02, min_scores={"arc_easy/acc_norm": 0.0})
    blessed, message = decide_blessing(_metrics(arc_easy=(0.40, 0.10)), baseline, config)
    assert not blessed and "acc_norm 0.1000 is worse" in message
    # bits per byte and task failures are all named
    blessed, message = decide_blessing(_metrics(9.0, arc_easy=(0.1, 0.1)), baseline, config)
    assert "bits_per_byte 9.0000 > eval.max_bits_per_byte" in message and "task arc_easy" in message


def test_a_drop_within_two_standard_errors_is_noise_not_a_regression():
    """100 examples: acc's standard error is about 0.045, so 5 points down is noise and
    20 points down is a regression; the message gives the allowed drop and its source."""
    def with_stderr(acc):
        m = _metrics(arc_easy=(acc, acc))
        m["tasks"]["arc_easy"]["acc_stderr"] = 0.045
        return m

    config = _config(task_tolerance=0.02)
    assert decide_blessing(with_stderr(0.35), with_stderr(0.40), config)[0]
    blessed, message = decide_blessing(with_stderr(0.20), with_stderr(0.40), config)
    assert not blessed
    assert "task arc_easy acc 0.2000 is worse than the last blessed model's 0.4000" in message
    assert "allowed down to 0.2727" in message and "2 standard errors" in message
    nan = with_stderr(0.30)
    nan["tasks"]["arc_easy"]["acc_stderr"] = float("nan")  # one example: no stderr
    assert not decide_blessing(nan, _metrics(arc_easy=(0.40, 0.40)), config)[0]


def test_a_baseline_without_task_scores_gates_bits_per_byte_only():
    blessed, message = decide_blessing(_metrics(arc_easy=(0.2, 0.2)), {"bits_per_byte": 2.5},
                                       _config())
    assert blessed and "baseline 2.5000" in message


def test_eval_settings_parse_and_refuse_by_name():
    config = _config(tasks="a.jsonl, b.jsonl", min_scores={"arc_easy/acc_norm": 0.3})
    assert config.eval.tasks == ("a.jsonl", "b.jsonl")
    assert type(config).from_json(config.to_json()).eval == config.eval
    for bad, what in ((dict(tasks=["a", "a"]), "listed twice"),
                      (dict(min_scores={"arc_easy/f1": 0.3}), "TASK/METRIC"),
                      (dict(min_scores={"arc_easy": 1.5}), r"\[0, 1\]"),
                      (dict(min_scores="arc_easy"), "JSON object"),
                      (dict(task_tolerance=2), "task_tolerance")):
        with pytest.raises(ValueError, match=what):
            _config(**bad)


def test_min_scores_must_name_loaded_tasks_and_their_metrics(tmp_path):
    paths = [TASKS / "arc_easy.jsonl", TASKS / "poem_next_line_zh.jsonl"]
    assert [t.name for t in load_tasks(paths, {"arc_easy": 0.2})] == ["arc_easy",
                                                                        "poem_next_line_zh"]
    with pytest.raises(TaskFileError, match="no task 'mmlu' in eval.tasks"):
        load_tasks(paths, {"mmlu": 0.3})
    with pytest.raises(TaskFileError, match="reports acc, acc_norm, acc_bytes"):
        load_tasks(paths, {"arc_easy/exact_match": 0.3})
    copy = tmp_path / "again.jsonl"
    copy.write_bytes(paths[0].read_bytes())
    with pytest.raises(TaskFileError, match="also the task of"):
        load_tasks([paths[0], copy])


def test_the_cli_makes_task_paths_absolute_and_refuses_a_bad_file(tmp_path, monkeypatch):
    from cli.settings import with_task_paths

    monkeypatch.chdir(TASKS)
    config = with_task_paths(_config(tasks=["arc_easy.jsonl"]))
    assert config.eval.tasks == (str(TASKS / "arc_easy.jsonl"),)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"task": "x", "type": "multiple_choice"}) + "\n{\n",
                   encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        with_task_paths(_config(tasks=[str(bad)]))


def _by_source(**bpb):
    return {"bits_per_byte": 2.0, "by_source": {
        name: {"bits_per_byte": v, "perplexity": 2.0, "tokens": 10, "bytes": 10,
               "documents": 1} for name, v in bpb.items()}}


def test_a_source_over_its_threshold_fails_naming_the_source_and_both_numbers():
    config = _config(max_bits_per_byte_by_source={"poems": 3.5, "web": 2.5})
    blessed, message = decide_blessing(_by_source(poems=3.91, web=1.2), None, config)
    assert not blessed
    assert message == ("bits per byte on source 'poems' 3.9100 > "
                       "eval.max_bits_per_byte_by_source['poems'] = 3.5000")
    blessed, message = decide_blessing(_by_source(poems=3.4, web=1.2), None, config)
    assert blessed
    assert "bits per byte on source 'poems' 3.4000 <= 3.5000" in message
    assert "source 'web' 1.2000 <= 2.5000" in message
    # no thresholds: the per-source figures gate nothing
    assert decide_blessing(_by_source(poems=9.0), None, _config())[0]


def test_a_threshold_on_a_source_without_eval_documents_is_not_blessed_with_the_reason():
    config = _config(max_bits_per_byte_by_source={"replay": 3.0})
    blessed, message = decide_blessing(_by_source(poems=1.0, web=1.0), None, config)
    assert not blessed
    assert message == ("eval.max_bits_per_byte_by_source['replay'] = 3.0000 names a source "
                       "with no eval documents (sources scored: 'poems', 'web')")
