"""`deepseek-tfx compile-kfp`: the pipeline as a Kubeflow Pipelines v2 PipelineSpec YAML
(KubeflowV2DagRunner); compiles only, needs no cluster."""

from __future__ import annotations

import argparse

from cli import console
from cli.settings import component_order, config_from_args


def cmd_compile_kfp(args: argparse.Namespace) -> int:
    """Writes the KFP v2 PipelineSpec YAML (KubeflowV2DagRunner); runs nothing."""
    from pipeline.kubeflow_runner import CONTAINER_CORPUS, compile_kfp

    config = config_from_args(args)
    try:
        path = compile_kfp(config, args.output, args.pipeline_root, image=args.image,
                           data=args.data or CONTAINER_CORPUS, serving_model_dir=args.serving_dir,
                           beam_pipeline_args=args.beam_arg or None, until=args.until)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    print(f"KFP v2 pipeline spec: {path}")
    print(f"  image {args.image}, data {args.data or CONTAINER_CORPUS}, "
          f"pipeline root {args.pipeline_root}")
    return 0


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
    console.add_arguments(kfp, "compile-kfp")
    kfp.add_argument("--preset", default="cpu_small", help="tiny | cpu_small | gpu_base")
    kfp.add_argument("--train-steps", type=int, help="override train.train_steps")
    kfp.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field")
    kfp.add_argument("--beam-arg", action="append", metavar="=ARG",
                     help="a Beam pipeline arg for every Beam-based component (--beam-arg=ARG, "
                     "repeatable; default --direct_num_workers=1)")
    kfp.add_argument("--until", choices=component_order(), metavar="COMPONENT",
                     help="compile only up to this component")
    kfp.set_defaults(fn=cmd_compile_kfp)
