"""`create_pipeline(...)`: the one place the components are wired together.

  TextExampleGen -> StatisticsGen -> ImportSchemaGen -> ExampleValidator
    -> TextCleaner -> DriftValidator (vs the latest blessed run's text profile)
    -> Transform -> Trainer -> LmEvaluator (vs latest blessed) -> Pusher

Data flows one way: raw text -> examples -> clean examples -> token ids -> model
-> blessing -> pushed SavedModel.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os

import tensorflow_data_validation as tfdv

# TFX's own modules, not `tfx.v1`: importing `tfx.v1` imports its Google Cloud extensions
# (Vertex AI, BigQuery), ~6 s of every run's start-up (docs/development.md).
from tfx.components.example_validator.component import ExampleValidator
from tfx.components.pusher.component import Pusher
from tfx.components.schema_gen.import_schema_gen.component import ImportSchemaGen
from tfx.components.statistics_gen.component import StatisticsGen
from tfx.components.transform.component import Transform
from tfx.dsl.components.common.importer import Importer
from tfx.dsl.components.common.resolver import Resolver
from tfx.dsl.input_resolution.strategies.latest_blessed_model_strategy import (
    LatestBlessedModelStrategy,
)
from tfx.orchestration.pipeline import Pipeline
from tfx.proto import pusher_pb2, trainer_pb2
from tfx.types import standard_artifacts
from tfx.types.channel import Channel
from tfx_bsl.public.proto import slicing_spec_pb2

from components.drift_validator.component import DriftValidator
from components.drift_validator.resolver import LatestBlessedRunStatisticsStrategy
from components.lm_evaluator.component import LmEvaluator
from components.text_cleaner.component import TextCleaner
from components.text_example_gen.component import TextExampleGen
from components.trainer.component import Trainer
from config import PipelineConfig, TokenizerConfig, TrainConfig
from config.data import CHAT_TASKS
from evaluation.tasks import load_tasks
from models.deepseek.config import DeepSeekConfig
from pipeline.component_order import (
    BASE_MODEL_IMPORTER,
    BUILD_ORDER,
    COMPONENT_ORDER,
    REPLAY_EXAMPLES_IMPORTER,
)
from pipeline.sources import source_fingerprint

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA_FILE = os.path.join(_ROOT, "data", "schema", "schema.pbtxt")
SFT_SCHEMA_FILE = os.path.join(_ROOT, "data", "schema", "sft_schema.pbtxt")  # data.task=sft
DPO_SCHEMA_FILE = os.path.join(_ROOT, "data", "schema", "dpo_schema.pbtxt")  # data.task=dpo
# The curated schema of each record task (a GRPO record is an SFT record: prompt, answer).
TASK_SCHEMA_FILES = {"sft": SFT_SCHEMA_FILE, "grpo": SFT_SCHEMA_FILE, "dpo": DPO_SCHEMA_FILE}
PREPROCESSING_FN = "components.transform.preprocessing.preprocessing_fn"
RUN_FN = "components.trainer.run_fn.run_fn"
# The code behind PREPROCESSING_FN and RUN_FN, fingerprinted into each component's
# custom_config (pipeline/sources.py): an edit of what it imports re-runs it.
TRANSFORM_MODULES = (PREPROCESSING_FN.rpartition(".")[0],)
TRAINER_MODULES = (RUN_FN.rpartition(".")[0], "components.trainer.worker")  # + its workers
# COMPONENT_ORDER, BASE_MODEL_IMPORTER and BUILD_ORDER live in pipeline/component_order.py
# (plain data, no TFX: the CLI reads them for `--help`) and are re-exported from here.


# The config sections each component reads (grep `config.` in components/). A
# component gets only these; the others are reset to their defaults, so that a
# change to, say, `train.*` leaves the cache keys of ingestion and Transform alone.
# The Trainer and LmEvaluator get the whole config: the trained model records it,
# and `serving/evaluate.py` reads `data` and `train` back from it.
CONFIG_SECTIONS = {
    "TextExampleGen": ("data",),
    "TextCleaner": ("data",),
    "DriftValidator": ("validation",),
    "Transform": ("tokenizer",),
}
# Supervised fine-tuning: ExampleGen renders prompts with the chat template and the
# tokenizer's special tokens (`tokenizer.path`); Transform records the template
# (`data.chat_template`) in the tokenizer_config.json asset.
SFT_CONFIG_SECTIONS = {
    "TextExampleGen": ("data", "tokenizer"),
    "Transform": ("tokenizer", "data"),
}


def _sections(config: PipelineConfig, component: str) -> tuple[str, ...]:
    if config.data.task in CHAT_TASKS and component in SFT_CONFIG_SECTIONS:
        return SFT_CONFIG_SECTIONS[component]
    return CONFIG_SECTIONS[component]
_SECTIONS = ("model", "data", "tokenizer", "train", "eval", "validation", "generation")


def _abspath(path: str) -> str:
    """A local path made absolute; a URL (`gs://...`, anything with `://`) as it is."""
    return path if "://" in path else os.path.abspath(path)


def check_given_tokenizer(config: PipelineConfig) -> tuple[PipelineConfig, str]:
    """(config with an absolute `tokenizer.path`, SHA-256 of its tokenizer.json) when a
    tokenizer is given; (config, "") when Transform learns one.

    Raises:
      ValueError: the model's `vocab_size` does not cover the tokenizer's ids.
      FileNotFoundError, pre_tokenizer.UnsupportedTokenizerError: see `ByteLevelBpe.from_file`.
    """
    if not config.tokenizer.path:
        return config, ""
    from tokenization.byte_level_bpe import ByteLevelBpe

    path = _abspath(config.tokenizer.path)
    given = ByteLevelBpe.from_file(path)
    if given.vocab_size > config.model.vocab_size:
        raise ValueError(
            f"tokenizer.path={path} has ids up to {given.vocab_size - 1} (vocabulary size "
            f"{given.vocab_size}), but model.vocab_size={config.model.vocab_size}: set "
            f"--set model.vocab_size={given.vocab_size} (or more)")
    import tensorflow as tf

    with tf.io.gfile.GFile(given.source, "rb") as f:  # a local path or a URL (gs://...)
        fingerprint = hashlib.sha256(f.read()).hexdigest()
    tokenizer = dataclasses.replace(config.tokenizer, path=path)
    return dataclasses.replace(config, tokenizer=tokenizer), fingerprint


def component_config(config: PipelineConfig, sections: tuple[str, ...]) -> PipelineConfig:
    """`config` with every section not in `sections` reset to its default.

    The result is still a valid `PipelineConfig` (executors parse it with
    `PipelineConfig.from_json` unchanged): a reset `model` takes the tokenizer's
    vocabulary size and a context long enough for `train.seq_len`; a reset
    `tokenizer` takes the model's vocabulary size, a reset `train` a `seq_len`
    the model can hold. The preset name is kept.

    Raises:
      ValueError: a name in `sections` is not a config section.
    """
    unknown = set(sections) - set(_SECTIONS)
    if unknown:
        raise ValueError(f"unknown config sections {sorted(unknown)}; sections are {list(_SECTIONS)}")
    defaults = PipelineConfig(preset=config.preset, model=DeepSeekConfig())
    kept = {name: getattr(config if name in sections else defaults, name) for name in _SECTIONS}
    if "train" not in sections:
        # The sources' weights and the replay share are the Trainer's sampling, not
        # how records are read, cleaned or tokenized.
        kept["data"] = dataclasses.replace(kept["data"].without_weights(), replay_fraction=0.0)
    if "model" not in sections:
        kept["model"] = DeepSeekConfig(
            vocab_size=kept["tokenizer"].vocab_size,
            max_position_embeddings=max(DeepSeekConfig().max_position_embeddings,
                                        kept["train"].seq_len),
        )
    else:
        if "tokenizer" not in sections:
            kept["tokenizer"] = TokenizerConfig(vocab_size=kept["model"].vocab_size)
        if "train" not in sections:
            kept["train"] = TrainConfig(
                seq_len=min(TrainConfig().seq_len, kept["model"].max_position_embeddings))
    return dataclasses.replace(defaults, **kept)


def task_fingerprints(config: PipelineConfig) -> str:
    """JSON {task file: sha256 of its bytes} of `eval.tasks`, after loading and checking
    them with `eval.min_scores` (`evaluation.tasks.load_tasks`), so that a bad task file
    stops the run before anything runs and an edited one re-runs the LmEvaluator.

    Raises:
      evaluation.tasks.TaskFileError (a ValueError): see `load_tasks`.
    """
    import json

    load_tasks(config.eval.tasks, config.eval.min_scores)
    digests = {}
    for path in config.eval.tasks:
        with open(path, "rb") as f:
            digests[path] = hashlib.sha256(f.read()).hexdigest()
    return json.dumps(digests, sort_keys=True)


def _run_config(config: PipelineConfig, schema_path: str,
                until: str | None) -> tuple[PipelineConfig, str, str]:
    """(config, tokenizer fingerprint, schema path) of a run: `until` checked, a given
    tokenizer checked and its path made absolute (`check_given_tokenizer`), the chat
    template pinned for a chat task, and the default schema replaced by the task's
    (`TASK_SCHEMA_FILES`).

    Raises:
      ValueError: `until` is not a component id; see `check_given_tokenizer`.
      FileNotFoundError, pre_tokenizer.UnsupportedTokenizerError: see
        `check_given_tokenizer`.
    """
    if until is not None and until not in COMPONENT_ORDER:
        raise ValueError(f"until={until!r} must be one of {list(COMPONENT_ORDER)}")
    config, tokenizer_fingerprint = check_given_tokenizer(config)
    if config.data.task in CHAT_TASKS:
        from tokenization.chat_template import pin_template

        config = pin_template(config)  # one chat template for every component
    if schema_path == SCHEMA_FILE:
        schema_path = TASK_SCHEMA_FILES.get(config.data.task, SCHEMA_FILE)
    return config, tokenizer_fingerprint, schema_path


def _ingestion(config: PipelineConfig, input_base: str, input_pattern: str, schema_path: str):
    """(TextExampleGen, StatisticsGen, ImportSchemaGen): the corpus as examples, their
    statistics, and the curated schema at `schema_path`."""
    example_gen = TextExampleGen(
        input_base=input_base,
        input_pattern=input_pattern,
        config=component_config(config, _sections(config, "TextExampleGen")),
    )
    statistics_gen = StatisticsGen(
        examples=example_gen.outputs["examples"],
        # Sketches (Misra-Gries top-k, KMV uniques) instead of exact value counts: the
        # exact ones group every distinct text, i.e. the whole corpus, in memory. Each
        # source of a mixture gets its own slice ("source_name_<name>") beside "All
        # Examples", which is the one ExampleValidator validates (one source: no slice,
        # it would repeat "All Examples").
        stats_options=tfdv.StatsOptions(
            use_sketch_based_topk_uniques=True,
            slicing_config=slicing_spec_pb2.SlicingConfig(
                slicing_specs=[slicing_spec_pb2.SlicingSpec(feature_keys=["source_name"])]
            ) if config.data.sources else None),
    )
    schema_gen = ImportSchemaGen(schema_file=schema_path)
    return example_gen, statistics_gen, schema_gen


def _validation(config: PipelineConfig, example_gen, statistics_gen, schema_gen,
                accept_drift: bool, drift_baseline: bool):
    """(ExampleValidator, TextCleaner, latest_blessed_statistics_resolver, DriftValidator):
    the examples checked against the schema, cleaned, and their text profile compared
    with the latest blessed run's.

    The resolver is always built; with `drift_baseline` False the DriftValidator gets no
    baseline and `create_pipeline` leaves the resolver out: for KubeflowV2DagRunner, which
    compiles only TFX's built-in resolver strategies (`deepseek-tfx compile-kfp`).
    """
    example_validator = ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"]
    )
    cleaner = TextCleaner(
        examples=example_gen.outputs["examples"],
        anomalies=example_validator.outputs["anomalies"],
        pipeline_config=component_config(config, CONFIG_SECTIONS["TextCleaner"]).to_json(),
    )
    statistics_resolver = Resolver(
        strategy_class=LatestBlessedRunStatisticsStrategy,
        statistics=Channel(type=standard_artifacts.ExampleStatistics),
        model_blessing=Channel(type=standard_artifacts.ModelBlessing),
        examples=cleaner.outputs["cleaned_examples"],
    ).with_id("latest_blessed_statistics_resolver")
    drift_validator = DriftValidator(
        examples=cleaner.outputs["cleaned_examples"],
        baseline_statistics=statistics_resolver.outputs["statistics"] if drift_baseline else None,
        pipeline_config=component_config(config, CONFIG_SECTIONS["DriftValidator"]).to_json(),
        accept_drift=accept_drift,
    )
    return example_validator, cleaner, statistics_resolver, drift_validator


def _transform(config: PipelineConfig, cleaner, schema_gen, tokenizer_fingerprint: str):
    """The Transform of the cleaned examples: `PREPROCESSING_FN`, with its code's and the
    given tokenizer's fingerprints in its custom_config."""
    return Transform(
        examples=cleaner.outputs["cleaned_examples"],
        schema=schema_gen.outputs["schema"],
        preprocessing_fn=PREPROCESSING_FN,
        # StatisticsGen (raw text) and DriftValidator (lengths, tokens) hold the
        # statistics; Transform's own pre/post-transform TFDV passes would only
        # repeat them.
        disable_statistics=True,
        custom_config={
            "pipeline_config": component_config(config, _sections(config, "Transform")).to_json(),
            "code_fingerprint": source_fingerprint(TRANSFORM_MODULES),
            # An edited tokenizer.json at the same path re-runs Transform.
            "tokenizer_fingerprint": tokenizer_fingerprint,
        },
    )


