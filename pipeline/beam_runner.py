"""Thin runner: the pipeline orchestrated by Apache Beam (BeamDagRunner).

The same `create_pipeline(...)`, paths and SQLite ML Metadata as
`pipeline/local_runner.py`; BeamDagRunner runs each component as a step of a
Beam pipeline, in dependency order. The components' own Beam pipelines
(ExampleGen, StatisticsGen, Transform, ...) run with `beam_pipeline_args`, e.g.

  DirectRunner, 2 processes:  --direct_running_mode=multi_processing --direct_num_workers=2
  Flink / Spark / Dataflow:   see docs/guides/runners.md.
"""

from __future__ import annotations

from config import PipelineConfig
from pipeline.local_runner import build_pipeline


def run_beam(config: PipelineConfig, input_base: str, input_pattern: str, output_dir: str,
             **options) -> dict[str, str]:
    """Runs the pipeline (up to `until`) with BeamDagRunner; returns the paths it
    used (root, metadata, serving), as `local_runner.run_local` does; `options` as
    in `local_runner.build_pipeline`."""
    from tfx.orchestration.beam.beam_dag_runner import BeamDagRunner

    pipeline, paths = build_pipeline(config, input_base, input_pattern, output_dir, **options)
    BeamDagRunner().run(pipeline)
    return paths
