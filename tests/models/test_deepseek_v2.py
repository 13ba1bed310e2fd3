"""The DeepSeek-V2 family: softmax routers, V2's balance loss, parity with transformers'
`DeepseekV2ForCausalLM`, export back to `deepseek_v2`, and what runs after import.

The fixtures under tests/fixtures/hf_deepseek_v2/ were made offline by
`make_fixtures.py` (transformers + torch, float32, eager attention; see each
`fixture.json`):

  v2_lite  topk_method "greedy", q_lora_rank null, n_group 1, 2 shared experts,
           first_k_dense_replace 1, YaRN with mscale 0.707, one safetensors file,
           config.json in DeepSeek-V2-Lite's own (transformers 4.x) form
  v2       topk_method "group_limited_greedy" (4 groups, keep 2; the group limit
           changes some choices), q_lora_rank 12, routed_scaling_factor 16,
           8 shards + index, config.json in the transformers 5.x form
"""

import json
import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek import hf_checkpoint
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.deepseek.generation import generate
from models.deepseek.moe import DeepSeekMoE
from models.deepseek.router import DeepSeekTopKRouter
from models.layers.balance_losses import expert_balance_loss

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v2"
TOLERANCE = 1e-4
V2_ROUTING = dict(topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
                  num_nextn_predict_layers=0, n_group=1, topk_group=1)


def _fixture(name):
    d = FIXTURES / name
    return d, np.load(d / "input_ids.npy"), np.load(d / "expected_logits.npy")


# ----------------------------------------------------------------------------- router


def _router(method, norm=False, scale=1.0, k=3):
    """A router over 8 experts whose logits are the input itself (weight = identity)."""
    config = DeepSeekConfig(hidden_size=8, n_routed_experts=8, num_experts_per_tok=k,
                            n_group=4, topk_group=2, topk_method=method, scoring_func="softmax",
                            norm_topk_prob=norm, routed_scaling_factor=scale)
    router = DeepSeekTopKRouter(config)
    router.build((None, 8))
    router.weight.assign(np.eye(8, dtype="float32"))
    return router


# Groups {0,1} {2,3} {4,5} {6,7}; group maxima 3.0, 2.9, 0.0, 2.95 keep groups 0 and 3;
# the sum of the top two would keep groups 1 (5.7) and 0 (3.5) instead.
LOGITS = np.array([[3.0, 0.5, 2.9, 2.8, 0.0, 0.0, 2.95, 0.1]], "float32")


@pytest.mark.parametrize("method, expected", [
    ("greedy", {0, 6, 2}),
    ("group_limited_greedy", {0, 6, 1}),
])
def test_v2_router_choices_and_weights_by_hand(method, expected):
    indices, weights, scores = _router(method, scale=16.0)(LOGITS)
    softmax = np.exp(LOGITS[0]) / np.exp(LOGITS[0]).sum()
    np.testing.assert_allclose(scores.numpy()[0], softmax, rtol=1e-6)
    chosen = indices.numpy()[0]
    assert set(chosen) == expected
    # No normalization (norm_topk_prob false), times routed_scaling_factor.
    np.testing.assert_allclose(weights.numpy()[0], 16.0 * softmax[chosen], rtol=1e-6)


def test_v2_router_normalizes_when_asked_and_has_no_bias():
    router = _router("group_limited_greedy", norm=True, scale=2.0)
    indices, weights, _ = router(LOGITS)
    np.testing.assert_allclose(weights.numpy().sum(), 2.0, rtol=1e-6)
    assert router.e_score_correction_bias is None
    assert [w.path.split("/")[-1] for w in router.weights] == ["weight"]
    assert router.update_bias(tf.ones([8]), 0.1) is None


# ----------------------------------------------------------------------------- balance loss


