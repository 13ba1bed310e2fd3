"""TextExampleGen's executor: text / JSONL files -> tf.Example TFRecords.

Plugs into TFX's `FileBasedExampleGen` (which does the deterministic hash split,
the TFRecord writing and the input fingerprints recorded in ML Metadata); this
file only turns the files of one split pattern into tf.Examples with features:

  text           bytes   the document (UTF-8), "" for a rejected record
  source         bytes   file path relative to the input directory (of its source)
  source_name    bytes   the mixture source's name (`data.sources`), "default" without
  record         int64   record number within that file
  reject_reason  bytes   "" or why the record cannot be used
  repairs        bytes   comma-separated changes made while reading ("" if none)

A mixture (`data.sources` not empty) reads every source's files, whatever the
split pattern TFX passes (create_pipeline gives it the first source's): each source's
path is a file, a directory or a glob (`common.files.split_input_path`), read with
that source's settings (`DataConfig.for_source`), its records tagged with its name.
Without sources, `input_base`/the split pattern are read as one source, "default".

In a supervised fine-tuning run (`data.task = "sft"`, schema
`data/schema/sft_schema.pbtxt`), where `text` is the response:

  prompt         bytes   the prompt rendered by the chat template ("" if rejected)

The chat template and its special tokens come from `data.chat_template` and the
tokenizer of `tokenizer.path` (`chat_template.chat_format`), so an SFT run gives
this component the `tokenizer` section of the config too.

Preference optimization (`data.task = "dpo"`, schema `data/schema/dpo_schema.pbtxt`)
and GRPO (`data.task = "grpo"`, `sft_schema.pbtxt`) records render their prompts the
same way (`sft_chat_format`); `text` is the chosen response (DPO) or the reference
answer (GRPO), and a DPO example adds:

  rejected       bytes   the rejected response ("" if the record is rejected)
"""

from __future__ import annotations

import json
import os
from typing import Any

import apache_beam as beam
import tensorflow as tf
from google.protobuf import json_format, wrappers_pb2
from tfx.components.example_gen import utils as example_gen_utils
from tfx.components.example_gen import write_split
from tfx.components.example_gen.base_example_gen_executor import BaseExampleGenExecutor
from tfx.components.util import examples_utils
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, standard_component_specs

from common.files import file_sha256, special_file_kind, split_input_path
from config import DEFAULT_SOURCE
from corpus.document_record import RECORD_TASKS
from corpus.documents import document_to_example, read_documents
from tokenization.chat_template import chat_format


def _serialize(example) -> bytes:
    return example if isinstance(example, bytes) else example.SerializeToString()


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


def source_inputs(data) -> list[tuple[str, str, str]]:
    """[(source name, input_base, pattern)] of a mixture's sources, in `data.sources`
    order (`common.files.split_input_path` of each path; nothing is listed)."""
    return [(source.name, *split_input_path(source.path, isdir=tf.io.gfile.isdir))
            for source in data.sources]


def list_source_files(name: str, path: str, input_base: str, pattern: str) -> list[str]:
    """The files of one mixture source, sorted; directories are skipped.

    Raises:
      FileNotFoundError: nothing matches (names the source and its path).
    """
    try:
        return list_input_files(input_base, pattern)
    except FileNotFoundError:
        raise FileNotFoundError(f"data source '{name}': no input files match its path "
                                f"{path}") from None


def unpack_custom_config(exec_properties: dict[str, Any]) -> dict[str, Any]:
    """{"pipeline_config": JSON text, "input_fingerprint": {...} or None} of the
    `CustomConfig` packed by `component.make_custom_config`: a StringValue Any holding
    `{"pipeline_config": ..., "input_fingerprint": ...}`, or the PipelineConfig JSON
    itself (the form before mixtures; fingerprint None).

    Raises:
      ValueError: no custom_config.
    """
    custom_config = exec_properties.get(standard_component_specs.CUSTOM_CONFIG_KEY)
    if not custom_config:
        raise ValueError("TextExampleGen needs custom_config with the pipeline config")
    proto = example_gen_pb2.CustomConfig()
    json_format.Parse(custom_config, proto)
    value = wrappers_pb2.StringValue()
    proto.custom_config.Unpack(value)
    packed = json.loads(value.value)
    if isinstance(packed, dict) and set(packed) == {"pipeline_config", "input_fingerprint"}:
        return packed
    return {"pipeline_config": value.value, "input_fingerprint": None}


