"""`deepseek-tfx`: the command line. It parses arguments and calls the pipeline;
the logic lives in the modules it calls.

  deepseek-tfx run       [--data PATH | --data NAME=PATH ... [--weight NAME=W ...]
                         [--source-set NAME.FIELD=VALUE ...]]
                         [--preset NAME] [--output DIR] [--train-steps N]
                         [--set SECTION.FIELD=VALUE ...] [--no-cache] [--num-workers N]
                         [--runner local|beam] [--beam-arg=ARG ...] [--until COMPONENT]
                         [--accept-drift] [--base-model latest|PATH] [--teacher PATH]
  deepseek-tfx validate  --data PATH [--preset NAME] [--output DIR] [--set ...]
  deepseek-tfx compile-kfp --output FILE.yaml --pipeline-root URI [--image IMAGE]
                         [--data PATH] [--preset NAME] [--set ...] [--beam-arg=ARG ...]
  deepseek-tfx generate  --model DIR (--prompt TEXT | --prompt-file PATH) [--max-new-tokens N]
                         [--temperature T] [--top-k K] [--top-p P] [--seed S] [--raw]
  deepseek-tfx chat      --model DIR [--max-new-tokens N] [--temperature T] [--top-k K]
                         [--top-p P] [--seed S]
  deepseek-tfx evaluate  --model DIR [--data PATH] [--tasks FILE ...] [--seq-len N]
  deepseek-tfx compare   DIR_A DIR_B [--data PATH] [--tasks FILE ...] [--json OUT]
                         [--requests N] [--concurrency N] [--max-tokens N] [--label-a A]
                         [--label-b B]  (cli/compare.py)
  deepseek-tfx serve     --model SERVING_DIR [--port P] [--host H] [--model-name NAME]
                         [--max-batch-size ROWS] [--batch-timeout-micros US]
                         [--max-enqueued-batches N] [--num-batch-threads N]
  deepseek-tfx mlmd      --output DIR {runs|artifacts|lineage MODEL_DIR} [--json]
  deepseek-tfx hf-import CHECKPOINT_DIR OUT_DIR [--no-tokenizer] [--dtype auto|bfloat16|float32|int8]
  deepseek-tfx hf-export MODEL_DIR OUT_DIR [--max-shard-size BYTES] [--config-form 4.x|5.x]
                         [--dtype auto|bfloat16|float32]
  deepseek-tfx prune     --model DIR --keep-experts N --data PATH --output DIR
                         [--seq-len N] [--max-tokens N]  (cli/prune.py)
  deepseek-tfx harness-task TASK.jsonl ... --output DIR [--tokenizer HF_EXPORT_DIR]
                         (lm-evaluation-harness tasks and the lm_eval command, cli/harness.py)
  deepseek-tfx harness-task TASK.jsonl... --output DIR [--tokenizer HF_EXPORT_DIR] (cli/harness.py)
  deepseek-tfx plan      [--tables] | --preset NAME | --config CONFIG_JSON [--mode ...] (cli/plan.py)

run, validate, generate, evaluate, compare, serve, hf-import and hf-export show the
project's own lines only; the libraries' logs and warnings go to a log file (`cli/console.py`):
  [-v|--verbose]  show them on the console too     [--log-dir DIR]  where the log goes

One module per group of commands, each with its handlers and `add_parsers(sub)`:
  run.py (run, validate)   kubeflow.py (compile-kfp)   text.py (generate, chat, evaluate)
  serve.py (serve)   compare.py (compare)   metadata.py (mlmd, report)
  hf.py (hf-import, hf-export)   prune.py (prune)   harness.py (harness-task)   plan.py (plan)
and what they share: data.py (default corpus, --data), settings.py (config, warm start,
teacher, output directory, --until choices), progress.py (component progress lines),
model_dir.py (--model: a SavedModel or a serving dir's newest version), console.py (the
quiet session), quiet_commands.py (which commands are quiet, their --verbose, --log-dir and
log files).
"""


from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from typing import NoReturn

from cli import (
    compare,
    console,
    harness,
    hf,
    kubeflow,
    library_logs,
    metadata,
    plan,
    prune,
    quiet_commands,
    run,
    serve,
    text,
)
from cli.console import failure_message
from cli.data import DEFAULT_CORPUS_NAME, DEFAULT_CORPUS_URL, default_corpus, split_data_path
from cli.model_dir import resolve_model_dir
from cli.progress import ComponentProgress, show_progress
from cli.settings import (
    component_order,
    config_from_args,
    default_output,
    parse_overrides,
    warm_start,
)
from common.process_exit import exit_frozen

__all__ = [
    "DEFAULT_CORPUS_NAME", "DEFAULT_CORPUS_URL", "ComponentProgress", "build_parser",
    "component_order", "config_from_args", "default_corpus", "default_output", "entry",
    "failure_message", "log_dir", "main", "parse_overrides", "resolve_model_dir",
    "show_progress", "split_data_path", "warm_start",
]


