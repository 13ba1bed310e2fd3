"""A bounded loopback load test for `deepseek-tfx serve` (or TF Serving).

`load_test(url, bodies, requests, concurrency)` sends `requests` POSTs, at most
`concurrency` at a time, to `url` (which must be on the loopback interface),
cycling through `bodies`, and returns latency percentiles and the status counts.
It stops by itself: a fixed number of requests, each with a timeout.
`wait_until_ready(url)` polls a model's status URL until the model is AVAILABLE.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _check_loopback(url: str) -> None:
    if urllib.parse.urlparse(url).hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"{url}: load tests only target the loopback interface")


def post_json(url: str, body, timeout: float = 60.0) -> tuple[int, dict]:
    """(HTTP status, parsed JSON body) of one POST; `timeout` in seconds.

    Raises:
      OSError: no connection, or no answer within `timeout`.
      ValueError: the answer is not JSON.
    """
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _available(body: bytes) -> bool:
    """False while TF Serving's model status says a version is not AVAILABLE (LOADING:
    warming up); True for any other 200 answer."""
    try:
        versions = json.loads(body).get("model_version_status", [])
    except (ValueError, AttributeError):
        return True
    return all(v.get("state", "AVAILABLE") == "AVAILABLE" for v in versions)


def wait_until_ready(status_url: str, timeout_s: float = 300.0, alive=lambda: True) -> float:
    """Polls `status_url` (GET) until it answers 200 and, when it is TF Serving's model
    status, every version's state is AVAILABLE; returns the seconds waited.

    Args:
      status_url: e.g. http://127.0.0.1:8501/v1/models/deepseek (loopback only).
      timeout_s: give up after this many seconds.
      alive: returns False when the server process has died (stop waiting).

    Raises:
      ValueError: `status_url` is not on the loopback interface.
      TimeoutError: no 200 within `timeout_s`, or `alive()` turned False.
    """
    _check_loopback(status_url)
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if not alive():
            raise TimeoutError(f"{status_url}: the server exited before it answered")
        try:
            with urllib.request.urlopen(status_url, timeout=5) as response:
                if response.status == 200 and _available(response.read()):
                    return time.perf_counter() - start
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{status_url}: no answer within {timeout_s:.0f} s")


def load_test(url: str, bodies: list, requests: int = 200, concurrency: int = 8,
              timeout: float = 60.0) -> dict:
    """Latency p50/p90/p99 (ms), requests per second and status counts of `requests`
    POSTs, at most `concurrency` at a time; each times out after `timeout` seconds
    (status 0, as a connection error).

    Raises:
      ValueError: `url` is not on the loopback interface.
    """
    _check_loopback(url)

    def one(i: int) -> tuple[int, float]:
        start = time.perf_counter()
        try:
            status, _ = post_json(url, bodies[i % len(bodies)], timeout)
        except (OSError, ValueError):
            status = 0  # connection error, timeout, or an answer that is not JSON
        return status, time.perf_counter() - start

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    latencies = np.array([s for _, s in results]) * 1000
    statuses: dict[str, int] = {}
    for status, _ in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {
        "requests": requests,
        "concurrency": concurrency,
        "status_counts": statuses,
        "errors": sum(n for s, n in statuses.items() if s != "200"),
        "p50_ms": round(float(np.percentile(latencies, 50)), 1),
        "p90_ms": round(float(np.percentile(latencies, 90)), 1),
        "p99_ms": round(float(np.percentile(latencies, 99)), 1),
        "requests_per_second": round(requests / wall, 2),
    }