def _trainer_inputs(base_model: str | None, teacher_model: str | None,
                    checkpoint_root: str | None, replay_lineage: dict | None):
    """(base node, replay Importer or None, baseline channel, extra Trainer custom_config).

    The base node is what brings the baseline model in: an `Importer`
    (`BASE_MODEL_IMPORTER`) of a `base_model` directory (a pushed SavedModel version, or a
    Hugging Face checkpoint directory), else `latest_blessed_model_resolver`
    (LatestBlessedModelStrategy: the latest blessed model of this pipeline). Its model
    feeds the LmEvaluator's `baseline_model`, and, when `base_model` is given ("latest"
    or a directory), the Trainer's `base_model`, so the new model is blessed only when it
    is not worse than its base. The config must already carry the base's architecture
    and tokenizer (`pipeline/warm_start.py`).

    `replay_lineage`: the base run's data is replayed (`pipeline/replay.py`; the config
    already has the source "replay"): {"examples_uri", "examples_id", "base_model_id"} of
    the base run's TextExampleGen Examples. An Importer of that URI
    (`REPLAY_EXAMPLES_IMPORTER`) reuses the artifact, so this pipeline run's context holds
    it, and the Trainer records the ids on the new Model artifact.
    """
    model_resolver = Resolver(
        strategy_class=LatestBlessedModelStrategy,
        model=Channel(type=standard_artifacts.Model),
        model_blessing=Channel(type=standard_artifacts.ModelBlessing),
    ).with_id("latest_blessed_model_resolver")
    importer = None
    trainer_extra = {}
    from savedmodel import base_model as base_model_lib

    if base_model and base_model != "latest":
        path = _abspath(base_model)
        importer = Importer(
            source_uri=path, artifact_type=standard_artifacts.Model,
        ).with_id(BASE_MODEL_IMPORTER)
        baseline = importer.outputs["result"]
        # The Importer reuses an artifact of the same URI: the weights' fingerprint
        # makes an edited directory a new Trainer input.
        trainer_extra["base_model_fingerprint"] = base_model_lib.fingerprint(path)
    else:
        baseline = model_resolver.outputs["model"]
    if teacher_model:
        teacher_path = _abspath(teacher_model)
        trainer_extra["teacher_model"] = teacher_path
        trainer_extra["teacher_fingerprint"] = base_model_lib.fingerprint(teacher_path)
    if checkpoint_root:
        trainer_extra["checkpoint_root"] = checkpoint_root
    replay_importer = None
    if replay_lineage:
        replay_importer = Importer(
            source_uri=replay_lineage["examples_uri"],
            artifact_type=standard_artifacts.Examples,
        ).with_id(REPLAY_EXAMPLES_IMPORTER)
        trainer_extra["replay_lineage"] = {k: replay_lineage[k] for k in (
            "examples_id", "base_model_id")}
    base_node = importer if importer is not None else model_resolver
    return base_node, replay_importer, baseline, trainer_extra


