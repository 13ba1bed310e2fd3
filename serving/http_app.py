"""`deepseek-tfx serve` over HTTP: TF Serving's REST API on uvicorn (h11) + FastAPI.

Routes (`serving/server.py` has the request and reply shapes):

  GET  /v1/models/<name>[/versions/N]            200, TF Serving's model status: state
                                                 LOADING while warming up, then AVAILABLE
  GET  /v1/models/<name>[/versions/N]/metadata   200, the signatures
  POST /v1/models/<name>[/versions/N]:predict    200 {"predictions"|"outputs": ...}

plus the routes of `extra_routers` (e.g. the OpenAI API), which must not lie under
/v1/models/<...> (TF Serving's). Every error is JSON `{"error": "<one line>"}`:

  400  malformed JSON, a value out of range, an unknown key (ModelServer.predict's
       BadRequest); HTTP framing h11 refuses (a Content-Length of -1, abc or 1e3, two
       that differ; request headers past 16 KiB) or this app refuses (Content-Length
       beside Transfer-Encoding), and the connection is closed ("Content-Length: 5, 5"
       is 5, as RFC 9110 §8.6 allows)
  404  an unknown path, model name or version
  405  a method the route does not take (DELETE, PUT, ...; HEAD on :predict), with Allow
  408  headers begun but not finished within `timeout_keep_alive` seconds, or a body
       not all there `timeout_request_body` seconds after its headers; the
       connection is closed
  413  a body over `max_body_bytes`: at once from its Content-Length, or as soon as a
       chunked body passes it while it streams in; the connection is closed
  500  anything else the model raised (logged with its traceback)
  503  the batch queue is full, or the model is still LOADING (Retry-After: 1)

Limits (`config.ServeConfig`, defaults): max_body_bytes 10 MiB, max_response_bytes
64 MiB (a `logits` reply, sized before it runs), timeout_keep_alive 5 s (an idle
connection, one that sent no complete request headers, is closed), timeout_request_body
30 s. The JSON body is parsed and the reply encoded in a worker thread; the model runs
in the batcher's threads, so the event loop only moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence

import h11
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.protocols.http.h11_impl import H11Protocol

from config import ServeConfig
from serving.batcher import Unavailable
from serving.http_body import HTTPError, json_response, read_body
from serving.metrics import ServerMetrics
from serving.openai_api import OPENAI_ROUTES, SESSION_HEADER, make_openai_router
from serving.request_limits import BadRequest, parse_json_body
from serving.served_models import ServedModels
from serving.server import ModelServer

log = logging.getLogger(__name__)

_PREDICT = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict$")
_STATUS = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?P<metadata>/metadata)?$")
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
# The route labels of TF Serving's routes in /metrics (one catch-all route serves them).
STATUS_ROUTE = "/v1/models/{name}"
METADATA_ROUTE = "/v1/models/{name}/metadata"
PREDICT_ROUTE = "/v1/models/{name}:predict"
METRICS_ROUTE = "/metrics"
ROUTES = (STATUS_ROUTE, METADATA_ROUTE, PREDICT_ROUTE, METRICS_ROUTE, *OPENAI_ROUTES)


def make_app(models: ServedModels | ModelServer, metrics: ServerMetrics | None = None,
             openai: bool = True, extra_routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The ASGI app serving `models` (module docstring).

    Args:
      models: the served models (`ServedModels`), or one `ModelServer` (served under
        its name). They may still be warming up (state LOADING).
      metrics: where requests, tokens and batches are counted (`/metrics`); a new
        `ServerMetrics` for the models when None.
      openai: also serve the OpenAI-compatible routes (`serving/openai_api.py`).
      extra_routers: more routes, included last; paths under /v1/models/<...> stay
        TF Serving's.
    """
    if isinstance(models, ModelServer):
        models = ServedModels({models.name: models})
    limits = models.servers[models.default].serve
    app = FastAPI(title="deepseek-tfx serve", docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        message = exc.detail if exc.status_code != 404 else f"no such resource: {request.url.path}"
        return json_response(exc.status_code, {"error": str(message)}, exc.headers)

    @app.exception_handler(HTTPError)
    async def _own_error(request: Request, exc: HTTPError) -> Response:
        return json_response(exc.status, {"error": str(exc)}, exc.headers)

    @app.api_route("/v1/models/{path:path}", methods=_ALL_METHODS)
    async def tf_serving(request: Request, path: str) -> Response:
        try:
            return await _tf_serving(request, path)
        except HTTPError as e:
            if request.method == "HEAD":
                return Response(status_code=e.status, headers=e.headers)
            return json_response(e.status, {"error": str(e)}, e.headers)

    async def _tf_serving(request: Request, path: str) -> Response:
        predict, status = _PREDICT.match(path), _STATUS.match(path)
        match = predict or status
        if not match:
            raise HTTPError(404, f"no such resource: {request.url.path}")
        request.state.route = (PREDICT_ROUTE if predict else METADATA_ROUTE
                               if status.group("metadata") else STATUS_ROUTE)
        allowed = ["POST"] if predict else ["GET", "HEAD"]
        if request.method not in allowed:
            raise HTTPError(405, f"{request.method} is not allowed on {request.url.path}; "
                             f"it takes {', '.join(allowed)}", {"Allow": ", ".join(allowed)})
        if status:
            members = _members(models, match)
            request.state.model = members[0].name if len(members) == 1 else None
            if request.method == "HEAD":
                return Response(status_code=200, media_type="application/json")
            if match.group("metadata"):
                return json_response(200, members[0].metadata())
            return json_response(200, _status(members))
        _members(models, match)  # 404 before the body is read
        server = models.get(match.group("name"), request.headers.get(SESSION_HEADER))
        request.state.model = server.name
        _check_version(server, match)
        raw = await read_body(request, limits)
        return await run_in_threadpool(_predict, server, raw, metrics)

    if metrics is None:
        metrics = ServerMetrics(models.names(), routes=ROUTES)
    metrics.watch_servers(models.servers)

    @app.get(METRICS_ROUTE)
    async def prometheus_metrics(request: Request) -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    if openai:
        app.include_router(make_openai_router(
            models, read_body=lambda request: read_body(request, limits),
            on_usage=metrics.count_tokens))
    for router in extra_routers:
        app.include_router(router)
    app.add_middleware(_MetricsMiddleware, metrics=metrics)
    return app


def _members(models: ServedModels, match: re.Match) -> list[ModelServer]:
    name = match.group("name")
    try:
        return models.members(name)
    except KeyError:
        split = f" or the split '{models.split_name}'" if models.split_name else ""
        raise HTTPError(404, f"Servable not found for request: '{name}' (this server serves "
                             f"{models.names()}{split})") from None


def _check_version(server: ModelServer, match: re.Match) -> None:
    version = match.group("version")
    if version is not None and int(version) != server.version:
        raise HTTPError(404, f"version {version} is not loaded (loaded: {server.version})")


def _status(members: list[ModelServer]) -> dict:
    """TF Serving's model status; a split name is AVAILABLE once all its models are."""
    if len(members) == 1:
        return members[0].status()
    state = "AVAILABLE" if all(m.state == "AVAILABLE" for m in members) else "LOADING"
    return {"model_version_status": [{"version": str(m.version), "state": state,
                                      "status": {"error_code": "OK", "error_message": ""}}
                                     for m in members[:1]]}


def _predict(server: ModelServer, raw: bytes, metrics: ServerMetrics) -> Response:
    """Parse, predict, encode (a worker thread: all of it may take a while)."""
    try:
        usage: dict = {}
        reply = server.predict(parse_json_body(raw), usage)
        metrics.count_tokens(server.name, usage["prompt_tokens"], usage["completion_tokens"])
        return json_response(200, reply)
    except BadRequest as e:
        return json_response(400, {"error": str(e)})
    except Unavailable as e:
        return json_response(503, {"error": str(e)}, {"Retry-After": "1"})
    except Exception as e:  # noqa: BLE001 (a server keeps serving)
        log.exception("predict failed")
        return json_response(500, {"error": f"internal error: {e}"})


class _MetricsMiddleware:
    """ASGI middleware: every HTTP request is counted and timed, from its arrival to the
    last byte of its reply (a stream's included), under the route and model the handler
    recorded in `request.state` (`route`, `model`), else FastAPI's route template."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, code = time.perf_counter(), [500]

        async def send_counted(message) -> None:
            if message["type"] == "http.response.start":
                code[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        finally:
            state = scope.get("state") or {}
            route = state.get("route") or getattr(scope.get("route"), "path", None) or ""
            self.metrics.observe_request(state.get("model"), route, code[0],
                                         time.perf_counter() - start)


# ----------------------------------------------------------------------------- uvicorn

_HEADER_TIMEOUT_REPLY = json.dumps({"error": "the request headers did not arrive within "
                                             "timeout_keep_alive"}).encode()


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for request headers: a connection with no
    complete request headers `timeout_keep_alive` seconds after it opened (or after its
    last reply) is closed, with a 408 if it had sent part of them. uvicorn alone times
    out only idle connections after a reply, so a client that connects and trickles
    headers would hold its connection forever."""

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what h11 cannot parse (a Content-Length of -1, abc or 1e3,
        two that differ, headers past 16 KiB), as JSON."""
        body = json.dumps({"error": "the request is not valid HTTP/1.1 (its request line, "
                                    "headers or framing, e.g. a Content-Length that is not "
                                    "one non-negative integer)"}).encode()
        headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                   (b"content-length", str(len(body)).encode())]
        for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                      h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = asyncio.get_running_loop().call_later(
            self.timeout_keep_alive, self._on_header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return  # closed, or a request is in (its body has its own timeout)
        if self.conn.trailing_data[0]:  # part of the headers came
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                % (len(_HEADER_TIMEOUT_REPLY), _HEADER_TIMEOUT_REPLY))
        self.transport.close()


def uvicorn_config(app: FastAPI, host: str, port: int, limits: ServeConfig) -> uvicorn.Config:
    """uvicorn on h11 with the connection limits of `limits`, quiet (warnings only)."""
    return uvicorn.Config(app, host=host, port=port, http=TimedH11Protocol, lifespan="off",
                          timeout_keep_alive=limits.timeout_keep_alive, access_log=False,
                          log_level="warning", backlog=2048)


@contextlib.contextmanager
def serving_in_thread(app: FastAPI, limits: ServeConfig, host: str = "127.0.0.1",
                      port: int = 0) -> Iterator[int]:
    """Serves `app` from a background thread (tests, benchmarks); yields the bound port
    (port 0: a free one) and stops the server on exit."""
    config = uvicorn_config(app, host, port, limits)
    sock = config.bind_socket()
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            threading.Event().wait(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
