"""A run with a given tokenizer (a warm start keeps the base model's: every DPO and GRPO
run, and SFT from an SFT model) reads every text feature it encodes.

tf.Transform decides which raw features the transform is fed from a trace in which the
analyzers' values are not known yet (`tft.get_transform_input_columns`); a copied
tokenizer's analyzer reads no feature, so the ids of that trace must still depend on the
prompt (and the rejected response): else TFX's Transform fails with "Unexpected output
keys requested: {'input_ids', 'prompt_length'}".
"""

from __future__ import annotations

import pytest
import tensorflow as tf
import tensorflow_transform as tft

from components.transform import preprocessing
from config import get_config
from tokenization.tokenizer import learn


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tokenizer")
    learn({"23+58=": 5, "81": 5, "床前明月光": 5}, 300).write(str(d))
    return str(d)


@pytest.mark.parametrize("task, features", [
    ("pretrain", ["text"]),
    ("sft", ["text", "prompt"]),
    ("grpo", ["text", "prompt"]),
    ("dpo", ["text", "prompt", "rejected"]),
])
def test_every_encoded_feature_is_a_transform_input(tokenizer_dir, task, features):
    config = get_config("tiny", {"data.task": task, "tokenizer.path": tokenizer_dir})
    spec = {name: tf.TensorSpec([None, 1], tf.string)
            for name in [*features, "source_name", "record_id_unused"]}

    def preprocessing_fn(inputs):
        return preprocessing.preprocessing_fn(inputs, {"pipeline_config": config.to_json()})

    columns = set(tft.get_transform_input_columns(preprocessing_fn, spec))
    assert set(features) <= columns, (task, sorted(columns))
    assert "record_id_unused" not in columns
