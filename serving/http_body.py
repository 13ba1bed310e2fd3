"""Reading a request body within limits, and HTTP errors as JSON: what every route of
`deepseek-tfx serve` shares (TF Serving's in `serving/http_app.py`, OpenAI's in
`serving/openai_api.py`)."""

from __future__ import annotations

import asyncio
import json

from fastapi import Request
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from config import ServeConfig


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