def build_parser() -> argparse.ArgumentParser:
    """The `deepseek-tfx` parser; each subcommand's `fn` is its handler (args -> exit code)."""
    parser = argparse.ArgumentParser(prog="deepseek-tfx", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (run, kubeflow, text, serve, compare, metadata, hf, prune, harness, plan):  # `--help` order
        group.add_parsers(sub)
    return parser


def log_dir(args: argparse.Namespace) -> str:
    """--log-dir; else <output>/logs for commands with --output (`default_output` when not
    given), else the per-user `quiet_commands.default_log_dir()`."""
    if args.log_dir:
        return args.log_dir
    if quiet_commands.QUIET_COMMANDS[args.command].logs_under_output:
        args.output = args.output or default_output(args)
        return os.path.join(args.output, "logs")
    return quiet_commands.default_log_dir()


# Arguments that name files (the rest is text): their refusal says how to get around it.
_PATH_ARGUMENTS = frozenset({"data", "model", "output", "log_dir", "teacher", "base_model",
                             "config", "checkpoint_dir", "out_dir", "model_dir", "dir_a",
                             "dir_b", "tasks", "json", "prompt_file"})
_POSITIONAL_ARGUMENTS = frozenset({"checkpoint_dir", "out_dir", "model_dir", "what", "dir_a",
                                   "dir_b"})


def check_argument_bytes(args: argparse.Namespace) -> None:
    """Refuses, in one line, an argument whose bytes are not UTF-8 (Python gives them as
    lone surrogates): TensorFlow, TFX's ML Metadata and the tokenizer take paths and text
    as UTF-8. The line shows the bytes as `\\xNN` and names the argument.

    Raises:
      SystemExit: such an argument (`--prompt`, `--data`, ...).
    """
    for dest, value in vars(args).items():
        for item in value if isinstance(value, list) else [value]:
            if not isinstance(item, str):
                continue
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as e:
                name = dest.upper() if dest in _POSITIONAL_ARGUMENTS else \
                    "--" + dest.replace("_", "-")
                what = (f"byte 0x{ord(item[e.start]) - 0xDC00:02x} at offset {e.start}"
                        if 0xDC80 <= ord(item[e.start]) <= 0xDCFF else
                        f"character U+{ord(item[e.start]):04X} at offset {e.start}")
                fix = ("rename the file, or reach it through a link with a UTF-8 name"
                       if dest in _PATH_ARGUMENTS else "give the text in UTF-8")
                raise SystemExit(f"error: {name} '{console.shown(item)}': not UTF-8 ({what}); "
                                 f"{fix}") from None


def main(argv: list[str] | None = None) -> int:
    """Parses `argv` (default: sys.argv[1:]) and runs the command; returns its exit code.
    A quiet command (`quiet_commands.QUIET_COMMANDS`) runs inside `console.session`.
    An argument that is not UTF-8 is refused in one line (`check_argument_bytes`), and
    stdout and stderr write any undecodable byte as `\\xNN`."""
    console.escape_undecodable(sys.stdout, sys.stderr)
    args = build_parser().parse_args(argv)
    check_argument_bytes(args)
    quiet = quiet_commands.QUIET_COMMANDS.get(args.command)
    if quiet is None:  # libraries log on the console, TensorFlow's C++ INFO and WARNING muted
        logging.basicConfig(level=logging.INFO, format=console.LOG_FORMAT)
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        with library_logs.library_loggers_at(logging.WARNING):
            return args.fn(args)
    if hasattr(args, "preset") and hasattr(args, "set"):
        config_from_args(args, check_tokenizer=False)  # a bad value: one line, no log opened
    command_line = shlex.join(["deepseek-tfx"] + list(sys.argv[1:] if argv is None else argv))
    with console.session(quiet_commands.log_path(args.command, log_dir(args)), verbose=args.verbose,
                         announce=quiet.announce, header=command_line):
        return args.fn(args)


def entry() -> int:
    """The `deepseek-tfx` command: `main`, with an error already shown on the console (its
    messages and the log's path; the traceback is in the log) ending in exit code 1,
    Ctrl-C (KeyboardInterrupt) in exit code 130 with one line, and a preempted Trainer
    (SIGTERM; its checkpoint saved) in exit code 143 ("preempted, resumable")."""
    try:
        return main()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        return 130
    except Exception as e:
        preempted = _preempted(e)
        if preempted is not None:
            print(f"{preempted}; re-run the same command to resume from that step",
                  file=sys.stderr, flush=True)
            return preempted.EXIT_CODE
        if console.reported(e):
            return 1
        raise


def command() -> NoReturn:
    """The `deepseek-tfx` script and `python -m cli`: `entry`, then the process ends with its
    exit code without collecting the TensorFlow graphs it traced (`process_exit.exit_frozen`:
    seconds sooner after a run). An exception `entry` lets through ends it the usual way."""
    exit_frozen(entry())


def _preempted(error: BaseException):
    """The `Preempted` (SIGTERM to the Trainer, checkpoint saved) in `error`'s chain, or None."""
    from components.trainer.preemption import Preempted

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Preempted):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None

