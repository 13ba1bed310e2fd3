"""Thin runner: compiles the pipeline for Kubeflow Pipelines v2 (KubeflowV2DagRunner).

`compile_kfp(...)` writes a KFP v2 PipelineSpec YAML of the same
`create_pipeline(...)`; nothing runs here and no cluster is needed. Every task
runs in one container image (the repository's `Dockerfile`), which holds the
project at `CONTAINER_PROJECT_DIR`: the custom components and the
`preprocessing_fn`/`run_fn` are referenced by dotted path and import from
there, and the curated schema is read from `CONTAINER_SCHEMA_FILE`.

One difference from the local runners: the DriftValidator gets no baseline (its
resolver strategy is custom, which KubeflowV2DagRunner cannot compile), so it
records the text profile of each run but compares it with none.

`trainer_workers=N > 1` trains on N MultiWorkerMirroredStrategy workers as a
Vertex AI CustomJob (`components/trainer/vertex.py`: a chief pool of 1 replica and a
worker pool of N - 1, TF_CONFIG set by Vertex AI in each). Checkpoints go to
`<pipeline_root>/Trainer/checkpoints/<fingerprint>`, which every worker, and every
retry, reads. The Trainer and the Beam-based tasks get a KFP `retry_policy` (TFX's
compiler writes none; `add_retry_policies` patches the spec), so a failed or
preempted Trainer resumes from its last checkpoint.

Submit the YAML with the KFP SDK (`kfp.Client().create_run_from_pipeline_package`)
or as a Vertex AI `PipelineJob(template_path=...)`.
"""

from __future__ import annotations

import itertools
import os
import posixpath

import yaml  # PyYAML: TFX's own YAML writer (a dependency of tfx and kfp)

from config import PIPELINE_NAME, PipelineConfig

# Where the Dockerfile copies and installs the project (its WORKDIR).
CONTAINER_PROJECT_DIR = "/opt/deepseek-tfx"
CONTAINER_SCHEMA_FILE = posixpath.join(CONTAINER_PROJECT_DIR, "data", "schema", "schema.pbtxt")
# Tiny Shakespeare, downloaded into the image by the Dockerfile.
CONTAINER_CORPUS = posixpath.join(CONTAINER_PROJECT_DIR, "data", "corpora", "tinyshakespeare.txt")
DEFAULT_IMAGE = "deepseek-tfx:latest"
# Left out on KFP (see `compile_kfp`).
DRIFT_BASELINE_RESOLVER = "latest_blessed_statistics_resolver"
TRAINER = "Trainer"
# KFP v2 task retries (PipelineTaskSpec.retry_policy): wait RETRY_BACKOFF_S, then x2
# after each failure, at most RETRY_MAX_BACKOFF_S.
DEFAULT_RETRIES = 2
RETRY_BACKOFF_S = 60
RETRY_BACKOFF_FACTOR = 2.0
RETRY_MAX_BACKOFF_S = 3600


def split_remote_path(data: str) -> tuple[str, str]:
    """`gs://bucket/dir/file.txt` or a path -> (input_base, pattern) for ExampleGen.

    A glob's directory and pattern; `.../dir/` (trailing slash) -> every file
    in dir; anything else is one file. Nothing is checked: the path must exist
    where the pipeline runs, not here.

    Raises:
      ValueError: `data` is empty, or a glob in a directory name.
    """
    if not data:
        raise ValueError("data: empty path")
    if data.endswith("/"):
        base, pattern = data.rstrip("/"), "*"
    else:
        base, pattern = posixpath.split(data)
    if any(ch in base for ch in "*?["):
        raise ValueError(f"data {data!r}: a glob may only be in the file name, not in {base!r}")
    if not base:
        raise ValueError(f"data {data!r}: give a directory, e.g. gs://BUCKET/corpus/{pattern}")
    return base, pattern


