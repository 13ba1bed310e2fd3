"""`deepseek-tfx run` and `validate`: the TFX pipeline on this machine (LocalDagRunner
or BeamDagRunner), the whole of it or its data half, with progress lines and a summary
read back from ML Metadata."""

from __future__ import annotations

import argparse
import os
import time

from cli import quiet_commands
from cli.console import failure_message
from cli.data import data_lines, default_corpus, split_data_path
from cli.progress import show_progress
from cli.settings import (
    component_order,
    config_from_args,
    default_output,
    distillation,
    replay,
    warm_start,
)
from config import SOURCE_SETTINGS


def cmd_run(args: argparse.Namespace) -> int:
    """Runs the pipeline; prints the summary and writes report.html. Exit code 1 when a
    component did not complete."""
    config = config_from_args(args)
    if args.num_workers < 1:
        raise SystemExit(f"error: --num-workers {args.num_workers}: must be >= 1")
    sources = config.data.sources
    data = sources[0].path if sources else (args.data or [str(default_corpus())])[-1]
    input_base, pattern = split_data_path(data)
    output_dir = args.output or default_output(args)
    config, base_model = warm_start(args, config, output_dir)
    config, replay_lineage = replay(args, config, base_model,
                                    os.path.join(input_base, pattern), output_dir)
    config, teacher = distillation(args, config)
    from components.trainer.job import check_mixture

    try:
        check_mixture(config)  # what the Trainer would refuse, before anything runs
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if config.data.task in ("dpo", "grpo") and base_model is None:
        raise SystemExit(f"error: --task {config.data.task} starts from a base model (usually an "
                         "SFT model), which is also the frozen reference policy: add "
                         "--base-model latest|PATH")

    _print_data(config, input_base, pattern)
    print(f"              outputs under {os.path.abspath(output_dir)}")
    print(f"              runner {args.runner}"
          + (f", Beam args {' '.join(args.beam_arg)}" if args.beam_arg else "")
          + (f", until {args.until}" if args.until else ""))
    start = time.perf_counter()
    if args.runner == "beam":
        from pipeline.beam_runner import run_beam as runner
    else:
        from pipeline.local_runner import run_local as runner

    from reporting import report
    from reporting.run_summary import print_summary

    with report.written_on_failure(output_dir), show_progress():
        paths = runner(config, input_base, pattern, output_dir,
                       beam_pipeline_args=args.beam_arg or None,
                       enable_cache=not args.no_cache, until=args.until,
                       num_workers=args.num_workers, accept_drift=args.accept_drift,
                       base_model=base_model, teacher_model=teacher,
                       replay_lineage=replay_lineage)
    wall = time.perf_counter() - start
    failed = print_summary(paths["metadata_path"], wall)
    report.write_report_quietly(output_dir)
    return 1 if failed else 0


def _print_data(config, input_base: str, pattern: str) -> None:
    """`run`'s first line: the preset and the data (one path, or each source and its share)."""
    first, *more = data_lines(config, os.path.join(input_base, pattern))
    print(f"deepseek-tfx: preset {config.preset}, {first}")
    for line in more:
        print(f"              {line}")


def cmd_validate(args: argparse.Namespace) -> int:
    """Ingestion, validation, cleaning and the drift check only; prints the data report.

    `--data` is one path, or named sources (`--data NAME=PATH ... --source-set ...`), each
    read and cleaned with its own settings and counted on its own, as `run` does.
    With `--output` set to a run's directory, drift is measured against the run of
    that directory's latest blessed model (and reported; validate never stops on it).
    """
    config = config_from_args(args, check_tokenizer=False)
    sources = config.data.sources
    input_base, pattern = split_data_path(sources[0].path if sources else args.data[-1])
    output_dir = args.output or default_output(args)
    first, *more = data_lines(config, os.path.join(input_base, pattern))
    print(f"deepseek-tfx validate: {first}")
    for line in more:
        print(f"              {line}")
    from pipeline.local_runner import run_local, run_paths
    from reporting.run_summary import print_data_report

    failure = None
    try:
        with show_progress():
            run_local(config, input_base, pattern, output_dir, enable_cache=False,
                      until="DriftValidator", accept_drift=True)
    except Exception as e:  # noqa: BLE001 (reported below, with the counts that exist)
        failure = e
    print_data_report(run_paths(output_dir)["metadata_path"])
    if failure is not None:
        print(f"\nthe data does not pass: {failure_message(failure)}")
        return 1
    return 0


