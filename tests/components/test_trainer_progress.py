"""The training run's terminal output (`components/trainer/progress.py`): when the
progress bar is drawn, and the log line of a logging window."""

from __future__ import annotations

import io
import logging

import pytest

from components.trainer.progress import PROGRESS_ENV, Progress, progress_enabled

LOGGER = "components.trainer.train_loop"  # the loop passes its own logger


class Tty(io.StringIO):
    def isatty(self):
        return True


def record(**changes):
    """A window's record (`metrics.MetricWindow.close`) at step 6 of 10."""
    return {"step": 6, "loss": 1.75, "lm_loss": 1.5, "mtp_loss": 1.25, "balance_loss": 0.01,
            "distill_loss": 0.0, "indexer_loss": 0.0, "grad_norm": 0.75, "learning_rate": 5e-4,
            "tokens_per_second": 256.0, "mfu": 0.256, "moe_dropped_fraction": 0.0,
            "skipped_steps": 0, **changes}


def logged_line(caplog, rec, timed=True):
    progress = Progress(10, 0, 256, enabled=False, logger=logging.getLogger(LOGGER),
                        stream=io.StringIO())
    with caplog.at_level(logging.INFO, logger=LOGGER):
        progress.log_window(rec, 10, timed=timed)
    progress.close()
    (line,) = [r for r in caplog.records if r.name == LOGGER]
    return line.getMessage()


def test_progress_bar_only_on_a_terminal_outside_ci(monkeypatch):
    monkeypatch.delenv(PROGRESS_ENV, raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert progress_enabled(Tty()) and not progress_enabled(io.StringIO())
    monkeypatch.setenv("CI", "true")
    assert not progress_enabled(Tty())
    monkeypatch.setenv(PROGRESS_ENV, "1")
    assert progress_enabled(io.StringIO())
    monkeypatch.setenv(PROGRESS_ENV, "yes")
    with pytest.raises(ValueError, match=PROGRESS_ENV):
        progress_enabled(Tty())


def test_the_log_line_of_a_window(caplog):
    assert logged_line(caplog, record()) == (
        "step     6/10  loss 1.7500  lm_loss 1.5000  lr 5.00e-04  grad_norm 0.750  "
        "256 tok/s  MFU 25.6%")


def test_the_log_line_names_distillation_drops_and_skips_only_when_not_zero(caplog):
    line = logged_line(caplog, record(distill_loss=0.5, moe_dropped_fraction=3 / 32,
                                      skipped_steps=2))
    assert line == ("step     6/10  loss 1.7500  lm_loss 1.5000  distill_loss 0.5000  "
                    "lr 5.00e-04  grad_norm 0.750  256 tok/s  MFU 25.6%  MoE dropped 9.38%  "
                    "skipped 2")


def test_the_first_window_has_no_speed(caplog):
    line = logged_line(caplog, record(step=1, tokens_per_second=float("nan"), mfu=float("nan")),
                       timed=False)
    assert line == ("step     1/10  loss 1.7500  lm_loss 1.5000  lr 5.00e-04  grad_norm 0.750  "
                    "(first step: tracing)")


def test_the_bar_draws_steps_and_the_loss_on_its_stream():
    stream = io.StringIO()
    with Progress(2, 0, 256, enabled=True, logger=logging.getLogger(LOGGER),
                  stream=stream) as progress:
        progress.step(1, 1.5)
        progress.step(2, 1.25)  # the last step always refreshes the postfix
    assert "2/2" in stream.getvalue() and "loss 1.2500" in stream.getvalue()


def test_the_log_line_gives_each_sources_token_share_with_two_or_more(caplog):
    line = logged_line(caplog, record(token_share={"poems": 0.1, "shakespeare": 0.9}))
    assert line.endswith("MFU 25.6%  tokens poems 10.0% shakespeare 90.0%")
    caplog.clear()
    assert logged_line(caplog, record(token_share={"default": 1.0})).endswith("MFU 25.6%")
