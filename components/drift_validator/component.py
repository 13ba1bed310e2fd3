"""DriftValidator: a TFX component that stops training on data drift between runs.

Inputs:  examples (Examples: TextCleaner's cleaned_examples),
         baseline_statistics (ExampleStatistics, optional: the text profile of the
         run that produced the latest blessed model, from a Resolver with
         `LatestBlessedRunStatisticsStrategy`).
Outputs: statistics (ExampleStatistics: this run's text profile, per split, TFDV
         `FeatureStats.pb`: the overall dataset and one slice per `source_name`),
         anomalies (ExampleAnomalies: TFDV's drift anomalies, per split
         `SchemaDiff.pb`, empty without a baseline, and for a mixture per source
         `source_name_<source>/SchemaDiff.pb`; the custom property `drift_by_source`).
Parameters: pipeline_config (PipelineConfig JSON; the `validation` section holds
         the rule), accept_drift (1: record drift but do not stop).
"""

from __future__ import annotations

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.drift_validator import executor


class DriftValidatorSpec(types.ComponentSpec):
    PARAMETERS = {
        "pipeline_config": ExecutionParameter(type=str),
        "accept_drift": ExecutionParameter(type=int, optional=True),
    }
    INPUTS = {
        "examples": ChannelParameter(type=standard_artifacts.Examples),
        "baseline_statistics": ChannelParameter(type=standard_artifacts.ExampleStatistics,
                                                optional=True),
    }
    OUTPUTS = {
        "statistics": ChannelParameter(type=standard_artifacts.ExampleStatistics),
        "anomalies": ChannelParameter(type=standard_artifacts.ExampleAnomalies),
    }


class DriftValidator(base_beam_component.BaseBeamComponent):
    """Text profile statistics (TFDV) and drift against the latest blessed run."""

    SPEC_CLASS = DriftValidatorSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples: types.BaseChannel, pipeline_config: str,
                 baseline_statistics: types.BaseChannel | None = None, accept_drift: bool = False):
        super().__init__(
            spec=DriftValidatorSpec(
                examples=examples,
                baseline_statistics=baseline_statistics,
                pipeline_config=pipeline_config,
                accept_drift=int(accept_drift),
                statistics=types.Channel(type=standard_artifacts.ExampleStatistics),
                anomalies=types.Channel(type=standard_artifacts.ExampleAnomalies),
            )
        )
