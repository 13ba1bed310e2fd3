"""`deepseek-tfx compile-kfp`: the pipeline as a Kubeflow Pipelines v2 PipelineSpec YAML
(KubeflowV2DagRunner); compiles only, needs no cluster."""

from __future__ import annotations

import argparse
import os

from cli import quiet_commands
from cli.settings import component_order, config_from_args, parse_overrides


def cmd_compile_kfp(args: argparse.Namespace) -> int:
    """Writes the KFP v2 PipelineSpec YAML (KubeflowV2DagRunner); runs nothing."""
    check_options(args)
    from pipeline.kubeflow_runner import CONTAINER_CORPUS, compile_kfp

    config = config_from_args(args)
    config, base_model, teacher = models_to_start_from(args, config)
    try:
        path = compile_kfp(config, args.output, args.pipeline_root, image=args.image,
                           data=args.data or CONTAINER_CORPUS, serving_model_dir=args.serving_dir,
                           beam_pipeline_args=args.beam_arg or None, until=args.until,
                           trainer_workers=args.trainer_workers,
                           vertex_project=args.vertex_project or "",
                           vertex_region=args.vertex_region, machine_type=args.machine_type,
                           accelerator_type=args.accelerator_type or "",
                           accelerator_count=args.accelerator_count, retries=args.retries,
                           retry_backoff_s=args.retry_backoff, base_model=base_model,
                           teacher_model=teacher)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    print(f"KFP v2 pipeline spec: {path}")
    print(f"  image {args.image}, data {args.data or CONTAINER_CORPUS}, "
          f"pipeline root {args.pipeline_root}")
    if args.trainer_workers > 1:
        print(f"  Trainer: Vertex AI CustomJob of {args.trainer_workers} workers "
              f"({args.machine_type}) in {args.vertex_project}/{args.vertex_region}")
    return 0


def check_options(args: argparse.Namespace) -> None:
    """Exits with a one-line `error: ...` naming a bad option (before TFX is imported)."""
    if args.trainer_workers < 1:
        raise SystemExit(f"error: --trainer-workers {args.trainer_workers}: must be >= 1")
    if args.trainer_workers > 1 and not args.vertex_project:
        raise SystemExit(f"error: --trainer-workers {args.trainer_workers}: give "
                         f"--vertex-project (the Trainer runs as a Vertex AI CustomJob)")
    if args.trainer_workers == 1:
        given = [option for option, value in (("--vertex-project", args.vertex_project),
                                              ("--accelerator-type", args.accelerator_type),
                                              ("--accelerator-count", args.accelerator_count))
                 if value]
        if given:
            raise SystemExit(f"error: {given[0]}: only with --trainer-workers N > 1 (one "
                             f"worker trains in the pipeline's own task)")
    if args.retries < 0:
        raise SystemExit(f"error: --retries {args.retries}: must be >= 0")
    if args.retry_backoff < 0:
        raise SystemExit(f"error: --retry-backoff {args.retry_backoff}: must be >= 0 seconds")
    if args.base_model == "latest":
        raise SystemExit("error: --base-model latest: not with compile-kfp: the base model's "
                         "architecture and tokenizer are compiled into the spec, and the latest "
                         "blessed model is known only when the pipeline runs; give its "
                         "directory (gs://...)")


def models_to_start_from(args: argparse.Namespace, config):
    """(config, base model, teacher) of `--base-model PATH` and `--teacher PATH`, read
    here through tf.io.gfile (a gs:// URL or a path); exits naming a problem."""
    if not args.base_model and not args.teacher:
        return config, None, None
    from pipeline import warm_start as ws
    from pipeline.pipeline import check_given_tokenizer
    from savedmodel import base_model as base_model_lib

    def located(path: str) -> str:  # a URL as it is, a local path made absolute
        return path if "://" in path else os.path.abspath(path)

    overrides = parse_overrides(args.set or [])
    base = teacher = None
    if args.base_model:
        try:
            base = located(args.base_model)
            config = ws.warm_start_config(config, base, overrides)
            config, _ = check_given_tokenizer(config)
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"error: --base-model {args.base_model}: {e}") from e
    if args.teacher:
        try:
            teacher = base_model_lib.model_dir(located(args.teacher))
            if not base:  # a warm start already has the (same) tokenizer
                config = ws.distillation_config(config, teacher, overrides)
        except (ValueError, FileNotFoundError) as e:
            raise SystemExit(f"error: --teacher {args.teacher}: {e}") from e
    return config, base, teacher


