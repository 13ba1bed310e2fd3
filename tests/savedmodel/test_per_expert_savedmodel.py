"""Models pushed before the experts were stacked still serve, load, warm-start and export.

The SavedModels in tests/fixtures/per_expert_savedmodel/ were written by main at b9aaa7c
(`make_fixture.py` there), when each routed expert was its own SwiGLU layer
(`mlp/experts/<e>/gate_proj/kernel` in the variables); a float32 and an int8 model of the
`tiny` preset (a MoE block and a MoE MTP block, 8 experts each), with the logits the old
code computed for a Chinese + English prompt. Now a MoE layer holds its experts stacked
(`mlp/experts/gate_proj/kernel`, (E, in, out)), and `restore_cast` reads each expert's
tensor into its slice. Serving, warm start and export are `slow` (15 s and more each).
"""

import os
import pathlib

import numpy as np
import pytest
import tensorflow as tf

FIXTURE = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "per_expert_savedmodel"


def _expected(name):
    return np.load(FIXTURE / "input_ids.npy"), np.load(FIXTURE / f"logits_{name}.npy")


@pytest.mark.parametrize("name", ["float32", "int8"])
def test_a_per_expert_savedmodel_loads_stacked_with_the_same_logits(name):
    from models.formats.quantization import is_quantized_model
    from savedmodel.base_model import load_model

    ids, expected = _expected(name)
    model = load_model(str(FIXTURE / name))
    assert is_quantized_model(model) == (name == "int8")
    assert tuple(model.moe_layers[0].experts.gate_proj.kernel_variable().shape) == (8, 64, 32)
    # Equal up to float32 rounding: the fixture's logits were written on another CPU, and
    # TensorFlow's kernels sum in another order on this one (3.6e-7 apart here).
    np.testing.assert_allclose(model(tf.constant(ids)).numpy(), expected, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_per_expert_savedmodel_still_serves():
    from serving.server import ModelServer

    ids, expected = _expected("float32")
    server = ModelServer(str(FIXTURE / "float32"))
    try:
        out = server.run("logits", {"input_ids": ids}, rows=1)
        np.testing.assert_allclose(next(iter(out.values())), expected, rtol=0, atol=1e-5)
        text = server.run("serving_default", {"prompt": np.array(["明月 and the moon"])}, rows=1)
        assert text
    finally:
        server.close()


@pytest.mark.slow
def test_a_per_expert_savedmodel_warm_starts_a_run():
    from components.trainer import train_loop
    from savedmodel.layout import read_pipeline_config

    ids, expected = _expected("float32")
    config = read_pipeline_config(str(FIXTURE / "float32"))
    state = train_loop.setup(config, tf.distribute.get_strategy(), "float32", warm_start=True,
                             base_model=str(FIXTURE / "float32"))
    np.testing.assert_allclose(state.model(tf.constant(ids)).numpy(), expected, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_a_per_expert_savedmodel_exports_to_hugging_face(tmp_path):
    from models.deepseek import hf_checkpoint
    from models.formats import safetensors_reader
    from savedmodel.hf_interop import hf_export

    ids, expected = _expected("int8")
    hf_export(str(FIXTURE / "int8"), str(tmp_path), dtype="float32")
    names = safetensors_reader.open_checkpoint(str(tmp_path)).tensors
    assert "model.layers.1.mlp.experts.7.down_proj.weight" in names
    assert names["model.layers.1.mlp.experts.7.down_proj.weight"].shape == (64, 32)
    assert not any(".mlp.experts.gate_proj" in n for n in names)  # one tensor per expert
    # Expert 7's tensor is its old int8 kernel over its scale, Q / s, transposed to [out, in].
    reader = tf.train.load_checkpoint(str(FIXTURE / "int8" / "variables" / "variables"))
    keys = [k for k in reader.get_variable_to_shape_map()
            if "decoder_layers/1/mlp/experts/7/down_proj/" in k]
    q = reader.get_tensor(next(k for k in keys if "/_kernel/" in k))  # (32, 64) int8
    s = reader.get_tensor(next(k for k in keys if "/kernel_scale/" in k))  # (64,)
    exported = safetensors_reader.open_checkpoint(str(tmp_path)).read(
        "model.layers.1.mlp.experts.7.down_proj.weight")
    np.testing.assert_allclose(exported, (q.astype(np.float32) / s).T, rtol=1e-6)
    # The float32 Q / s model runs without int8 activations: close to the int8 logits.
    model = hf_checkpoint.load_hf_checkpoint(str(tmp_path))
    np.testing.assert_allclose(model(tf.constant(ids)).numpy(), expected, rtol=0, atol=1e-2)
    assert os.path.isfile(tmp_path / "tokenizer.json")