def compile_kfp(
    config: PipelineConfig,
    output_file: str,
    pipeline_root: str,
    image: str = DEFAULT_IMAGE,
    data: str = CONTAINER_CORPUS,
    serving_model_dir: str | None = None,
    beam_pipeline_args: list[str] | None = None,
    until: str | None = None,
    schema_path: str = CONTAINER_SCHEMA_FILE,
    trainer_workers: int = 1,
    vertex_project: str = "",
    vertex_region: str = "us-central1",
    machine_type: str = "n1-standard-8",
    accelerator_type: str = "",
    accelerator_count: int = 0,
    retries: int = DEFAULT_RETRIES,
    retry_backoff_s: int = RETRY_BACKOFF_S,
    base_model: str | None = None,
    teacher_model: str | None = None,
) -> str:
    """Writes the KFP v2 PipelineSpec YAML of the pipeline to `output_file`.

    Args:
      config: the PipelineConfig, compiled into the components' parameters.
      output_file: the YAML to write (`.yaml` or `.yml`).
      pipeline_root: where the tasks write artifacts, a location every task's
        pod can write (e.g. `gs://BUCKET/deepseek-tfx`); recorded as the spec's
        `defaultPipelineRoot` (a run may override it).
      image: the container image of every task (built from the Dockerfile).
      data: the corpus as seen from inside the tasks: a file, a glob or a
        directory ending in `/` (default: the copy baked into the image).
      serving_model_dir: Pusher's destination (default `<pipeline_root>/serving`).
      beam_pipeline_args: for every Beam-based component (default
        `local_runner.DEFAULT_BEAM_PIPELINE_ARGS`, DirectRunner in the task's pod).
      until: compile only up to this component id.
      schema_path: the curated schema inside the image.
      trainer_workers: N > 1 trains on N workers, a Vertex AI CustomJob
        (`components.trainer.vertex`) in `vertex_project`/`vertex_region`, every
        replica on `machine_type` with `accelerator_count` x `accelerator_type`.
      retries: the `retry_policy.max_retry_count` of the Trainer and the Beam-based
        tasks (0: none), the first retry after `retry_backoff_s` seconds.
      base_model: warm start from this model directory (readable here and from the
        pods, e.g. gs://...), brought in by an Importer; `config` must already
        carry its architecture and tokenizer (`pipeline/warm_start.py`).
      teacher_model: a distillation teacher's directory (same rule).

    Returns:
      The path written.

    Raises:
      ValueError: `output_file` is not YAML, `data` is not a usable path,
        `until` names the component left out on KFP, `base_model` is "latest",
        trainer_workers < 1, retries < 0, or a Vertex AI option is missing or
        wrong (`vertex.custom_config`).
    """
    _check_kfp_options(output_file, until, base_model, trainer_workers, retries,
                       retry_backoff_s)
    input_base, input_pattern = split_remote_path(data)
    vertex_training = None
    if trainer_workers > 1:
        from components.trainer import vertex

        vertex_training = vertex.custom_config(trainer_workers, image, vertex_project,
                                               vertex_region, machine_type, accelerator_type,
                                               accelerator_count)
    pipeline = _kfp_pipeline(config, pipeline_root, input_base, input_pattern, serving_model_dir,
                             beam_pipeline_args, until, schema_path, trainer_workers,
                             base_model, teacher_model, vertex_training)
    return _write_kfp_spec(pipeline, output_file, image, pipeline_root, retries,
                           retry_backoff_s)


def _check_kfp_options(output_file: str, until: str | None, base_model: str | None,
                       trainer_workers: int, retries: int, retry_backoff_s: int) -> None:
    """Refuses the options `compile_kfp` cannot compile.

    Raises:
      ValueError: `output_file` is not YAML, `until` names the component left out on
        KFP, `base_model` is "latest", trainer_workers < 1, or retries < 0 or
        retry_backoff_s < 0.
    """
    if not output_file.endswith((".yaml", ".yml")):
        raise ValueError(f"output {output_file!r}: must end in .yaml or .yml (KFP v2 YAML)")
    if until == DRIFT_BASELINE_RESOLVER:
        raise ValueError(f"until={until!r}: that resolver is not compiled for KFP "
                         "(a custom resolver strategy); stop at TextCleaner or DriftValidator")
    if base_model == "latest":
        raise ValueError("base_model='latest': not with compile-kfp: the config (the base "
                         "model's architecture and tokenizer) is compiled into the spec, but "
                         "the latest blessed model is known only when the pipeline runs; "
                         "give its directory (gs://...)")
    if trainer_workers < 1:
        raise ValueError(f"trainer_workers={trainer_workers}: must be >= 1")
    if retries < 0 or retry_backoff_s < 0:
        raise ValueError(f"retries={retries}, retry_backoff_s={retry_backoff_s}: must be >= 0")


def _kfp_pipeline(config: PipelineConfig, pipeline_root: str, input_base: str,
                  input_pattern: str, serving_model_dir: str | None,
                  beam_pipeline_args: list[str] | None, until: str | None, schema_path: str,
                  trainer_workers: int, base_model: str | None, teacher_model: str | None,
                  vertex_training: dict | None):
    """The `create_pipeline(...)` of `compile_kfp`'s arguments, as KFP runs it: no ML
    Metadata connection (KFP records it), no drift baseline, checkpoints under the
    pipeline root.

    Raises:
      ValueError, FileNotFoundError: see `create_pipeline`.
    """
    from pipeline.local_runner import DEFAULT_BEAM_PIPELINE_ARGS
    from pipeline.pipeline import create_pipeline

    return create_pipeline(
        pipeline_name=PIPELINE_NAME,
        pipeline_root=pipeline_root,
        input_base=input_base,
        input_pattern=input_pattern,
        serving_model_dir=serving_model_dir or posixpath.join(pipeline_root, "serving"),
        config=config,
        metadata_connection_config=None,  # KFP records ML Metadata itself
        beam_pipeline_args=list(beam_pipeline_args or DEFAULT_BEAM_PIPELINE_ARGS),
        schema_path=schema_path,
        until=until,
        # KFP v2 compiles only TFX's built-in resolver strategies, not the
        # DriftValidator's baseline resolver: drift is profiled, not compared.
        drift_baseline=False,
        num_workers=trainer_workers,
        base_model=base_model,
        teacher_model=teacher_model,
        # Under the pipeline root, not under one run's outputs: a retry of the task, and
        # the next run of the same data and config, resume from the last checkpoint.
        checkpoint_root=posixpath.join(pipeline_root, TRAINER, "checkpoints"),
        vertex_training=vertex_training,
    )


