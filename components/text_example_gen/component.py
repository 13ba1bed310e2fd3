"""TextExampleGen: TFX's FileBasedExampleGen with the text/JSONL executor.

The standard component keeps what TFX users expect: input fingerprints and spans
in ML Metadata, the `Examples` artifact with `train`/`eval` splits, gzipped
TFRecords. The split is deterministic: a hash of the `text` feature picks the
bucket, so exact duplicates land in the same split.
"""

from __future__ import annotations

from google.protobuf import any_pb2, wrappers_pb2
from tfx.components import FileBasedExampleGen
from tfx.dsl.components.base import executor_spec
from tfx.proto import example_gen_pb2

from components.text_example_gen import executor
from config import PipelineConfig


def make_custom_config(config: PipelineConfig) -> example_gen_pb2.CustomConfig:
    packed = any_pb2.Any()
    packed.Pack(wrappers_pb2.StringValue(value=config.to_json()))
    return example_gen_pb2.CustomConfig(custom_config=packed)


def TextExampleGen(  # noqa: N802 (a component factory, named like one)
    input_base: str, input_pattern: str, config: PipelineConfig
) -> FileBasedExampleGen:
    """Builds the ExampleGen for a text corpus.

    Args:
      input_base: directory holding the corpus.
      input_pattern: glob relative to input_base (a file name, or `*`).
      config: the pipeline config (document boundary, split buckets, ...).

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
                partition_feature_name="text",
            )
        ),
        custom_config=make_custom_config(config),
        custom_executor_spec=executor_spec.BeamExecutorSpec(executor.Executor),
    ).with_id("TextExampleGen")
