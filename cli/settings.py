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
    sources_overrides,
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
    `eval.min_scores` before anything runs (`evaluation.tasks.load_tasks`).

    Raises:
      ValueError: naming the task file, line and key, or the min_scores key.
    """
    if not config.eval.tasks:
        return config
    import dataclasses

    from evaluation.tasks import load_tasks

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


def replay(args: argparse.Namespace, config, base_model: str | None, data_path: str,
           output_dir: str):
    """(config, replay lineage for create_pipeline or None) of `data.replay_fraction` and
    `--replay-data PATH` (`pipeline/replay.py`): the old data joins the mixture as the
    source "replay"; exits naming a problem (no base model, no lineage, changed files).

    `replay lineage` is {"examples_uri", "examples_id", "base_model_id"} when the old data
    was found through ML Metadata, None for `--replay-data` or no replay.
    """
    fraction = config.data.replay_fraction
    replay_data = getattr(args, "replay_data", None)
    if not fraction and not replay_data:
        return config, None
    from pipeline import replay as rp

    try:
        if not base_model:
            raise rp.ReplayError("replay (data.replay_fraction, --replay-data) mixes in the "
                                 "base model's data: give --base-model")
        if not fraction:
            raise rp.ReplayError("--replay-data needs data.replay_fraction > 0 (e.g. --set "
                                 "data.replay_fraction=0.2)")
        lineage = None
        if replay_data:
            old = checked_sources(_with_sources(config, rp.replay_data_sources(replay_data)))
            old_sources = old.data.sources
            print(f"              replay: {fraction:.0%} of the tokens from --replay-data "
                  f"{old_sources[0].path}")
        else:
            from pipeline.local_runner import run_paths

            store = rp.open_store(run_paths(output_dir)["metadata_path"])
            if base_model == "latest":
                from pipeline.warm_start import latest_blessed_model_in

                base_model, _ = latest_blessed_model_in(store, output_dir)
            origin = rp.replay_origin(store, base_model)
            if origin.task != config.data.task:
                raise rp.ReplayError(f"replay: the base model was trained with data.task="
                                     f"{origin.task}, this run has data.task="
                                     f"{config.data.task}; its data cannot be replayed")
            rp.check_unchanged(origin)
            old_sources = origin.sources
            lineage = {"examples_uri": origin.examples_uri, "examples_id": origin.examples_id,
                       "base_model_id": origin.base_model_id}
            print(f"              replay: {fraction:.0%} of the tokens from the base model's "
                  f"data (ML Metadata: Examples {origin.examples_id} of Model "
                  f"{origin.base_model_id}): "
                  + ", ".join(s.path for s in old_sources))
        return rp.with_replay(config, old_sources, data_path), lineage
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def _with_sources(config, sources):
    import dataclasses

    return dataclasses.replace(config, data=dataclasses.replace(config.data, sources=sources))


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
        return os.path.join("runs", f"validate-{Path(corpus_name(args)).stem}")
    return os.path.join("runs", f"{corpus_name(args)}-{args.preset}")
