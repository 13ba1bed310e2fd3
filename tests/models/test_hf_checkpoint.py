"""HF checkpoint interop: config.json forms, safetensors round trips, bad checkpoints."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek import hf_checkpoint
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.deepseek.deepseek_presets import deepseek_v3_config
from models.formats.expert_slice import ExpertSlice

YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
        "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}


def _ids(batch=2, seq=12, vocab=64, seed=0):
    return tf.constant(np.random.default_rng(seed).integers(0, vocab, (batch, seq)), tf.int32)


def _model_with_biases(config, seed=0):
    keras.utils.set_random_seed(seed)
    model = DeepSeekCausalLM(config)
    rng = np.random.default_rng(seed)
    for moe in model.moe_layers:  # non-zero router biases: they must travel too
        bias = moe.gate.e_score_correction_bias
        bias.assign(rng.normal(0, 0.1, bias.shape).astype("float32"))
    return model


@pytest.mark.parametrize("form", ["4.x", "5.x"])
def test_config_json_both_forms_round_trip(tiny_kwargs, form):
    config = DeepSeekConfig(**{**tiny_kwargs, "rope_scaling": YARN})
    hf = hf_checkpoint.config_to_hf(config, form)
    if form == "5.x":
        assert "rope_scaling" not in hf and hf["rope_parameters"]["rope_type"] == "yarn"
        assert hf["rope_parameters"]["rope_theta"] == config.rope_theta
    else:
        assert "rope_parameters" not in hf and hf["rope_scaling"]["type"] == "yarn"
    assert hf_checkpoint.config_from_hf(json.loads(json.dumps(hf))) == config
    plain = DeepSeekConfig(**tiny_kwargs)
    assert hf_checkpoint.config_from_hf(hf_checkpoint.config_to_hf(plain, form)) == plain


def test_released_deepseek_v3_config_json_reads():
    # The fields of deepseek-ai/DeepSeek-V3's config.json, FP8 quantization removed.
    released = {
        "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": False,
        "attention_dropout": 0.0, "aux_loss_alpha": 0.0001, "bos_token_id": 0,
        "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu",
        "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
        "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
        "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8,
        "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
        "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
        "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "pretraining_tp": 1,
        "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
                         "type": "yarn"},
        "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
        "seq_aux": True, "tie_word_embeddings": False, "topk_group": 4,
        "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": True,
        "v_head_dim": 128, "vocab_size": 129280,
    }
    assert hf_checkpoint.config_from_hf(released) == deepseek_v3_config()
    fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128],
           "activation_scheme": "dynamic"}
    assert hf_checkpoint.config_from_hf({**released, "quantization_config": fp8}) == (
        deepseek_v3_config())
    # (an unsupported quantization_config is refused when the weights are opened:
    # tests/models/test_fp8_checkpoint.py, test_hostile_checkpoints.py)
    with pytest.raises(hf_checkpoint.CheckpointError, match="hidden_act='gelu'"):
        hf_checkpoint.config_from_hf({**released, "hidden_act": "gelu"})


# DeepSeek-V2-Lite's config.json (deepseek-ai/DeepSeek-V2-Lite), auto_map left out.
V2_LITE_CONFIG_JSON = {
    "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": False,
    "attention_dropout": 0.0, "aux_loss_alpha": 0.001, "bos_token_id": 100000,
    "eos_token_id": 100001, "first_k_dense_replace": 1, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 10944,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
    "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
    "n_shared_experts": 2, "norm_topk_prob": False, "num_attention_heads": 16,
    "num_experts_per_tok": 6, "num_hidden_layers": 27, "num_key_value_heads": 16,
    "pretraining_tp": 1, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
    "seq_aux": True, "tie_word_embeddings": False, "topk_group": 1, "topk_method": "greedy",
    "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": True,
    "v_head_dim": 128, "vocab_size": 102400,
}


def test_released_deepseek_v2_lite_config_json_reads():
    from models.deepseek.deepseek_presets import deepseek_preset

    config = hf_checkpoint.config_from_hf(V2_LITE_CONFIG_JSON)
    assert config == deepseek_preset("deepseek_v2_lite")
    for form in ("4.x", "5.x"):
        hf = json.loads(json.dumps(hf_checkpoint.config_to_hf(config, form)))
        assert hf["model_type"] == "deepseek_v2"
        assert hf["architectures"] == ["DeepseekV2ForCausalLM"]
        assert (hf["topk_method"], hf["scoring_func"], hf["seq_aux"]) == (
            "greedy", "softmax", True)
        assert hf_checkpoint.config_from_hf(hf) == config
    v2 = deepseek_preset("deepseek_v2")
    assert hf_checkpoint.config_from_hf(hf_checkpoint.config_to_hf(v2)) == v2
    # transformers 5.x may write n_group / topk_group as null with "greedy".
    nulls = {**V2_LITE_CONFIG_JSON, "n_group": None, "topk_group": None}
    assert hf_checkpoint.config_from_hf(nulls) == config


@pytest.mark.parametrize("key, value, message", [
    ("scoring_func", "sigmoid", r"scoring_func='sigmoid' with model_type 'deepseek_v2'"),
    ("topk_method", "noaux_tc", r"topk_method='noaux_tc' with model_type 'deepseek_v2'"),
    ("topk_method", "gready", r"topk_method='gready'"),
    ("moe_layer_freq", 2, r"moe_layer_freq=2 with model_type 'deepseek_v2'"),
    ("norm_topk_prob", True, r"norm_topk_prob=True with model_type 'deepseek_v2'"),
    ("num_nextn_predict_layers", 1, r"num_nextn_predict_layers=1"),
    ("mlp_bias", True, r"mlp_bias=True"),
    ("model_type", "llama", r"model_type='llama'"),
])
def test_unsupported_deepseek_v2_configs_are_refused_by_name(key, value, message):
    with pytest.raises(hf_checkpoint.CheckpointError, match=message):
        hf_checkpoint.config_from_hf({**V2_LITE_CONFIG_JSON, key: value})
    glg = {**V2_LITE_CONFIG_JSON, "topk_method": "group_limited_greedy", "n_group": None}
    with pytest.raises(hf_checkpoint.CheckpointError, match="n_group=None"):
        hf_checkpoint.config_from_hf(glg)


def test_v2_configs_deepseek_v2_cannot_express_are_not_exported(tiny_config):
    v2 = tiny_config.replace(topk_method="greedy", scoring_func="softmax", n_group=1,
                             topk_group=1, norm_topk_prob=False, num_nextn_predict_layers=0)
    hf_checkpoint.config_to_hf(v2)
    for changes in (dict(norm_topk_prob=True), dict(num_nextn_predict_layers=1),
                    dict(rope_interleave=False)):
        name = next(iter(changes))
        with pytest.raises(ValueError, match=f"{name}=.* model_type 'deepseek_v2' needs"):
            hf_checkpoint.config_to_hf(v2.replace(**changes))


def test_v3_config_json_is_written_as_before(tiny_config):
    hf = hf_checkpoint.config_to_hf(tiny_config)
    assert hf["model_type"] == "deepseek_v3" and hf["architectures"] == ["DeepseekV3ForCausalLM"]
    assert (hf["topk_method"], hf["scoring_func"]) == ("noaux_tc", "sigmoid")
    assert "seq_aux" not in hf and "mlp_bias" not in hf and hf["rope_interleave"] is True


def test_weight_map_covers_every_variable_once(tiny_config):
    model = DeepSeekCausalLM(tiny_config)
    mapped = hf_checkpoint.hf_weight_map(model)
    ids = [id(v) for v, _ in mapped.values() if not isinstance(v, ExpertSlice)]
    assert len(ids) == len(set(ids))
    # A routed expert is a slice of a stacked kernel, each (kernel, expert) named once.
    slices = [(id(v.projection), v.expert) for v, _ in mapped.values()
              if isinstance(v, ExpertSlice)]
    assert len(slices) == len(set(slices)) == 2 * 3 * tiny_config.n_routed_experts
    covered = {id(hf_checkpoint.stored_variable(v)) for v, _ in mapped.values()}
    assert len(covered) == len(model.weights)
    assert "model.layers.1.mlp.gate.e_score_correction_bias" in mapped
    assert "model.layers.2.eh_proj.weight" in mapped  # MTP at num_hidden_layers
    assert "model.layers.0.mlp.gate_proj.weight" in mapped  # first_k_dense_replace = 1


@pytest.mark.parametrize("shard_bytes", [10**9, 60_000])
def test_save_load_round_trip_keeps_logits(tmp_path, tiny_kwargs, shard_bytes):
    config = DeepSeekConfig(**{**tiny_kwargs, "rope_scaling": YARN})
    model = _model_with_biases(config)
    files = hf_checkpoint.save_hf_checkpoint(model, str(tmp_path), max_shard_bytes=shard_bytes)
    if shard_bytes < 10**9:
        assert len(files) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    else:
        assert [f.split("/")[-1] for f in files] == ["model.safetensors"]
    loaded = hf_checkpoint.load_hf_checkpoint(str(tmp_path))
    ids = _ids()
    np.testing.assert_array_equal(loaded(ids).numpy(), model(ids).numpy())
    out, ref = loaded.forward_train(ids), model.forward_train(ids)
    np.testing.assert_array_equal(out["mtp_logits"][0].numpy(), ref["mtp_logits"][0].numpy())
    for a, b in zip(loaded.moe_layers, model.moe_layers, strict=True):
        np.testing.assert_array_equal(a.gate.e_score_correction_bias.numpy(),
                                      b.gate.e_score_correction_bias.numpy())


def test_bad_checkpoints_are_named(tmp_path, tiny_config):
    from safetensors.tensorflow import load_file, save_file

    model = _model_with_biases(tiny_config)
    hf_checkpoint.save_hf_checkpoint(model, str(tmp_path))
    path = str(tmp_path / "model.safetensors")
    tensors = load_file(path)

    wrong = dict(tensors)
    wrong["model.layers.0.self_attn.o_proj.weight"] = tf.zeros([3, 3])
    save_file(wrong, path, metadata={"format": "pt"})
    with pytest.raises(hf_checkpoint.CheckpointError, match=r"o_proj.weight has shape \(3, 3\)"):
        hf_checkpoint.load_hf_checkpoint(str(tmp_path))

    missing = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    save_file(missing, path, metadata={"format": "pt"})
    with pytest.raises(hf_checkpoint.CheckpointError, match="missing.*model.norm.weight"):
        hf_checkpoint.load_hf_checkpoint(str(tmp_path))

    extra = {**tensors, "model.layers.9.mlp.gate.weight": tf.zeros([8, 32])}
    save_file(extra, path, metadata={"format": "pt"})
    with pytest.raises(hf_checkpoint.CheckpointError, match="no place.*layers.9"):
        hf_checkpoint.load_hf_checkpoint(str(tmp_path))

    with pytest.raises(FileNotFoundError, match="config.json"):
        hf_checkpoint.load_hf_checkpoint(str(tmp_path / "nowhere"))
