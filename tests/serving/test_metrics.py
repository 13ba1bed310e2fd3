"""`/metrics` (serving/metrics.py): Prometheus' text format parsed back with
prometheus_client's parser, per-model counts, bounded labels, and the batcher's hooks in
a real `Batcher` run with a Python function for a model. No TensorFlow."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from config import ServeConfig
from serving.batcher import Batcher
from serving.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from serving.model_split import parse_split


def _samples(metrics: ServerMetrics) -> dict:
    """{(sample name, frozenset(labels)): value} of a render, through the parser."""
    body, content_type = metrics.render()
    assert content_type == CONTENT_TYPE_LATEST and content_type.startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode("utf-8"))
            for s in family.samples}


def _value(samples: dict, name: str, **labels) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _sum(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


def test_every_metric_is_documented_named_and_typed_as_prometheus_expects():
    body, _ = ServerMetrics(["A"]).render()
    # (prometheus_client adds a `<name>_created` gauge beside each counter and histogram)
    families = {f.name: f for f in text_string_to_metric_families(body.decode())
                if not f.name.endswith("_created")}
    assert {name: f.type for name, f in families.items()} == {
        "deepseek_tfx_requests": "counter",  # the parser drops counters' _total
        "deepseek_tfx_request_duration_seconds": "histogram",
        "deepseek_tfx_prompt_tokens": "counter",
        "deepseek_tfx_completion_tokens": "counter",
        "deepseek_tfx_batch_size": "histogram",
        "deepseek_tfx_queue_depth": "gauge",
        "deepseek_tfx_time_to_first_token_seconds": "histogram",
        "deepseek_tfx_inter_token_latency_seconds": "histogram",
        "deepseek_tfx_e2e_request_latency_seconds": "histogram",
        "deepseek_tfx_request_queue_time_seconds": "histogram",
        "deepseek_tfx_num_requests_running": "gauge",
        "deepseek_tfx_num_requests_waiting": "gauge",
        "deepseek_tfx_kv_cache_usage_perc": "gauge",
    }
    assert all(len(f.documentation) > 30 for f in families.values())
    text = body.decode()
    # exported at 0 for a served model before its first request
    assert 'deepseek_tfx_prompt_tokens_total{model="A"} 0.0' in text
    assert 'deepseek_tfx_batch_size_count{model="A"} 0.0' in text
    assert 'deepseek_tfx_queue_depth{model="A"} 0.0' in text


def test_several_servers_in_one_process_have_their_own_registries():
    one, two = ServerMetrics(["A"]), ServerMetrics(["A"])  # the default registry would clash
    one.observe_request("A", "/v1/completions", 200, 0.1)
    assert _value(_samples(one), "deepseek_tfx_requests_total",
                  model="A", route="/v1/completions", code="200") == 1
    assert _value(_samples(two), "deepseek_tfx_requests_total",
                  model="A", route="/v1/completions", code="200") == 0


def test_per_model_requests_errors_tokens_and_durations_add_up_over_a_90_10_split():
    metrics = ServerMetrics(["A", "B"], routes=["/v1/completions", "/v1/models/{name}:predict"])
    split = parse_split("A=90,B=10", ["A", "B"])
    sent = {"A": 0, "B": 0}
    for i in range(1000):
        model = split.choose(f"user-{i}")
        sent[model] += 1
        code = 400 if i % 50 == 0 else 200  # 20 bad requests
        metrics.observe_request(model, "/v1/completions", code, 0.02 + (i % 10) * 0.1)
        if code == 200:
            metrics.count_tokens(model, prompt_tokens=7, completion_tokens=np.int64(16))
    samples = _samples(metrics)
    for model in ("A", "B"):
        assert _sum(samples, "deepseek_tfx_requests_total", model=model) == sent[model]
        assert _value(samples, "deepseek_tfx_request_duration_seconds_count", model=model,
                      route="/v1/completions") == sent[model]
    assert _sum(samples, "deepseek_tfx_requests_total") == 1000
    assert _sum(samples, "deepseek_tfx_requests_total", code="400") == 20
    assert 870 <= _sum(samples, "deepseek_tfx_requests_total", model="A") <= 930
    assert (_value(samples, "deepseek_tfx_prompt_tokens_total", model="A")
            + _value(samples, "deepseek_tfx_prompt_tokens_total", model="B")) == 980 * 7
    assert (_value(samples, "deepseek_tfx_completion_tokens_total", model="A")
            + _value(samples, "deepseek_tfx_completion_tokens_total", model="B")) == 980 * 16
    # durations: 0.02 .. 0.92 s, 100 of each; le="0.1" holds the 0.02 s ones only
    assert _sum(samples, "deepseek_tfx_request_duration_seconds_bucket", le="0.1") == 100
    assert _sum(samples, "deepseek_tfx_request_duration_seconds_bucket", le="1.0") == 1000
    assert _sum(samples, "deepseek_tfx_request_duration_seconds_sum") == pytest.approx(
        1000 * 0.02 + 100 * 0.1 * sum(range(10)))


def test_label_values_stay_bounded_whatever_a_request_names():
    metrics = ServerMetrics(["A"], routes=["/v1/models/{name}:predict"])
    for i in range(100):  # hostile names and paths: two series, not two hundred
        metrics.observe_request(f"no-such-model-{i}", "/v1/models/{name}:predict", 404, 0.001)
        metrics.observe_request("A", f"/random/{i}", 404, 0.001)
    samples = _samples(metrics)
    requests = {ls: v for (n, ls), v in samples.items() if n == "deepseek_tfx_requests_total"}
    assert requests == {
        frozenset({("model", "(unknown)"), ("route", "/v1/models/{name}:predict"),
                   ("code", "404")}): 100,
        frozenset({("model", "A"), ("route", "(unmatched)"), ("code", "404")}): 100}
    metrics.observe_request(None, "/v1/models/{name}:predict", 404, 0.001)
    assert _value(_samples(metrics), "deepseek_tfx_requests_total", model="(unknown)",
                  route="/v1/models/{name}:predict", code="404") == 101


@pytest.mark.parametrize("call, message", [
    (lambda m: m.observe_request("A", "/r", 1000, 0.1), r"code=1000 is not an HTTP status"),
    (lambda m: m.observe_request("A", "/r", True, 0.1), r"code=True is not an HTTP status"),
    (lambda m: m.observe_request("A", "/r", 200, -1.0), r"seconds=-1.0 must be finite"),
    (lambda m: m.observe_request("A", "/r", 200, float("nan")), r"seconds=nan must be"),
    (lambda m: m.count_tokens("A", prompt_tokens=-1), r"prompt_tokens=-1 must be an integer"),
    (lambda m: m.count_tokens("A", completion_tokens=2.5), r"completion_tokens=2.5 must be"),
])
def test_bad_observations_are_refused_naming_the_value(call, message):
    with pytest.raises(ValueError, match=message):
        call(ServerMetrics(["A"]))


class _Model:
    """A stand-in model: doubles x; blocks while `hold` is clear."""

    def __init__(self):
        self.hold = threading.Event()
        self.hold.set()
        self.rows: list[int] = []

    def __call__(self, name, inputs):
        self.rows.append(len(inputs["x"]))
        assert self.hold.wait(10)
        return {"y": inputs["x"] * 2}


def _wait_for(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_the_batcher_hooks_see_every_model_call_and_the_rows_waiting():
    metrics = ServerMetrics(["A"])
    model = _Model()
    on_batch, track_queue = metrics.batcher_hooks("A")
    batcher = Batcher(model, ServeConfig(max_batch_size=4, batch_timeout_micros=0,
                                         num_batch_threads=1), on_batch=on_batch)
    track_queue(batcher.queued_rows)
    try:
        model.hold.clear()  # the first call blocks; the rest queue up behind it
        first = batcher.submit(("f",), {"x": np.array([1])}, 1)
        _wait_for(lambda: model.rows == [1])
        queued = [batcher.submit(("f",), {"x": np.arange(rows)}, rows) for rows in (3, 2, 2)]
        assert batcher.queued_rows() == 7
        samples = _samples(metrics)
        assert _value(samples, "deepseek_tfx_queue_depth", model="A") == 7
        model.hold.set()
        assert first.result(5)["y"].tolist() == [2]
        assert [f.result(5)["y"].tolist() for f in queued] == [[0, 2, 4], [0, 2], [0, 2]]
        assert batcher.queued_rows() == 0
    finally:
        batcher.close()
    # calls of 1, then 3 (3 + 2 > 4 rows), then 2 + 2 = 4
    assert model.rows == [1, 3, 4]
    samples = _samples(metrics)
    assert _value(samples, "deepseek_tfx_queue_depth", model="A") == 0
    assert _value(samples, "deepseek_tfx_batch_size_count", model="A") == 3
    assert _value(samples, "deepseek_tfx_batch_size_sum", model="A") == 8
    assert _value(samples, "deepseek_tfx_batch_size_bucket", model="A", le="1.0") == 1
    assert _value(samples, "deepseek_tfx_batch_size_bucket", model="A", le="2.0") == 1
    assert _value(samples, "deepseek_tfx_batch_size_bucket", model="A", le="4.0") == 3


def test_watch_batcher_hooks_an_existing_batcher_and_a_failing_hook_fails_no_request():
    metrics = ServerMetrics(["A", "B"])
    model = _Model()
    batcher = Batcher(model, ServeConfig(max_batch_size=8, batch_timeout_micros=0))
    try:
        metrics.watch_batcher("B", batcher)
        assert batcher.submit(("f",), {"x": np.arange(5)}, 5).result(5)["y"].tolist() == [
            0, 2, 4, 6, 8]
        samples = _samples(metrics)
        assert _value(samples, "deepseek_tfx_batch_size_sum", model="B") == 5
        assert _value(samples, "deepseek_tfx_batch_size_count", model="A") == 0

        def broken(rows):
            raise RuntimeError("a broken hook")

        batcher.on_batch = broken
        assert batcher.submit(("f",), {"x": np.arange(2)}, 2).result(5)["y"].tolist() == [0, 2]
    finally:
        batcher.close()
