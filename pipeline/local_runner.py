"""Thin runner: the pipeline on this machine with LocalDagRunner and SQLite MLMD.

`build_pipeline(...)` is shared with `pipeline/beam_runner.py`: both runners
orchestrate the same `create_pipeline(...)` with the same paths and ML Metadata.
"""

from __future__ import annotations

import os

from config import PIPELINE_NAME, PipelineConfig

# Beam pipeline args of every Beam-based component unless the caller passes its
# own: DirectRunner, in this process, one worker.
DEFAULT_BEAM_PIPELINE_ARGS = ("--direct_num_workers=1",)
# The Beam options TFX reads as "the dependencies are given" (tfx.utils.dependency_utils
# `make_beam_dependency_flags`).
_DEPENDENCY_FLAGS = ("extra_packages", "setup_file", "requirements_file",
                     "worker_harness_container_image", "sdk_container_image")
_LOCAL_RUNNERS = (None, "DirectRunner", "direct", "BundleBasedDirectRunner")


def with_local_dependencies(beam_pipeline_args: list[str]) -> list[str]:
    """`beam_pipeline_args`, plus `--sdk_container_image` (Beam's own default image for
    this Python and Beam) when they run on this machine (the DirectRunner, or a
    PortableRunner with `--environment_type=LOOPBACK`) and name no dependencies.

    Why: given Beam args without dependency flags, every TFX Beam executor re-packages
    the whole installed TFX (`tfx.utils.dependency_utils.build_ephemeral_package`: a copy
    of ~42 MB and a `setup.py sdist` in a fresh temp directory, never removed) so that
    remote workers could import it. The DirectRunner's workers are this process (or its
    children): the package is never used, and a run of ten components left ~400 MB in
    /tmp. Naming Beam's default image changes nothing the DirectRunner does, and TFX then
    builds nothing. Remote runners (Dataflow, Flink, Spark, Portable with workers in
    containers) are left as given:
    they need the dependencies named by the user (docs/guides/runners.md).
    """
    import sys

    import apache_beam as beam

    options = beam.options.pipeline_options.PipelineOptions(
        flags=beam_pipeline_args).get_all_options()
    loopback = (options.get("runner") == "PortableRunner"
                and str(options.get("environment_type")).upper() == "LOOPBACK")
    if (options.get("runner") not in _LOCAL_RUNNERS and not loopback) or any(
            options.get(flag) for flag in _DEPENDENCY_FLAGS):
        return list(beam_pipeline_args)
    image = (f"apache/beam_python{sys.version_info.major}.{sys.version_info.minor}_sdk:"
             f"{beam.version.__version__}")
    return [*beam_pipeline_args, f"--sdk_container_image={image}"]


def build_pipeline(
    config: PipelineConfig,
    input_base: str,
    input_pattern: str,
    output_dir: str,
    beam_pipeline_args: list[str] | None = None,
    schema_path: str | None = None,
    **options,
):
    """The `create_pipeline(...)` of a run on this machine, and the paths it uses.

    Outputs go under `output_dir` (`run_paths`), ML Metadata to a SQLite file
    there. `beam_pipeline_args` (default `DEFAULT_BEAM_PIPELINE_ARGS`) go to
    every Beam-based component. `options` are `create_pipeline`'s
    (`enable_cache`, `until`, `num_workers`, `accept_drift`, ...).

    Returns:
      (the TFX `Pipeline`, paths dict of `run_paths`).
    """
    from tfx.orchestration.metadata import sqlite_metadata_connection_config

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
        metadata_connection_config=sqlite_metadata_connection_config(
            paths["metadata_path"]
        ),
        beam_pipeline_args=with_local_dependencies(
            list(beam_pipeline_args or DEFAULT_BEAM_PIPELINE_ARGS)),
        **({"schema_path": schema_path} if schema_path else {}),
        **options,
    )
    return pipeline, paths


def run_local(config: PipelineConfig, input_base: str, input_pattern: str, output_dir: str,
              **options) -> dict[str, str]:
    """Runs the pipeline (up to `until`) with LocalDagRunner; returns the paths it
    used (root, metadata, serving). `options` as in `build_pipeline`.

    num_workers > 1 runs the Trainer as that many MultiWorkerMirroredStrategy
    worker processes on this machine, over loopback (`components/trainer/launcher.py`);
    accept_drift: the DriftValidator records drift but does not stop the run.
    """
    from tfx.orchestration.local.local_dag_runner import LocalDagRunner

    pipeline, paths = build_pipeline(config, input_base, input_pattern, output_dir, **options)
    LocalDagRunner().run(pipeline)
    return paths


def run_paths(output_dir: str) -> dict[str, str]:
    """Where a run under `output_dir` keeps its artifacts, ML Metadata and pushed models."""
    output_dir = os.path.abspath(output_dir)
    return {
        "output_dir": output_dir,
        "pipeline_root": os.path.join(output_dir, "pipeline_root"),
        "metadata_path": os.path.join(output_dir, "metadata.db"),
        "serving_model_dir": os.path.join(output_dir, "serving"),
    }
