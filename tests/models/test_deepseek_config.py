"""DeepSeekConfig: validation, round trips, and import hygiene of models/."""

import ast
import math
import pathlib
import subprocess
import sys

import pytest

from models.deepseek.config import DeepSeekConfig

MODELS_DIR = pathlib.Path(__file__).resolve().parents[2] / "models"


def test_defaults_are_valid_and_derived_sizes(tiny_kwargs):
    config = DeepSeekConfig()
    assert config.qk_head_dim == config.qk_nope_head_dim + config.qk_rope_head_dim
    tiny = DeepSeekConfig(**tiny_kwargs)
    assert tiny.qk_head_dim == 12
    assert not tiny.is_moe_layer(0) and tiny.is_moe_layer(1) and tiny.is_moe_layer(2)


def test_round_trip(tiny_kwargs):
    config = DeepSeekConfig(**tiny_kwargs)
    assert DeepSeekConfig.from_dict(config.to_dict()) == config
    assert DeepSeekConfig.from_dict({"hidden_size": 64}).hidden_size == 64
    changed = config.replace(q_lora_rank=None, aux_loss_alpha=0.0)
    assert changed.q_lora_rank is None and changed.aux_loss_alpha == 0.0
    assert config.q_lora_rank == 16  # frozen original untouched


def test_unknown_keys_are_named(tiny_kwargs):
    with pytest.raises(ValueError, match="hidden_act"):
        DeepSeekConfig.from_dict({**tiny_kwargs, "hidden_act": "silu"})


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"hidden_size": 0}, "hidden_size"),
        ({"vocab_size": -1}, "vocab_size"),
        ({"num_hidden_layers": 2.5}, "num_hidden_layers"),
        ({"q_lora_rank": 0}, "q_lora_rank"),
        ({"qk_rope_head_dim": 3}, "qk_rope_head_dim"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"n_group": 3}, "n_routed_experts"),
        ({"topk_group": 5}, "topk_group"),
        ({"num_experts_per_tok": 5, "topk_group": 2}, "num_experts_per_tok"),
        ({"first_k_dense_replace": 3}, "first_k_dense_replace"),
        ({"rms_norm_eps": 0.0}, "rms_norm_eps"),
        ({"attention_dropout": 1.0}, "attention_dropout"),
        ({"mtp_loss_weight": -0.1}, "mtp_loss_weight"),
        ({"norm_topk_prob": 1}, "norm_topk_prob"),
        ({"num_nextn_predict_layers": -1}, "num_nextn_predict_layers"),
    ],
)
def test_validation_names_field_and_value(tiny_kwargs, changes, field):
    with pytest.raises(ValueError, match=field):
        DeepSeekConfig(**{**tiny_kwargs, **changes})


def test_rope_scaling_is_validated_and_canonical(tiny_config):
    yarn = tiny_config.replace(rope_scaling={"type": "yarn", "factor": 40})
    assert yarn.rope_scaling["rope_type"] == "yarn"
    # Missing keys take HF's defaults; original_max_position_embeddings defaults
    # to max_position_embeddings.
    assert yarn.rope_scaling["beta_fast"] == 32 and yarn.rope_scaling["beta_slow"] == 1
    assert yarn.rope_scaling["original_max_position_embeddings"] == 32
    assert DeepSeekConfig.from_dict(yarn.to_dict()) == yarn
    assert tiny_config.replace(rope_scaling={"rope_type": "default"}).rope_scaling is None
    with pytest.raises(ValueError, match="linear"):
        tiny_config.replace(rope_scaling={"type": "linear", "factor": 2})
    with pytest.raises(ValueError, match="factor"):
        tiny_config.replace(rope_scaling={"type": "yarn", "factor": 0.5})
    with pytest.raises(ValueError, match="bogus"):
        tiny_config.replace(rope_scaling={"type": "yarn", "factor": 2, "bogus": 1})


def test_yarn_frequencies_and_scales_by_hand():
    from models.layers import rope_scaling as yarn

    # dim 8, theta 10000, factor 4, original 16, beta_fast 32, beta_slow 1:
    #   correction_dim(r) = 8 * ln(16 / (2 pi r)) / (2 ln 10000)
    #   low  = floor(correction_dim(32)) = floor(-1.099...) = -2 -> clamped to 0
    #   high = ceil(correction_dim(1))   = ceil(0.406...)  = 1
    #   ramp_i = clip(i / 1, 0, 1) = [0, 1, 1, 1]
    #   inv_freq = [1, 10000^-0.25 / 4, 10000^-0.5 / 4, 10000^-0.75 / 4]
    s = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
         "mscale": 1.0, "mscale_all_dim": 1.0}
    canonical = yarn.normalize_rope_scaling(s, 64)
    expected = [1.0, 10000**-0.25 / 4, 10000**-0.5 / 4, 10000**-0.75 / 4]
    assert yarn.inv_freq(8, 10000.0, canonical) == pytest.approx(expected, rel=1e-12)
    assert yarn.inv_freq(8, 10000.0, None) == pytest.approx([10000 ** (-i / 4) for i in range(4)])
    # mscale(4, 1) = 0.1 ln 4 + 1 = 1.1386...; attention factor = mscale / mscale = 1;
    # softmax scale = 24^-0.5 * 1.1386^2.
    m = 0.1 * math.log(4) + 1
    assert yarn.attention_factor(canonical) == pytest.approx(1.0)
    assert yarn.softmax_scale(24, canonical) == pytest.approx(24**-0.5 * m * m)
    # Without mscale_all_dim: cos/sin carry mscale(4) and the softmax scale is plain.
    plain = yarn.normalize_rope_scaling({"type": "yarn", "factor": 4.0}, 64)
    assert yarn.attention_factor(plain) == pytest.approx(m)
    assert yarn.softmax_scale(24, plain) == pytest.approx(24**-0.5)


