"""An SFT run's wiring: `--task sft`, the schema picked by `data.task`, the chat
template pinned into the config, and the sections ExampleGen and Transform get.

Nothing runs a pipeline (creating one imports TFX, ~40 s).
"""

from __future__ import annotations

import json

import cli


def _components(config):
    from pipeline.pipeline import create_pipeline

    return {c.id: c for c in create_pipeline(
        pipeline_name="p", pipeline_root="/tmp/root", input_base="/tmp/in", input_pattern="*",
        serving_model_dir="/tmp/serving", config=config).components}


def _transform_config(component) -> dict:
    value = component.exec_properties["custom_config"]
    value = json.loads(value) if isinstance(value, str) else value
    return json.loads(value["pipeline_config"])


def test_cli_task_sets_data_task():
    args = cli.build_parser().parse_args(["run", "--preset", "tiny", "--task", "sft"])
    assert cli.config_from_args(args).data.task == "sft"
    args = cli.build_parser().parse_args(["run", "--preset", "tiny"])
    assert cli.config_from_args(args).data.task == "pretrain"


def test_sft_pipeline_schema_template_and_sections():
    from components.text_example_gen.executor import config_from_exec_properties
    from config import get_config
    from pipeline.pipeline import SCHEMA_FILE, SFT_SCHEMA_FILE
    from tokenization.chat_template import DEFAULT_CHAT_TEMPLATE

    sft = _components(get_config("tiny", {"data.task": "sft",
                                          "tokenizer.min_frequency": 3}))
    assert sft["ImportSchemaGen"].exec_properties["schema_file"] == SFT_SCHEMA_FILE
    example_gen = config_from_exec_properties(sft["TextExampleGen"].exec_properties)
    assert example_gen.data.task == "sft"
    assert example_gen.data.chat_template == DEFAULT_CHAT_TEMPLATE  # pinned
    assert example_gen.tokenizer.min_frequency == 3  # ExampleGen gets the tokenizer section
    transform = _transform_config(sft["Transform"])
    assert transform["data"]["chat_template"] == DEFAULT_CHAT_TEMPLATE
    assert transform["tokenizer"]["min_frequency"] == 3

    pretrain = _components(get_config("tiny", {"tokenizer.min_frequency": 3}))
    assert pretrain["ImportSchemaGen"].exec_properties["schema_file"] == SCHEMA_FILE
    example_gen = config_from_exec_properties(pretrain["TextExampleGen"].exec_properties)
    assert (example_gen.data.chat_template, example_gen.tokenizer.min_frequency) == ("", 2)
    assert _transform_config(pretrain["Transform"])["data"]["task"] == "pretrain"


def test_sft_schema_is_the_pretraining_schema_plus_prompt():
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import schema_pb2

    from pipeline.pipeline import SCHEMA_FILE, SFT_SCHEMA_FILE

    def features(path):
        with open(path, encoding="utf-8") as f:
            schema = text_format.Parse(f.read(), schema_pb2.Schema())
        return {f.name: f for f in schema.feature}

    plain, sft = features(SCHEMA_FILE), features(SFT_SCHEMA_FILE)
    assert set(sft) == set(plain) | {"prompt"}
    assert all(sft[name] == plain[name] for name in plain)
    assert sft["prompt"].type == schema_pb2.BYTES
