"""`deepseek-tfx harness-task TASK.jsonl... --output DIR`: our task files as
lm-evaluation-harness tasks (`evaluation/harness_tasks.py`), and the `lm_eval` command that
runs them against `deepseek-tfx serve` (the harness lives in its own environment,
harness/README.md)."""

from __future__ import annotations

import argparse
import json
import os
import shlex

DEFAULT_BASE_URL = "http://127.0.0.1:8501/v1/completions"
# The harness reads local files only: no Hugging Face Hub look-ups.
HARNESS_ENV = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
HARNESS_PROJECT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "harness")


def max_length_of(hf_dir: str) -> int:
    """The harness's `max_length` for a model: max_position_embeddings from the hf-export
    directory's config.json. The harness sends at most max_length - 1 prompt tokens (it
    keeps one for the token it asks for); serve puts [EOS] before them, which fills the
    context, and takes the one greedy token from the last position's logits. Our scorer's
    rows are [EOS] + the last C - 1 tokens too, so truncated examples agree as well.

    Raises:
      ValueError: no tokenizer.json or config.json in `hf_dir`, or no integer
        max_position_embeddings >= 3 in config.json.
    """
    for name in ("tokenizer.json", "config.json"):
        if not os.path.isfile(os.path.join(hf_dir, name)):
            raise ValueError(f"--tokenizer {hf_dir}: no {name} (give a `deepseek-tfx hf-export` "
                             "directory of a model with a tokenizer)")
    path = os.path.join(hf_dir, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            context = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    if not isinstance(context, int) or isinstance(context, bool) or context < 3:
        raise ValueError(f"{path}: key 'max_position_embeddings': expected an integer >= 3, "
                         f"got {context!r}")
    return context


def lm_eval_command(task_names: list[str], include_path: str, *, tokenizer: str,
                    max_length: int | str, base_url: str = DEFAULT_BASE_URL,
                    model: str = "deepseek", output_path: str | None = None,
                    batch_size: int = 32, harness_project: str = HARNESS_PROJECT,
                    uv: tuple[str, ...] = ("python3", "-m", "uv")) -> list[str]:
    """The argv (to run with `HARNESS_ENV` in the environment) that runs `task_names` with
    the harness's `local-completions` model against `base_url` (log-likelihoods of token-id
    prompts; the hf-export `tokenizer` directory's tokenizer.json), `batch_size` prompts per
    request (at most serve's max_batch_size, default 32), writing results and per-example
    samples under `output_path` when given."""
    model_args = ",".join([
        f"model={model}", f"base_url={base_url}", "tokenizer_backend=huggingface",
        f"tokenizer={os.path.abspath(tokenizer) if os.path.isdir(tokenizer) else tokenizer}",
        f"max_length={max_length}", "num_concurrent=1", "max_retries=3"])
    argv = [*uv, "run", "--project", harness_project, "lm_eval", "run",
            "--model", "local-completions", "--model_args", model_args,
            "--include_path", os.path.abspath(include_path), "--tasks", ",".join(task_names),
            "--batch_size", str(batch_size)]
    if output_path:
        argv += ["--output_path", output_path, "--log_samples"]
    return argv


def cmd_harness_task(args: argparse.Namespace) -> int:
    """Writes the harness tasks; prints each task's name and the `lm_eval` command."""
    from evaluation.harness_tasks import harness_task_name, write_harness_task
    from evaluation.tasks import TaskFileError, load_task

    try:
        tasks = [load_task(path) for path in args.tasks]
        max_length: int | str = (max_length_of(args.tokenizer) if args.tokenizer
                                 else "<max_position_embeddings>")
    except (TaskFileError, ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    seen: dict[str, str] = {}
    for task in tasks:
        name = harness_task_name(task.name)
        if name in seen:
            raise SystemExit(f"error: {task.path} and {seen[name]} both hold task "
                             f"{task.name!r} (harness name {name}): give each task once")
        seen[name] = task.path
    names = []
    for task in tasks:
        try:
            names.append(write_harness_task(task, args.output))
        except (ValueError, OSError) as e:
            raise SystemExit(f"error: {e}") from None
        print(f"{names[-1]}: {len(task.examples)} {task.type} examples from {task.path}")
    argv = lm_eval_command(names, args.output, tokenizer=args.tokenizer or "<HF_EXPORT_DIR>",
                           max_length=max_length, base_url=args.base_url,
                           model=args.model_name, batch_size=args.batch_size,
                           output_path=os.path.join(os.path.abspath(args.output), "results"))
    print(f"harness tasks in {os.path.abspath(args.output)}; with `deepseek-tfx serve` running "
          f"and the harness installed (python3 -m uv sync --project {HARNESS_PROJECT} "
          "--locked), run:")
    print(" ".join(f"{k}={v}" for k, v in HARNESS_ENV.items()), shlex.join(argv))
    return 0


def add_parsers(sub) -> None:
    """Registers `harness-task` on `sub`, the top-level parser's `add_subparsers()`."""
    p = sub.add_parser("harness-task", help="task files -> lm-evaluation-harness tasks, and "
                       "the lm_eval command that runs them against `serve`")
    p.add_argument("tasks", nargs="+", metavar="TASK.jsonl", help="task files "
                   "(evaluation/tasks.py format)")
    p.add_argument("--output", required=True, metavar="DIR",
                   help="where <name>.yaml and <name>.jsonl are written (--include_path)")
    p.add_argument("--tokenizer", metavar="HF_EXPORT_DIR",
                   help="the model's `deepseek-tfx hf-export` directory: the harness loads its "
                   "tokenizer.json, and max_length comes from its config.json")
    p.add_argument("--base-url", default=DEFAULT_BASE_URL,
                   help=f"serve's /v1/completions (default {DEFAULT_BASE_URL})")
    p.add_argument("--model-name", default="deepseek",
                   help="the model name serve answers to (default deepseek, serve's default)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="prompts per request (at most serve's --max-batch-size; default 32)")
    p.set_defaults(fn=cmd_harness_task)
