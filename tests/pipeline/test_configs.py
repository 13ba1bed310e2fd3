"""The typed config: presets, overrides, validation, JSON round trip."""

from __future__ import annotations

import pytest

import config as configs


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


@pytest.mark.parametrize("key, value, message", [
    ("train.learning_rate", "abc", r"train\.learning_rate='abc': expected a finite number"),
    ("train.train_steps", -3, r"train\.train_steps=-3 must be > 0"),
    ("train.train_steps", "many", r"train\.train_steps='many': expected an integer"),
    ("data.normalization", "XYZ", r"data\.normalization='XYZ' must be one of"),
    ("train.recompute_activations", "yes", r"train\.recompute_activations='yes': expected true"),
    ("model.q_lora_rank", "x", r"model\.q_lora_rank='x': expected an integer or none"),
    ("eval.max_bits_per_byte", "nan", r"eval\.max_bits_per_byte='nan': expected a finite"),
])
def test_overrides_are_parsed_into_the_declared_type_or_refused_by_name(key, value, message):
    with pytest.raises(ValueError, match=message):
        configs.get_config("tiny", {key: value})


def test_overrides_given_as_text_take_the_declared_type():
    c = configs.get_config("tiny", {"train.train_steps": "12", "train.learning_rate": "3e-4",
                                    "train.recompute_activations": "True",
                                    "model.q_lora_rank": "none", "data.csv_text_column": 123})
    assert c.train.train_steps == 12 and c.train.learning_rate == 3e-4
    assert c.train.recompute_activations is True and c.model.q_lora_rank is None
    assert c.data.csv_text_column == "123"


def test_a_config_file_with_a_wrong_type_is_refused_by_name():
    d = configs.get_config("tiny").to_dict()
    d["train"]["learning_rate"] = "fast"
    with pytest.raises(ValueError, match=r"train\.learning_rate='fast'"):
        configs.PipelineConfig.from_dict(d)
    assert configs.PipelineConfig.from_json(configs.get_config("tiny").to_json()) == \
        configs.get_config("tiny")


@pytest.mark.parametrize("setting", ["train.learning_rate=abc", "train.train_steps=-3",
                                     "data.normalization=XYZ"])
def test_cli_refuses_a_bad_set_with_one_line_naming_the_key(setting, capsys):
    import cli

    with pytest.raises(SystemExit) as info:
        cli.main(["run", "--preset", "tiny", "--set", setting])
    message = str(info.value.code)
    assert message.startswith("error: ") and "\n" not in message
    assert setting.split("=")[0] in message


def test_parse_set_reads_json_values_or_keeps_the_text():
    from config import parse_set

    assert parse_set(["train.learning_rate=3e-4", " data.normalization =NFKC",
                      "train.lora_targets=[\"q\", \"kv\"]", "data.redact_pii=true"]) == {
        "train.learning_rate": 3e-4, "data.normalization": "NFKC",
        "train.lora_targets": ["q", "kv"], "data.redact_pii": True}
    with pytest.raises(ValueError, match=r"--set 'train.learning_rate': expected SECTION.FIELD=VALUE"):
        parse_set(["train.learning_rate"])
