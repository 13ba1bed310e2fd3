"""Benchmark task files: a small JSONL format of our own, its strict loader, and few-shot
prompts rendered as lm-evaluation-harness renders them.

The harness defines tasks in YAML over Hugging Face datasets (it needs `datasets`, which
this environment cannot install; see issue 25). A task file here holds the rendered text
instead, so scoring needs nothing but this module and a model.

File format (UTF-8, JSON Lines: one JSON object per line, no blank lines)
-------------------------------------------------------------------------
Line 1, the header:

    {"task": "arc_easy", "type": "multiple_choice", "num_fewshot": 0,
     "target_delimiter": " ", "fewshot_delimiter": "\\n\\n", "description": "",
     "fewshot": [<example>, ...], "source": "..."}

  task               str, required: the task's name (metrics are reported under it).
  type               "multiple_choice" | "generation", required.
  num_fewshot        int >= 0, default 0: k, the few-shot examples put before each context;
                     at most len(fewshot).
  target_delimiter   str, default " ": between a context and its target (harness name).
  fewshot_delimiter  str, default "\\n\\n": between rendered few-shot examples (harness name).
  description        str, default "": text put before the few-shot examples (harness name).
  fewshot            list of examples of the task's type, default []: the few-shot pool.
  source             str, default "": where the data came from (free text).
  max_gen_toks       int >= 1, default 256 (the harness's default): generation tasks only,
                     the most tokens generated per example.

Lines 2..N, one example each, of the header's type:

  multiple_choice    {"context": str, "choices": [str, ...], "label": int}
                     context non-empty; >= 2 choices, each non-empty; 0 <= label < len(choices).
                     A choice is scored as the continuation target_delimiter + choice.
  generation         {"context": str, "answer": str, "stop": [str, ...]}
                     context and answer non-empty; stop: strings that end a generation
                     (each non-empty; may be []).

Unknown keys, missing keys, wrong types (a JSON `true` is not an int), duplicate keys,
bad JSON, bytes that are not UTF-8 and blank lines are errors: `load_task` raises
`TaskFileError` with one line `PATH:LINE: key 'KEY': what is wrong`. A path that is not a
regular file (a FIFO, a device, a directory) is refused before it is opened.

Prompts (harness semantics, lm_eval/api/samplers.py ContextSampler and
lm_eval/tasks/arc/arc_easy.yaml): each few-shot example is rendered as
`context + target_delimiter + target` (target: the correct choice, or the answer), the
shots are joined with fewshot_delimiter, and the prompt is

    description + shot_1 + fd + ... + shot_k + fd + context          (k > 0)
    description + context                                            (k = 0)

A multiple-choice example is scored as one continuation per choice,
`target_delimiter + choice` after the prompt (`continuations`).

The harness samples the k shots at random (seed 1234) from its few-shot split; here they
are the first k of the pool (skipping one equal to the example itself), so prompts are
deterministic and match the harness exactly for k = 0.
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass

from common.files import shown, special_file_kind

MULTIPLE_CHOICE = "multiple_choice"
GENERATION = "generation"
TASK_TYPES = (MULTIPLE_CHOICE, GENERATION)

_HEADER_DEFAULTS = {"num_fewshot": 0, "target_delimiter": " ", "fewshot_delimiter": "\n\n",
                    "description": "", "fewshot": [], "source": "", "max_gen_toks": 256}
_HEADER_KEYS = ("task", "type", *_HEADER_DEFAULTS)
_EXAMPLE_KEYS = {MULTIPLE_CHOICE: ("context", "choices", "label"),
                 GENERATION: ("context", "answer", "stop")}


class TaskFileError(ValueError):
    """A task file that cannot be loaded; the message is one line naming file, line and key."""


@dataclass(frozen=True)
class MultipleChoiceExample:
    """One multiple-choice question: `choices[label]` is the correct continuation."""
    context: str
    choices: tuple[str, ...]
    label: int

    @property
    def target(self) -> str:
        return self.choices[self.label]


@dataclass(frozen=True)
class GenerationExample:
    """One generation question: the output, cut at the first of `stop`, must equal `answer`."""
    context: str
    answer: str
    stop: tuple[str, ...]

    @property
    def target(self) -> str:
        return self.answer


Example = MultipleChoiceExample | GenerationExample


@dataclass(frozen=True)
class Task:
    """A loaded task file (see the module docstring for the meaning of each field)."""
    name: str
    type: str
    num_fewshot: int
    target_delimiter: str
    fewshot_delimiter: str
    description: str
    examples: tuple[Example, ...]
    fewshot: tuple[Example, ...]
    source: str
    path: str
    max_gen_toks: int = 256


def _fail(path: str, line: int, key: str | None, what: str) -> TaskFileError:
    where = f"{shown(path)}:{line}: " + (f"key {key!r}: " if key else "")
    return TaskFileError(where + what)


def _no_duplicates(pairs):
    seen = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"duplicate key {key!r}")
        seen[key] = value
    return seen


def _type_name(value) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def _check_keys(obj: dict, allowed, required, path: str, line: int, prefix: str = "") -> None:
    for key in obj:
        if key not in allowed:
            raise _fail(path, line, prefix + key, f"unknown key (allowed: {', '.join(allowed)})")
    for key in required:
        if key not in obj:
            raise _fail(path, line, prefix + key, "missing")


def _string(value, key: str, path: str, line: int, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise _fail(path, line, key, f"expected a string, got {_type_name(value)}")
    if not empty_ok and not value:
        raise _fail(path, line, key, "is empty")
    return value


def _strings(value, key: str, path: str, line: int) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise _fail(path, line, key, f"expected a list of strings, got {_type_name(value)}")
    return tuple(_string(v, f"{key}[{i}]", path, line) for i, v in enumerate(value))


def _example(obj, task_type: str, path: str, line: int, prefix: str = "") -> Example:
    if not isinstance(obj, dict):
        raise _fail(path, line, prefix.rstrip(".") or None,
                    f"expected an example object, got {_type_name(obj)}")
    keys = _EXAMPLE_KEYS[task_type]
    _check_keys(obj, keys, keys, path, line, prefix)
    context = _string(obj["context"], prefix + "context", path, line)
    if task_type == GENERATION:
        return GenerationExample(context, _string(obj["answer"], prefix + "answer", path, line),
                                 _strings(obj["stop"], prefix + "stop", path, line))
    choices = _strings(obj["choices"], prefix + "choices", path, line)
    if len(choices) < 2:
        raise _fail(path, line, prefix + "choices", f"needs at least 2 choices, got {len(choices)}")
    label = obj["label"]
    if type(label) is not int:
        raise _fail(path, line, prefix + "label", f"expected an integer, got {_type_name(label)}")
    if not 0 <= label < len(choices):
        raise _fail(path, line, prefix + "label",
                    f"{label} is out of range for {len(choices)} choices (0..{len(choices) - 1})")
    return MultipleChoiceExample(context, choices, label)


def _parse_line(raw: bytes, path: str, line: int):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(path, line, None, f"not UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}") from None
    if not text.strip():
        raise _fail(path, line, None, "blank line (one JSON object per line)")
    try:
        obj = json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as e:  # json.JSONDecodeError and duplicate keys
        raise _fail(path, line, None, f"not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise _fail(path, line, None, f"expected a JSON object, got {_type_name(obj)}")
    return obj


def load_task(path: str | os.PathLike) -> Task:
    """The task in the JSONL file `path` (format: module docstring), validated in full.

    Raises:
      TaskFileError: one line `PATH:LINE: key 'KEY': what is wrong` for a path that is not a
        regular file (refused without opening it), a file that cannot be read, bytes that are
        not UTF-8, bad JSON, a blank line, an unknown or missing key, a wrong type, an empty
        string, fewer than 2 choices, a label out of range, num_fewshot larger than the pool,
        or a file without examples.
    """
    path = os.fspath(path)
    kind = special_file_kind(path)
    if kind:
        raise TaskFileError(f"{shown(path)}: is {kind}, not a regular file; refusing to open it")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise TaskFileError(f"{shown(path)}: cannot read: {e.strerror or e}") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline
    if not lines:
        raise _fail(path, 1, None, "empty file (expected a header line, then examples)")

    header = _parse_line(lines[0], path, 1)
    if "task" not in header and "context" in header:
        raise _fail(path, 1, "task", 'missing: line 1 is the task header ({"task": ..., '
                    '"type": ...}), not an example')
    _check_keys(header, _HEADER_KEYS, ("task", "type"), path, 1)
    raw_header = header
    header = {**_HEADER_DEFAULTS, **header}
    name = _string(header["task"], "task", path, 1)
    task_type = header["type"]
    if task_type not in TASK_TYPES:
        raise _fail(path, 1, "type", f"{task_type!r} is not one of {', '.join(TASK_TYPES)}")
    k = header["num_fewshot"]
    if type(k) is not int or k < 0:
        raise _fail(path, 1, "num_fewshot", f"expected an integer >= 0, got {k!r}")
    delimiters = [_string(header[key], key, path, 1, empty_ok=True)
                  for key in ("target_delimiter", "fewshot_delimiter", "description", "source")]
    pool = header["fewshot"]
    if not isinstance(pool, list):
        raise _fail(path, 1, "fewshot", f"expected a list of examples, got {_type_name(pool)}")
    fewshot = tuple(_example(obj, task_type, path, 1, f"fewshot[{i}].") for i, obj in enumerate(pool))
    if k > len(fewshot):
        raise _fail(path, 1, "num_fewshot", f"{k} is more than the {len(fewshot)} examples in 'fewshot'")

    max_gen_toks = header["max_gen_toks"]
    if type(max_gen_toks) is not int or max_gen_toks < 1:
        raise _fail(path, 1, "max_gen_toks", f"expected an integer >= 1, got {max_gen_toks!r}")
    if task_type != GENERATION and "max_gen_toks" in raw_header:
        raise _fail(path, 1, "max_gen_toks", f"applies to {GENERATION} tasks only")

    examples = tuple(_example(_parse_line(raw, path, i), task_type, path, i)
                     for i, raw in enumerate(lines[1:], start=2))
    if not examples:
        raise _fail(path, 1, None, "no examples after the header")
    target_delimiter, fewshot_delimiter, description, source = delimiters
    return Task(name=name, type=task_type, num_fewshot=k, target_delimiter=target_delimiter,
                fewshot_delimiter=fewshot_delimiter, description=description,
                examples=examples, fewshot=fewshot, source=source, path=path,
                max_gen_toks=max_gen_toks)


METRICS = {MULTIPLE_CHOICE: ("acc", "acc_norm", "acc_bytes"), GENERATION: ("exact_match",)}
PRIMARY_METRIC = {MULTIPLE_CHOICE: "acc", GENERATION: "exact_match"}  # what gates by default


def load_tasks(paths, min_scores: dict[str, float] | None = None) -> list[Task]:
    """The tasks of `paths` (`load_task` each), checked together with `min_scores`
    ({"TASK" or "TASK/METRIC": threshold}, `eval.min_scores`).

    Raises:
      TaskFileError: a file that does not load, two files with one task name, or a
        `min_scores` key naming a task none of the files holds, or a metric the task's
        type does not report.
    """
    tasks = [load_task(p) for p in paths]
    seen: dict[str, str] = {}
    for task in tasks:
        if task.name in seen:
            raise TaskFileError(f"{shown(task.path)}: task {task.name!r} is also the task of "
                                f"{shown(seen[task.name])}; task names must differ")
        seen[task.name] = task.path
    by_name = {t.name: t for t in tasks}
    for key in min_scores or {}:
        name, _, metric = key.partition("/")
        if name not in by_name:
            raise TaskFileError(f"eval.min_scores key {key!r}: no task {name!r} in eval.tasks "
                                f"(tasks: {', '.join(sorted(by_name)) or 'none'})")
        if metric and metric not in METRICS[by_name[name].type]:
            raise TaskFileError(f"eval.min_scores key {key!r}: a {by_name[name].type} task "
                                f"reports {', '.join(METRICS[by_name[name].type])}")
    return tasks


def fewshot_prompt(task: Task, example: Example, k: int | None = None) -> str:
    """The context scored for `example`: `k` (default `task.num_fewshot`) shots from the
    task's pool, each `context + target_delimiter + target`, joined and followed by
    `fewshot_delimiter`, then the example's context; `task.description` first. The shots
    are the first k of the pool, skipping one equal to `example`.

    Raises:
      ValueError: k < 0, or fewer than k pool examples other than `example`.
    """
    k = task.num_fewshot if k is None else k
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    shots = [shot for shot in task.fewshot if shot != example][:k]
    if len(shots) < k:
        raise ValueError(f"task {task.name!r}: k={k} few-shot examples asked for, "
                         f"the pool has {len(shots)} (besides this example)")
    labeled = "".join(s.context + task.target_delimiter + s.target + task.fewshot_delimiter
                      for s in shots)
    return task.description + labeled + example.context


def continuations(task: Task, example: MultipleChoiceExample) -> tuple[str, ...]:
    """The strings scored after the prompt, one per choice: `target_delimiter + choice`
    (the harness's multiple-choice requests `(context, target_delimiter + choice)`)."""
    return tuple(task.target_delimiter + choice for choice in example.choices)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_poems(poems_text: str) -> list[tuple[str, str, list[str]]]:
    """`(title, author, lines)` for each poem in the fortunes-zh format of
    `tang_song_poems.txt`: entries separated by lines `%`; a title line `《...》` and an
    author line `作者：...` wrapped in ANSI colour escapes, then the poem's lines. Colour
    escapes and surrounding whitespace are removed; empty lines are dropped."""
    poems = []
    for entry in re.split(r"^%\s*$", poems_text, flags=re.M):
        rows = [r.strip() for r in _ANSI.sub("", entry).split("\n")]
        rows = [r for r in rows if r]
        if len(rows) < 3 or not rows[1].startswith("作者："):
            continue
        poems.append((rows[0], rows[1][len("作者："):], rows[2:]))
    return poems


def poem_next_line_task(poems_text: str, n: int, seed: int,
                        context_lines: int = 4) -> list[dict]:
    """`n` 4-choice examples "which line comes next in this poem", as task-file dicts
    `{"context", "choices", "label"}` (target_delimiter ""): the context is the title, the
    author and the (at most `context_lines`) lines before the answer, each ending in
    "\\n"; the correct choice is the next line; the 3 distractors are lines of the same
    length (characters) from other poems. Deterministic for a given text and seed
    (`random.Random(seed)`).

    Raises:
      ValueError: n < 1, or fewer than n usable (poem, line) positions in the text.
    """
    if n < 1 or context_lines < 1:
        raise ValueError(f"n and context_lines must be >= 1, got {n} and {context_lines}")
    poems = parse_poems(poems_text)
    by_length: dict[int, list[tuple[int, str]]] = {}
    for p, (_, _, lines) in enumerate(poems):
        for line in lines:
            by_length.setdefault(len(line), []).append((p, line))

    def distractors(p: int, answer: str) -> list[str]:
        return sorted({line for q, line in by_length[len(answer)] if q != p and line != answer})

    positions = [(p, i) for p, (_, _, lines) in enumerate(poems) for i in range(1, len(lines))
                 if len(distractors(p, lines[i])) >= 3]
    if len(positions) < n:
        raise ValueError(f"only {len(positions)} usable poem lines, {n} asked for")
    rng = random.Random(seed)
    examples = []
    for p, i in rng.sample(positions, n):
        title, author, lines = poems[p]
        choices = rng.sample(distractors(p, lines[i]), 3)
        label = rng.randrange(4)
        choices.insert(label, lines[i])
        context = "".join(row + "\n" for row in [title, f"作者：{author}", *lines[max(0, i - context_lines):i]])
        examples.append({"context": context, "choices": choices, "label": label})
    return examples
