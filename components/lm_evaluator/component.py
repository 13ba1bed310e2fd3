"""LmEvaluator: perplexity and bits per byte on the eval split, and a ModelBlessing.

Inputs:  examples (Transform's transformed_examples), model (Trainer's Model),
         baseline_model (optional: the latest blessed Model, from a Resolver with
         LatestBlessedModelStrategy).
Outputs: evaluation (ModelEvaluation: metrics.json + custom properties, per mixture
         source too: `by_source`, bits_per_byte_<source>),
         blessing (ModelBlessing: `blessed` 1/0, as TFX's Pusher reads it).
Parameters: pipeline_config (PipelineConfig JSON; the `eval` section holds the rule),
            task_fingerprints (optional JSON {task file path: sha256 of its bytes}: an
            edited task file at the same path re-runs the Evaluator instead of hitting
            the cache).
"""

from __future__ import annotations

from tfx import types
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import standard_artifacts
from tfx.types.component_spec import ChannelParameter, ExecutionParameter

from components.lm_evaluator import executor


class LmEvaluatorSpec(types.ComponentSpec):
    PARAMETERS = {"pipeline_config": ExecutionParameter(type=str),
                  "task_fingerprints": ExecutionParameter(type=str, optional=True)}
    INPUTS = {
        "examples": ChannelParameter(type=standard_artifacts.Examples),
        "model": ChannelParameter(type=standard_artifacts.Model),
        "baseline_model": ChannelParameter(type=standard_artifacts.Model, optional=True),
    }
    OUTPUTS = {
        "evaluation": ChannelParameter(type=standard_artifacts.ModelEvaluation),
        "blessing": ChannelParameter(type=standard_artifacts.ModelBlessing),
    }


class LmEvaluator(base_component.BaseComponent):
    SPEC_CLASS = LmEvaluatorSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

    def __init__(self, examples, model, pipeline_config: str, baseline_model=None,
                 task_fingerprints: str | None = None):
        super().__init__(
            spec=LmEvaluatorSpec(
                examples=examples,
                model=model,
                baseline_model=baseline_model,
                pipeline_config=pipeline_config,
                task_fingerprints=task_fingerprints,
                evaluation=types.Channel(type=standard_artifacts.ModelEvaluation),
                blessing=types.Channel(type=standard_artifacts.ModelBlessing),
            )
        )
