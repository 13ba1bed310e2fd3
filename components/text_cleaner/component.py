"""TextCleaner: a TFX component that cleans text Examples and counts every decision.

Inputs:  examples (Examples, from TextExampleGen), anomalies (ExampleAnomalies,
         from ExampleValidator: any anomaly stops the pipeline here).
Outputs: cleaned_examples (Examples, same splits and features).
Parameter: pipeline_config (PipelineConfig JSON).
"""

from __future__ import annotations

from tfx import types
from tfx.dsl.components.base import base_beam_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.text_cleaner import executor


class TextCleanerSpec(types.ComponentSpec):
    PARAMETERS = {"pipeline_config": ExecutionParameter(type=str)}
    INPUTS = {
        "examples": ChannelParameter(type=standard_artifacts.Examples),
        "anomalies": ChannelParameter(type=standard_artifacts.ExampleAnomalies),
    }
    OUTPUTS = {"cleaned_examples": ChannelParameter(type=standard_artifacts.Examples)}


class TextCleaner(base_beam_component.BaseBeamComponent):
    """Unicode normalization, control characters, PII redaction, empty/length and
    quality filters, exact and near-duplicate removal; every decision counted."""

    SPEC_CLASS = TextCleanerSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

    def __init__(self, examples: types.BaseChannel, anomalies: types.BaseChannel, pipeline_config: str):
        super().__init__(
            spec=TextCleanerSpec(
                examples=examples,
                anomalies=anomalies,
                pipeline_config=pipeline_config,
                cleaned_examples=types.Channel(type=standard_artifacts.Examples),
            )
        )
