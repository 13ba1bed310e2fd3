"""`deepseek-tfx compare DIR_A DIR_B`: two models (e.g. two pushed versions) measured in one
run on this machine (`serving/compare.py`), shown side by side (`reporting/comparison.py`)
and written as JSON: `compare_models`' result plus "table" ({"a", "b": the labels,
"rows": each `Row` as a dict})."""

from __future__ import annotations

import argparse
import json
import os
import time

from cli import console, quiet_commands
from cli.data import split_data_path

DEFAULT_REQUESTS = 64
DEFAULT_CONCURRENCY = 8
DEFAULT_MAX_TOKENS = 32
DEFAULT_BATCH_SIZE = 8


def default_labels(dir_a: str, dir_b: str) -> tuple[str, str]:
    """"v<N>" for a numbered version (a serving directory: its newest), else the
    directory's name; "A" and "B" when these are the same or cannot be read."""
    from savedmodel.layout import latest_version

    labels = []
    for model_dir in (dir_a, dir_b):
        try:
            path, _ = latest_version(model_dir)
        except OSError:
            return "A", "B"
        name = os.path.basename(os.path.normpath(path))
        labels.append(f"v{name}" if name.isdigit() else name)
    return (labels[0], labels[1]) if labels[0] != labels[1] else ("A", "B")


def cmd_compare(args: argparse.Namespace) -> int:
    """Measures both models, prints the table, writes the JSON; 0 on success."""
    import dataclasses

    from reporting.comparison import comparison_rows, format_table
    from serving.compare import CompareError, compare_models, json_safe

    labels = default_labels(args.dir_a, args.dir_b)
    labels = (args.label_a or labels[0], args.label_b or labels[1])
    if labels[0] == labels[1]:
        raise SystemExit(f"error: compare: --label-a and --label-b are both {labels[0]!r}: "
                         "labels must differ")
    pattern = os.path.join(*split_data_path(args.data)) if args.data else None
    out = args.json or f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"
    where = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(where) or not os.access(where, os.W_OK):
        raise SystemExit(f"error: compare: --json {out}: {where} is not a writable directory "
                         "(checked before measuring)")
    err = console.stderr()

    def progress(line: str) -> None:
        print(line, file=err, flush=True)

    try:
        result = compare_models({labels[0]: args.dir_a, labels[1]: args.dir_b}, pattern,
                                args.tasks or [], requests=args.requests,
                                concurrency=args.concurrency, max_tokens=args.max_tokens,
                                batch_size=args.batch_size, progress=progress)
    except CompareError as e:
        raise SystemExit(f"error: compare: {e}") from None
    models = result["models"]
    print(f"A = {labels[0]}: {models[labels[0]]['dir']}")
    print(f"B = {labels[1]}: {models[labels[1]]['dir']}")
    m = result["machine"]
    latency = models[labels[0]]["latency"]
    print(f"data: {result['data'] or 'none (built-in prompts)'}; tasks: "
          f"{', '.join(result['tasks']) or 'none'}; load: {latency['requests']} requests to "
          f"/v1/completions, {latency['concurrency']} at a time, greedy, max_tokens "
          f"{latency['max_tokens']}; {m['cpu_count']} CPUs ({m['cpu']}), TensorFlow "
          f"{m['tensorflow']}")
    for label, model in models.items():
        if model["latency"]["errors"]:
            print(f"warning: {label}: {model['latency']['errors']} of "
                  f"{model['latency']['requests']} requests failed (HTTP status counts "
                  f"{model['latency']['status_counts']}; 0 = timeout or no connection): its "
                  "latency figures include them", file=err)
    rows = comparison_rows(models[labels[0]], models[labels[1]])
    print()
    print(format_table(rows, labels))
    # the table too: {"a": label A, "b": label B, "rows": [Row as a dict]}
    result["table"] = json_safe({"a": labels[0], "b": labels[1],
                                 "rows": [dataclasses.asdict(r) for r in rows]})
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2, ensure_ascii=False, allow_nan=False)
        f.write("\n")
    print(f"\njson: {os.path.abspath(out)}")
    return 0


def add_parsers(sub) -> None:
    """Registers `compare` on `sub`, the top-level parser's `add_subparsers()`."""
    cmp = sub.add_parser(
        "compare", help="two models side by side on this machine: bits per byte, task "
        "scores, p50/p99 latency and tokens/s of a load run against the served model")
    cmp.add_argument("dir_a", metavar="DIR_A", help="serving dir (newest version) or SavedModel")
    cmp.add_argument("dir_b", metavar="DIR_B", help="serving dir (newest version) or SavedModel")
    cmp.add_argument("--data", metavar="PATH", help="text/JSONL file, directory or glob: bits per byte and the "
                     "load run's prompts (default: no bits per byte, built-in English and "
                     "Chinese prompts)")
    cmp.add_argument("--tasks", nargs="+", metavar="FILE", help="task files (JSONL, "
                     "evaluation/tasks.py)")
    cmp.add_argument("--json", metavar="OUT", help="where the JSON goes (default "
                     "./compare-YYYYmmdd-HHMMSS.json)")
    cmp.add_argument("--requests", type=int, metavar="N", default=DEFAULT_REQUESTS,
                     help=f"timed requests per model (default {DEFAULT_REQUESTS})")
    cmp.add_argument("--concurrency", type=int, metavar="N", default=DEFAULT_CONCURRENCY,
                     help=f"requests at a time (default {DEFAULT_CONCURRENCY})")
    cmp.add_argument("--max-tokens", type=int, metavar="N", default=DEFAULT_MAX_TOKENS,
                     help=f"completion tokens per request (default {DEFAULT_MAX_TOKENS})")
    cmp.add_argument("--batch-size", type=int, metavar="N", default=DEFAULT_BATCH_SIZE,
                     help=f"rows per forward pass when scoring tasks (default "
                     f"{DEFAULT_BATCH_SIZE})")
    cmp.add_argument("--label-a", metavar="A", help="DIR_A's name in the table (default v<version>)")
    cmp.add_argument("--label-b", metavar="B", help="DIR_B's name in the table (default v<version>)")
    quiet_commands.add_arguments(cmp, "compare")
    cmp.set_defaults(fn=cmd_compare)
