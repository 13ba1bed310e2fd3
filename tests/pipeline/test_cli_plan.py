"""`deepseek-tfx plan`: the design table, one case, a HF config.json, errors; no TensorFlow."""

import json
import pathlib
import subprocess
import sys

import pytest

import cli

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "hf_deepseek_v3"


def test_plan_without_arguments_prints_the_design_table(capsys):
    assert cli.main(["plan"]) == 0
    out = capsys.readouterr().out
    for case in ("7B dense", "65B dense", "175B dense", "V2-Lite 16B", "V3 671B"):
        assert sum(line.startswith(case) for line in out.splitlines()) == 5, case
    # 7B: full fine-tuning does not fit one A100 80 GB; LoRA does.
    rows = {tuple(line.split()[:4]): line for line in out.splitlines() if line.startswith("7B")}
    assert " NO " in rows["7B", "dense", "full", "DP"]
    assert " yes " in rows["7B", "dense", "lora", "r16"]


def test_plan_one_preset(capsys):
    assert cli.main(["plan", "--preset", "cpu_small", "--weights-dtype", "float32",
                     "--compute-dtype", "float32", "--batch", "16", "--seq-len", "128",
                     "--mode", "lora", "--lora-rank", "8", "--memory-gb", "24"]) == 0
    out = capsys.readouterr().out
    assert "cpu_small: 8,479,256 parameters" in out
    assert "fits on 1 x 24 GiB" in out
    assert "time at 40% MFU of 156 TFLOP/s (A100 TF32)" in out


def test_plan_a_hf_config_json(tmp_path, capsys):
    checkpoint = next(p for p in sorted(FIXTURES.iterdir()) if (p / "config.json").exists())
    assert cli.main(["plan", "--config", str(checkpoint), "--mode", "inference",
                     "--seq-len", "16"]) == 0
    assert f"{checkpoint.name}: " in capsys.readouterr().out

    # An FP8 DeepSeek-V3 and a DeepSeek-V2-Lite config.json plan as they are.
    for name in ("hf_deepseek_v3_fp8", "hf_deepseek_v2/v2_lite"):
        assert cli.main(["plan", "--config", str(FIXTURES.parent / name), "--mode", "lora",
                         "--seq-len", "16", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["counts"]["adapters"] > 0

    other = json.loads((checkpoint / "config.json").read_text())
    other["model_type"] = "llama"
    (tmp_path / "config.json").write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="config.json.*model_type='llama'"):
        cli.main(["plan", "--config", str(tmp_path / "config.json")])


def test_plan_errors_name_the_value():
    with pytest.raises(SystemExit, match="--preset 'huge'"):
        cli.main(["plan", "--preset", "huge"])
    with pytest.raises(SystemExit, match="no such file"):
        cli.main(["plan", "--config", "/nonexistent/config.json"])
    with pytest.raises(SystemExit, match="trainable_blocks"):
        cli.main(["plan", "--preset", "tiny", "--mode", "frozen"])
    with pytest.raises(SystemExit, match="--gpu 'Z80'"):
        cli.main(["plan", "--preset", "tiny", "--gpu", "Z80"])


def test_plan_imports_no_tensorflow():
    code = ("import sys, cli; cli.main(['plan']); cli.main(['plan', '--preset', 'deepseek_v3']);"
            " assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