def test_deepseek_v3_preset_has_671b_parameters_and_37b_activated():
    from models.deepseek.deepseek_presets import deepseek_v3_config
    from models.deepseek.flops import activated_params, total_params

    c = deepseek_v3_config()
    # DeepSeek-V3 report: 671B total, 37B activated per token (MTP module excluded;
    # HF's 685B adds the 14B MTP module, whose embedding and head copies we share).
    assert total_params(c.replace(num_nextn_predict_layers=0)) == 671_026_419_200
    assert 36.5e9 < activated_params(c) < 37.5e9
    assert c.rope_scaling["factor"] == 40 and c.q_lora_rank == 1536


def test_router_fields_default_to_deepseek_v3_and_refuse_other_pairs_by_name():
    c = DeepSeekConfig()
    assert (c.topk_method, c.scoring_func, c.seq_aux, c.uses_router_bias) == (
        "noaux_tc", "sigmoid", True, True)
    for method in ("greedy", "group_limited_greedy"):
        v2 = c.replace(topk_method=method, scoring_func="softmax")
        assert not v2.uses_router_bias and DeepSeekConfig.from_dict(v2.to_dict()) == v2
    cases = [
        (dict(topk_method="noaux_tc", scoring_func="softmax"),
         r"scoring_func='softmax' with topk_method='noaux_tc' is not supported"),
        (dict(topk_method="greedy", scoring_func="sigmoid"),
         r"scoring_func='sigmoid' with topk_method='greedy'"),
        (dict(topk_method="gready", scoring_func="softmax"), r"topk_method='gready' is not supported"),
        (dict(topk_method="group_limited_greedy", scoring_func="sigmoid"),
         r"scoring_func='sigmoid' with topk_method='group_limited_greedy'"),
        (dict(seq_aux=False), r"seq_aux=False with topk_method='noaux_tc'"),
        (dict(seq_aux=1), r"seq_aux=1 must be a bool"),
    ]
    for changes, message in cases:
        with pytest.raises(ValueError, match=message):
            c.replace(**changes)
    # greedy ignores groups (as HF does); group_limited_greedy needs enough experts in them.
    greedy = c.replace(topk_method="greedy", scoring_func="softmax", n_group=4, topk_group=1,
                       num_experts_per_tok=4)
    assert greedy.num_experts_per_tok == 4
    with pytest.raises(ValueError, match="num_experts_per_tok=4 must be <= topk_group"):
        greedy.replace(topk_method="group_limited_greedy")


def test_deepseek_v2_presets_have_their_published_sizes():
    from models.deepseek.deepseek_presets import deepseek_preset
    from models.deepseek.flops import activated_params, total_params

    lite = deepseek_preset("deepseek_v2_lite")
    # DeepSeek-V2-Lite model card: 15.7B total, 2.4B activated.
    assert round(total_params(lite) / 1e9, 1) == 15.7
    assert 2.35e9 < activated_params(lite) < 2.5e9
    assert (lite.topk_method, lite.q_lora_rank, lite.n_routed_experts) == ("greedy", None, 64)
    assert lite.num_nextn_predict_layers == 0 and not lite.uses_router_bias
    v2 = deepseek_preset("deepseek_v2")
    # DeepSeek-V2 (arXiv 2405.04434): 236B total, 21B activated.
    assert round(total_params(v2) / 1e9) == 236
    assert 20.5e9 < activated_params(v2) < 21.5e9
    assert (v2.topk_method, v2.n_group, v2.topk_group, v2.routed_scaling_factor) == (
        "group_limited_greedy", 8, 3, 16.0)


def test_models_never_import_tfx_beam_or_transform():
    forbidden = {"tfx", "apache_beam", "tensorflow_transform"}
    for path in MODELS_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in forbidden, f"{path} imports {name}"
            for name in names:
                assert not name.startswith("tensorflow.keras"), f"{path} imports {name}"


def test_config_and_package_import_without_tensorflow():
    code = (
        "import sys, models.deepseek\n"
        "from models.deepseek import DeepSeekConfig, total_params\n"
        "total_params(DeepSeekConfig())\n"
        "bad = {'tensorflow', 'keras', 'tfx', 'apache_beam', 'tensorflow_transform'}\n"
        "print(sorted(bad & set(sys.modules)))\n"
    )
    root = MODELS_DIR.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"
