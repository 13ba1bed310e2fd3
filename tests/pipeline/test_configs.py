"""The typed config: presets, overrides, validation, JSON round trip."""

from __future__ import annotations

import pytest

from pipeline import configs


@pytest.mark.parametrize("name", sorted(configs.PRESETS))
def test_presets_build_and_round_trip(name):
    config = configs.get_config(name)
    assert config.preset == name
    assert configs.PipelineConfig.from_json(config.to_json()) == config
    assert config.model.vocab_size == config.tokenizer.vocab_size


def test_overrides_apply_and_keep_vocab_in_step():
    config = configs.get_config("tiny", {"train.train_steps": 7, "tokenizer.vocab_size": 600})
    assert config.train.train_steps == 7
    assert config.model.vocab_size == 600


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"train.nope": 1}, "unknown config key 'train.nope'"),
        ({"nope": 1}, "unknown config key 'nope'"),
        ({"train.batch_size": 0}, "train.batch_size=0 must be > 0"),
        ({"data.document_boundary": "page"}, "data.document_boundary='page'"),
        ({"train.seq_len": 4096}, "exceeds model.max_position_embeddings"),
        ({"model.vocab_size": 999}, "must equal tokenizer.vocab_size"),
    ],
)
def test_bad_overrides_name_key_and_value(overrides, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        configs.get_config("tiny", overrides)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        configs.get_config("huge")
