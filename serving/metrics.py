"""`/metrics` of `deepseek-tfx serve`: Prometheus' text format, per served model.

`ServerMetrics` owns one `prometheus_client.CollectorRegistry` (never the process-wide
default registry, so tests and several servers in one process each get their own) and
the metrics below, each labelled by `model`, the served model's name (`--model NAME=DIR`,
or `--model-name`):

| metric | type | labels | meaning |
| --- | --- | --- | --- |
| `deepseek_tfx_requests_total` | counter | model, route, code | HTTP requests answered, by route template and status code |
| `deepseek_tfx_request_duration_seconds` | histogram | model, route | wall time from the request's arrival to its reply (the end of a stream) |
| `deepseek_tfx_prompt_tokens_total` | counter | model | tokens in: prompt tokens the model read |
| `deepseek_tfx_completion_tokens_total` | counter | model | tokens out: tokens the model generated |
| `deepseek_tfx_batch_size` | histogram | model | rows (prompts) per model call of the batcher |
| `deepseek_tfx_queue_depth` | gauge | model | rows queued in the batcher, not yet in a model call |
| `deepseek_tfx_time_to_first_token_seconds` | histogram | model | engine: from a request's arrival to its first token |
| `deepseek_tfx_inter_token_latency_seconds` | histogram | model | engine: between two tokens of one request |
| `deepseek_tfx_e2e_request_latency_seconds` | histogram | model | engine: from a request's arrival to its last token |
| `deepseek_tfx_request_queue_time_seconds` | histogram | model | engine: from arrival to a decode slot |
| `deepseek_tfx_num_requests_running` | gauge | model | engine: requests in decode slots |
| `deepseek_tfx_num_requests_waiting` | gauge | model | engine: requests waiting for a slot |
| `deepseek_tfx_kv_cache_usage_perc` | gauge | model | engine: the share of decode slots in use, 0-1 |

The engine's metrics are vLLM's (`vllm:time_to_first_token_seconds`,
`vllm:inter_token_latency_seconds`, `vllm:e2e_request_latency_seconds`,
`vllm:request_queue_time_seconds`, `vllm:num_requests_running`, `...waiting`,
`vllm:kv_cache_usage_perc`) under this server's prefix; a slot holds a whole request's
cache, so slot usage is cache usage.

Errors are `deepseek_tfx_requests_total` with a 4xx or 5xx `code`, not a second counter:
Prometheus' naming guide asks for one metric with a label over one metric per outcome
(`http_requests_total{code}`), so the error ratio is one query and the requests of a
model add up whatever their code, e.g.
`sum by (model, code) (rate(deepseek_tfx_requests_total{code=~"4..|5.."}[5m]))`.

Label values are bounded, as hostile requests must not grow the registry: `model` is a
served model or `(unknown)` (a request naming no served model), `route` is the route's
template (`/v1/models/{name}:predict`, never the raw path) and, when `routes` is given,
one of them or `(unmatched)`; `code` is an HTTP status code, 100-599.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

PREFIX = "deepseek_tfx"
UNKNOWN_MODEL = "(unknown)"  # not a valid model name ([A-Za-z0-9._-]+): no collision
UNMATCHED_ROUTE = "(unmatched)"

# Seconds. A tokenize or a short logits call takes milliseconds, a long generation on a
# CPU tens of seconds: fine steps below 1 s (the cold-start bound is p99 < 1 s), coarse
# ones up to two minutes.
DURATION_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                      10.0, 20.0, 30.0, 60.0, 120.0, float("inf"))
# Seconds between tokens and to the first one: vLLM's buckets for both, cut at 60 s.
TOKEN_LATENCY_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                           1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0, float("inf"))
# Rows per model call: powers of two up to 1024 (ServeConfig.max_batch_size is 32 by default).
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, float("inf"))


def _is_int(value) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class ServerMetrics:
    """The Prometheus metrics of one server (module docstring: names and meanings).

    Args:
      models: the served model names; their token counters and batch histograms are
        exported at 0 from the start, and requests for any other name are counted
        under `model="(unknown)"`. Empty: every name is taken as given.
      routes: the route templates the app serves; any other route is counted as
        `route="(unmatched)"`. None: every route string is taken as given (then pass
        templates only, never raw paths).
      registry: where the metrics live; None makes a new `CollectorRegistry`.

    Thread-safe: the app and the batch threads call it concurrently.
    """

    def __init__(self, models: Iterable[str] = (), routes: Iterable[str] | None = None,
                 registry: CollectorRegistry | None = None):
        self.registry = CollectorRegistry() if registry is None else registry
        self.models = frozenset(models)
        self.routes = None if routes is None else frozenset(routes)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests", "HTTP requests answered, by served model, route template "
            "and HTTP status code (errors are the 4xx and 5xx codes).",
            ["model", "route", "code"], registry=r)
        self.request_duration = Histogram(
            f"{PREFIX}_request_duration_seconds", "Seconds from a request's arrival to the "
            "end of its reply (the last event of a stream), by served model and route "
            "template.", ["model", "route"], buckets=DURATION_BUCKETS_S, registry=r)
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "Tokens in: prompt tokens read by the model "
            "(OpenAI usage.prompt_tokens), by served model.", ["model"], registry=r)
        self.completion_tokens = Counter(
            f"{PREFIX}_completion_tokens", "Tokens out: tokens generated by the model "
            "(OpenAI usage.completion_tokens), by served model.", ["model"], registry=r)
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size", "Rows (prompts) per model call of the request batcher "
            "(TF Serving's batching; at most serve.max_batch_size), by served model.",
            ["model"], buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.queue_depth = Gauge(
            f"{PREFIX}_queue_depth", "Rows (prompts) queued in the request batcher and not "
            "yet in a model call, by served model; beyond serve.max_enqueued_batches x "
            "serve.max_batch_size requests get 503.", ["model"], registry=r)
        token_histograms = {
            "time_to_first_token": "Seconds from a request's arrival to its first token "
                                   "(serving engine), by served model.",
            "inter_token_latency": "Seconds between two consecutive tokens of one request "
                                   "(serving engine), by served model.",
            "e2e_request_latency": "Seconds from a request's arrival to its last token "
                                   "(serving engine), by served model.",
            "request_queue_time": "Seconds a request waited for a decode slot (serving "
                                  "engine), by served model.",
        }
        self.engine_latency = {
            name: Histogram(f"{PREFIX}_{name}_seconds", doc, ["model"],
                            buckets=TOKEN_LATENCY_BUCKETS_S, registry=r)
            for name, doc in token_histograms.items()}
        self.engine_gauges = {
            "running": Gauge(f"{PREFIX}_num_requests_running", "Requests in decode slots "
                             "of the serving engine, by served model.", ["model"], registry=r),
            "waiting": Gauge(f"{PREFIX}_num_requests_waiting", "Requests waiting for a "
                             "decode slot, by served model.", ["model"], registry=r),
            "usage": Gauge(f"{PREFIX}_kv_cache_usage_perc", "The share of the engine's "
                           "decode slots (each one request's KV cache) in use, 0-1, by "
                           "served model.", ["model"], registry=r),
        }
        for model in sorted(self.models):  # exported at 0 before the first request
            self.prompt_tokens.labels(model)
            self.completion_tokens.labels(model)
            self.batch_size.labels(model)
            self.queue_depth.labels(model)
            for metric in (*self.engine_latency.values(), *self.engine_gauges.values()):
                metric.labels(model)

    # ------------------------------------------------------------------ request path
    def model_label(self, model: str | None) -> str:
        """`model` if it is served (or no list of models was given), else `(unknown)`."""
        if not model or (self.models and model not in self.models):
            return UNKNOWN_MODEL
        return model

    def route_label(self, route: str) -> str:
        """`route` if the app serves it (or no list of routes was given), else `(unmatched)`."""
        if self.routes is not None and route not in self.routes:
            return UNMATCHED_ROUTE
        return route

    def observe_request(self, model: str | None, route: str, code: int,
                        seconds: float) -> None:
        """Counts one answered request and its duration.

        Args:
          model: the served model that answered; None or an unserved name (a 404 for
            an unknown model) is counted as `(unknown)`.
          route: the route template, e.g. "/v1/completions", "/v1/models/{name}:predict".
          code: the HTTP status code sent, 100-599.
          seconds: wall time from arrival to the end of the reply, >= 0.

        Raises:
          ValueError: a code outside 100-599 or negative (or non-finite) seconds.
        """
        if not _is_int(code) or not 100 <= code <= 599:
            raise ValueError(f"code={code!r} is not an HTTP status code (100-599)")
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"seconds={seconds!r} must be finite and >= 0")
        model, route = self.model_label(model), self.route_label(route)
        self.requests.labels(model, route, str(int(code))).inc()
        self.request_duration.labels(model, route).observe(seconds)

    def count_tokens(self, model: str, prompt_tokens: int = 0,
                     completion_tokens: int = 0) -> None:
        """Adds one request's tokens in (prompt) and out (completion).

        Raises:
          ValueError: a negative or non-integer count.
        """
        for name, value in (("prompt_tokens", prompt_tokens),
                            ("completion_tokens", completion_tokens)):
            if not _is_int(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be an integer >= 0")
        model = self.model_label(model)
        if prompt_tokens:
            self.prompt_tokens.labels(model).inc(int(prompt_tokens))
        if completion_tokens:
            self.completion_tokens.labels(model).inc(int(completion_tokens))

    # ------------------------------------------------------------------ the batcher
    def observe_batch(self, model: str, rows: int) -> None:
        """Records one model call of `rows` rows (the batch size histogram)."""
        self.batch_size.labels(self.model_label(model)).observe(rows)

    def batch_observer(self, model: str) -> Callable[[int], None]:
        """The `on_batch(rows)` hook of `serving.batcher.Batcher` for `model`."""
        return self.batch_size.labels(self.model_label(model)).observe

    def track_queue_depth(self, model: str, queued_rows: Callable[[], int]) -> None:
        """Makes `deepseek_tfx_queue_depth{model}` read `queued_rows()` at every scrape
        (e.g. `Batcher.queued_rows`). A second call for one model replaces the first."""
        self.queue_depth.labels(self.model_label(model)).set_function(lambda: float(queued_rows()))

    def batcher_hooks(self, model: str) -> tuple[Callable[[int], None],
                                                  Callable[[Callable[[], int]], None]]:
        """`(on_batch, track_queue)` for a batcher built after this call:
        `Batcher(call, config, on_batch=on_batch)`, then `track_queue(batcher.queued_rows)`."""
        return (self.batch_observer(model),
                lambda queued_rows: self.track_queue_depth(model, queued_rows))

    def watch_batcher(self, model: str, batcher) -> None:
        """Hooks an existing `serving.batcher.Batcher` (its `on_batch` attribute and its
        `queued_rows()`) to `model`'s batch size and queue depth."""
        batcher.on_batch = self.batch_observer(model)
        self.track_queue_depth(model, batcher.queued_rows)

    def watch_servers(self, servers: dict) -> None:
        """Hooks each served model's batcher, and its engine when it has one
        ({name: `ModelServer`})."""
        for name, server in servers.items():
            self.watch_batcher(name, server.batcher)
            if getattr(server, "engine", None) is not None:
                self.watch_engine(name, server.engine)

    # ------------------------------------------------------------------ the engine
    def watch_engine(self, model: str, engine) -> None:
        """Hooks a `serving.engine.Engine` to `model`'s latency histograms (its
        `observer`) and makes the running, waiting and slot-usage gauges read its
        `stats()` at every scrape."""
        label = self.model_label(model)
        latency = {name: h.labels(label) for name, h in self.engine_latency.items()}
        engine.observer = EngineObserver(latency["request_queue_time"].observe,
                                         latency["time_to_first_token"].observe,
                                         latency["inter_token_latency"].observe,
                                         latency["e2e_request_latency"].observe)
        gauges = {name: g.labels(label) for name, g in self.engine_gauges.items()}
        gauges["running"].set_function(lambda: float(engine.stats()["running"]))
        gauges["waiting"].set_function(lambda: float(engine.stats()["waiting"]))
        gauges["usage"].set_function(
            lambda: engine.stats()["running"] / max(engine.stats()["slots"], 1))

    # ------------------------------------------------------------------ /metrics
    def render(self) -> tuple[bytes, str]:
        """`(body, content_type)` of `/metrics`: Prometheus' text format 0.0.4."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class EngineObserver:
    """The hooks `serving.engine.Engine` calls (seconds each): `queued` (arrival to a
    slot), `first_token` (arrival to the first token), `next_token` (since the request's
    previous token) and `finished` (arrival to the end)."""

    def __init__(self, queued: Callable[[float], None], first_token: Callable[[float], None],
                 next_token: Callable[[float], None], finished: Callable[[float], None]):
        self.queued, self.first_token = queued, first_token
        self.next_token, self.finished = next_token, finished