def test_expert_balance_loss_by_hand():
    """DeepSeek-V2 §2.2.3 L_ExpBal, E = 4, K = 2, two sequences of two tokens."""
    indices = tf.constant([[0, 1], [0, 2], [3, 1], [3, 2]], tf.int32)
    scores = tf.constant([[0.4, 0.3, 0.2, 0.1], [0.5, 0.1, 0.3, 0.1],
                          [0.1, 0.2, 0.3, 0.4], [0.1, 0.1, 0.2, 0.6]], tf.float32)
    # Per sequence: f = 4 / (2 * 2) * counts; sequence 0: f = [2, 1, 1, 0],
    # P = [.45, .2, .25, .1], sum f P = 1.35; sequence 1: f = [0, 1, 1, 2],
    # P = [.1, .15, .25, .5], sum f P = 1.4; mean 1.375.
    per_sequence = expert_balance_loss(indices, scores, 2, 2, 4, 2, 0.1, seq_aux=True)
    np.testing.assert_allclose(per_sequence.numpy(), 0.1 * 1.375, rtol=1e-6)
    # Over the batch: f = 4 / (2 * 4) * [2, 2, 2, 2] = 1, sum_i P_i = 1.
    batch = expert_balance_loss(indices, scores, 2, 2, 4, 2, 0.1, seq_aux=False)
    np.testing.assert_allclose(batch.numpy(), 0.1 * 1.0, rtol=1e-6)


def test_v2_moe_uses_the_expert_balance_loss(tiny_config):
    config = tiny_config.replace(**V2_ROUTING, aux_loss_alpha=0.5)
    keras.utils.set_random_seed(3)
    moe = DeepSeekMoE(config)
    moe.build()
    x = np.random.default_rng(1).normal(size=(3, 4, 32)).astype("float32")
    _, load, balance_loss, _ = moe(x)
    indices, _, scores = moe.gate(x.reshape(12, 32))
    expected = expert_balance_loss(indices, scores, 3, 4, 8, 2, 0.5, seq_aux=True)
    np.testing.assert_allclose(balance_loss.numpy(), expected.numpy(), rtol=1e-6)
    np.testing.assert_allclose(scores.numpy().sum(-1), 1.0, rtol=1e-5)  # softmax
    assert moe.update_bias(load) is None


# ----------------------------------------------------------------------------- parity


# Logits against transformers': tests/models/test_hf_parity.py (both fixtures).


def test_v2_fixtures_exercise_what_they_claim():
    lite = hf_checkpoint.read_config_json(str(FIXTURES / "v2_lite"))
    assert (lite.topk_method, lite.scoring_func, lite.q_lora_rank) == ("greedy", "softmax", None)
    assert lite.n_group == 1 and lite.n_shared_experts == 2 and lite.first_k_dense_replace == 1
    assert lite.norm_topk_prob is False and lite.num_nextn_predict_layers == 0
    assert lite.rope_scaling["mscale_all_dim"] == 0.707 and lite.aux_loss_alpha == 0.001
    v2 = hf_checkpoint.read_config_json(str(FIXTURES / "v2"))
    assert v2.topk_method == "group_limited_greedy" and (v2.n_group, v2.topk_group) == (4, 2)
    assert v2.routed_scaling_factor == 16.0 and v2.q_lora_rank == 12
    assert len(hf_checkpoint.checkpoint_files(str(FIXTURES / "v2"))) > 1
    meta = json.loads((FIXTURES / "v2" / "fixture.json").read_text())
    assert all(r["changed_by_group_limit"] > 0 for r in meta["checks"]["routing"].values())
    model = hf_checkpoint.load_hf_checkpoint(str(FIXTURES / "v2"))
    mapped = hf_checkpoint.hf_weight_map(model)
    assert not [n for n in mapped if "e_score_correction_bias" in n]
    # Every weight once: a routed expert's entries are slices of one stacked kernel, and
    # the stacked kernels (gate, up, down per MoE layer) are the weights they cover.
    assert len({id(hf_checkpoint.stored_variable(v)) for v, _ in mapped.values()}) == len(
        model.weights)
    assert all(moe.gate.e_score_correction_bias is None for moe in model.moe_layers)


