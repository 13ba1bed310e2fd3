"""DeepSeekConfig: validation, round trips, and import hygiene of models/."""

import ast
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


def test_rope_scaling_not_implemented(tiny_kwargs):
    with pytest.raises(NotImplementedError, match="YaRN"):
        DeepSeekConfig(**tiny_kwargs, rope_scaling={"type": "yarn", "factor": 40})


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
