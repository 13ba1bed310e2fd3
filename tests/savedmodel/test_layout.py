"""`savedmodel.layout`: the files beside a SavedModel, one reader each, and the one rule
for the model's config (the pipeline config when the SavedModel carries one, else
config.json)."""

from __future__ import annotations

import json
import os
import re

import pytest

from config import GenerationConfig, get_config
from models.deepseek import hf_checkpoint
from savedmodel import base_model, layout
from savedmodel.hf_generation import generation_config_to_hf


def _savedmodel(directory, *, pipeline=None, hf=None, generation=None, chat_prompt=None):
    """A directory laid out as a SavedModel (an empty saved_model.pb) with these extras."""
    extra = directory / layout.ASSETS_EXTRA_DIR
    extra.mkdir(parents=True)
    (directory / layout.SAVED_MODEL_FILE).write_bytes(b"")
    for name, value in ((layout.PIPELINE_CONFIG_ASSET, pipeline), (layout.MODEL_CONFIG_NAME, hf),
                        (layout.GENERATION_CONFIG_NAME, generation),
                        (layout.CHAT_PROMPT_ASSET, chat_prompt)):
        if value is not None:
            (extra / name).write_text(json.dumps(value))
    return str(directory)


def test_the_pipeline_config_wins_over_config_json_and_config_json_comes_next(tmp_path):
    pipeline = get_config("tiny")
    theirs = pipeline.model.replace(max_position_embeddings=2 * pipeline.model.max_position_embeddings)
    both = _savedmodel(tmp_path / "both", pipeline=pipeline.to_dict(),
                       hf=hf_checkpoint.config_to_hf(theirs))
    assert layout.read_model_config(both) == pipeline.model
    assert base_model.read_model_config(both) == pipeline.model  # warm start, `generate`'s check
    assert layout.read_pipeline_config(both) == pipeline

    hf_only = _savedmodel(tmp_path / "hf_only", hf=hf_checkpoint.config_to_hf(theirs))
    assert layout.read_model_config(hf_only) == theirs
    assert layout.read_pipeline_config(hf_only) is None

    pipeline_only = _savedmodel(tmp_path / "pipeline_only", pipeline=pipeline.to_dict())
    assert layout.read_model_config(pipeline_only) == pipeline.model

    neither = _savedmodel(tmp_path / "neither")
    with pytest.raises(FileNotFoundError, match="no assets.extra/config.json or assets.extra/"
                                                "deepseek_tfx_config.json; not a deepseek-tfx"):
        layout.read_model_config(neither)


def test_a_broken_config_file_is_named(tmp_path):
    model_dir = _savedmodel(tmp_path / "model")
    path = os.path.join(model_dir, layout.ASSETS_EXTRA_DIR, layout.MODEL_CONFIG_NAME)
    with open(path, "w") as f:
        f.write('{"vocab_size": 512,')
    with pytest.raises(ValueError, match=rf"{re.escape(path)}: not a JSON file \(the SavedModel's model "
                                         r"config\): line 1 column 20"):
        layout.read_model_config(model_dir)


def test_generation_defaults_chat_prompt_and_tokenizer(tmp_path):
    generation = GenerationConfig(max_new_tokens=7, temperature=0.5, top_k=3, top_p=0.9)
    model_dir = _savedmodel(tmp_path / "chat", generation=generation_config_to_hf(generation),
                            chat_prompt={"prefix": "User: ", "suffix": "\nAssistant:"})
    assert layout.read_generation_config(model_dir) == generation
    assert layout.read_hf_generation_config(model_dir)["max_new_tokens"] == 7
    assert layout.read_chat_prompt(model_dir) == ("User: ", "\nAssistant:")
    assert not layout.has_tokenizer(model_dir) and layout.read_tokenizer(model_dir) is None

    plain = _savedmodel(tmp_path / "plain")
    assert layout.read_generation_config(plain) is None
    assert layout.read_hf_generation_config(plain) is None
    assert layout.read_chat_prompt(plain) is None


def test_latest_version_is_the_highest_numbered_savedmodel(tmp_path):
    for version in ("1", "2", "10"):
        (tmp_path / "serving" / version).mkdir(parents=True)
    for version in ("1", "2"):
        (tmp_path / "serving" / version / layout.SAVED_MODEL_FILE).write_bytes(b"")
    (tmp_path / "serving" / "latest").mkdir()  # not a number
    serving = str(tmp_path / "serving")
    # 10 holds no saved_model.pb (a push still being written): not a version yet.
    assert layout.latest_version(serving) == (os.path.join(serving, "2"), 2)
    version_dir = os.path.join(serving, "1")
    assert layout.latest_version(version_dir) == (version_dir, 1)  # a SavedModel itself
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no saved_model.pb and no numbered"):
        layout.latest_version(str(tmp_path / "empty"))
