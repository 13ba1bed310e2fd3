"""The V4-style presets and the V4 model section of the pipeline config (issue 41)."""

from __future__ import annotations

import json
import re

import pytest

import config as configs
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config

V4_PRESETS = ("tiny_v4", "cpu_small_v4", "gpu_base_v4")


@pytest.mark.parametrize("name", V4_PRESETS)
def test_v4_presets_are_their_v3_preset_with_a_v4_model(name):
    config, base = configs.get_config(name), configs.get_config(name.removesuffix("_v4"))
    assert isinstance(config.model, DeepSeekV4Config) and config.is_v4()
    assert not base.is_v4()
    # The V3 preset's width and vocabulary, every V4 piece present.
    assert config.model.hidden_size == base.model.hidden_size
    assert config.model.vocab_size == base.model.vocab_size == config.tokenizer.vocab_size
    assert set(config.model.layer_types) >= {CSA, HCA} and config.model.hc_mult > 1
    assert config.model.mlp_layer_types[0] == "hash_moe"
    # Only what the preset names differs from the V3 preset outside the model.
    changed = configs.presets.V4_PRESETS[name][1]
    for section in ("data", "tokenizer", "eval", "validation", "generation", "serve"):
        assert getattr(config, section) == getattr(base, section), section
    for field, value in vars(config.train).items():
        assert value == changed.get("train", {}).get(field, getattr(base.train, field)), field


@pytest.mark.parametrize("name", V4_PRESETS)
def test_the_v4_model_section_round_trips_and_says_its_model_type(name):
    config = configs.get_config(name)
    d = json.loads(config.to_json())
    assert d["model"]["model_type"] == "deepseek_v4"
    assert configs.PipelineConfig.from_json(config.to_json()) == config
    assert "model_type" not in configs.get_config("tiny").to_dict()["model"]


def test_v4_fields_take_overrides_in_their_declared_types():
    config = configs.get_config("tiny_v4", {
        "model.hc_mult": "3", "model.layer_types": json.dumps([SLIDING, CSA, CSA]),
        "model.compress_rates": json.dumps({CSA: 2, HCA: 8})})
    assert config.model.hc_mult == 3
    assert config.model.layer_types == (SLIDING, CSA, CSA)
    assert config.model.compress_rates == {CSA: 2, HCA: 8}


@pytest.mark.parametrize("overrides, message", [
    ({"model.layer_types": json.dumps([SLIDING] * 4)},
     "model.layer_types has 4 entries, must equal num_hidden_layers=3"),
    ({"model.hc_mult": 0}, "model.hc_mult=0 must be an integer >= 1"),
    ({"model.index_topk": 9}, "model.index_topk=9 exceeds the 8 compressed entries a "
                              "train.seq_len=32 sequence has in a CSA layer"),
    ({"train.seq_len": 12}, "model.index_topk=4 exceeds the 3 compressed entries"),
    ({"model.mlp_layer_types": json.dumps(["hash_moe", "moe", "dense"])}, "mlp_layer_types"),
    ({"model.model_type": "deepseek_v5"}, "model.model_type='deepseek_v5' is not known"),
    ({"model.kv_lora_rank": 8}, "unknown config key 'model.kv_lora_rank'"),
    ({"model.attn_implementation": "flash"},
     "model.attn_implementation='flash' is not supported; choose one of ['sparse', 'dense']"),
    ({"train.prune_keep_experts": 1}, "train.prune_keep_experts=1 must be in "
                                      "[num_experts_per_tok=2, n_routed_experts=8]"),
])
def test_bad_v4_fields_are_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        configs.get_config("tiny_v4", overrides)


def test_a_v3_section_refuses_v4_fields_by_name():
    with pytest.raises(ValueError, match=re.escape("unknown config key 'model.hc_mult'")):
        configs.get_config("tiny", {"model.hc_mult": 2})


def test_the_long_context_preset_is_cpu_small_v4_with_the_released_attention():
    """cpu_long_v4: window 128, CSA 4 (top-128 of a 4,096-token sequence's 1,024 entries),
    HCA 128, the release's compress-rope YaRN (x16 from 65,536), 131,072 positions."""
    config, small = configs.get_config("cpu_long_v4"), configs.get_config("cpu_small_v4")
    m = config.model
    assert (m.sliding_window, m.compress_rates, m.index_topk) == (128, {CSA: 4, HCA: 128}, 128)
    assert m.max_position_embeddings == 131072 and m.attn_implementation == "sparse"
    assert (m.rope_scaling["factor"], m.rope_scaling["original_max_position_embeddings"]) == (
        16.0, 65536)
    assert m.index_topk <= config.train.seq_len // 4 // 8
    assert (config.train.seq_len, config.train.batch_size) == (4096, 1)
    unchanged = ("sliding_window", "compress_rates", "index_topk", "max_position_embeddings",
                 "rope_scaling")
    assert m.replace(**{f: getattr(small.model, f) for f in unchanged}) == small.model


def test_a_v3_section_takes_attn_implementation_and_refuses_an_unknown_one_by_name():
    config = configs.get_config("tiny", {"model.attn_implementation": "dense"})
    assert config.model.attn_implementation == "dense"
    with pytest.raises(ValueError, match=re.escape(
            "model.attn_implementation='flash' is not supported; choose one of "
            "['sparse', 'dense']")):
        configs.get_config("tiny", {"model.attn_implementation": "flash"})
