"""Logit parity with transformers 5.24's `DeepseekV4ForCausalLM` (PyTorch), and export.

The fixtures under tests/fixtures/hf_deepseek_v4/ were made offline by its
`make_fixtures.py` (see its docstring and each `fixture.json`): `tiny/` is a random
5-layer V4 (sliding / CSA / HCA / CSA / HCA, hash-MoE then top-k MoE) saved by
`save_pretrained` in bf16, with transformers' float32 logits on 2 x 300 tokens; the
`released_*` folders hold the same weights in DeepSeek's release layout (FP8 / MXFP4).
Here only TensorFlow runs: each checkpoint is imported with `load_v4_checkpoint` and its
logits must match to 1e-4. The export test writes the model back with
`save_hf_checkpoint`: the names and dtypes must be save_pretrained's (names.txt), and the
written checkpoint must load to the same logits. (That transformers' `from_pretrained`
reads the export to the same logits was checked with transformers itself, offline.)
"""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from models.deepseek_v4.hf_checkpoint import load_v4_checkpoint, save_hf_checkpoint

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v4"
TINY = FIXTURES / "tiny"
TOLERANCE = 1e-4


def _need(path: pathlib.Path) -> pathlib.Path:
    if not path.exists():
        raise AssertionError(f"fixture {path.relative_to(FIXTURES.parent)} is missing "
                             "(made by tests/fixtures/hf_deepseek_v4/make_fixtures.py)")
    return path


@pytest.fixture(scope="module")
def tiny_model():
    return load_v4_checkpoint(str(_need(TINY / "model.safetensors").parent))


def _max_diff(model, input_ids, expected) -> float:
    logits = model(tf.constant(input_ids, tf.int32)).numpy()
    assert logits.shape == expected.shape
    return float(np.abs(logits - expected).max())


def test_logits_match_transformers(tiny_model):
    expected = np.load(_need(TINY / "logits.npy"))
    input_ids = np.load(TINY / "input_ids.npy")
    max_diff = _max_diff(tiny_model, input_ids, expected)
    assert max_diff <= TOLERANCE, f"tiny: max |logits - transformers| = {max_diff:.2e}"


def test_prompt_shorter_than_an_hca_window(tiny_model):
    """37 tokens: CSA entries but no complete HCA window (rate 128)."""
    expected = np.load(_need(TINY / "logits_first37.npy"))
    input_ids = np.load(TINY / "input_ids.npy")[:, :expected.shape[1]]
    max_diff = _max_diff(tiny_model, input_ids, expected)
    assert max_diff <= TOLERANCE, f"tiny[:37]: max |logits - transformers| = {max_diff:.2e}"


@pytest.mark.parametrize("name", ["released_fp8_mxfp4", "released_fp8"])
def test_release_layouts_match_transformers(name):
    """DeepSeek's names (no `model.` prefix, `mtp.*` skipped), FP8 / MXFP4 dequantized."""
    folder = _need(FIXTURES / name / "logits.npy").parent
    model = load_v4_checkpoint(str(folder))
    max_diff = _max_diff(model, np.load(folder / "input_ids.npy"), np.load(folder / "logits.npy"))
    assert max_diff <= TOLERANCE, f"{name}: max |logits - transformers| = {max_diff:.2e}"


def _stored(names_txt: pathlib.Path) -> dict[str, str]:
    """names.txt lines `name [shape] DTYPE` -> {name: "[shape] DTYPE"}."""
    lines = names_txt.read_text().splitlines()
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in lines if line.strip()}


def test_export_has_save_pretrained_names_and_reloads(tiny_model, tmp_path):
    from models.formats.safetensors_reader import open_checkpoint

    expected = _stored(_need(TINY / "names.txt"))
    save_hf_checkpoint(tiny_model, str(tmp_path), dtype="bfloat16")
    written = {name: f"[{','.join(str(d) for d in info.shape)}] {info.dtype}"
               for name, info in open_checkpoint(str(tmp_path)).tensors.items()}
    assert set(written) == set(expected)
    assert written == expected  # shapes and dtypes too (float32 where transformers keeps it)
    reloaded = load_v4_checkpoint(str(tmp_path))
    input_ids = tf.constant(np.load(TINY / "input_ids.npy")[:, :64], tf.int32)
    np.testing.assert_array_equal(reloaded(input_ids).numpy(), tiny_model(input_ids).numpy())
