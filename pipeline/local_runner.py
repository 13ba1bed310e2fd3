"""Thin runner: the pipeline on this machine with LocalDagRunner and SQLite MLMD."""

from __future__ import annotations

import os

from pipeline.configs import PIPELINE_NAME, PipelineConfig


def run_local(
    config: PipelineConfig,
    input_base: str,
    input_pattern: str,
    output_dir: str,
    beam_pipeline_args: list[str] | None = None,
    enable_cache: bool = True,
    schema_path: str | None = None,
    until: str | None = None,
    num_workers: int = 1,
) -> dict[str, str]:
    """Runs the whole pipeline; returns the paths it used (root, metadata, serving).

    num_workers > 1 runs the Trainer as that many MultiWorkerMirroredStrategy
    worker processes on this machine, over loopback (`components/trainer/launcher.py`).
    """
    from tfx import v1 as tfx

    from pipeline.pipeline import create_pipeline

    paths = run_paths(output_dir)
    os.makedirs(paths["pipeline_root"], exist_ok=True)
    pipeline = create_pipeline(
        pipeline_name=PIPELINE_NAME,
        pipeline_root=paths["pipeline_root"],
        input_base=input_base,
        input_pattern=input_pattern,
        serving_model_dir=paths["serving_model_dir"],
        config=config,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            paths["metadata_path"]
        ),
        beam_pipeline_args=beam_pipeline_args or ["--direct_num_workers=1"],
        enable_cache=enable_cache,
        **({"schema_path": schema_path} if schema_path else {}),
        until=until,
        num_workers=num_workers,
    )
    tfx.orchestration.LocalDagRunner().run(pipeline)
    return paths


def run_paths(output_dir: str) -> dict[str, str]:
    output_dir = os.path.abspath(output_dir)
    return {
        "output_dir": output_dir,
        "pipeline_root": os.path.join(output_dir, "pipeline_root"),
        "metadata_path": os.path.join(output_dir, "metadata.db"),
        "serving_model_dir": os.path.join(output_dir, "serving"),
    }