def _read_tensors(folder):
    from safetensors.numpy import load_file

    tensors = {}
    for f in sorted(pathlib.Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


@pytest.mark.parametrize("name, form, shard_bytes", [("v2_lite", "4.x", 10**9),
                                                     ("v2", "5.x", 60_000)])
def test_export_writes_deepseek_v2_with_identical_tensors(tmp_path, name, form, shard_bytes):
    d, _, _ = _fixture(name)
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    hf_checkpoint.save_hf_checkpoint(model, str(tmp_path), max_shard_bytes=shard_bytes,
                                     config_form=form)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["model_type"] == "deepseek_v2"
    assert written["architectures"] == ["DeepseekV2ForCausalLM"]
    assert written["topk_method"] == model.config.topk_method
    assert written["scoring_func"] == "softmax" and written["seq_aux"] is True
    assert "rope_interleave" not in written and "num_nextn_predict_layers" not in written
    assert hf_checkpoint.read_config_json(str(tmp_path)) == hf_checkpoint.read_config_json(str(d))
    ours, theirs = _read_tensors(tmp_path), _read_tensors(d)
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        assert ours[key].dtype == value.dtype == np.float32, key
        np.testing.assert_array_equal(ours[key], value, err_msg=key)


# ----------------------------------------------------------------------------- after import


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_cached_and_absorbed_decoding_of_v2_match_transformers():
    d, input_ids, expected = _fixture("v2")
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    ids = tf.constant(input_ids, tf.int32)
    batch, seq = ids.shape
    for absorb in (True, False):
        cache = model.init_cache(batch, seq)
        logits, cache = model.call_with_cache(ids[:, :8], cache, 0, absorb=absorb)
        steps = [logits]
        for t in range(8, seq):
            step_logits, cache = model.call_with_cache(ids[:, t:t + 1], cache, t, absorb=absorb)
            steps.append(step_logits)
        cached = tf.concat(steps, axis=1).numpy()
        assert float(np.abs(cached - expected).max()) <= TOLERANCE, absorb


def test_greedy_generation_of_v2_lite_is_the_same_with_and_without_cache():
    d, input_ids, _ = _fixture("v2_lite")
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    prompts = tf.constant(input_ids[:, :6], tf.int32)
    cached, _ = generate(model, prompts, 8, temperature=0.0, use_cache=True)
    windowed, _ = generate(model, prompts, 8, temperature=0.0, use_cache=False)
    np.testing.assert_array_equal(cached.numpy(), windowed.numpy())
    assert cached.shape == (2, 14)


def _v2_pipeline_config(**train):
    from config import get_config

    overrides = {f"model.{k}": v for k, v in V2_ROUTING.items()}
    overrides.update({"train.warmup_steps": 0, "train.learning_rate": 1e-2, **{
        f"train.{k}": v for k, v in train.items()}})
    return get_config("tiny", overrides)


def _trainer(config):
    """(state, run): run(n) takes n steps of the Trainer's own train step on one fixed
    batch and returns the losses."""
    from components.trainer import data, train_loop
    from components.trainer.train_step import make_train_step

    strategy = tf.distribute.get_strategy()
    state = train_loop.setup(config, strategy, "float32", warm_start=False)
    tc = config.train
    step = make_train_step(state.model, state.optimizer, state.selection.variables, strategy,
                           micro_batches=tc.grad_accum_steps, grad_clip_norm=tc.grad_clip_norm,
                           loss_scaling=False, moe_mask=state.selection.moe_mask,
                           step_counter=state.step)
    ids = tf.random.stateless_uniform([tc.batch_size, tc.seq_len], [1, 2], 0,
                                      config.model.vocab_size, tf.int32)

    def dataset_fn():
        return tf.data.Dataset.from_tensors(
            {"input_ids": ids, "labels": tf.roll(ids, -1, axis=1)}).repeat()

    it = iter(data.distribute_global_batches(strategy, dataset_fn, tc.grad_accum_steps))
    return state, lambda n: [float(step(it)["terms"][0]) for _ in range(n)]


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_a_tiny_v2_model_trains_with_the_trainer_step():
    config = _v2_pipeline_config()
    assert config.model.topk_method == "greedy" and not config.model.uses_router_bias
    state, run = _trainer(config)
    losses = run(4)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert all(moe.gate.e_score_correction_bias is None for moe in state.model.moe_layers)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_lora_on_a_v2_model_trains_adapters_only():
    config = _v2_pipeline_config(lora_rank=4)
    state, run = _trainer(config)
    selection = state.selection
    assert selection.lora_layers and not any(selection.moe_mask)
    assert all(v.path.endswith(("lora_kernel_a", "lora_kernel_b")) for v in selection.variables)
    adapters = {id(v) for v in selection.variables}
    before = {v.path: v.numpy().copy() for v in state.model.weights if id(v) not in adapters}
    losses = run(3)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    for v in state.model.weights:  # the base (router weights included) did not move
        if v.path in before:
            np.testing.assert_array_equal(v.numpy(), before[v.path], err_msg=v.path)


def test_v2_config_builds_and_counts_parameters(tiny_config):
    from models.deepseek.flops import total_params

    config = tiny_config.replace(**V2_ROUTING)
    model = DeepSeekCausalLM(config)
    assert model.count_params() == total_params(config)
    v3 = DeepSeekCausalLM(tiny_config.replace(num_nextn_predict_layers=0))
    # The only difference: V3's router biases, one of n_routed_experts per MoE layer.
    assert v3.count_params() - model.count_params() == (
        len(v3.moe_layers) * tiny_config.n_routed_experts)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_hf_import_export_of_v2_lite_through_a_savedmodel(tmp_path):
    """hf-import -> SavedModel (its logits) -> hf-export writes deepseek_v2, same tensors."""
    from savedmodel.hf_interop import hf_export, hf_import

    d, input_ids, expected = _fixture("v2_lite")
    saved = hf_import(str(d), str(tmp_path / "saved")).path
    served = tf.saved_model.load(saved).signatures["logits"](
        input_ids=tf.constant(input_ids))["logits"].numpy()
    assert float(np.abs(served - expected).max()) <= TOLERANCE
    hf_export(saved, str(tmp_path / "hf"), config_form="4.x")
    written = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert written["model_type"] == "deepseek_v2" and written["topk_method"] == "greedy"
    ours, theirs = _read_tensors(tmp_path / "hf"), _read_tensors(d)
    assert sorted(ours) == sorted(theirs)
    for key, value in theirs.items():
        np.testing.assert_array_equal(ours[key], value, err_msg=key)


def test_training_summaries_of_a_v2_model_have_load_but_no_router_bias(tiny_config, tmp_path):
    from components.trainer.summaries import TrainSummaries
    from reporting.report_data import read_events

    model = DeepSeekCausalLM(tiny_config.replace(**V2_ROUTING))
    record = {"step": 1, "loss": 1.0, "lm_loss": 1.0, "mtp_loss": 0.0, "balance_loss": 0.01,
              "distill_loss": 0.0, "indexer_loss": 0.0, "grad_norm": 0.5, "learning_rate": 0.001,
              "tokens_per_second": 1.0, "mfu": 0.1, "moe_dropped_fraction": 0.0,
              "skipped_steps": 0}
    summaries = TrainSummaries(str(tmp_path), model)
    summaries.write(record, np.full([1, 8], 2.0, np.float32))
    summaries.flush()
    scalars, tensors = read_events(str(tmp_path))
    assert "moe/layers.1/expert_load" in tensors
    assert scalars["moe/layers.1/load_max_over_mean"][1] == [1.0]
    assert not [k for k in scalars if k.startswith("router_bias/")]
