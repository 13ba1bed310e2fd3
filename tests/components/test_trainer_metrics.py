"""The figures of a logging window and of a run (`components/trainer/metrics.py`),
against values worked out by hand (MaxText-style: the arithmetic in the comments).

The clock is replaced by a fake one the test sets, so that seconds are exact.
"""

from __future__ import annotations

import math
import types

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import metrics
from components.trainer.train_step import LOSS_TERMS


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(metrics, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def step_out(loss, grad_norm, load, dropped):
    """A step's outputs as `train_step` gives them (M = 2 MoE layers, E = 4 experts)."""
    terms = [loss, loss - 0.25, loss - 0.5, 0.0078125, 0.0, 0.0]  # exact in float32
    assert len(terms) == len(LOSS_TERMS)
    return {"terms": tf.constant(terms, tf.float32), "grad_norm": tf.constant(grad_norm),
            "expert_load": tf.constant(load, tf.float32),
            "moe_dropped": tf.constant(dropped, tf.float32), "skipped": tf.constant(False)}


def schedule(step):
    return 1e-3 * (step + 1)  # the rate of step s (0-based)


def test_a_window_sums_the_load_and_keeps_the_last_step(clock):
    clock.now = 10.0
    window = metrics.MetricWindow(schedule, tokens_per_step=256, flops_per_token=1000,
                                  peak_flops=1e6)
    window.add(step_out(2.0, 0.5, [[3, 1, 0, 4], [2, 2, 2, 2]], [0, 1]))
    window.add(step_out(1.75, 0.75, [[1, 3, 4, 0], [4, 0, 2, 2]], [2, 0]))
    clock.now = 12.0
    record, load = window.close(6, skipped_steps=1, timed=True)
    # load: [[3+1, 1+3, 0+4, 4+0], [2+4, 2+0, 2+2, 2+2]] = [[4, 4, 4, 4], [6, 2, 4, 4]]
    assert load.dtype == np.float32
    np.testing.assert_array_equal(load, [[4, 4, 4, 4], [6, 2, 4, 4]])
    assert record == {
        "step": 6,
        # the loss terms and grad norm of the window's last step, not a mean
        "loss": 1.75, "lm_loss": 1.5, "mtp_loss": 1.25, "balance_loss": 0.0078125,
        "distill_loss": 0.0, "indexer_loss": 0.0, "grad_norm": 0.75,
        "learning_rate": schedule(5),  # the rate of step 6 = schedule(6 - 1)
        # 2 steps x 256 tokens / (12 - 10) s = 256 tokens/s
        "tokens_per_second": 256.0,
        # 256 tokens/s x 1000 FLOPs/token / 1e6 FLOP/s = 0.256
        "mfu": pytest.approx(0.256),
        # dropped (0+2) + (1+0) = 3 of the routed 16 + 16 = 32 pairs
        "moe_dropped_fraction": 3 / 32,
        "skipped_steps": 1,
    }
    assert window.history == [record] and window.final_loss == 1.75


def test_the_next_window_starts_empty_and_the_run_totals_add_up(clock):
    window = metrics.MetricWindow(schedule, 256, 1000, 1e6)
    window.add(step_out(2.0, 0.5, [[3, 1, 0, 4], [2, 2, 2, 2]], [0, 1]))
    clock.now = 1.0
    window.close(1, 0, timed=True)
    clock.now = 5.0
    window.restart()
    window.add(step_out(1.5, 0.25, [[8, 0, 0, 0], [0, 0, 0, 8]], [4, 4]))
    clock.now = 5.5
    record, load = window.close(2, 0, timed=True)
    np.testing.assert_array_equal(load, [[8, 0, 0, 0], [0, 0, 0, 8]])  # this window's only
    assert record["tokens_per_second"] == 512.0  # 1 step x 256 tokens / 0.5 s
    assert record["moe_dropped_fraction"] == 0.5  # (4 + 4) / 16
    # over the run: (1 + 8) dropped of (16 + 16) routed
    assert window.run_dropped_fraction == 9 / 32
    assert [r["step"] for r in window.history] == [1, 2]


def test_an_untimed_window_and_no_peak_give_nan_speed_figures(clock):
    window = metrics.MetricWindow(schedule, 256, 1000, peak_flops=0.0)
    window.add(step_out(2.0, 0.5, [[0, 0, 0, 0], [0, 0, 0, 0]], [0, 0]))
    clock.now = 3.0
    first, _ = window.close(1, 0, timed=False)  # the first step: its time is tracing
    assert math.isnan(first["tokens_per_second"]) and math.isnan(first["mfu"])
    assert first["moe_dropped_fraction"] == 0.0  # nothing routed: 0, not 0/0
    window.restart()  # at 3 s
    window.add(step_out(2.0, 0.5, [[1, 1, 1, 1], [1, 1, 1, 1]], [0, 0]))
    clock.now = 4.0
    second, _ = window.close(2, 0, timed=True)
    # 1 step x 256 tokens / (4 - 3) s; no peak: no MFU
    assert second["tokens_per_second"] == 256.0 and math.isnan(second["mfu"])


def test_the_run_clock_leaves_tracing_and_saving_out_of_the_steady_state(clock):
    run = metrics.RunClock()  # at 0 s
    clock.now = 5.0
    assert run.step_done(tf.constant([1.0]))  # the first step ends at 5 s (with tracing)
    clock.now = 6.0
    assert not run.step_done(tf.constant([1.0]))
    clock.now = 8.0
    with run.saving():
        clock.now = 9.0  # 1 s of checkpoint writing
    clock.now = 15.0
    run.stop()
    figures = run.figures(steps_run=11, tokens_per_step=100, flops_per_token=1000,
                          peak_flops=1e6)
    assert figures == {
        "train_wall_s": 15.0,
        "tokens_per_second": 11 * 100 / 15,  # every step over the whole time
        # the 10 steps after the first over 15 - 5 (first step) - 1 (saving) = 9 s
        "steady_tokens_per_second": 10 * 100 / 9,
        "mfu": pytest.approx(11 * 100 / 15 * 1000 / 1e6),
        "steady_mfu": pytest.approx(10 * 100 / 9 * 1000 / 1e6),
    }


def test_a_run_of_one_step_or_none(clock):
    run = metrics.RunClock()
    clock.now = 2.0
    run.stop()
    assert run.figures(0, 100, 1000, 0.0) == {  # a finished run re-run: nothing trained
        "train_wall_s": 2.0, "tokens_per_second": 0.0, "steady_tokens_per_second": 0.0,
        "mfu": 0.0, "steady_mfu": 0.0}
    one = metrics.RunClock()  # at 2 s
    clock.now = 4.0
    one.step_done(tf.constant([1.0]))
    one.stop()
    figures = one.figures(1, 100, 1000, 0.0)
    # 1 step x 100 tokens / 2 s; no step after the first: steady = overall
    assert figures["steady_tokens_per_second"] == figures["tokens_per_second"] == 50.0


def test_source_counts_add_applied_tokens_and_every_drawn_sequence():
    tokens = tf.Variable([10, 0], dtype=tf.int64)  # restored from a checkpoint
    sequences = tf.Variable([1, 0], dtype=tf.int64)
    counts = metrics.SourceCounts(["a", "b"], tokens, sequences)
    step = {"source_tokens": tf.constant([64.0, 192.0]),
            "source_sequences": tf.constant([2.0, 6.0])}
    counts.add(step, applied=True)
    counts.add(step, applied=False)  # a skipped step drew its batch, trained nothing
    assert counts.token_counts() == {"a": 10, "b": 0}  # still on the device
    counts.sync()
    assert counts.token_counts() == {"a": 74, "b": 192}
    assert counts.sequence_counts() == {"a": 5, "b": 12}
    assert counts.shares() == {"a": 74 / 266, "b": 192 / 266}
    counts.add(step, applied=True)
    counts.store()
    assert tokens.numpy().tolist() == [138, 384] and sequences.numpy().tolist() == [7, 18]
    empty = metrics.SourceCounts(["x"], tf.Variable([0], dtype=tf.int64),
                                 tf.Variable([0], dtype=tf.int64))
    assert empty.shares() == {"x": 0.0}


def test_the_history_comes_back_from_its_checkpointed_copy_in_any_language(clock):
    """`store` writes the records into the checkpointed string; a window that `resume`s
    from it (a restarted run) starts with them, keeps NaN figures and sources' names
    byte for byte, and without a step of its own reports the last record's loss."""
    stored = tf.Variable("[]", dtype=tf.string)
    first = metrics.MetricWindow(schedule, tokens_per_step=256, flops_per_token=1000,
                                 peak_flops=1e6)
    first.resume(stored)
    assert first.history == [] and math.isnan(first.final_loss)
    first.add(step_out(2.0, 0.5, [[1, 1, 1, 1], [1, 1, 1, 1]], [0, 0]))
    record, _ = first.close(1, skipped_steps=0, timed=False)  # tokens/s NaN
    record["source_tokens"] = {"唐诗": 100, "Shakespeare": 156}
    first.store()
    again = metrics.MetricWindow(schedule, tokens_per_step=256, flops_per_token=1000,
                                 peak_flops=1e6)
    again.resume(stored)
    assert len(again.history) == 1 and again.history[0]["source_tokens"] == {
        "唐诗": 100, "Shakespeare": 156}
    assert math.isnan(again.history[0]["tokens_per_second"])
    assert again.history[0]["loss"] == 2.0 and again.final_loss == 2.0
