"""`deepseek-tfx compile-kfp`: the KubeflowV2DagRunner output is a valid KFP v2
PipelineSpec of the same pipeline, runnable in the Dockerfile's image."""

from __future__ import annotations

import re

import pytest
import yaml

import cli

IMAGE = "registry.example/deepseek-tfx:test"
ROOT = "gs://bucket/deepseek-tfx"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    path = tmp_path_factory.mktemp("kfp") / "pipeline.yaml"
    code = cli.main(["compile-kfp", "--output", str(path), "--image", IMAGE,
                     "--pipeline-root", ROOT, "--data", "gs://bucket/corpus/*.txt",
                     "--preset", "tiny", "--beam-arg=--direct_num_workers=2"])
    assert code == 0
    text = path.read_text()
    as_dict = yaml.safe_load(text)
    spec = json_format.ParseDict(as_dict, pipeline_spec_pb2.PipelineSpec())
    return spec, as_dict, text


def test_every_component_is_a_task_of_the_root_dag(compiled):
    from pipeline.pipeline import COMPONENT_ORDER

    spec, _, _ = compiled
    assert spec.pipeline_info.name == "deepseek-tfx"
    assert spec.schema_version == "2.1.0"
    tasks = set(spec.root.dag.tasks)
    # The DriftValidator's baseline resolver is left out on KFP (custom strategy);
    # TFX compiles its LatestBlessedModelStrategy resolver into one task per channel.
    expected = set(COMPONENT_ORDER) - {"latest_blessed_statistics_resolver"}
    missing = {c for c in expected
               if c not in tasks and not any(t.startswith(f"{c}-") for t in tasks)}
    assert not missing, (missing, tasks)
    assert {"latest_blessed_model_resolver-model-resolver",
            "latest_blessed_model_resolver-model-blessing-resolver"} <= tasks
    assert spec.default_pipeline_root == ROOT
    # Tasks depend on their upstream components, as in the TFX DAG.
    assert "TextExampleGen" in spec.root.dag.tasks["StatisticsGen"].dependent_tasks
    assert "Transform" in spec.root.dag.tasks["Trainer"].dependent_tasks


# TFX's and Vertex AI / KFP v2's rule for artifact schema titles.
SCHEMA_TITLE = re.compile(r"^[a-z][a-z0-9-_]{2,20}[.][A-Z][a-zA-Z0-9-_]{2,49}$")


def test_artifact_types_are_valid_kfp_v2_schema_titles(compiled):
    spec, _, _ = compiled
    titles = set()
    for component in spec.components.values():
        for definitions in (component.input_definitions, component.output_definitions):
            for artifact in definitions.artifacts.values():
                # TFX writes each type as an instance schema whose title names it.
                kind = artifact.artifact_type.WhichOneof("kind")
                assert kind == "instance_schema", artifact
                titles.add(yaml.safe_load(artifact.artifact_type.instance_schema)["title"])
            for name, parameter in definitions.parameters.items():
                assert parameter.parameter_type, name  # schema 2.1: typed parameters
    assert titles and all(SCHEMA_TITLE.fullmatch(t) for t in titles), titles
    assert all(t.startswith("tfx.") for t in titles), titles
    assert {"tfx.Examples", "tfx.ExampleStatistics", "tfx.TransformGraph", "tfx.Model",
            "tfx.ModelBlessing", "tfx.PushedModel"} <= titles


def test_tasks_run_the_project_image_and_in_image_paths(compiled):
    from pipeline.kubeflow_runner import CONTAINER_SCHEMA_FILE

    _, as_dict, text = compiled
    executors = as_dict["deploymentSpec"]["executors"]
    containers = [e["container"] for e in executors.values() if "container" in e]
    assert containers and all(c["image"] == IMAGE for c in containers)
    # The custom executors and functions are imported from the installed project.
    for dotted in ("components.text_example_gen.executor.Executor",
                   "components.text_cleaner.executor.Executor",
                   "components.drift_validator.executor.Executor",
                   "components.lm_evaluator.executor.Executor",
                   "components.transform.preprocessing.preprocessing_fn",
                   "components.trainer.run_fn.run_fn"):
        assert dotted in text, dotted
    assert CONTAINER_SCHEMA_FILE in text
    assert "/work/" not in text and "/tmp/" not in text  # no path of this machine
    assert "gs://bucket/corpus" in text and "--direct_num_workers=2" in text


def test_compile_kfp_names_what_is_wrong(tmp_path, capsys):
    with pytest.raises(SystemExit, match="must end in .yaml"):
        cli.main(["compile-kfp", "--output", str(tmp_path / "p.json"), "--pipeline-root", ROOT])
    with pytest.raises(SystemExit):
        cli.main(["compile-kfp", "--output", str(tmp_path / "p.yaml")])
    assert "--pipeline-root" in capsys.readouterr().err
    from pipeline.kubeflow_runner import DRIFT_BASELINE_RESOLVER

    with pytest.raises(SystemExit, match="not compiled for KFP"):
        cli.main(["compile-kfp", "--output", str(tmp_path / "p.yaml"), "--pipeline-root", ROOT,
                  "--until", DRIFT_BASELINE_RESOLVER])


def test_split_remote_path():
    from pipeline.kubeflow_runner import split_remote_path

    assert split_remote_path("gs://b/c/x.txt") == ("gs://b/c", "x.txt")
    assert split_remote_path("gs://b/c/") == ("gs://b/c", "*")
    assert split_remote_path("/data/*.jsonl") == ("/data", "*.jsonl")
    with pytest.raises(ValueError, match="glob may only be in the file name"):
        split_remote_path("gs://b/*/x.txt")
