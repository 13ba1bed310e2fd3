"""`deepseek-tfx mlmd` and `report`: what a run recorded in ML Metadata, as text or
JSON (`reporting/mlmd_report.py`) and as report.html (`reporting/report.py`)."""

from __future__ import annotations

import argparse

from cli import quiet_commands


def cmd_mlmd(args: argparse.Namespace) -> int:
    """Prints the runs, the artifacts or a pushed model's lineage."""
    from pipeline.local_runner import run_paths
    from reporting.mlmd_report import report

    if args.what == "lineage" and not args.model_dir:
        raise SystemExit("error: mlmd lineage needs MODEL_DIR (a serving dir or version dir)")
    try:
        print(report(run_paths(args.output)["metadata_path"], args.what, args.model_dir,
                     as_json=args.json))
    except (FileNotFoundError, LookupError) as e:
        raise SystemExit(f"error: {e}") from e
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Rebuilds report.html in `--output` and prints its path."""
    from reporting.report import write_report

    try:
        print(f"report: {write_report(args.output)}")
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from e
    return 0


def add_parsers(sub) -> None:
    """Registers `mlmd` and `report` on `sub`, the top-level parser's `add_subparsers()`."""
    md = sub.add_parser("mlmd", help="what ML Metadata recorded: runs, artifacts, lineage")
    md.add_argument("--output", required=True, help="a run's output directory (holds metadata.db)")
    md.add_argument("what", choices=("runs", "artifacts", "lineage"))
    md.add_argument("model_dir", nargs="?", help="lineage: the pushed model (serving dir, "
                    "version dir or Model artifact URI)")
    md.add_argument("--json", action="store_true", help="JSON for machines")
    md.set_defaults(fn=cmd_mlmd)

    rep = sub.add_parser("report", help="rebuild report.html (pipeline, data, training, MoE, "
                         "eval, samples, lineage) of the newest run in a directory")
    rep.add_argument("--output", required=True, help="a run's output directory (holds "
                     "metadata.db); report.html is written there")
    quiet_commands.add_arguments(rep, "report")
    rep.set_defaults(fn=cmd_report)
