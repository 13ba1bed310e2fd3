"""Logit parity with Hugging Face transformers' `DeepseekV3ForCausalLM` (PyTorch).

The fixtures under tests/fixtures/hf_deepseek_v3/ were made offline by
`make_fixtures.py` (transformers + torch, float32, eager attention; see each
`fixture.json`): tiny seeded checkpoints with non-zero router biases and grouped
routing (n_group 4, topk_group 2), the input ids, and the logits transformers
computed. Here only TensorFlow runs: the checkpoint is imported and its logits
must match to 1e-4.

  q_lora      q_lora_rank 24, 6 safetensors shards + index, config.json in the
              transformers 4.x / released-checkpoint form, MTP weights at layer 3
  no_q_lora   q_proj (q_lora_rank null), YaRN rope_scaling, config.json in the
              transformers 5.x form (rope_parameters)
  yarn_extra  YaRN with mscale != mscale_all_dim (attention factor != 1)

and tests/fixtures/hf_deepseek_v3_256/ (bf16 checkpoints of 256 and 8 routed experts).
"""

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from models.deepseek import hf_checkpoint
from models.formats import tensor_assign

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v3"
TOLERANCE = 1e-4


def _fixture(name):
    d = FIXTURES / name
    return d, np.load(d / "input_ids.npy"), np.load(d / "expected_logits.npy")


@pytest.mark.parametrize("name", [
    "hf_deepseek_v3/q_lora", "hf_deepseek_v3/no_q_lora", "hf_deepseek_v3/yarn_extra",
    # DeepseekV2ForCausalLM: greedy V2-Lite-style, group_limited_greedy V2-style
    "hf_deepseek_v2/v2_lite", "hf_deepseek_v2/v2",
    # DeepSeek-V3's expert layout at small widths: 256 routed experts in 8 groups, top-8,
    # bf16 on disk with float32 router biases, 5 MoE layers (stacked in the model), and
    # the same model with 8 experts
    "hf_deepseek_v3_256/experts_256", "hf_deepseek_v3_256/experts_8"])
def test_logits_match_transformers(name):
    d = FIXTURES.parent / name
    input_ids, expected = np.load(d / "input_ids.npy"), np.load(d / "expected_logits.npy")
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    logits = model(tf.constant(input_ids, tf.int32)).numpy()
    assert logits.shape == expected.shape
    max_diff = float(np.abs(logits - expected).max())
    assert max_diff <= TOLERANCE, f"{name}: max |logits - transformers| = {max_diff:.2e}"


@pytest.mark.parametrize("name", ["hf_deepseek_v3/q_lora", "hf_deepseek_v2/v2_lite"])
def test_weights_assigned_in_row_blocks_give_the_same_logits(name, monkeypatch):
    """Tensors above ASSIGN_BLOCK_BYTES load in row blocks, in place (the embedding and
    lm_head of a real checkpoint): with 512-byte blocks every 2-D weight takes that path,
    Dense kernels (transposed) and the embedding (not) alike, including the last,
    shorter block."""
    monkeypatch.setattr(tensor_assign, "ASSIGN_BLOCK_BYTES", 512)
    d = FIXTURES.parent / name
    input_ids, expected = np.load(d / "input_ids.npy"), np.load(d / "expected_logits.npy")
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    max_diff = float(np.abs(model(tf.constant(input_ids, tf.int32)).numpy() - expected).max())
    assert max_diff <= TOLERANCE, f"{name}: max |logits - transformers| = {max_diff:.2e}"


def test_fixtures_exercise_what_they_claim():
    d, _, _ = _fixture("q_lora")
    config = hf_checkpoint.read_config_json(str(d))
    assert config.q_lora_rank == 24 and config.n_group == 4 and config.topk_group == 2
    assert config.num_nextn_predict_layers == 1
    assert len(hf_checkpoint.checkpoint_files(str(d))) > 1
    weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.3.eh_proj.weight" in weight_map  # MTP weights are in the checkpoint
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    for moe in model.moe_layers:
        assert np.abs(moe.gate.e_score_correction_bias.numpy()).min() > 0
    no_q = hf_checkpoint.read_config_json(str(FIXTURES / "no_q_lora"))
    assert no_q.q_lora_rank is None and no_q.rope_scaling["rope_type"] == "yarn"
    assert "rope_parameters" in json.loads((FIXTURES / "no_q_lora" / "config.json").read_text())


def test_cached_decoding_of_imported_checkpoint_matches_transformers():
    """Prefill + one-token steps with the latent cache give transformers' logits too."""
    d, input_ids, expected = _fixture("no_q_lora")
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    ids = tf.constant(input_ids, tf.int32)
    batch, seq = ids.shape
    cache = model.init_cache(batch, seq)
    logits, cache = model.call_with_cache(ids[:, :8], cache, 0)
    steps = [logits]
    for t in range(8, seq):
        step_logits, cache = model.call_with_cache(ids[:, t:t + 1], cache, t)
        steps.append(step_logits)
    cached = tf.concat(steps, axis=1).numpy()
    assert float(np.abs(cached - expected).max()) <= TOLERANCE


@pytest.mark.slow
def test_hf_import_export_round_trip(tmp_path):
    """hf-import -> SavedModel -> hf-export -> hf-import leaves the logits unchanged."""
    from savedmodel.hf_interop import hf_export, hf_import

    d, input_ids, expected = _fixture("q_lora")
    first = hf_import(str(d), str(tmp_path / "saved")).path
    loaded = tf.saved_model.load(first)
    served = loaded.signatures["logits"](input_ids=tf.constant(input_ids))["logits"].numpy()
    assert float(np.abs(served - expected).max()) <= TOLERANCE

    files = hf_export(first, str(tmp_path / "hf"), max_shard_bytes=300_000, config_form="4.x")
    assert len(files) > 1
    again = hf_import(str(tmp_path / "hf"), str(tmp_path / "saved2")).path
    served2 = tf.saved_model.load(again).signatures["logits"](
        input_ids=tf.constant(input_ids))["logits"].numpy()
    np.testing.assert_array_equal(served2, served)
