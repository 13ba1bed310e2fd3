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
from collections.abc import Iterator, Sequence

import h11
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from config import ServeConfig
from serving.batcher import Unavailable
from serving.request_limits import BadRequest, parse_json_body
from serving.server import ModelServer

log = logging.getLogger(__name__)

_PREDICT = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict$")
_STATUS = re.compile(r"^(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?P<metadata>/metadata)?$")
_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]


class HTTPError(Exception):
    """An HTTP error reply: `status`, the one-line message, extra `headers`. Raised by
    `read_body`; the app answers it as JSON {"error": message} (routes of
    `extra_routers` may catch it to answer in their own error shape)."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


def json_response(status: int, payload: dict, headers: dict | None = None) -> Response:
    """`payload` as JSON (as `json.dumps`, non-ASCII escaped, like the server before)."""
    return Response(json.dumps(payload).encode("utf-8"), status_code=status,
                    media_type="application/json", headers=headers)


def make_app(server: ModelServer, extra_routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The ASGI app serving `server` on TF Serving's REST routes (module docstring).

    Args:
      server: the loaded model (it may still be warming up: state LOADING).
      extra_routers: more routes (e.g. OpenAI's `/v1/completions`), included after
        TF Serving's; paths under /v1/models/<...> stay TF Serving's.
    """
    limits = server.serve
    app = FastAPI(title="deepseek-tfx serve", docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.model_server = server

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
        allowed = ["POST"] if predict else ["GET", "HEAD"]
        if request.method not in allowed:
            raise HTTPError(405, f"{request.method} is not allowed on {request.url.path}; "
                             f"it takes {', '.join(allowed)}", {"Allow": ", ".join(allowed)})
        _check_model(server, match)
        if status:
            if request.method == "HEAD":
                return Response(status_code=200, media_type="application/json")
            return json_response(200, server.metadata() if match.group("metadata")
                                 else server.status())
        raw = await read_body(request, limits)
        return await run_in_threadpool(_predict, server, raw)

    for router in extra_routers:
        app.include_router(router)
    return app


def _check_model(server: ModelServer, match: re.Match) -> None:
    if match.group("name") != server.name:
        raise HTTPError(404, f"Servable not found for request: '{match.group('name')}'"
                              f" (this server serves '{server.name}')")
    version = match.group("version")
    if version is not None and int(version) != server.version:
        raise HTTPError(404, f"version {version} is not loaded (loaded: {server.version})")


async def read_body(request: Request, limits: ServeConfig) -> bytes:
    """The request body, at most `limits.max_body_bytes` in any framing, all of it
    within `limits.timeout_request_body` seconds. For other routes too (OpenAI's).

    Raises:
      HTTPError: 413 (too large: refused from Content-Length before reading, or as
        soon as a chunked body passes the limit), 408 (too slow), 400 (Content-Length
        beside Transfer-Encoding, or the client went away); each closes the connection.
    """
    cap, close = limits.max_body_bytes, {"Connection": "close"}
    declared = request.headers.get("content-length")
    if declared is not None and "transfer-encoding" in request.headers:
        # h11 frames it by Transfer-Encoding; a proxy in front may use Content-Length
        # (request smuggling): refused, as RFC 9112 §6.3 allows, and the connection closed
        raise HTTPError(400, "Content-Length beside Transfer-Encoding: the body's framing "
                             "is ambiguous; send one of them", close)
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise HTTPError(413, f"request body of {declared} bytes is over max_body_bytes={cap}",
                         close)
    chunks: list[bytes] = []
    size = 0

    async def receive_all() -> None:
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise HTTPError(413, f"request body is over max_body_bytes={cap} bytes",
                                 close)
            chunks.append(chunk)

    try:
        await asyncio.wait_for(receive_all(), limits.timeout_request_body)
    except asyncio.TimeoutError as e:
        raise HTTPError(408, f"the request body did not arrive within timeout_request_body="
                              f"{limits.timeout_request_body} s ({size} bytes came)",
                         close) from e
    except ClientDisconnect as e:
        raise HTTPError(400, "the client closed the connection before the body ended",
                         close) from e
    return b"".join(chunks)


def _predict(server: ModelServer, raw: bytes) -> Response:
    """Parse, predict, encode (a worker thread: all of it may take a while)."""
    try:
        return json_response(200, server.predict(parse_json_body(raw)))
    except BadRequest as e:
        return json_response(400, {"error": str(e)})
    except Unavailable as e:
        return json_response(503, {"error": str(e)}, {"Retry-After": "1"})
    except Exception as e:  # noqa: BLE001 (a server keeps serving)
        log.exception("predict failed")
        return json_response(500, {"error": f"internal error: {e}"})


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
