"""`create_pipeline(...)`: the one place the components are wired together.

  TextExampleGen -> StatisticsGen -> ImportSchemaGen -> ExampleValidator
    -> TextCleaner -> Transform -> Trainer -> LmEvaluator (vs latest blessed) -> Pusher

Data flows one way: raw text -> examples -> clean examples -> token ids -> model
-> blessing -> pushed SavedModel.
"""

from __future__ import annotations

import os

from tfx import v1 as tfx

from components.lm_evaluator.component import LmEvaluator
from components.text_cleaner.component import TextCleaner
from components.text_example_gen.component import TextExampleGen
from components.trainer.component import Trainer
from pipeline.configs import PipelineConfig

SCHEMA_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "schema", "schema.pbtxt")
PREPROCESSING_FN = "components.transform.preprocessing.preprocessing_fn"
RUN_FN = "components.trainer.run_fn.run_fn"

COMPONENT_ORDER = (
    "TextExampleGen",
    "StatisticsGen",
    "ImportSchemaGen",
    "ExampleValidator",
    "TextCleaner",
    "Transform",
    "Trainer",
    "latest_blessed_model_resolver",
    "LmEvaluator",
    "Pusher",
)


def create_pipeline(
    pipeline_name: str,
    pipeline_root: str,
    input_base: str,
    input_pattern: str,
    serving_model_dir: str,
    config: PipelineConfig,
    metadata_connection_config=None,
    beam_pipeline_args: list[str] | None = None,
    enable_cache: bool = True,
    schema_path: str = SCHEMA_FILE,
    until: str | None = None,
    num_workers: int = 1,
) -> tfx.dsl.Pipeline:
    """Builds the TFX pipeline.

    Args:
      pipeline_name: name recorded in ML Metadata.
      pipeline_root: where component outputs are written.
      input_base: directory holding the corpus.
      input_pattern: glob of the corpus files, relative to input_base.
      serving_model_dir: Pusher's destination; versions go to `<dir>/<version>/`.
      config: the one PipelineConfig, passed to every component.
      metadata_connection_config: ML Metadata connection (SQLite locally).
      beam_pipeline_args: passed to every Beam-based component.
      enable_cache: reuse outputs of unchanged components.
      schema_path: the curated schema (ImportSchemaGen).
      until: build the pipeline only up to this component id (one of
        `COMPONENT_ORDER`), e.g. "TextCleaner" for ingestion, validation and
        cleaning only (`deepseek-tfx validate`).
      num_workers: the Trainer runs as this many MultiWorkerMirroredStrategy
        worker processes on this machine (loopback); not part of `config`, so
        it changes neither the upstream components' cache keys nor the
        checkpoint directory (a 1-worker and an N-worker run of the same
        config train the same model).

    Raises:
      ValueError: `until` is not a component id.
    """
    if until is not None and until not in COMPONENT_ORDER:
        raise ValueError(f"until={until!r} must be one of {list(COMPONENT_ORDER)}")
    config_json = config.to_json()

    example_gen = TextExampleGen(input_base=input_base, input_pattern=input_pattern, config=config)
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = tfx.components.ImportSchemaGen(schema_file=schema_path)
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"]
    )
    cleaner = TextCleaner(
        examples=example_gen.outputs["examples"],
        anomalies=example_validator.outputs["anomalies"],
        pipeline_config=config_json,
    )
    transform = tfx.components.Transform(
        examples=cleaner.outputs["cleaned_examples"],
        schema=schema_gen.outputs["schema"],
        preprocessing_fn=PREPROCESSING_FN,
        custom_config={"pipeline_config": config_json},
    )
    trainer = Trainer(
        run_fn=RUN_FN,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        train_args=tfx.proto.TrainArgs(num_steps=config.train.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=config.train.eval_batches),
        custom_config={"pipeline_config": config_json, "num_workers": num_workers},
    )
    model_resolver = tfx.dsl.Resolver(
        strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
    ).with_id("latest_blessed_model_resolver")
    evaluator = LmEvaluator(
        examples=transform.outputs["transformed_examples"],
        model=trainer.outputs["model"],
        baseline_model=model_resolver.outputs["model"],
        pipeline_config=config_json,
    )
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=serving_model_dir)
        ),
    )
    components = [
        example_gen,
        statistics_gen,
        schema_gen,
        example_validator,
        cleaner,
        transform,
        trainer,
        model_resolver,
        evaluator,
        pusher,
    ]
    if until is not None:
        components = components[: [c.id for c in components].index(until) + 1]
    return tfx.dsl.Pipeline(
        pipeline_name=pipeline_name,
        pipeline_root=pipeline_root,
        components=components,
        enable_cache=enable_cache,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=beam_pipeline_args or [],
    )