def config_from_exec_properties(exec_properties: dict[str, Any]):
    """The PipelineConfig packed by `component.make_custom_config` (a JSON string
    inside `CustomConfig.custom_config`, a `google.protobuf.StringValue` Any; either
    form of `unpack_custom_config`)."""
    from config import PipelineConfig

    return PipelineConfig.from_json(unpack_custom_config(exec_properties)["pipeline_config"])


def sft_chat_format(config):
    """The `ChatFormat` of an SFT, DPO or GRPO run: the template of `data.chat_template`, else of the
    tokenizer at `tokenizer.path`, else the default; that tokenizer's BOS/EOS strings
    (DeepSeek's when Transform learns the tokenizer)."""
    tokenizer = None
    if config.tokenizer.path:
        from tokenization.byte_level_bpe import ByteLevelBpe

        tokenizer = ByteLevelBpe.from_file(config.tokenizer.path)
    return chat_format(config.data, tokenizer)


@beam.ptransform_fn
@beam.typehints.with_input_types(beam.Pipeline)
@beam.typehints.with_output_types(tf.train.Example)
def _TextToExample(  # noqa: N802 (TFX naming)
    pipeline: beam.Pipeline, exec_properties: dict[str, Any], split_pattern: str
) -> beam.pvalue.PCollection:
    config = config_from_exec_properties(exec_properties)
    data = config.data
    # (source name, input_base, file) of every file to read.
    if data.sources:
        files = [(name, base, path) for (name, base, pattern), source
                 in zip(source_inputs(data), data.sources, strict=True)
                 for path in list_source_files(name, source.path, base, pattern)]
    else:
        input_base = exec_properties[standard_component_specs.INPUT_BASE_KEY]
        files = [(DEFAULT_SOURCE, input_base, path)
                 for path in list_input_files(input_base, split_pattern)]
    settings = {name: data.for_source(name) for name, _, _ in files}
    # no source sets the task; every record task renders prompts with the chat template
    chat = sft_chat_format(config) if data.task in RECORD_TASKS else None

    def read(item: tuple[str, str, str]):
        name, input_base, path = item
        source = os.path.relpath(path, input_base)
        for doc in read_documents(path, source, settings[name], chat, name):
            yield document_to_example(doc)

    return (
        pipeline
        | "ListFiles" >> beam.Create(files)
        | "Reshuffle" >> beam.Reshuffle()
        | "ReadDocuments" >> beam.FlatMap(read)
    )


def file_fingerprints(files: list[str], input_base: str) -> list[dict[str, Any]]:
    """[{"path", "bytes", "sha256"}] of the input files (streamed, 1 MiB at a time); a
    FIFO, device or socket is not opened: {"path", "bytes": 0, "sha256": "", "refused":
    what it is} (its one record is rejected as `not_a_regular_file`)."""
    out = []
    for path in files:
        kind = special_file_kind(path)
        if kind:
            out.append({"path": os.path.relpath(path, input_base), "bytes": 0, "sha256": "",
                        "refused": kind})
            continue
        out.append({"path": os.path.relpath(path, input_base),
                    "bytes": tf.io.gfile.stat(path).length, "sha256": file_sha256(path)})
    return out