def add_parsers(sub) -> None:
    """Registers `run` and `validate` on `sub`, the top-level parser's `add_subparsers()`."""
    order = component_order()
    run = sub.add_parser("run", help="run the TFX pipeline on this machine (LocalDagRunner or "
                         "BeamDagRunner)")
    run.add_argument("--data", action="append", metavar="[NAME=]PATH",
                     help="text/JSONL/CSV/Parquet file, directory or glob (default: Tiny "
                     "Shakespeare); NAME=PATH (repeatable) names a source of a mixture, NAME "
                     "of [a-z0-9_]+ (anything else before '=' is part of the path: "
                     "gs://b/k=v/x, ./a=b)")
    run.add_argument("--weight", action="append", metavar="NAME=W",
                     help="a named source's weight, relative to the others' (default 1; "
                     "repeatable): --weight web=7 --weight code=3")
    run.add_argument("--source-set", action="append", metavar="NAME.FIELD=VALUE",
                     help="a named source's own value of a data.FIELD, FIELD one of "
                     f"{', '.join(SOURCE_SETTINGS)} (repeatable): --source-set "
                     "poems.jsonl_text_field=content")
    run.add_argument("--preset", default="cpu_small", help="a preset name (config/presets.py): tiny, cpu_small, gpu_base, deepseek_v3, the *_v4 presets, ...")
    run.add_argument("--output", help="output directory (default: runs/<corpus>-<preset>)")
    run.add_argument("--train-steps", type=int, help="override train.train_steps")
    run.add_argument("--task", choices=("pretrain", "sft", "dpo", "grpo"),
                     help="sets data.task: pretrain (text documents), sft (prompt/response "
                     "or chat records from JSONL, CSV or Parquet; the loss covers responses), "
                     "dpo (records of a prompt or chat, 'chosen' and 'rejected' responses; "
                     "data.chosen_field, data.rejected_field) or grpo (records of a prompt or "
                     "chat and a reference 'answer'; data.answer_field); a dpo/grpo record "
                     "without data.prompt_field takes its prompt from 'prompt'")
    run.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field, e.g. --set model.hidden_size=128")
    run.add_argument("--no-cache", action="store_true", help="re-run every component")
    run.add_argument("--num-workers", type=int, default=1, metavar="N",
                     help="train as N MultiWorkerMirroredStrategy workers on this machine "
                     "(loopback); same global batch and data order as one worker")
    run.add_argument("--runner", choices=("local", "beam"), default="local",
                     help="orchestrator: local (LocalDagRunner, default) or beam (BeamDagRunner)")
    run.add_argument("--beam-arg", action="append", metavar="=ARG",
                     help="a Beam pipeline arg for every Beam-based component, written "
                     "--beam-arg=ARG, repeatable, e.g. --beam-arg=--direct_running_mode="
                     "multi_processing --beam-arg=--direct_num_workers=2 "
                     "(default: --direct_num_workers=1)")
    run.add_argument("--until", choices=order, metavar="COMPONENT",
                     help=f"run only up to this component, one of: {', '.join(order)}")
    run.add_argument("--accept-drift", action="store_true",
                     help="record drift from the latest blessed run's data but go on training")
    run.add_argument("--base-model", metavar="latest|PATH",
                     help="warm start: 'latest' (the latest blessed model of this --output's "
                     "pipeline) or PATH (a pushed SavedModel version directory, or a Hugging "
                     "Face checkpoint directory: config.json, safetensors, tokenizer.json); "
                     "the run keeps its architecture and tokenizer, and is blessed only when "
                     "not worse than it")
    run.add_argument("--replay-data", metavar="PATH",
                     help="with --base-model and --set data.replay_fraction=F: the base "
                     "model's old data, mixed in as the source 'replay' (F of the tokens); "
                     "without it, the old data is found through ML Metadata lineage")
    run.add_argument("--teacher", metavar="PATH",
                     help="distill from this model (a pushed SavedModel or Hugging Face "
                     "directory with the same tokenizer): train.distill_alpha, "
                     "train.distill_temperature")
    quiet_commands.add_arguments(run, "run")
    run.set_defaults(fn=cmd_run)

    val = sub.add_parser("validate", help="ingest, validate (TFDV) and clean only; print the "
                         "data report (records, rejects by reason, repairs, anomalies)")
    val.add_argument("--data", required=True, action="append", metavar="[NAME=]PATH",
                     help="text/JSONL/CSV/Parquet file, directory or glob; NAME=PATH "
                     "(repeatable) names a source of a mixture, as for run")
    val.add_argument("--source-set", action="append", metavar="NAME.FIELD=VALUE",
                     help="a named source's own value of a data.FIELD (repeatable), as for run")
    val.add_argument("--preset", default="cpu_small", help="a preset name (config/presets.py): tiny, cpu_small, gpu_base, deepseek_v3, the *_v4 presets, ...")
    val.add_argument("--output", help="output directory (default: runs/validate-<corpus>)")
    val.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field, e.g. --set data.invalid_utf8=reject")
    quiet_commands.add_arguments(val, "validate")
    val.set_defaults(fn=cmd_validate, weight=None)
