"""`evaluation.harness_tasks` and `deepseek-tfx harness-task`: our task files as
lm-evaluation-harness task configs (YAML + JSONL), without the harness's environment (the
harness itself runs in tests/e2e/test_lm_eval_harness_e2e.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex

import pytest
import yaml

from cli import main
from evaluation.harness_tasks import harness_task_name, write_harness_task
from evaluation.tasks import continuations, fewshot_prompt, load_task

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "tasks")


def _write(tmp_path, lines, name="task.jsonl") -> str:
    path = tmp_path / name
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                    encoding="utf-8")
    return str(path)


def _read(out_dir, name):
    with open(os.path.join(out_dir, name + ".yaml"), encoding="utf-8") as f:
        config = yaml.safe_load(f)
    with open(os.path.join(out_dir, name + ".jsonl"), "rb") as f:
        raw = f.read()
    return config, raw, [json.loads(line) for line in raw.decode("utf-8").splitlines()]


@pytest.mark.parametrize("fixture", ["arc_easy", "poem_next_line_zh"])
def test_multiple_choice_rows_are_our_prompts(tmp_path, fixture):
    task = load_task(os.path.join(FIXTURES, fixture + ".jsonl"))
    name = write_harness_task(task, str(tmp_path / "out"))
    assert name == "deepseek_tfx_" + fixture  # never the harness's own `arc_easy`
    config, _, rows = _read(tmp_path / "out", name)
    assert config["task"] == name
    assert config["dataset_path"] == "json"
    data = config["dataset_kwargs"]["data_files"]["test"]
    assert os.path.isabs(data) and data == str(tmp_path / "out" / (name + ".jsonl"))
    assert config["test_split"] == "test" and config["num_fewshot"] == 0
    assert config["output_type"] == "multiple_choice"
    assert (config["doc_to_text"], config["doc_to_choice"], config["doc_to_target"]) == \
        ("query", "choices", "label")
    assert config["target_delimiter"] == task.target_delimiter
    assert [m["metric"] for m in config["metric_list"]] == ["acc", "acc_norm", "acc_bytes"]
    assert len(rows) == len(task.examples) == 100
    for row, ex in zip(rows, task.examples, strict=True):
        # What the harness scores at num_fewshot 0: (query, target_delimiter + choice).
        assert row["query"] == fewshot_prompt(task, ex)
        assert tuple(config["target_delimiter"] + c for c in row["choices"]) == \
            continuations(task, ex)
        assert row["label"] == ex.label


def test_chinese_text_byte_for_byte(tmp_path):
    """Chinese (and a character outside the BMP) is written as UTF-8, not \\u-escaped,
    and reads back identical; the few-shot example is in the prompt."""
    shot = {"context": "《静夜思》\n作者：李白\n床前明月光，", "choices": ["疑是地上霜。", "春眠不觉晓。"],
            "label": 0}
    ex = {"context": "《春晓》\n作者：孟浩然\n", "choices": ["处处闻啼鸟。", "春眠不觉晓。𠀋"],
          "label": 1}
    path = _write(tmp_path, [{"task": "诗句_zh", "type": "multiple_choice", "num_fewshot": 1,
                              "target_delimiter": "", "description": "选出下一句。\n",
                              "fewshot": [shot]}, ex])
    task = load_task(path)
    name = write_harness_task(task, str(tmp_path / "out"))
    assert name.startswith("deepseek_tfx_") and name.isascii()
    config, raw, rows = _read(tmp_path / "out", name)
    expected = "选出下一句。\n《静夜思》\n作者：李白\n床前明月光，疑是地上霜。\n\n《春晓》\n作者：孟浩然\n"
    assert rows[0]["query"] == expected == fewshot_prompt(task, task.examples[0])
    assert expected.encode("utf-8") in raw.replace(b"\\n", b"\n")
    assert "春眠不觉晓。𠀋".encode() in raw and b"\\u" not in raw
    assert config["target_delimiter"] == ""
    assert config["metadata"]["converted_from"] == os.path.abspath(path)


def test_names_are_distinct_and_plain():
    assert harness_task_name("arc_easy") == "deepseek_tfx_arc_easy"
    a, b = harness_task_name("诗"), harness_task_name("词")
    assert a != b and a.isascii() and b.isascii()
    assert harness_task_name("a-b") != harness_task_name("a_b")
    with pytest.raises(ValueError, match="empty"):
        harness_task_name("")


def test_generation_task(tmp_path):
    header = {"task": "sums", "type": "generation", "max_gen_toks": 8}
    path = _write(tmp_path, [header, {"context": "2+2=", "answer": " 4", "stop": ["\n", "。"]},
                             {"context": "三加三等于", "answer": "六", "stop": ["\n", "。"]}])
    name = write_harness_task(load_task(path), str(tmp_path / "out"))
    config, _, rows = _read(tmp_path / "out", name)
    assert config["output_type"] == "generate_until"
    assert config["doc_to_target"] == "answer"
    assert config["generation_kwargs"] == {"until": ["\n", "。"], "do_sample": False,
                                           "temperature": 0.0, "max_gen_toks": 8}
    assert [m["metric"] for m in config["metric_list"]] == ["exact_match"]
    # Ours compares stripped output and answer: the harness strips the output, the row's
    # answer is stored stripped.
    assert config["filter_list"] == [{"name": "strip", "filter": [
        {"function": "remove_whitespace"}, {"function": "take_first"}]}]
    assert rows == [{"query": "2+2=", "answer": "4"}, {"query": "三加三等于", "answer": "六"}]


def test_generation_stops_must_agree(tmp_path):
    path = _write(tmp_path, [{"task": "g", "type": "generation"},
                             {"context": "a", "answer": "b", "stop": ["\n"]},
                             {"context": "c", "answer": "d", "stop": ["。"]}])
    with pytest.raises(ValueError, match=r"'g'.*one list of stop strings.*2 different"):
        write_harness_task(load_task(path), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_bad_input(tmp_path):
    with pytest.raises(TypeError, match="load_task"):
        write_harness_task({"task": "t"}, str(tmp_path))
    task = load_task(os.path.join(FIXTURES, "arc_easy.jsonl"))
    with pytest.raises(ValueError, match="no examples"):
        write_harness_task(dataclasses.replace(task, examples=()), str(tmp_path))
    with pytest.raises(ValueError, match="type 'ranking'"):
        write_harness_task(dataclasses.replace(task, type="ranking"), str(tmp_path))
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(OSError):
        write_harness_task(task, str(blocker))


# --- the CLI ---------------------------------------------------------------------------

def test_cli_prints_the_lm_eval_command(tmp_path, capsys):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "tokenizer.json").write_text("{}")
    (hf_dir / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    out = tmp_path / "tasks"
    assert main(["harness-task", os.path.join(FIXTURES, "arc_easy.jsonl"),
                 os.path.join(FIXTURES, "poem_next_line_zh.jsonl"), "--output", str(out),
                 "--tokenizer", str(hf_dir), "--base-url", "http://127.0.0.1:9000/v1/completions"]) == 0
    lines = capsys.readouterr().out.splitlines()
    argv = shlex.split(lines[-1])
    assert argv[:2] == ["HF_DATASETS_OFFLINE=1", "HF_HUB_OFFLINE=1"]
    assert argv[argv.index("--model") + 1] == "local-completions"
    model_args = dict(kv.split("=", 1) for kv in argv[argv.index("--model_args") + 1].split(","))
    assert model_args["max_length"] == "256"  # [EOS] + 255 prompt tokens; +1 from the last logits
    assert model_args["tokenizer"] == str(hf_dir)
    assert model_args["tokenizer_backend"] == "huggingface"
    assert model_args["base_url"] == "http://127.0.0.1:9000/v1/completions"
    assert argv[argv.index("--include_path") + 1] == str(out)
    assert argv[argv.index("--batch_size") + 1] == "32"  # serve's default max_batch_size
    assert argv[argv.index("--tasks") + 1] == "deepseek_tfx_arc_easy,deepseek_tfx_poem_next_line_zh"
    assert sorted(os.listdir(out)) == sorted(f"deepseek_tfx_{t}.{e}" for t in
                                             ("arc_easy", "poem_next_line_zh")
                                             for e in ("yaml", "jsonl"))


def test_cli_without_tokenizer_prints_placeholders(tmp_path, capsys):
    assert main(["harness-task", os.path.join(FIXTURES, "arc_easy.jsonl"),
                 "--output", str(tmp_path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert "tokenizer=<HF_EXPORT_DIR>" in last and "max_length=<max_position_embeddings>" in last


@pytest.mark.parametrize("case, message", [
    ("bad_file", r"^error: .*bad\.jsonl:1: "),
    ("duplicate", r"^error: .* both hold task 'arc_easy'"),
    ("no_config", r"^error: --tokenizer .*: no config\.json"),
    ("bad_context", r"^error: .*config\.json: key 'max_position_embeddings': expected an "
                    r"integer >= 3, got '256'"),
])
def test_cli_bad_input_is_one_line(tmp_path, case, message):
    arc = os.path.join(FIXTURES, "arc_easy.jsonl")
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "tokenizer.json").write_text("{}")
    args = ["harness-task", arc, "--output", str(tmp_path / "out")]
    if case == "bad_file":
        (tmp_path / "bad.jsonl").write_text('{"task": "t", "type": "ranking"}\n')
        args[1] = str(tmp_path / "bad.jsonl")
    elif case == "duplicate":
        args.insert(2, arc)
    else:
        if case == "bad_context":
            (hf_dir / "config.json").write_text(json.dumps({"max_position_embeddings": "256"}))
        args += ["--tokenizer", str(hf_dir)]
    with pytest.raises(SystemExit) as e:
        main(args)
    assert "\n" not in str(e.value)
    assert re.search(message, str(e.value)), str(e.value)