def _write_kfp_spec(pipeline, output_file: str, image: str, pipeline_root: str, retries: int,
                    retry_backoff_s: int) -> str:
    """Compiles `pipeline` with KubeflowV2DagRunner into `output_file` (made absolute, its
    directory created), with `pipeline_root` as the spec's `defaultPipelineRoot` and
    `retries` retries of the Trainer and the Beam-based tasks (`add_retry_policies`).

    Returns:
      The absolute path written.
    """
    from tfx.v1.orchestration import experimental

    retried = [c.id for c in pipeline.components if c.id == TRAINER or _uses_beam(c)]
    output_file = os.path.abspath(output_file)
    runner = experimental.KubeflowV2DagRunner(
        # Pipeline spec schema 2.1.0, what kfp-pipeline-spec > 0.1.13 and the KFP 2
        # SDK write (parameters typed by `parameterType`).
        config=experimental.KubeflowV2DagRunnerConfig(default_image=image,
                                                      use_pipeline_spec_2_1=True),
        output_dir=os.path.dirname(output_file),
        output_filename=os.path.basename(output_file),
    )
    os.makedirs(os.path.dirname(output_file), exist_ok=True)
    # TFX writes the YAML (a comment header, then the PipelineSpec) and returns
    # the PipelineJob it came from.
    job = runner.run(pipeline, write_out=True)
    # TFX keeps the pipeline root in the PipelineJob's runtime config, which the
    # YAML form (the PipelineSpec alone) leaves out; KFP reads it from here.
    spec = job["pipelineSpec"]
    spec["defaultPipelineRoot"] = pipeline_root
    if retries:
        add_retry_policies(spec, retried, retries, retry_backoff_s)
    _rewrite_spec(output_file, spec, f"{PIPELINE_NAME}: compiled by deepseek-tfx compile-kfp")
    return output_file


def _uses_beam(component) -> bool:
    """Whether TFX runs the component's executor with a Beam pipeline."""
    from tfx.dsl.components.base import base_beam_executor, executor_spec

    spec = getattr(component, "executor_spec", None)  # none on an Importer, a Resolver
    return (isinstance(spec, executor_spec.BeamExecutorSpec)
            or (isinstance(spec, executor_spec.ExecutorClassSpec)
                and issubclass(spec.executor_class, base_beam_executor.BaseBeamExecutor)))


def add_retry_policies(spec: dict, tasks: list[str], retries: int,
                       backoff_s: int = RETRY_BACKOFF_S) -> None:
    """Sets `retryPolicy` (KFP v2 PipelineTaskSpec.retry_policy, what the KFP SDK's
    `set_retry` writes) on `tasks` of the root DAG of `spec`, a PipelineSpec as a dict:
    `retries` retries, the first after `backoff_s` seconds, then x RETRY_BACKOFF_FACTOR,
    at most RETRY_MAX_BACKOFF_S.

    Raises:
      KeyError: a name in `tasks` is not a task of the root DAG.
    """
    dag = spec["root"]["dag"]["tasks"]
    for name in tasks:
        dag[name]["retryPolicy"] = {
            "maxRetryCount": retries,
            "backoffDuration": f"{backoff_s}s",
            "backoffFactor": RETRY_BACKOFF_FACTOR,
            "backoffMaxDuration": f"{max(RETRY_MAX_BACKOFF_S, backoff_s)}s",
        }


def _rewrite_spec(path: str, spec: dict, description: str) -> None:
    """Rewrites the YAML TFX wrote at `path` with `spec` and `description`.

    Keeps TFX's comment header (pipeline name, inputs, outputs) but for its
    `# Description:` line, and dumps `spec` the way TFX does (`yaml.dump_all`,
    keys sorted), so the file is TFX's own with our two changes.
    """
    with open(path) as f:
        header = list(itertools.takewhile(lambda line: line.startswith("#"), f))
    header = [f"# Description: {description}\n" if line.startswith("# Description:") else line
              for line in header]
    with open(path, "w") as f:
        f.writelines(header)
        yaml.dump_all([spec], f, sort_keys=True)
