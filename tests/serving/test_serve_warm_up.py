"""`deepseek-tfx serve --warm-up`: which part of each model is warmed before `ready`.

`ModelServer.warm_up(signatures=False)` itself (the engine only, AVAILABLE, a signature
working on first use) is tested on real V3 and V4 models in test_deepseek_api.py, and
on a model without an engine (its signatures warmed anyway) in test_server_batching.py;
here, the flag and what `warm_up_models` asks of each model, on stand-ins that record it.
"""

from __future__ import annotations

import pytest

import cli
from cli.serve import warm_up_models


class _Recorder:
    """A served model as `warm_up_models` sees it: `warm_up(signatures)`, which warms the
    signatures when asked, or always without an engine (as `ModelServer.warm_up`)."""

    def __init__(self, requests: int, failed: int = 0, engine: bool = True):
        self.requests, self.failed, self.engine = requests, failed, engine
        self.calls: list[bool] = []

    def warm_up(self, signatures: bool = True) -> dict:
        self.calls.append(signatures)
        return {"requests": self.requests, "failed": self.failed, "seconds": 1.25,
                "signatures": signatures or not self.engine}


def test_the_flag_defaults_to_all_and_takes_engine_only():
    parser = cli.build_parser()
    assert parser.parse_args(["serve", "--model", "m"]).warm_up == "all"
    assert parser.parse_args(["serve", "--model", "m", "--warm-up", "engine"]).warm_up == "engine"
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--model", "m", "--warm-up", "none"])


def test_all_warms_every_signature_of_every_model():
    servers = {"A": _Recorder(requests=9), "B": _Recorder(requests=7)}
    line = warm_up_models(servers, "all")
    assert [s.calls for s in servers.values()] == [[True], [True]]
    assert line == "ready: warmed up with 16 requests in 2.5 s; state AVAILABLE"


def test_engine_asks_every_model_for_its_engine_only_and_names_those_left_cold():
    servers = {"A": _Recorder(requests=2, failed=1), "C": _Recorder(requests=2),
               "B": _Recorder(requests=7, engine=False)}  # e.g. --decode-slots 0
    line = warm_up_models(servers, "engine")
    assert [s.calls for s in servers.values()] == [[False], [False], [False]]
    assert line == ("ready: warmed up with 11 requests in 3.8 s, 1 failed (engine only: the "
                    "signatures of 'A', 'C' warm on first use); state AVAILABLE")


def test_engine_without_any_engine_says_nothing_is_left_cold():
    line = warm_up_models({"B": _Recorder(requests=7, engine=False)}, "engine")
    assert line == "ready: warmed up with 7 requests in 1.2 s; state AVAILABLE"


def test_an_unknown_mode_is_refused_by_name():
    with pytest.raises(ValueError, match="--warm-up 'lazy': expected one of all, engine"):
        warm_up_models({"A": _Recorder(requests=2)}, "lazy")
