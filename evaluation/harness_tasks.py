"""Our task files as lm-evaluation-harness tasks: `write_harness_task(task, out_dir)`.

The harness (its own environment, `harness/`) defines a task as a YAML config over a
dataset; it cannot read our task files (`evaluation/tasks.py`). For each task this writes

  <out_dir>/<name>.jsonl   one row per example, UTF-8 (Chinese as is, not \\u-escaped):
                           multiple_choice  {"query", "choices", "label"}
                           generation       {"query", "answer"} (answer stripped)
                           `query` is our `fewshot_prompt(task, example)`: the description,
                           the task's k few-shot examples and the context, rendered here.
  <out_dir>/<name>.yaml    `task: <name>`, `dataset_path: json`,
                           `dataset_kwargs: {data_files: {test: <abs path of the .jsonl>}}`,
                           `test_split: test`, `num_fewshot: 0`, `doc_to_text: query` (a
                           column name, so no Jinja rendering touches the text), and
                           multiple_choice: `doc_to_choice: choices`, `doc_to_target: label`,
                             the task's `target_delimiter`, metrics acc, acc_norm, acc_bytes;
                           generation: `output_type: generate_until`, `doc_to_target:
                             answer`, `generation_kwargs: {until: <stop strings>,
                             do_sample: false, temperature: 0, max_gen_toks}`, the filter
                             `strip` (remove_whitespace, take_first) and exact_match: the
                             stripped output equals the stripped answer, as ours
                             (results key `exact_match,strip`).

With `num_fewshot 0` (the YAML's, so leave `--num_fewshot` unset) the harness's prompt
for an example is `query` byte for byte, and a choice is scored as `target_delimiter +
choice` after it, exactly as `evaluation/task_scoring.py` scores it; `--num_fewshot N` would
add N shots of the harness's own choosing on top. The harness's `acc_norm` divides by the
choice's characters (the delimiter excluded), as ours. Scores agree on every example when
the harness runs with `max_length = max_position_embeddings` (`cli/harness.py`,
harness/README.md): both then read [EOS] + the last C - 1 tokens.

Names: `deepseek_tfx_<task name>` (so `arc_easy` never shadows the harness's own), with
characters other than ASCII letters, digits and `_` replaced by `_` and, when any was, 8
hex digits of the name's SHA-1 appended (so `诗` and `词` stay apart). The `.jsonl` path in
the YAML is absolute: move the directory and write it again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import yaml

from evaluation.tasks import GENERATION, MULTIPLE_CHOICE, Task, fewshot_prompt

NAME_PREFIX = "deepseek_tfx_"
_PLAIN = re.compile(r"[A-Za-z0-9_]+")


def harness_task_name(task_name: str) -> str:
    """The name the harness knows a task by: `deepseek_tfx_` + the name, made of ASCII
    letters, digits and `_` (see the module docstring).

    Raises:
      ValueError: an empty name.
    """
    if not task_name:
        raise ValueError("task name is empty")
    if _PLAIN.fullmatch(task_name):
        return NAME_PREFIX + task_name
    digest = hashlib.sha1(task_name.encode("utf-8")).hexdigest()[:8]
    return f"{NAME_PREFIX}{re.sub(r'[^A-Za-z0-9_]', '_', task_name)}_{digest}"


def _generation_stops(task: Task) -> list[str]:
    stops = {ex.stop for ex in task.examples}
    if len(stops) > 1:
        shown = ", ".join(repr(list(s)) for s in sorted(stops)[:3])
        raise ValueError(f"task {task.name!r} ({task.path}): the harness takes one list of stop "
                         f"strings per task (generation_kwargs.until), the examples have "
                         f"{len(stops)} different ones: {shown}")
    return list(stops.pop()) if stops else []


def harness_task_config(task: Task, data_path: str) -> dict:
    """The harness's YAML config of `task` (a dict, see the module docstring) reading its
    rows from `data_path` (made absolute).

    Raises:
      ValueError: a task type other than multiple_choice/generation, or a generation task
        whose examples have different stop strings (the harness has one `until` per task).
    """
    config = {
        "task": harness_task_name(task.name),
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": os.path.abspath(data_path)}},
        "test_split": "test",
        "num_fewshot": 0,
        "doc_to_text": "query",
        "description": "",
        "target_delimiter": task.target_delimiter,
        "fewshot_delimiter": task.fewshot_delimiter,
    }
    if task.type == MULTIPLE_CHOICE:
        config.update({
            "output_type": "multiple_choice",
            "doc_to_choice": "choices",
            "doc_to_target": "label",
            "metric_list": [{"metric": m, "aggregation": "mean", "higher_is_better": True}
                            for m in ("acc", "acc_norm", "acc_bytes")],
        })
    elif task.type == GENERATION:
        config.update({
            "output_type": "generate_until",
            "doc_to_target": "answer",
            "generation_kwargs": {"until": _generation_stops(task), "do_sample": False,
                                  "temperature": 0.0, "max_gen_toks": task.max_gen_toks},
            "filter_list": [{"name": "strip", "filter": [{"function": "remove_whitespace"},
                                                         {"function": "take_first"}]}],
            "metric_list": [{"metric": "exact_match", "aggregation": "mean",
                             "higher_is_better": True}],
        })
    else:
        raise ValueError(f"task {task.name!r} ({task.path}): type {task.type!r} is neither "
                         f"{MULTIPLE_CHOICE!r} nor {GENERATION!r}")
    config["metadata"] = {"version": 1.0, "source": task.source,
                          "converted_from": os.path.abspath(task.path) if task.path else ""}
    return config


def harness_rows(task: Task) -> list[dict]:
    """One harness dataset row per example of `task` (see the module docstring).

    Raises:
      ValueError: the task's few-shot pool is too small for an example (`fewshot_prompt`).
    """
    if task.type == MULTIPLE_CHOICE:
        return [{"query": fewshot_prompt(task, ex), "choices": list(ex.choices),
                 "label": ex.label} for ex in task.examples]
    return [{"query": fewshot_prompt(task, ex), "answer": ex.answer.strip()}
            for ex in task.examples]


def write_harness_task(task: Task, out_dir: str) -> str:
    """Writes `<out_dir>/<name>.yaml` and `<out_dir>/<name>.jsonl` (UTF-8) for `task` and
    returns `<name>`, the task name to pass to `lm_eval --include_path out_dir --tasks`.
    `out_dir` is created if absent; files of the same name are replaced.

    Raises:
      TypeError: `task` is not a `evaluation.tasks.Task`.
      ValueError: as `harness_task_config` and `harness_rows`; a task with no examples.
      OSError: `out_dir` cannot be created or written (e.g. it is a file).
    """
    if not isinstance(task, Task):
        raise TypeError(f"expected a evaluation.tasks.Task (load_task(path)), got "
                        f"{type(task).__name__}")
    if not task.examples:
        raise ValueError(f"task {task.name!r} ({task.path}): no examples")
    name = harness_task_name(task.name)
    data_path = os.path.join(out_dir, name + ".jsonl")
    config = harness_task_config(task, data_path)
    rows = harness_rows(task)
    os.makedirs(out_dir, exist_ok=True)
    with open(data_path, "w", encoding="utf-8", newline="\n") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(os.path.join(out_dir, name + ".yaml"), "w", encoding="utf-8") as f:
        f.write(f"# lm-evaluation-harness task written by deepseek-tfx from {task.path}\n"
                "# (evaluation/harness_tasks.py); prompts are rendered: run with num_fewshot 0.\n")
        yaml.safe_dump(config, f, allow_unicode=True, sort_keys=False, width=100)
    return name