def _trainer(config: PipelineConfig, transform, schema_gen, base_model, num_workers: int,
             trainer_extra: dict, vertex_training: dict | None):
    """The Trainer (`RUN_FN`) of the transformed examples, from `base_model` (a channel,
    or None for random weights), with id "Trainer": a `VertexTrainer` when
    `vertex_training` holds its custom_config keys.

    `num_workers` is not part of `config`, so it changes neither the upstream
    components' cache keys nor the checkpoint directory (a 1-worker and an N-worker run
    of the same config train the same model).
    """
    trainer_class = Trainer
    if vertex_training:
        from components.trainer.vertex import VertexTrainer

        trainer_class, trainer_extra = VertexTrainer, {**trainer_extra, **vertex_training}
    return trainer_class(
        run_fn=RUN_FN,
        base_model=base_model,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_gen.outputs["schema"],
        train_args=trainer_pb2.TrainArgs(num_steps=config.train.train_steps),
        eval_args=trainer_pb2.EvalArgs(num_steps=config.train.eval_batches),
        custom_config={"pipeline_config": config.to_json(), "num_workers": num_workers,
                       "code_fingerprint": source_fingerprint(TRAINER_MODULES), **trainer_extra},
    ).with_id("Trainer")  # VertexTrainer's too


def _evaluation_and_push(config: PipelineConfig, transform, trainer, baseline,
                         serving_model_dir: str):
    """(LmEvaluator, Pusher): the trained model compared with `baseline` and, when
    blessed, pushed to `serving_model_dir`.

    Raises:
      evaluation.tasks.TaskFileError (a ValueError): see `task_fingerprints`.
    """
    evaluator = LmEvaluator(
        examples=transform.outputs["transformed_examples"],
        model=trainer.outputs["model"],
        baseline_model=baseline,
        pipeline_config=config.to_json(),
        task_fingerprints=task_fingerprints(config) if config.eval.tasks else None,
    )
    pusher = Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=pusher_pb2.PushDestination(
            filesystem=pusher_pb2.PushDestination.Filesystem(base_directory=serving_model_dir)
        ),
    )
    return evaluator, pusher


