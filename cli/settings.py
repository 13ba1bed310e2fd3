"""What the pipeline commands' options amount to: the PipelineConfig (`--preset`,
`--set`, `--train-steps`, `--task`, `run`'s named sources `--data NAME=PATH --weight
--source-set`), the warm start (`--base-model`), the teacher
(`--teacher`), the output directory (`--output`) and the choices of `--until`.

Each exits with one `error: ...` line naming a bad value, before anything runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cli.data import (
    checked_sources,
    corpus_name,
    default_corpus,
    sources_overrides,
    split_data_path,
)
from pipeline.component_order import COMPONENT_ORDER


def component_order() -> tuple[str, ...]:
    """`--until`'s choices: the pipeline's component ids in run order
    (`pipeline/component_order.py`, plain data: no TFX import for `--help`)."""
    return COMPONENT_ORDER


def parse_overrides(items: list[str]) -> dict:
    """`config.parse_set` of `--set SECTION.FIELD=VALUE ...`; exits with its one-line error."""
    from config import parse_set

    try:
        return parse_set(items)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def config_from_args(args: argparse.Namespace, check_tokenizer: bool = True):
    """The PipelineConfig of `--preset`, `--set`, `--train-steps`, `--task` and `run`'s
    named sources (their paths checked and made absolute); exits naming a bad one (and a
    bad `tokenizer.path`, unless `check_tokenizer` is False)."""
    from config import get_config

    overrides = parse_overrides(args.set or [])
    if getattr(args, "train_steps", None) is not None:
        overrides["train.train_steps"] = args.train_steps
    if getattr(args, "task", None) is not None:
        overrides["data.task"] = args.task
    if hasattr(args, "weight"):  # `run`: named sources
        overrides = sources_overrides(args, overrides)
    try:
        config = checked_sources(get_config(args.preset, overrides))
        config = with_task_paths(config)
        if check_tokenizer and config.tokenizer.path:  # checked before anything runs
            from pipeline.pipeline import check_given_tokenizer

            config, _ = check_given_tokenizer(config)
        return config
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from e


def with_task_paths(config):
    """`config` with `eval.tasks` as absolute paths, each task file loaded and checked with
    `eval.min_scores` before anything runs (`savedmodel.tasks.load_tasks`).

    Raises:
      ValueError: naming the task file, line and key, or the min_scores key.
    """
    if not config.eval.tasks:
        return config
    import dataclasses

    from savedmodel.tasks import load_tasks

    paths = tuple(os.path.abspath(p) for p in config.eval.tasks)
    load_tasks(paths, config.eval.min_scores)
    return dataclasses.replace(config, eval=dataclasses.replace(config.eval, tasks=paths))


def warm_start(args: argparse.Namespace, config, output_dir: str):
    """(config, base model for create_pipeline) of `--base-model`; exits naming a problem."""
    if not args.base_model:
        return config, None
    from pipeline import warm_start as ws

    try:
        if args.base_model == ws.LATEST:
            from pipeline.local_runner import run_paths

            uri, model_id = ws.latest_blessed_model(run_paths(output_dir)["metadata_path"])
            print(f"              base model: latest blessed, {uri} (MLMD id {model_id})")
            base_dir = uri
        else:
            base_dir = os.path.abspath(args.base_model)
            print(f"              base model: {base_dir}")
        config = ws.warm_start_config(config, base_dir, parse_overrides(args.set or []))
        from pipeline.pipeline import check_given_tokenizer

        config, _ = check_given_tokenizer(config)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"error: {e}") from e
    return config, args.base_model if args.base_model == ws.LATEST else base_dir


def distillation(args: argparse.Namespace, config):
    """(config, teacher model directory or None) of `--teacher`; exits naming a problem.
    Without `--base-model` the config takes the teacher's tokenizer (a warm start
    already has the same one)."""
    if not args.teacher:
        return config, None
    from pipeline import warm_start as ws
    from savedmodel import base_model as base_model_lib

    try:
        teacher = base_model_lib.model_dir(os.path.abspath(args.teacher))
        if not args.base_model:  # a warm start already has the (same) tokenizer
            config = ws.distillation_config(config, teacher, parse_overrides(args.set or []))
        print(f"              teacher: {teacher}")
    except ValueError as e:
        raise SystemExit(f"error: --teacher: {e}") from e
    return config, teacher


def default_output(args: argparse.Namespace) -> str:
    """`run`: runs/<corpus>-<preset> (`corpus_name`: a mixture's is its sources' names
    joined by '+'); `validate`: runs/validate-<corpus>."""
    if args.command == "validate":
        _, pattern = split_data_path(args.data or str(default_corpus()))
        return os.path.join("runs", f"validate-{Path(pattern).stem}")
    return os.path.join("runs", f"{corpus_name(args)}-{args.preset}")
