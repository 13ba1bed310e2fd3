"""The TensorBoard summaries of a logging window (`components/trainer/summaries.py`):
names and values, on the `tiny` model (MoE in decoder layer 1 and in the MTP module)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from components.trainer.summaries import SCALARS, TrainSummaries, moe_block_names
from config import get_config
from models.deepseek import DeepSeekCausalLM
from reporting.report_data import read_events


@pytest.fixture(scope="module")
def model():
    return DeepSeekCausalLM(get_config("tiny").model)


def record(step, **changes):
    return {"step": step, "loss": 1.75, "lm_loss": 1.5, "mtp_loss": 1.25,
            "balance_loss": 0.0078125, "distill_loss": 0.0, "indexer_loss": 0.0, "grad_norm": 0.75,
            "learning_rate": 0.001, "tokens_per_second": 256.0, "mfu": 0.25,
            "moe_dropped_fraction": 0.125, "skipped_steps": 1, **changes}


def test_moe_layers_are_named_by_their_block(model):
    assert moe_block_names(model) == ["layers.1", "mtp.0"]


def test_a_window_writes_its_scalars_the_expert_load_and_the_router_bias(model, tmp_path):
    biases = [m.gate.e_score_correction_bias for m in model.moe_layers]
    biases[0].assign([-0.5, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.25])
    load = np.array([[4, 4, 4, 4, 4, 4, 4, 4], [16, 0, 0, 0, 0, 0, 0, 16]], np.float32)
    summaries = TrainSummaries(str(tmp_path), model)
    summaries.write(record(1, tokens_per_second=float("nan"), mfu=float("nan")), load)
    summaries.write(record(3), np.zeros_like(load))
    summaries.flush()
    scalars, tensors = read_events(str(tmp_path))
    for key in SCALARS:  # the first window's NaN speed figures are left out
        assert scalars[f"train/{key}"][0] == ([3] if key in ("tokens_per_second", "mfu")
                                               else [1, 3]), key
    assert scalars["train/loss"][1] == [1.75, 1.75]
    assert scalars["train/skipped_steps"][1] == [1.0, 1.0]
    steps, loads = tensors["moe/layers.1/expert_load"]
    assert steps == [1, 3] and loads[0].dtype == np.float32
    np.testing.assert_array_equal(loads[0], load[0])
    # max / mean: 4 / 4 = 1 (balanced); 16 / (32 / 8) = 4; nothing routed: 0
    assert scalars["moe/layers.1/load_max_over_mean"][1] == [1.0, 0.0]
    assert scalars["moe/mtp.0/load_max_over_mean"][1] == [4.0, 0.0]
    # b = [-0.5, 0.25, 0, 0, 0, 0, 0, 0.25]: min -0.5, max 0.25, mean |b| = 1 / 8
    assert scalars["router_bias/layers.1/min"][1][0] == -0.5
    assert scalars["router_bias/layers.1/max"][1][0] == 0.25
    assert math.isclose(scalars["router_bias/layers.1/mean_abs"][1][0], 0.125)
    assert scalars["router_bias/mtp.0/mean_abs"][1][0] == 0.0


def test_no_log_dir_writes_nothing(model, tmp_path):
    summaries = TrainSummaries(None, model)
    summaries.write(record(1), np.zeros((2, 8), np.float32))
    summaries.flush()
    assert list(tmp_path.iterdir()) == []


def test_a_mixture_window_writes_each_sources_token_share(model, tmp_path):
    summaries = TrainSummaries(str(tmp_path), model)
    load = np.zeros([2, 8], np.float32)
    summaries.write(record(2, token_share={"poems": 0.25, "web": 0.75},
                           source_tokens={"poems": 128, "web": 384}), load)
    summaries.flush()
    scalars, _ = read_events(str(tmp_path))
    assert scalars["data/token_share/poems"] == ([2], [0.25])
    assert scalars["data/token_share/web"] == ([2], [0.75])
    assert scalars["data/tokens/web"] == ([2], [384.0])
