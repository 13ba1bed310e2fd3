"""`deepseek-tfx compare` (serving/compare.py, cli/compare.py): two versions of a tiny
model measured in one process: bits per byte on English and Chinese text, an English and
a Chinese multiple-choice task and a generation task, and a load run against the served
model; the JSON, the table, and the refusals of bad input (one line, before any model
is loaded).

Subject: two tiny text SavedModels (tests/tiny_text_model.py, seeds 0 and 1 = "two
versions") pushed as versions 1 and 2 of one serving directory; the second is named by
the serving directory itself (its newest version).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_text_model import save_tiny_text_model

from reporting.comparison import NOT_SIGNIFICANT_NOTE, comparison_rows, format_table

pytestmark = pytest.mark.slow  # two models traced, scored and served: ~40 s

PROJECT_ROOT = Path(__file__).resolve().parents[2]
UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "Question": 8, "Answer": 8, ":": 9, "\n": 30, "床前": 6, "明月": 4, "。": 10, "，": 20}
VOCAB, CONTEXT = 300, 64
TEXT = ("the quick brown fox jumps over the lazy dog.\n\nQuestion: the fox?\nAnswer: jumps\n\n"
        "床前明月光，疑是地上霜。\n举头望明月，低头思故乡。\n\n春眠不觉晓，处处闻啼鸟。\n")
ENGLISH = [{"task": "tiny_en", "type": "multiple_choice"},
           {"context": "Question: the quick brown fox?\nAnswer:", "choices": ["jumps", "over the"],
            "label": 0},
           {"context": "Question: over the?\nAnswer:", "choices": ["fox", "brown", "the"],
            "label": 2}]
CHINESE = [{"task": "诗句_zh", "type": "multiple_choice", "target_delimiter": ""},
           {"context": "床前明月光，", "choices": ["疑是地上霜。", "低头思故乡。", "处处闻啼鸟。",
                                                 "夜来风雨声。"], "label": 0},
           {"context": "举头望明月，", "choices": ["疑是地上霜。", "低头思故乡。"], "label": 1}]
GENERATION = [{"task": "tiny_gen", "type": "generation", "max_gen_toks": 4},
              {"context": "Question: the quick brown?\nAnswer:", "answer": "fox", "stop": ["\n"]}]
REQUESTS, CONCURRENCY, MAX_TOKENS = 6, 2, 4


def _write_jsonl(path: Path, lines: list[dict]) -> str:
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                    encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """(serving dir with versions 1 and 2, data file, [task files])."""
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    root = tmp_path_factory.mktemp("compare")
    tokenizer = ByteLevelBpe(learn(UNITS, VOCAB).json)
    serving = root / "serving"
    for version, seed in ((1, 0), (2, 1)):
        save_tiny_text_model(serving / str(version), tokenizer, context=CONTEXT,
                             max_new_tokens=4, vocab_size=VOCAB, seed=seed)
    data = root / "text.txt"
    data.write_text(TEXT, encoding="utf-8")
    tasks = [_write_jsonl(root / f"{name}.jsonl", lines) for name, lines in
             (("en", ENGLISH), ("zh", CHINESE), ("gen", GENERATION))]
    return serving, str(data), tasks


@pytest.fixture(scope="module")
def result(inputs):
    from serving.compare import compare_models

    serving, data, tasks = inputs
    lines = []
    out = compare_models({"v1": str(serving / "1"), "v2": str(serving)}, data, tasks,
                         requests=REQUESTS, concurrency=CONCURRENCY, max_tokens=MAX_TOKENS,
                         batch_size=4, progress=lines.append)
    out["progress"] = lines
    return out


def test_the_json_has_every_field_for_both_models(result, inputs):
    serving, data, tasks = inputs
    assert json.loads(json.dumps(result, allow_nan=False)) == result  # strict JSON as is
    assert list(result["models"]) == ["v1", "v2"]
    assert result["models"]["v1"]["dir"] == str(serving / "1")
    assert result["models"]["v2"]["dir"] == str(serving / "2")  # the serving dir's newest
    assert result["data"] == data and result["data_files"] == [data]
    assert result["tasks"] == ["tiny_en", "诗句_zh", "tiny_gen"]
    assert result["task_files"] == tasks
    assert set(result["machine"]) >= {"cpu_count", "platform", "tensorflow"}
    assert result["machine"]["cpu_count"] >= 1
    # one model at a time: v1 is done before v2 starts
    assert [line.split(" in ")[0] for line in result["progress"]] == [
        f"v1: measuring {serving / '1'}", "v1: done", f"v2: measuring {serving / '2'}", "v2: done"]
    for model in result["models"].values():
        assert set(model) >= {"dir", "bits_per_byte", "perplexity", "tasks", "latency"}
        assert set(model["tasks"]) == {"tiny_en", "诗句_zh", "tiny_gen"}
        assert set(model["latency"]) >= {"p50_ms", "p99_ms", "tokens_per_second", "requests",
                                         "concurrency", "max_tokens", "errors"}


def test_both_models_are_measured_and_differ(result):
    v1, v2 = result["models"]["v1"], result["models"]["v2"]
    for model in (v1, v2):
        # a random 300-token model: about log2(300) bits per token, a few tokens per byte
        assert 0 < model["bits_per_byte"] < 20
        assert model["perplexity"] == pytest.approx(2 ** (model["bits_per_byte"]
                                                          * model["eval_bytes"]
                                                          / model["eval_tokens"]), rel=1e-4)
        en, zh = model["tasks"]["tiny_en"], model["tasks"]["诗句_zh"]
        assert en["n"] == 2 and zh["n"] == 2 and 0 <= en["acc"] <= 1
        assert en["chance"] == pytest.approx((1 / 2 + 1 / 3) / 2)
        assert zh["chance"] == pytest.approx((1 / 4 + 1 / 2) / 2)
        assert model["tasks"]["tiny_gen"]["exact_match"] in (0.0, 1.0)
        assert model["tasks"]["tiny_gen"]["exact_match_stderr"] is None  # one example: NaN
    assert v1["bits_per_byte"] != v2["bits_per_byte"]  # seeds 0 and 1: other weights


def test_the_load_run_reports_positive_latency_and_tokens_per_second(result):
    for model in result["models"].values():
        latency = model["latency"]
        assert latency["errors"] == 0 and latency["status_counts"] == {"200": REQUESTS}
        assert latency["requests"] == REQUESTS and latency["concurrency"] == CONCURRENCY
        assert latency["max_tokens"] == MAX_TOKENS
        assert 0 < latency["p50_ms"] <= latency["p99_ms"]
        # greedy, max_tokens each; [EOS] may end one early
        assert 0 < latency["completion_tokens"] <= REQUESTS * MAX_TOKENS
        assert latency["tokens_per_second"] == pytest.approx(
            latency["completion_tokens"] / latency["wall_s"], rel=0.02)
    # the data's documents are the prompts (4 documents: 4 prompts), the same for both
    assert len(result["prompts"]) == 4 and result["prompts"][2].startswith("床前明月光")


def test_the_table_names_both_models_every_task_and_the_latency(result):
    v1, v2 = result["models"]["v1"], result["models"]["v2"]
    table = format_table(comparison_rows(v1, v2), ("v1", "v2"))
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["metric", "v1", "v2"]
    names = [line.split("  ")[0].strip() for line in lines[2:12]]
    assert names == ["bits per byte", "perplexity", "tiny_en acc", "tiny_en acc_norm",
                     "诗句_zh acc", "诗句_zh acc_norm", "tiny_gen exact_match",
                     "p50 latency (ms)", "p99 latency (ms)", "tokens/s"]
    assert lines[12:] in ([], [NOT_SIGNIFICANT_NOTE])  # 2 examples per task: all noise
    bpb = lines[2].split()
    assert float(bpb[3]) == pytest.approx(v1["bits_per_byte"], abs=1e-4)
    assert float(bpb[4]) == pytest.approx(v2["bits_per_byte"], abs=1e-4)


def test_the_cli_prints_the_table_and_writes_the_json(result, inputs, tmp_path, monkeypatch,
                                                       capsys):
    """cmd_compare on the measured result (compare_models stubbed: measured above)."""
    import serving.compare
    from cli import build_parser

    serving_dir, data, tasks = inputs
    calls = []

    def measured(dirs, pattern, task_paths, **kw):
        calls.append((dirs, pattern, task_paths, kw))
        return {**result, "models": dict(zip(dirs, result["models"].values(), strict=True))}

    monkeypatch.setattr(serving.compare, "compare_models", measured)
    out = tmp_path / "out.json"
    args = build_parser().parse_args(["compare", str(serving_dir / "1"), str(serving_dir),
                                      "--data", data, "--tasks", *tasks, "--json", str(out),
                                      "--requests", "6", "--concurrency", "2",
                                      "--max-tokens", "4"])
    assert args.fn(args) == 0
    (dirs, pattern, task_paths, kw) = calls[0]
    assert dirs == {"v1": str(serving_dir / "1"), "v2": str(serving_dir)}  # default labels
    assert pattern == data and task_paths == tasks
    assert kw["requests"] == 6 and kw["concurrency"] == 2 and kw["max_tokens"] == 4
    printed = capsys.readouterr().out
    assert "metric" in printed and "诗句_zh acc" in printed and "tokens/s" in printed
    assert f"json: {out}" in printed
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["tasks"] == result["tasks"] and written["models"] == result["models"]
    assert (written["table"]["a"], written["table"]["b"]) == ("v1", "v2")
    rows = {r["name"]: r for r in written["table"]["rows"]}
    assert rows["bits per byte"]["a"] == result["models"]["v1"]["bits_per_byte"]
    assert rows["诗句_zh acc"]["chance"] == pytest.approx(0.375)
    assert set(rows["tokens/s"]) >= {"a", "b", "delta", "better", "lower_is_better"}


# ----------------------------------------------------------------------------- bad input


@pytest.fixture()
def no_measuring(monkeypatch):
    """Fails the test if a model would be measured (input must be refused before)."""
    import serving.compare

    def measure(*args, **kwargs):
        raise AssertionError("a model was measured before the input was checked")

    monkeypatch.setattr(serving.compare, "_measure", measure)


def _refusal(inputs, **changes) -> str:
    from serving.compare import CompareError, compare_models

    serving, data, tasks = inputs
    kw = dict(dirs={"v1": str(serving / "1"), "v2": str(serving)}, data_pattern=data,
              task_paths=tasks, requests=2, concurrency=1, max_tokens=4, batch_size=4)
    kw.update(changes)
    with pytest.raises(CompareError) as e:
        compare_models(kw.pop("dirs"), kw.pop("data_pattern"), kw.pop("task_paths"), **kw)
    message = str(e.value)
    assert "\n" not in message
    return message


def test_bad_input_is_refused_in_one_line_naming_it(inputs, tmp_path, no_measuring):
    serving, data, tasks = inputs
    (tmp_path / "empty").mkdir()
    assert _refusal(inputs, dirs={"v1": str(tmp_path / "empty"), "v2": str(serving)}) == (
        f"v1: {tmp_path / 'empty'}: not a SavedModel (no saved_model.pb) and no numbered "
        "versions holding one")
    assert "no such directory" in _refusal(inputs, dirs={"a": "/no/such", "b": str(serving)})
    logits_only = tmp_path / "logits_only"
    logits_only.mkdir()
    shutil.copy(serving / "1" / "saved_model.pb", logits_only)  # no assets/tokenizer.json
    assert "has no tokenizer" in _refusal(inputs, dirs={"a": str(logits_only), "b": str(serving)})
    missing = str(tmp_path / "missing.txt")
    assert _refusal(inputs, data_pattern=missing) == f"data {missing}: no files match"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "x", "type": "multiple_choice"}\n{"context": "a", "choices": ["b"], '
                   '"label": 0}\n', encoding="utf-8")
    message = _refusal(inputs, task_paths=[*tasks, str(bad)])
    assert message.startswith(f"{bad}:2:") and "choices" in message
    assert "two task files name the task 'tiny_en'" in _refusal(
        inputs, task_paths=[tasks[0], tasks[0]])
    assert _refusal(inputs, max_tokens=63).startswith("max_tokens 63: must be at most 62")
    assert _refusal(inputs, concurrency=0) == "concurrency 0: must be an integer >= 1"


@pytest.mark.parametrize("case", ["not_a_model", "bad_task", "no_data", "json_dir"])
def test_the_cli_refuses_bad_input_in_one_line_without_a_traceback(inputs, tmp_path, case):
    serving, data, tasks = inputs
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n", encoding="utf-8")
    args = {"not_a_model": [str(tmp_path), str(serving), "--tasks", *tasks],
            "bad_task": [str(serving / "1"), str(serving), "--tasks", str(bad)],
            "no_data": [str(serving / "1"), str(serving), "--data", str(tmp_path / "none.txt")],
            "json_dir": [str(serving / "1"), str(serving), "--json",
                         str(tmp_path / "no" / "out.json")],
            }[case]
    env = dict(os.environ, DEEPSEEK_TFX_LOG_DIR=str(tmp_path / "logs"))
    json_out = [] if case == "json_dir" else ["--json", str(tmp_path / "out.json")]
    proc = subprocess.run([sys.executable, "-m", "cli", "compare", *args, *json_out],
                          cwd=PROJECT_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("log: ")]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert not (tmp_path / "out.json").exists()
    expected = {"not_a_model": str(tmp_path), "bad_task": f"{bad}:1:",
                "no_data": "none.txt", "json_dir": "is not a writable directory"}[case]
    assert expected in lines[0]


def test_the_cli_refuses_a_directory_name_that_is_not_utf8_in_one_line(tmp_path):
    env = dict(os.environ, DEEPSEEK_TFX_LOG_DIR=str(tmp_path / "logs"), PYTHONUTF8="0")
    proc = subprocess.run([sys.executable.encode(), b"-m", b"cli", b"compare", b"/tmp/mod\xe9l",
                           b"B"], cwd=PROJECT_ROOT, env=env, capture_output=True, timeout=120)
    err = proc.stderr.decode("utf-8")
    assert proc.returncode != 0 and "Traceback" not in err, err
    assert err.splitlines() == ["error: DIR_A '/tmp/mod\\xe9l': not UTF-8 (byte 0xe9 at offset "
                                "8); rename the file, or reach it through a link with a UTF-8 "
                                "name"]
