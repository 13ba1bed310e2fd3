"""An int8 model as a SavedModel: precision.json says int8, the variables are int8 kernels
with float32 scales (the embedding, norms and router float32), the text signatures are
unchanged and greedy `generate` equals the quantized Keras model's own decoding; it loads
back int8, bit for bit; hf-export writes its kernels as float32 Q / s, and hf-import
--dtype int8 quantizes them back to the same Q."""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np
import pytest
import safetensors.numpy
import tensorflow as tf

from config import GenerationConfig, get_config
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.formats import quantization as Q
from savedmodel import layout
from savedmodel.export import ServingModule, save_text_model
from savedmodel.hf_interop import hf_export, hf_import, load_model_from_savedmodel
from tokenization.tokenizer import learn

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         " lazy": 4, " dog": 8, "你好": 6, "世界": 5, "。": 10, ",": 20, "床前": 6, "明月光": 5}
PROMPTS = ["the quick brown fox", "床前明月光,你好世界。", "the lazy dog"]
GREEDY = dict(max_new_tokens=[6, 9, 4], temperature=[0.0] * 3, top_k=[0] * 3,
              top_p=[1.0] * 3, seed=[0] * 3)
# Slow: a SavedModel export and two traces of the decoding loop (about 35 s).
pytestmark = pytest.mark.slow
DTYPES = dict(max_new_tokens=tf.int32, temperature=tf.float32, top_k=tf.int32,
              top_p=tf.float32, seed=tf.int32)


@pytest.fixture(scope="module")
def int8_saved(tmp_path_factory):
    keras.utils.set_random_seed(31)
    config = dataclasses.replace(get_config("tiny").model, vocab_size=512,
                                 tie_word_embeddings=False)
    model = DeepSeekCausalLM(config)
    float_bytes = Q.weight_bytes(model)
    Q.quantize_int8(model)
    tokenizer = learn(UNITS, 400)
    out = str(tmp_path_factory.mktemp("int8") / "saved")
    save_text_model(model, tokenizer, GenerationConfig(max_new_tokens=6), out)
    return model, tokenizer, out, float_bytes


def _generate(fn):
    inputs = {k: tf.constant(v, DTYPES[k]) for k, v in GREEDY.items()}
    out = fn(prompt=tf.constant(PROMPTS), **inputs)
    return {k: v.numpy().tolist() for k, v in out.items()}


def test_the_savedmodel_is_int8_and_its_signatures_unchanged(int8_saved):
    model, _, out, float_bytes = int8_saved
    assert layout.read_weight_dtype(out) == "int8"
    reader = tf.train.load_checkpoint(os.path.join(out, "variables", "variables"))
    dtypes = reader.get_variable_to_dtype_map()
    assert sum(d == tf.int8 for d in dtypes.values()) == len(Q.quantized_layers(model))
    int8_bytes = Q.weight_bytes(model)
    assert float_bytes["quantized_layers"] / int8_bytes["quantized_layers"] >= 3.5
    assert float_bytes["total"] / int8_bytes["total"] >= 2.0
    loaded = tf.saved_model.load(out)
    assert set(loaded.signatures) == {"serving_default", "generate", "logits", "tokenize",
                                      "detokenize"}


def test_greedy_generate_equals_the_quantized_keras_model(int8_saved, tmp_path):
    model, tokenizer, out, _ = int8_saved
    signature = tf.saved_model.load(out).signatures["generate"]
    tokenizer.write(str(tmp_path))
    module = ServingModule(model, tokenizer, GenerationConfig(max_new_tokens=6), str(tmp_path))
    got, expected = _generate(signature), _generate(module.generate)
    assert got == expected  # token for token, the Chinese prompt included
    assert all(len(text) > 0 for text in got["text"])
    ids = tf.constant(np.arange(3, 40, dtype=np.int32)[None])
    logits = tf.saved_model.load(out).signatures["logits"](input_ids=ids)["logits"].numpy()
    np.testing.assert_array_equal(logits, module.logits(ids)["logits"].numpy())


def test_it_loads_back_int8_bit_for_bit(int8_saved):
    model, _, out, _ = int8_saved
    loaded = load_model_from_savedmodel(out)
    assert Q.is_quantized_model(loaded)
    for a, b in zip(model.weights, loaded.weights, strict=True):
        assert a.path.split("/", 1)[1] == b.path.split("/", 1)[1]
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_hf_export_writes_float32_q_over_s_and_int8_import_gives_back_q(int8_saved, tmp_path):
    model, _, out, _ = int8_saved
    hf_dir = str(tmp_path / "hf")
    hf_export(out, hf_dir)
    tensors = safetensors.numpy.load_file(os.path.join(hf_dir, "model.safetensors"))
    layer = model.decoder_layers[0].self_attn.q_a_proj
    weight = tensors["model.layers.0.self_attn.q_a_proj.weight"]
    assert weight.dtype == np.float32
    np.testing.assert_array_equal(weight.T, Q.float_kernel(layer, tf.float32).numpy())

    again = str(tmp_path / "again")
    assert hf_import(hf_dir, again, dtype="int8").weight_dtype == "int8"
    reloaded = load_model_from_savedmodel(again)
    for a, b in zip(Q.quantized_layers(model), Q.quantized_layers(reloaded), strict=True):
        np.testing.assert_array_equal(Q.kernel_variable(a).numpy(), Q.kernel_variable(b).numpy())
        # s' = 127 / (max|Q / s| + 1e-7) = s / (1 + 1e-7 s / 127): Keras' epsilon moves it
        # by about 1e-7 * s / 127 relative, 2e-6 for these scales (~2500).
        np.testing.assert_allclose(a.kernel_scale.numpy(), b.kernel_scale.numpy(), rtol=1e-5)