def create_pipeline(
    pipeline_name: str, pipeline_root: str, input_base: str, input_pattern: str,
    serving_model_dir: str, config: PipelineConfig, metadata_connection_config=None,
    beam_pipeline_args: list[str] | None = None, enable_cache: bool = True,
    schema_path: str = SCHEMA_FILE, until: str | None = None, num_workers: int = 1,
    accept_drift: bool = False, drift_baseline: bool = True, base_model: str | None = None,
    teacher_model: str | None = None, checkpoint_root: str | None = None,
    vertex_training: dict | None = None, replay_lineage: dict | None = None,
) -> Pipeline:
    """Builds the TFX pipeline of its stages' components (`_ingestion` to `_evaluation_and_push`).

    Args:
      pipeline_name: name recorded in ML Metadata.
      pipeline_root: where component outputs are written.
      input_base: directory holding the corpus.
      input_pattern: glob of the corpus files, relative to input_base.
      serving_model_dir: Pusher's destination; versions go to `<dir>/<version>/`.
      config: the one PipelineConfig. The Trainer and LmEvaluator get all of it; the
        components before them only the sections they read (`CONFIG_SECTIONS`,
        `component_config`), so their cache survives changes to the others.
      metadata_connection_config: ML Metadata connection (SQLite locally).
      beam_pipeline_args: passed to every Beam-based component.
      enable_cache: reuse outputs of unchanged components.
      schema_path: the curated schema (ImportSchemaGen); the default means
        `TASK_SCHEMA_FILES[data.task]` for `sft`, `dpo` and `grpo`.
      until: build the pipeline only up to this component id (one of `COMPONENT_ORDER`),
        e.g. "TextCleaner" for ingestion, validation and cleaning only (`deepseek-tfx validate`).
      num_workers: the Trainer runs as this many MultiWorkerMirroredStrategy worker
        processes on this machine (loopback); not part of `config` (`_trainer`).
      accept_drift: the DriftValidator records drift from the latest blessed run but does
        not stop the run (`deepseek-tfx run --accept-drift`).
      drift_baseline: resolve the latest blessed run's text profile for the DriftValidator
        (`latest_blessed_statistics_resolver`); False: none, for compile-kfp (`_validation`).
      base_model: warm start: "latest", the latest blessed model of this pipeline, or a
        model directory (`_trainer_inputs`); the LmEvaluator's baseline too. None: train
        from random weights, and compare with the latest blessed model.
      teacher_model: a directory holding a distillation teacher (same tokenizer), passed
        to the Trainer in its custom_config (with its fingerprint).
      checkpoint_root: the parent of the Trainer's stable checkpoint directories (default
        `<Trainer's output dir>/checkpoints`, `checkpoint_location.py`).
      vertex_training: the Trainer trains on N workers as a Vertex AI CustomJob
        (`components.trainer.vertex.VertexTrainer`); these are the custom_config keys of
        `vertex.custom_config(...)`. None: the Trainer trains in its own task.
      replay_lineage: the base run's data is replayed (`pipeline/replay.py`): {"examples_uri",
        "examples_id", "base_model_id"} of its TextExampleGen Examples (`_trainer_inputs`).

    Raises:
      ValueError: `until` is not a component id; `tokenizer.path` is given and the
        model's vocabulary does not cover it.
      FileNotFoundError, pre_tokenizer.UnsupportedTokenizerError: `tokenizer.path`
        holds no tokenizer.json of the family (`ByteLevelBpe.from_file`).
    """
    config, tokenizer_fingerprint, schema_path = _run_config(config, schema_path, until)
    example_gen, statistics_gen, schema_gen = _ingestion(config, input_base, input_pattern,
                                                         schema_path)
    example_validator, cleaner, statistics_resolver, drift_validator = _validation(
        config, example_gen, statistics_gen, schema_gen, accept_drift, drift_baseline)
    transform = _transform(config, cleaner, schema_gen, tokenizer_fingerprint)
    base_node, replay_importer, baseline, trainer_extra = _trainer_inputs(
        base_model, teacher_model, checkpoint_root, replay_lineage)
    trainer = _trainer(config, transform, schema_gen, baseline if base_model else None,
                       num_workers, trainer_extra, vertex_training)
    evaluator, pusher = _evaluation_and_push(config, transform, trainer, baseline,
                                             serving_model_dir)
    components = [
        example_gen, statistics_gen, schema_gen, example_validator, cleaner,
        *([statistics_resolver] if drift_baseline else []), drift_validator, transform,
        base_node, *([replay_importer] if replay_importer is not None else []),
        trainer, evaluator, pusher,
    ]
    if until is not None:
        last = BUILD_ORDER.index(until)
        components = [c for c in components if BUILD_ORDER.index(c.id) <= last]
    if transform in components:
        # Drift stops the run before Transform and training (unless accepted).
        transform.add_upstream_node(drift_validator)
    return Pipeline(
        pipeline_name=pipeline_name, pipeline_root=pipeline_root, components=components,
        enable_cache=enable_cache, metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=beam_pipeline_args or [])
