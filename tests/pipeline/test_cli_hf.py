"""`deepseek-tfx hf-import` / `hf-export` on the HF fixtures (no pipeline run)."""

import pathlib

import numpy as np
import pytest

import cli

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v3"


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_hf_import_then_export_with_the_cli(tmp_path, capsys):
    import tensorflow as tf

    fixture = FIXTURES / "no_q_lora"
    assert cli.main(["hf-import", str(fixture), str(tmp_path / "saved")]) == 0
    assert "signatures logits" in capsys.readouterr().out
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    logits = loaded.signatures["logits"](
        input_ids=tf.constant(np.load(fixture / "input_ids.npy")))["logits"].numpy()
    assert np.abs(logits - np.load(fixture / "expected_logits.npy")).max() <= 1e-4
    assert cli.main(["hf-export", str(tmp_path / "saved"), str(tmp_path / "hf"),
                     "--config-form", "4.x", "--dtype", "bfloat16"]) == 0
    config = (tmp_path / "hf" / "config.json").read_text()
    assert '"rope_scaling"' in config and '"torch_dtype": "bfloat16"' in config


def test_hf_import_errors_name_the_problem(tmp_path):
    with pytest.raises(SystemExit, match="config.json"):
        cli.main(["hf-import", str(tmp_path), str(tmp_path / "out")])
    (tmp_path / "config.json").write_text('{"hidden_act": "gelu"}')
    with pytest.raises(SystemExit, match="hidden_act='gelu'"):
        cli.main(["hf-import", str(tmp_path), str(tmp_path / "out")])
