"""TextExampleGen's executor: text / JSONL files -> tf.Example TFRecords.

Plugs into TFX's `FileBasedExampleGen` (which does the deterministic hash split,
the TFRecord writing and the input fingerprints recorded in ML Metadata); this
file only turns the files of one split pattern into tf.Examples with features:

  text           bytes   the document (UTF-8), "" for a rejected record
  source         bytes   file path relative to the input directory
  record         int64   record number within that file
  reject_reason  bytes   "" or why the record cannot be used
  repairs        bytes   comma-separated changes made while reading ("" if none)
"""

from __future__ import annotations

import os
from typing import Any

import apache_beam as beam
import tensorflow as tf
from google.protobuf import json_format, wrappers_pb2
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
from tfx.proto import example_gen_pb2
from tfx.types import standard_component_specs

from components.text_example_gen.documents import Document, read_documents


def document_to_example(doc: Document) -> tf.train.Example:
    return tf.train.Example(
        features=tf.train.Features(
            feature={
                "text": _bytes_feature(doc.text.encode("utf-8")),
                "source": _bytes_feature(doc.source.encode("utf-8")),
                "record": tf.train.Feature(int64_list=tf.train.Int64List(value=[doc.record])),
                "reject_reason": _bytes_feature(doc.reject_reason.encode("utf-8")),
                "repairs": _bytes_feature(",".join(doc.repairs).encode("utf-8")),
            }
        )
    )


def _bytes_feature(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def list_input_files(input_base: str, split_pattern: str) -> list[str]:
    """Files matching the pattern, sorted; directories are skipped.

    Raises:
      FileNotFoundError: nothing matches (names the pattern).
    """
    pattern = os.path.join(input_base, split_pattern)
    files = sorted(p for p in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(p))
    if not files:
        raise FileNotFoundError(f"no input files match {pattern}")
    return files


def config_from_exec_properties(exec_properties: dict[str, Any]):
    """The PipelineConfig packed by `component.make_custom_config` (a JSON string
    inside `CustomConfig.custom_config`, a `google.protobuf.StringValue` Any)."""
    from pipeline.configs import PipelineConfig

    custom_config = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    if not custom_config:
        raise ValueError("TextExampleGen needs custom_config with the pipeline config")
    proto = example_gen_pb2.CustomConfig()
    json_format.Parse(custom_config, proto)
    value = wrappers_pb2.StringValue()
    proto.custom_config.Unpack(value)
    return PipelineConfig.from_json(value.value)


@beam.ptransform_fn
@beam.typehints.with_input_types(beam.Pipeline)
@beam.typehints.with_output_types(tf.train.Example)
def _TextToExample(  # noqa: N802 (TFX naming)
    pipeline: beam.Pipeline, exec_properties: dict[str, Any], split_pattern: str
) -> beam.pvalue.PCollection:
    config = config_from_exec_properties(exec_properties)
    input_base = exec_properties[standard_component_specs.INPUT_BASE_KEY]
    files = list_input_files(input_base, split_pattern)
    data = config.data

    def read(path: str):
        source = os.path.relpath(path, input_base)
        for doc in read_documents(path, source, data):
            yield document_to_example(doc)

    return (
        pipeline
        | "ListFiles" >> beam.Create(files)
        | "Reshuffle" >> beam.Reshuffle()
        | "ReadDocuments" >> beam.FlatMap(read)
    )


class Executor(BaseExampleGenExecutor):
    """FileBasedExampleGen executor for plain text and JSONL corpora."""

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802
        return _TextToExample
