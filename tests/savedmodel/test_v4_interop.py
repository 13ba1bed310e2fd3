"""DeepSeek-V4 through `deepseek-tfx hf-import` / `hf-export` (logits SavedModels).

The checkpoints are tests/fixtures/hf_deepseek_v4/ (made with transformers 5.24 by its
`make_fixtures.py`): `tiny/` in transformers' save_pretrained names (bf16), and the same
weights as DeepSeek publishes V4-Flash (`released_fp8_mxfp4/`: FP8 linears with e8m0
block scales, MXFP4 routed experts) and V4-Flash-Base (`released_fp8/`). Each imports as
a SavedModel whose `logits` signature matches transformers' float32 logits within 1e-4
on 2 x 300 tokens (every branch: the sliding window 16, CSA with index_topk 8 of 75
entries, HCA with 2 closed windows); exporting it writes save_pretrained's names, dtypes
and config.json, which imports again to the same logits. DeepSeek-V4.1 is refused in
one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import cli

# Slow: each test writes SavedModels through the CLI (14-19 s); the same parity runs in
# the fast tier through the loader (tests/models/test_hf_v4_parity.py).
pytestmark = pytest.mark.slow

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v4"
TOLERANCE = 1e-4


def _run(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(args)) == 0
    return out.getvalue()


def _logits(saved_model: pathlib.Path, input_ids: np.ndarray) -> np.ndarray:
    loaded = tf.saved_model.load(str(saved_model))
    return loaded.signatures["logits"](input_ids=tf.constant(input_ids, tf.int32))[
        "logits"].numpy()


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("v4") / "saved"
    _run("hf-import", str(FIXTURES / "tiny"), str(out), "--dtype", "float32")
    return out


def test_import_logits_match_transformers(imported):
    expected = np.load(FIXTURES / "tiny" / "logits.npy")
    logits = _logits(imported, np.load(FIXTURES / "tiny" / "input_ids.npy"))
    assert logits.shape == expected.shape == (2, 300, 512)
    assert np.abs(logits - expected).max() <= TOLERANCE
    config = json.loads((imported / "assets.extra" / "config.json").read_text())
    assert config["model_type"] == "deepseek_v4"


@pytest.mark.parametrize("name", ["released_fp8_mxfp4", "released_fp8"])
def test_released_formats_import_dequantized(name, tmp_path):
    out = tmp_path / "saved"
    _run("hf-import", str(FIXTURES / name), str(out), "--dtype", "float32")
    expected = np.load(FIXTURES / name / "logits.npy")
    logits = _logits(out, np.load(FIXTURES / name / "input_ids.npy"))
    assert np.abs(logits - expected).max() <= TOLERANCE, name


def test_export_writes_save_pretrained_names_and_imports_back(imported, tmp_path):
    exported = tmp_path / "hf"
    _run("hf-export", str(imported), str(exported))
    from safetensors import safe_open

    with safe_open(str(exported / "model.safetensors"), "np") as f:
        written = {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype())
                   for name in f.keys()}
    expected = {}
    for line in (FIXTURES / "tiny" / "names.txt").read_text().splitlines():
        name, shape, _ = line.split("\t") if "\t" in line else line.split(maxsplit=2)
        expected[name] = shape
    assert set(written) == set(expected)
    config = json.loads((exported / "config.json").read_text())
    assert config["model_type"] == "deepseek_v4"
    assert config["architectures"] == ["DeepseekV4ForCausalLM"]
    again = tmp_path / "again"
    _run("hf-import", str(exported), str(again), "--dtype", "float32")
    input_ids = np.load(FIXTURES / "tiny" / "input_ids.npy")
    np.testing.assert_array_equal(_logits(again, input_ids), _logits(imported, input_ids))


def test_v41_is_refused_in_one_line(tmp_path):
    checkpoint = tmp_path / "v41"
    checkpoint.mkdir()
    config = json.loads((FIXTURES / "tiny" / "config.json").read_text())
    config["model_type"] = "deepseek_v41"
    (checkpoint / "config.json").write_text(json.dumps(config))
    (checkpoint / "model.safetensors").symlink_to(FIXTURES / "tiny" / "model.safetensors")
    with pytest.raises(SystemExit) as raised:
        cli.main(["hf-import", str(checkpoint), str(tmp_path / "out")])
    message = str(raised.value)
    assert "\n" not in message
    assert "deepseek_v41" in message and "V4.1" in message and "Engram" in message
    assert not (tmp_path / "out").exists()
