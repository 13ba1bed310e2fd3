"""TextExampleGen: TFX's FileBasedExampleGen with the text/JSONL executor.

The standard component keeps what TFX users expect: input fingerprints and spans
in ML Metadata, the `Examples` artifact with `train`/`eval` splits, gzipped
TFRecords. The split is deterministic: a hash of the `text` feature picks the
bucket, so exact duplicates land in the same split.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import tensorflow as tf
from google.protobuf import any_pb2, wrappers_pb2
from tfx.components import FileBasedExampleGen
from tfx.dsl.components.base import executor_spec
from tfx.proto import example_gen_pb2

from components.text_example_gen import executor
from config import PipelineConfig


def sources_fingerprint(config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """{source name: {"path", "num_files", "total_bytes", "digest"}} of a mixture's
    sources: "digest" is the SHA-256 of every file's (path, size, mtime in ns), like
    TFX's input fingerprint but of every source, so that editing any source's files
    changes the component's exec properties (and re-runs it). Nothing is opened; a
    source without files gets num_files 0 (the executor refuses it, naming it).
    {} without sources (TFX's own fingerprint covers input_base/pattern)."""
    out = {}
    for (name, base, pattern), source in zip(executor.source_inputs(config.data),
                                             config.data.sources, strict=True):
        digest, total, files = hashlib.sha256(), 0, 0
        for path in sorted(tf.io.gfile.glob(os.path.join(base, pattern))):
            if tf.io.gfile.isdir(path):
                continue
            stat = tf.io.gfile.stat(path)
            digest.update(f"{path}\t{stat.length}\t{stat.mtime_nsec}\n".encode())
            total, files = total + stat.length, files + 1
        out[name] = {"path": source.path, "num_files": files, "total_bytes": total,
                     "digest": digest.hexdigest()}
    return out


def make_custom_config(config: PipelineConfig) -> example_gen_pb2.CustomConfig:
    """The config as ExampleGen's `CustomConfig` (a StringValue Any holding
    `{"pipeline_config": the PipelineConfig JSON, "input_fingerprint":
    sources_fingerprint(config)}`; `executor.unpack_custom_config` also reads the older
    form, the PipelineConfig JSON alone). The one-source case has this form too, with
    {} as fingerprint: its exec properties differ from those of the runs before
    `source_name`, so their cached examples (without it, an anomaly to the schema) are
    not reused."""
    text = json.dumps({"pipeline_config": config.to_json(),
                       "input_fingerprint": sources_fingerprint(config)}, sort_keys=True)
    packed = any_pb2.Any()
    packed.Pack(wrappers_pb2.StringValue(value=text))
    return example_gen_pb2.CustomConfig(custom_config=packed)


def partition_feature(config: PipelineConfig) -> str:
    """The feature the train/eval split hashes: the text of a pretraining document (exact
    duplicates fall into the same split); the rendered prompt of an SFT, DPO or GRPO
    record, so that a held-out prompt is held out with every response to it, and the
    same prompts are held out in an SFT run and in the DPO or GRPO run that follows it
    (their records render a prompt alike)."""
    return "text" if config.data.task == "pretrain" else "prompt"


def TextExampleGen(  # noqa: N802 (a component factory, named like one)
    input_base: str, input_pattern: str, config: PipelineConfig
) -> FileBasedExampleGen:
    """Builds the ExampleGen for a text corpus.

    Args:
      input_base: directory holding the corpus (a mixture: the first source's).
      input_pattern: glob relative to input_base (a file name, or `*`).
      config: the pipeline config (document boundary, split buckets, ...); with
        `data.sources`, every source is read (`executor`) and fingerprinted
        (`make_custom_config`).

    Returns:
      A `FileBasedExampleGen` with id `TextExampleGen`; output `examples`.
    """
    data = config.data
    return FileBasedExampleGen(
        input_base=input_base,
        input_config=example_gen_pb2.Input(
            splits=[example_gen_pb2.Input.Split(name="all", pattern=input_pattern)]
        ),
        output_config=example_gen_pb2.Output(
            split_config=example_gen_pb2.SplitConfig(
                splits=[
                    example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=data.train_buckets),
                    example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=data.eval_buckets),
                ],
                partition_feature_name=partition_feature(config),
            )
        ),
        custom_config=make_custom_config(config),
        custom_executor_spec=executor_spec.BeamExecutorSpec(executor.Executor),
    ).with_id("TextExampleGen")