def add_parsers(sub) -> None:
    """Registers `compile-kfp` on `sub`, the top-level parser's `add_subparsers()`."""
    kfp = sub.add_parser("compile-kfp", help="compile the pipeline to a Kubeflow Pipelines v2 "
                         "PipelineSpec YAML (KubeflowV2DagRunner); needs no cluster")
    kfp.add_argument("--output", required=True, metavar="FILE.yaml", help="the YAML to write")
    kfp.add_argument("--pipeline-root", required=True, metavar="URI",
                     help="where the tasks write artifacts, writable from every pod "
                     "(e.g. gs://BUCKET/deepseek-tfx); the spec's defaultPipelineRoot")
    kfp.add_argument("--image", default="deepseek-tfx:latest",
                     help="container image of every task, built from the Dockerfile "
                     "(default deepseek-tfx:latest; push it to a registry the cluster can pull)")
    kfp.add_argument("--data", metavar="GCS_OR_PATH",
                     help="the corpus as the tasks see it: file, glob or directory ending in / "
                     "(default: Tiny Shakespeare baked into the image)")
    kfp.add_argument("--serving-dir", metavar="URI",
                     help="Pusher's destination (default <pipeline-root>/serving)")
    quiet_commands.add_arguments(kfp, "compile-kfp")
    kfp.add_argument("--preset", default="cpu_small", help="a preset name (config/presets.py): tiny, cpu_small, gpu_base, deepseek_v3, the *_v4 presets, ...")
    kfp.add_argument("--train-steps", type=int, help="override train.train_steps")
    kfp.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field")
    kfp.add_argument("--beam-arg", action="append", metavar="=ARG",
                     help="a Beam pipeline arg for every Beam-based component (--beam-arg=ARG, "
                     "repeatable; default --direct_num_workers=1)")
    kfp.add_argument("--until", choices=component_order(), metavar="COMPONENT",
                     help="compile only up to this component")
    kfp.add_argument("--base-model", metavar="PATH",
                     help="warm start from this model directory (gs://... or a path the pods "
                     "can read; its config and tokenizer are read now); 'latest' is refused")
    kfp.add_argument("--teacher", metavar="PATH",
                     help="distil from this model directory (same tokenizer; read now)")
    workers = kfp.add_argument_group(
        "multi-worker Trainer (Vertex AI CustomJob, MultiWorkerMirroredStrategy)")
    workers.add_argument("--trainer-workers", type=int, default=1, metavar="N",
                         help="train on N workers: a CustomJob with a chief pool (1 replica) "
                         "and a worker pool (N-1), TF_CONFIG set by Vertex AI (default 1: the "
                         "Trainer trains in its own task)")
    workers.add_argument("--vertex-project", metavar="PROJECT",
                         help="the Google Cloud project of the CustomJob (needed for N > 1)")
    workers.add_argument("--vertex-region", default="us-central1",
                         help="the CustomJob's region (default us-central1)")
    workers.add_argument("--machine-type", default="n1-standard-8",
                         help="machine_spec.machine_type of every replica (default n1-standard-8)")
    workers.add_argument("--accelerator-type", metavar="TYPE",
                         help="machine_spec.accelerator_type, e.g. NVIDIA_TESLA_T4 (default none)")
    workers.add_argument("--accelerator-count", type=int, default=0, metavar="K",
                         help="accelerators per replica (default 0)")
    kfp.add_argument("--retries", type=int, default=2, metavar="N",
                     help="retry_policy of the Trainer and the Beam-based tasks: retry a failed "
                     "task N times (default 2; 0: never); the Trainer resumes from its "
                     "checkpoints")
    kfp.add_argument("--retry-backoff", type=int, default=60, metavar="SECONDS",
                     help="wait before the first retry, doubled after each (at most 1 h; "
                     "default 60)")
    kfp.set_defaults(fn=cmd_compile_kfp)