class Executor(BaseExampleGenExecutor):
    """FileBasedExampleGen executor for text, JSONL, CSV and Parquet corpora.

    Besides TFX's own `input_fingerprint` (file count, sizes, mtimes; of the first
    source only in a mixture, whose every source's files `component.make_custom_config`
    fingerprints into the custom config), the Examples artifact records `input_base` and `input_files`: every input
    file's path, size and SHA-256, for lineage (`deepseek-tfx mlmd lineage`).
    """

    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:  # noqa: N802
        return _TextToExample

    def _generate_examples(self, input_dict, output_dict, exec_properties) -> None:
        """`BaseExampleGenExecutor.Do` without the Reshuffle before writing.

        TFX's `WriteSplit` reshuffles every example before writing; on the Beam
        DirectRunner a Reshuffle holds the whole corpus in memory (a 1 GB corpus
        needs ~3 GB more), so it is left out: the hash split is unchanged, the
        Trainer shuffles its input itself, and the files are still read in
        parallel (the file list is reshuffled in `_TextToExample`).
        """
        input_config = example_gen_pb2.Input()
        json_format.Parse(exec_properties[standard_component_specs.INPUT_CONFIG_KEY], input_config)
        output_config = example_gen_pb2.Output()
        json_format.Parse(exec_properties[standard_component_specs.OUTPUT_CONFIG_KEY], output_config)
        examples = artifact_utils.get_single_instance(
            output_dict[standard_component_specs.EXAMPLES_KEY])
        examples.split_names = artifact_utils.encode_split_names(
            example_gen_utils.generate_output_split_names(input_config, output_config))
        with self._make_beam_pipeline() as pipeline:
            splits = self.GenerateExamplesByBeam(pipeline, exec_properties)
            for name, split in splits.items():
                _ = (
                    split
                    | f"Serialize[{name}]" >> beam.Map(_serialize)
                    | f"Write[{name}]" >> beam.io.WriteToTFRecord(
                        os.path.join(artifact_utils.get_split_uri([examples], name),
                                     write_split.DEFAULT_FILE_NAME),
                        file_name_suffix=".gz")
                )
        payload_format = exec_properties.get(standard_component_specs.OUTPUT_DATA_FORMAT_KEY)
        if payload_format:
            examples_utils.set_payload_format(examples, payload_format)
        file_format = exec_properties.get(standard_component_specs.OUTPUT_FILE_FORMAT_KEY)
        if file_format:
            examples_utils.set_file_format(examples, write_split.to_file_format_str(file_format))

    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 (TFX API)
        """Reads the input files into tf.Example TFRecords, one set per split.

        Args:
          input_dict: unused (FileBasedExampleGen has no input channels).
          output_dict: "examples" (one Examples artifact).
          exec_properties: TFX's FileBasedExampleGen properties: "input_base"
            (the input directory), "input_config" and "output_config" (JSON of
            example_gen_pb2.Input / Output: the split patterns, the hash split),
            "custom_config" (the PipelineConfig, see
            `config_from_exec_properties`) and the optional
            "output_data_format" and "output_file_format".

        Writes `examples/Split-<s>/data_tfrecord-*.gz` (the features in the
        module docstring) and sets on `examples` its split names, payload and
        file format, and the custom properties `input_base` and `input_files`
        ([{"path", "bytes", "sha256", "source_name"}] of every input file of every
        source, `file_fingerprints`; "path" relative to its source's directory).

        Raises:
          FileNotFoundError: a split pattern, or a mixture source's path, matches no
            file (names the source and its path).
          ValueError: "custom_config" is missing, or an input file cannot be
            used as configured (plain text in an SFT run, a CSV or Parquet file
            without the configured column, ...).
          OSError: an input file cannot be opened or read.
        """
        self._generate_examples(input_dict, output_dict, exec_properties)
        input_base = exec_properties[standard_component_specs.INPUT_BASE_KEY]
        input_config = example_gen_pb2.Input()
        json_format.Parse(exec_properties[standard_component_specs.INPUT_CONFIG_KEY],
                          input_config)
        data = config_from_exec_properties(exec_properties).data
        if data.sources:
            fingerprints = [
                dict(f, source_name=name)
                for (name, base, pattern), source in zip(source_inputs(data), data.sources,
                                                         strict=True)
                for f in file_fingerprints(list_source_files(name, source.path, base, pattern),
                                           base)]
        else:
            files = sorted({f for split in input_config.splits
                            for f in list_input_files(input_base, split.pattern)})
            fingerprints = [dict(f, source_name=DEFAULT_SOURCE)
                            for f in file_fingerprints(files, input_base)]
        for examples in output_dict[standard_component_specs.EXAMPLES_KEY]:
            examples.set_string_custom_property("input_base", input_base)
            examples.set_json_value_custom_property("input_files", fingerprints)
