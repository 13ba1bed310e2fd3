"""`evaluation.tasks`: the task file format, its strict loader, harness-style few-shot
prompts, and the committed task files (tests/fixtures/tasks/, made by make_tasks.py)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from evaluation import tasks
from evaluation.tasks import (
    GenerationExample,
    MultipleChoiceExample,
    TaskFileError,
    fewshot_prompt,
    load_task,
    parse_poems,
    poem_next_line_task,
)

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "tasks")
POEMS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "corpora",
                     "tang_song_poems.txt")
MC_HEADER = {"task": "t", "type": "multiple_choice"}
MC = {"context": "Question: 1+1?\nAnswer:", "choices": ["2", "3"], "label": 0}
GEN = {"context": "Q: 2+2=", "answer": "4", "stop": ["\n"]}


def _write(tmp_path, lines, name="task.jsonl") -> str:
    """`lines` (objects as JSON, str as is, bytes raw) as a task file, one per line."""
    path = tmp_path / name
    raw = [line if isinstance(line, bytes) else
           (line if isinstance(line, str) else json.dumps(line, ensure_ascii=False)).encode()
           for line in lines]
    path.write_bytes(b"\n".join(raw) + b"\n")
    return str(path)


# --- the committed files --------------------------------------------------------------

@pytest.mark.parametrize("name, n_choices", [("arc_easy", None), ("hellaswag", 4),
                                             ("poem_next_line_zh", 4)])
def test_committed_task_files_load(name, n_choices):
    task = load_task(os.path.join(FIXTURES, f"{name}.jsonl"))
    assert (task.name, task.type) == (name, tasks.MULTIPLE_CHOICE)
    assert len(task.examples) == 100 and len(task.fewshot) == 5
    for ex in task.examples + task.fewshot:
        assert isinstance(ex, MultipleChoiceExample)
        assert 0 <= ex.label < len(ex.choices)
        if n_choices:
            assert len(ex.choices) == n_choices
        else:  # ARC: 3 to 5 choices
            assert 3 <= len(ex.choices) <= 5
    # The few-shot pool is disjoint from the examples.
    assert not set(task.fewshot) & set(task.examples)


def test_committed_folder_is_small():
    total = sum(os.path.getsize(os.path.join(FIXTURES, f)) for f in os.listdir(FIXTURES))
    assert total < 1_000_000


def test_arc_prompt_is_the_harness_format():
    """lm_eval/tasks/arc/arc_easy.yaml: doc_to_text "Question: {{question}}\\nAnswer:",
    target " " + choices.text[label]; shots joined by "\\n\\n" (ContextSampler)."""
    task = load_task(os.path.join(FIXTURES, "arc_easy.jsonl"))
    first = task.examples[0]
    assert fewshot_prompt(task, first) == (
        "Question: Which technology was developed most recently?\nAnswer:")
    assert first.choices[first.label] == "cellular telephone"
    shot0, shot1 = task.fewshot[0], task.fewshot[1]
    expected = (f"{shot0.context} {shot0.choices[shot0.label]}\n\n"
                f"{shot1.context} {shot1.choices[shot1.label]}\n\n"
                "Question: Which technology was developed most recently?\nAnswer:")
    assert fewshot_prompt(task, first, k=2) == expected
    assert expected.startswith("Question: ") and expected.count("\nAnswer: ") == 2
    assert tasks.continuations(task, first) == (
        " cellular telephone", " television", " refrigerator", " airplane")


def test_fewshot_prompt_hand_written():
    task = load_task(os.path.join(FIXTURES, "arc_easy.jsonl"))
    task = tasks.Task(**{**task.__dict__, "description": "Science:\n",
                         "fewshot": (MultipleChoiceExample("Question: A?\nAnswer:", ("x", "y"), 1),
                                     MultipleChoiceExample("Question: B?\nAnswer:", ("z", "w"), 0))})
    ex = MultipleChoiceExample("Question: C?\nAnswer:", ("p", "q"), 0)
    assert fewshot_prompt(task, ex, k=2) == (
        "Science:\nQuestion: A?\nAnswer: y\n\nQuestion: B?\nAnswer: z\n\nQuestion: C?\nAnswer:")
    # The example itself is never its own shot; the next pool example takes its place.
    assert fewshot_prompt(task, task.fewshot[0], k=1) == (
        "Science:\nQuestion: B?\nAnswer: z\n\nQuestion: A?\nAnswer:")
    with pytest.raises(ValueError, match="k=2 .* pool has 1"):
        fewshot_prompt(task, task.fewshot[0], k=2)


def test_hellaswag_is_preprocessed_as_the_harness_does():
    """lm_eval/tasks/hellaswag/utils.py: activity_label + ": " + ctx_a + " " +
    ctx_b.capitalize(), then preprocess (no "[title]" / brackets / double spaces)."""
    task = load_task(os.path.join(FIXTURES, "hellaswag.jsonl"))
    assert task.examples[0].context == "Roof shingle removal: A man is sitting on a roof. He"
    for ex in task.examples:
        for text in (ex.context, *ex.choices):
            assert "[" not in text and "  " not in text and text == text.strip()


def test_chinese_round_trips_byte_for_byte(tmp_path):
    poem = {"context": "《静夜思》\n作者：李白\n床前明月光，\n", "label": 0,
            "choices": ["疑是地上霜。", "低头思故乡。", "举头望明月。", "𠀀𪚥。"]}
    path = _write(tmp_path, [{**MC_HEADER, "task": "诗", "target_delimiter": ""}, poem])
    task = load_task(path)
    ex = task.examples[0]
    assert task.name == "诗"
    assert ex.context.encode() == poem["context"].encode()
    assert [c.encode() for c in ex.choices] == [c.encode() for c in poem["choices"]]
    committed = os.path.join(FIXTURES, "poem_next_line_zh.jsonl")
    with open(committed, "rb") as f:
        lines = f.read().split(b"\n")
    assert lines[-1] == b""  # the final newline
    for raw, ex in zip(lines[1:-1], load_task(committed).examples, strict=True):
        assert json.dumps({"context": ex.context, "choices": list(ex.choices),
                           "label": ex.label}, ensure_ascii=False).encode() == raw


def test_generation_task(tmp_path):
    path = _write(tmp_path, [{"task": "g", "type": "generation", "num_fewshot": 1,
                              "fewshot": [{"context": "Q: 1+1=", "answer": "2", "stop": []}]},
                             GEN])
    task = load_task(path)
    assert task.examples == (GenerationExample("Q: 2+2=", "4", ("\n",)),)
    assert fewshot_prompt(task, task.examples[0]) == "Q: 1+1= 2\n\nQ: 2+2="


# --- every error names the file, the line and the key ----------------------------------

@pytest.mark.parametrize("lines, line, key, what", [
    ([MC_HEADER, "{not json"], 2, None, "not valid JSON"),
    ([MC_HEADER, '{"context": "a", "context": "b"}'], 2, None, "duplicate key 'context'"),
    ([MC_HEADER, "[1, 2]"], 2, None, "expected a JSON object, got a list"),
    ([MC_HEADER, MC, ""], 3, None, "blank line"),
    ([MC_HEADER, {**MC, "answer": "2"}], 2, "answer", "unknown key"),
    ([MC_HEADER, {"context": "c", "choices": ["a", "b"]}], 2, "label", "missing"),
    ([MC_HEADER, MC, {**MC, "label": 2}], 3, "label", "2 is out of range for 2 choices"),
    ([MC_HEADER, {**MC, "label": -1}], 2, "label", "out of range"),
    ([MC_HEADER, {**MC, "label": True}], 2, "label", "expected an integer, got a boolean"),
    ([MC_HEADER, {**MC, "label": "0"}], 2, "label", "expected an integer, got a string"),
    ([MC_HEADER, {**MC, "choices": ["only"]}], 2, "choices", "at least 2 choices, got 1"),
    ([MC_HEADER, {**MC, "choices": "ab"}], 2, "choices", "expected a list of strings"),
    ([MC_HEADER, {**MC, "choices": ["a", 3]}], 2, "choices[1]", "expected a string, got an integer"),
    ([MC_HEADER, {**MC, "choices": ["a", ""]}], 2, "choices[1]", "is empty"),
    ([MC_HEADER, {**MC, "context": ""}], 2, "context", "is empty"),
    ([MC_HEADER, {**MC, "context": None}], 2, "context", "expected a string, got null"),
    ([MC_HEADER, b'{"context": "\xff", "choices": ["a", "b"], "label": 0}'], 2, None,
     "not UTF-8: byte 0xff"),
    ([{"type": "multiple_choice"}, MC], 1, "task", "missing"),
    ([{**MC_HEADER, "type": "mc"}, MC], 1, "type", "'mc' is not one of"),
    ([{**MC_HEADER, "shots": 3}, MC], 1, "shots", "unknown key"),
    ([{**MC_HEADER, "num_fewshot": -1}, MC], 1, "num_fewshot", "expected an integer >= 0"),
    ([{**MC_HEADER, "num_fewshot": 1}, MC], 1, "num_fewshot", "1 is more than the 0 examples"),
    ([{**MC_HEADER, "target_delimiter": 1}, MC], 1, "target_delimiter", "expected a string"),
    ([{**MC_HEADER, "fewshot": [{**MC, "label": 9}]}, MC], 1, "fewshot[0].label", "out of range"),
    ([{**MC_HEADER, "fewshot": {}}, MC], 1, "fewshot", "expected a list of examples"),
    ([MC_HEADER], 1, None, "no examples after the header"),
    ([MC, MC], 1, "task", "missing: line 1 is the task header"),
    ([{"task": "g", "type": "generation"}, {**GEN, "stop": "\n"}], 2, "stop", "expected a list"),
    ([{"task": "g", "type": "generation"}, MC], 2, "choices", "unknown key"),
    ([{"task": "g", "type": "generation"}, {**GEN, "answer": ""}], 2, "answer", "is empty"),
])
def test_errors_name_file_line_and_key(tmp_path, lines, line, key, what):
    path = _write(tmp_path, lines, name="坏.jsonl")
    with pytest.raises(TaskFileError) as info:
        load_task(path)
    message = str(info.value)
    assert "\n" not in message
    prefix = f"{path}:{line}: " + (f"key {key!r}: " if key else "")
    assert message.startswith(prefix), message
    assert what in message, message


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(TaskFileError, match=r"empty\.jsonl:1: empty file"):
        load_task(tmp_path / "empty.jsonl")
    with pytest.raises(TaskFileError, match=r"nope\.jsonl: cannot read: No such file"):
        load_task(tmp_path / "nope.jsonl")
    with pytest.raises(TaskFileError, match="is a directory, not a regular file"):
        load_task(tmp_path)


def test_fifo_is_refused_without_opening(tmp_path):
    """Opening a FIFO for reading blocks until a writer comes; the loader must not open it.
    It runs in a thread so that a regression fails the test instead of hanging it."""
    fifo = tmp_path / "task.jsonl"
    os.mkfifo(fifo)
    outcome = []
    worker = threading.Thread(target=lambda: outcome.append(_error(fifo)), daemon=True)
    worker.start()
    worker.join(timeout=10)  # generous: the refusal is one stat() call
    if worker.is_alive():  # unblock the stuck open() so the thread ends
        with open(fifo, "wb"):
            pass
        pytest.fail("load_task opened the FIFO and blocked")
    assert outcome == [f"{fifo}: is a FIFO (named pipe), not a regular file; refusing to open it"]


def _error(path) -> str:
    try:
        load_task(path)
    except TaskFileError as e:
        return str(e)
    return "no error"


# --- the Chinese poem task -------------------------------------------------------------

SMALL_CORPUS = "\n%\n".join(
    f"\x1b[32m《题{i}》\x1b[m\n\x1b[33m作者：人{i}\x1b[m\n" + "\n".join(lines)
    for i, lines in enumerate([["一二三四五。", "六七八九十。", "甲乙丙丁戊。"],
                               ["春夏秋冬雪。", "东南西北风。"],
                               ["山水花鸟虫。", "日月星辰云。"],
                               ["金木水火土。", "天地人和美。"]]))


def test_parse_poems_strips_colour_escapes():
    poems = parse_poems(SMALL_CORPUS)
    assert poems[0] == ("《题0》", "人0", ["一二三四五。", "六七八九十。", "甲乙丙丁戊。"])
    assert len(poems) == 4


def test_poem_next_line_task_is_deterministic_and_correct():
    a = poem_next_line_task(SMALL_CORPUS, 3, seed=1)
    assert a == poem_next_line_task(SMALL_CORPUS, 3, seed=1)
    poems = {title: lines for title, _, lines in parse_poems(SMALL_CORPUS)}
    for ex in a:
        title, author, *before = ex["context"].rstrip("\n").split("\n")
        lines = poems[title]
        answer = ex["choices"][ex["label"]]
        assert author.startswith("作者：") and lines[len(before)] == answer
        assert len(ex["choices"]) == len(set(ex["choices"])) == 4
        for c in ex["choices"]:  # distractors: same length, from other poems
            assert len(c) == len(answer) and (c == answer or c not in lines)
    with pytest.raises(ValueError, match="only 5 usable poem lines, 6 asked for"):
        poem_next_line_task(SMALL_CORPUS, 6, seed=1)


@pytest.mark.skipif(not os.path.exists(POEMS), reason="the shared corpus is not here")
def test_committed_poem_task_is_what_the_builder_makes():
    with open(POEMS, encoding="utf-8") as f:
        made = poem_next_line_task(f.read(), 105, seed=25)
    task = load_task(os.path.join(FIXTURES, "poem_next_line_zh.jsonl"))
    as_dicts = [{"context": e.context, "choices": list(e.choices), "label": e.label}
                for e in task.examples + task.fewshot]
    assert as_dicts == made
