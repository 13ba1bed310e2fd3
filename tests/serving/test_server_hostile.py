"""`deepseek-tfx serve` against hostile requests, byte for byte over a raw socket
(issue 24's list): each gets a 4xx within 2 s (or a 408 at the configured timeout),
the process never exits, its RSS stays within 500 MB of idle, and 200 good requests
at concurrency 8 all succeed afterwards. Also: the first 8 concurrent requests after
`ready` have p99 under 1 s (the warm-up ran before AVAILABLE).

The server is `python -m cli serve` in a child process (an abort inside TensorFlow
cannot take pytest with it; its RSS is read from /proc) on a tiny plain language
model: the tiny preset with one dense block, context 64, vocabulary 512, a learned
byte-level BPE; max_batch_size 8, timeout_keep_alive 2 s, timeout_request_body 2 s,
max_body_bytes 1 MiB (so the over-the-limit bodies are quick to send).
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tiny_text_model import save_tiny_text_model

from serving.load_test import load_test, post_json, wait_until_ready

pytestmark = pytest.mark.slow

PROJECT_ROOT = Path(__file__).resolve().parents[2]
UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "\n\n": 10, "你好": 5, "世界": 5}
CONTEXT, VOCAB, MAX_BODY = 64, 512, 1 << 20
TIMEOUT_S = 2  # timeout_keep_alive and timeout_request_body
RSS_SLACK_MB = 500
PATH = "/v1/models/deepseek:predict"


def _generate(prompt: str, max_new_tokens: int = 6, **sampling) -> dict:
    return {"signature_name": "generate", "instances": [{
        "prompt": prompt, "max_new_tokens": max_new_tokens, "temperature": 0.0, "top_k": 0,
        "top_p": 1.0, "seed": 0, **sampling}]}


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    return save_tiny_text_model(tmp_path_factory.mktemp("hostile_model") / "saved",
                                ByteLevelBpe(learn(UNITS, 300).json), context=CONTEXT,
                                max_new_tokens=8, vocab_size=VOCAB)


class Served:
    """The child `serve` process: its port, pid and RSS."""

    def __init__(self, model_dir: Path, log_path: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log_path = log_path
        self.log = open(log_path, "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--model", str(model_dir),
             "--port", str(self.port), "--max-batch-size", "8",
             "--timeout-keep-alive", str(TIMEOUT_S), "--timeout-request-body", str(TIMEOUT_S),
             "--max-body-bytes", str(MAX_BODY)],
            cwd=PROJECT_ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
        self.base = f"http://127.0.0.1:{self.port}/v1/models/deepseek"

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmRSS")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def served(text_model, tmp_path_factory):
    server = Served(text_model, tmp_path_factory.mktemp("serve_log") / "serve.log")
    try:
        wait_until_ready(server.base, 300, server.alive)
        server.idle_rss_mb = server.rss_mb()
        yield server
    finally:
        server.stop()


# ----------------------------------------------------------------------------- raw HTTP


def _response(sock: socket.socket, timeout: float) -> tuple[int | None, dict, bytes | None]:
    """(status, headers, body) of one HTTP response; status None when the server closed
    (or reset) the connection without one, or sent none within `timeout` seconds; body
    None when a reset cut the response after its head."""
    sock.settimeout(timeout)
    raw = b""
    while True:
        head_end = raw.find(b"\r\n\r\n")
        if head_end >= 0:
            lines = raw[:head_end].decode("latin-1").split("\r\n")
            headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
            length = int(headers.get("content-length", "0"))
            if len(raw) - head_end - 4 >= length:
                body = raw[head_end + 4:head_end + 4 + length]
                return int(lines[0].split()[1]), headers, body
        try:
            chunk = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            chunk = b""
        if not chunk:
            if head_end >= 0:  # the answer's head came, then a reset took the rest
                return int(lines[0].split()[1]), headers, None
            return None, {}, raw
        raw += chunk


def exchange(port: int, head: bytes, body_chunks=(), timeout: float = 10.0):
    """Sends `head`, then each of `body_chunks` while no answer has come; returns
    (status, headers, body, seconds from the first byte sent to the answer)."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        start = time.perf_counter()
        sock.sendall(head)
        for chunk in body_chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the server answered: stop sending
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        status, headers, body = _response(sock, timeout)
        return status, headers, body, time.perf_counter() - start


def post(body: bytes, path: str = PATH, extra: bytes = b"") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body))


def _json(obj) -> bytes:
    return json.dumps(obj).encode()


def nested(depth: int, key: str) -> bytes:
    """{"<key>": [[[...["x"]...]]]}, `depth` levels (528 bytes at 255 under instances)."""
    return b'{"%s": %s"x"%s}' % (key.encode(), b"[" * depth, b"]" * depth)


# (name, raw request bytes, the statuses allowed, a regex of the error (JSON replies))
HOSTILE = [
    ("content-length -1", b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: -1\r\n\r\n" + b'{"instances": ["the"]}', {400}, r"^the request is not valid HTTP/1\.1"),
    ("content-length abc", b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: abc\r\n\r\n{}", {400}, r"^the request is not valid HTTP/1\.1"),
    ("content-length 1e3", b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 1e3\r\n\r\n{}", {400}, r"^the request is not valid HTTP/1\.1"),
    ("content-length 5, 5", b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 5, 5\r\n\r\n{\"a\":", {400}, r"not JSON"),
    ("content-length 6, 5", b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n"
     b"Content-Length: 6, 5\r\n\r\n{\"a\":1", {400}, r"^the request is not valid HTTP/1\.1"),
    ("honest content-length over the limit", b"POST " + PATH.encode() +
     b" HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (200 << 20), {413},
     r"over max_body_bytes"),
    ("100,000 nested lists", post(b"[" * 100_000 + b"]" * 100_000), {400}, r"nested too deep"),
    ("100,000 nested lists in instances",
     post(b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), {400}, r"nested too deep"),
    ("logits over the context: 4,096 ids",
     post(_json({"signature_name": "logits", "inputs": {"input_ids": [[1] * 4096]}})), {400},
     r"^input_ids has 4096 positions; logits takes at most 64 \(the model's context"),
    ("HEAD on predict", b"HEAD " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n", {405}, None),
    ("DELETE", b"DELETE /v1/models/deepseek HTTP/1.1\r\nHost: x\r\n\r\n", {405},
     r"^DELETE is not allowed on /v1/models/deepseek; it takes GET, HEAD$"),
    ("max_new_tokens 2**32+8", post(_json(_generate("the", 2**32 + 8))), {400},
     r"^input 'max_new_tokens' must be int32 in \[-2147483648, 2147483647\]; "
     r"max_new_tokens\[0\] = 4294967304$"),
    ("max_new_tokens 2**31", post(_json(_generate("the", 2**31))), {400},
     r"^input 'max_new_tokens' must be int32 .*= 2147483648$"),
    ("top_k 2**32", post(_json(_generate("the", top_k=2**32))), {400},
     r"^input 'top_k' must be int32"),
    ("max_new_tokens true", post(_json(_generate("the", True))), {400},
     r"^input 'max_new_tokens' takes numbers \(int32\), not booleans; max_new_tokens\[0\] = true"),
    ("temperature Infinity", post(_json(_generate("the", temperature=float("inf")))), {400},
     r"^input 'temperature' must be a finite float32 .*= inf$"),
    ("temperature NaN", post(_json(_generate("the", temperature=float("nan")))), {400},
     r"^input 'temperature' must be a finite float32"),
    ("temperature 1e39", post(_json(_generate("the", temperature=1e39))), {400},
     r"^input 'temperature' must be a finite float32"),
    ("unknown top-level key", post(_json({**_generate("the"), "max_tokens": 5})), {400},
     r"^unknown key 'max_tokens' in the request"),
    ("unknown key in an instance",
     post(_json({"signature_name": "generate", "instances": [{**_generate("the")["instances"][0],
                                                              "temprature": 0.5}]})), {400},
     r"^unknown key 'temprature' in instances\[0\]"),
    ('{"inputs": "ROMEO:"}', post(b'{"inputs": "ROMEO:"}'), {200, 400}, None),
    ("a string where numbers belong", post(_json(_generate("the", "8"))), {400},
     r"^input 'max_new_tokens' takes integers \(int32\)"),
    ("a number where text belongs", post(_json({"instances": [5]})), {400},
     r"^input 'prompt' takes strings"),
    ("ragged input_ids", post(_json({"signature_name": "logits",
                                     "inputs": {"input_ids": [[1, 2], [3]]}})), {400},
     r"ragged"),
    ("9 rows over max_batch_size 8", post(_json({"instances": ["the"] * 9})), {400},
     r"^a request may have at most max_batch_size=8 rows"),
    ("invalid UTF-8", post(b'{"instances": ["\xff\xfe"]}'), {400}, r"not JSON"),
    ("not JSON", post(b"not json"), {400}, r"not JSON"),
    ("unknown signature", post(_json({"signature_name": "nope", "instances": ["a"]})), {400},
     r"^unknown signature_name 'nope'"),
    ("path traversal", b"GET /v1/models/../../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n",
     {400, 404}, None),
    # h11 refuses request headers it cannot parse within 16 KiB of buffering
    ("a 1 MiB URL", b"GET /v1/models/" + b"a" * (1 << 20) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     {400, 414, 431}, r"^the request is not valid HTTP/1\.1"),
    ("a 1 MiB header", b"GET /v1/models/deepseek HTTP/1.1\r\nHost: x\r\nX-Big: " +
     b"a" * (1 << 20) + b"\r\n\r\n", {400, 431}, r"^the request is not valid HTTP/1\.1"),
    ("POST without a body", b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\n\r\n",
     {400, 411}, None),
]


def _assert_still_fine(served) -> None:
    assert served.alive(), served.log_path.read_text()[-3000:]
    grown = served.rss_mb() - served.idle_rss_mb
    assert grown < RSS_SLACK_MB, f"RSS grew {grown:.0f} MB over idle"


def test_the_first_8_concurrent_requests_after_ready_are_fast(served):
    # Must be the module's first predict requests: the warm-up alone warmed the model.
    status = json.loads(exchange(served.port, b"GET /v1/models/deepseek HTTP/1.1\r\n"
                                               b"Host: x\r\n\r\n")[2])
    assert status["model_version_status"][0]["state"] == "AVAILABLE"
    url = served.base + ":predict"
    prompts = ["the", "the quick", "fox", " brown fox", "你好", "世界 the", "quick", "\n\nthe"]

    def timed(prompt):
        start = time.perf_counter()
        code, _ = post_json(url, _generate(prompt, 16))
        return code, time.perf_counter() - start

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(timed, prompts))
    assert [code for code, _ in results] == [200] * 8
    # issue 24's bound: p99 (of 8: the slowest) under 1 s; 12.6 s each before the warm-up
    assert max(s for _, s in results) < 1.0, results


def test_255_deep_instances_or_inputs_get_a_400_and_the_server_lives(served):
    for key in ("instances", "inputs"):
        request = post(nested(255, key))
        if key == "instances":
            assert len(nested(255, key)) == 528  # the request, byte for byte
        status, _, body, seconds = exchange(served.port, request)
        assert status == 400 and seconds < 2, (key, status, body)
        assert json.loads(body)["error"] == (
            "input 'prompt' is nested deeper than its 1 dimensions (string [None])")
    _assert_still_fine(served)
    assert post_json(served.base + ":predict", _generate("the"))[0] == 200


@pytest.mark.parametrize("name,request_bytes,allowed,message", HOSTILE,
                         ids=[h[0] for h in HOSTILE])
def test_hostile_request_gets_a_4xx_within_2s(served, name, request_bytes, allowed, message):
    import re

    status, headers, body, seconds = exchange(served.port, request_bytes)
    assert status in allowed and seconds < 2, (status, (body or b"")[:300], seconds)
    # body None: the server closed with the client's request still unread (the 1 MiB
    # header), and the kernel's reset took its answer's body after the head (seen once in
    # CI); the status came, within the bound.
    if message is not None and body is not None:
        assert headers.get("content-type") == "application/json"
        assert re.search(message, json.loads(body)["error"]), body
    _assert_still_fine(served)


def test_a_chunked_body_counts_against_the_limit_while_it_streams(served):
    head = (b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: "
            b"application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n%s\r\n" % (65536, b"[" * 65536)
    # 200 MiB offered; refused once past 1 MiB (the client stops on the answer)
    status, headers, body, seconds = exchange(served.port, head, [chunk] * 3200)
    assert status == 413 and seconds < 2, (status, body)
    assert json.loads(body)["error"] == f"request body is over max_body_bytes={MAX_BODY} bytes"
    assert headers["connection"] == "close"
    _assert_still_fine(served)


def test_chunk_data_is_never_parsed_as_a_second_request(served):
    smuggled = b"GET /v1/models/deepseek HTTP/1.1\r\nHost: x\r\n\r\n"
    body = _json(_generate("the"))
    request = (b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
               b"chunked\r\n\r\n%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n"
               % (len(body), body, len(smuggled), smuggled))
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        sock.sendall(request)
        status, _, reply = _response(sock, 10)
        # the whole body (JSON + the smuggled bytes) is one body: not JSON, one 400
        assert status == 400 and b"not JSON" in reply, reply
        assert _response(sock, 1)[0] is None  # and no second response
    # the same body framed honestly: Content-Length beside Transfer-Encoding is refused
    both = (b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    status, _, reply, _ = exchange(served.port, both)
    assert status == 400 and b"Content-Length beside Transfer-Encoding" in reply, reply
    _assert_still_fine(served)


def test_a_body_that_never_arrives_gets_408_at_the_body_timeout(served):
    head = (b"POST " + PATH.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
            b'{"instances"')
    status, _, body, seconds = exchange(served.port, head)
    assert status == 408, body
    assert TIMEOUT_S - 0.1 < seconds < TIMEOUT_S + 2  # at timeout_request_body, with margin
    assert "timeout_request_body=2" in json.loads(body)["error"]


def test_idle_connections_are_closed_and_half_sent_headers_get_408(served):
    with socket.create_connection(("127.0.0.1", served.port)) as sock:
        start = time.perf_counter()
        assert _response(sock, 10)[0] is None  # closed without a word
        assert TIMEOUT_S - 0.1 < time.perf_counter() - start < TIMEOUT_S + 2
    status, _, body, seconds = exchange(served.port, b"POST " + PATH.encode() + b" HTTP/1.1\r\n"
                                                     b"Host: x\r\n")
    assert status == 408 and TIMEOUT_S - 0.1 < seconds < TIMEOUT_S + 2, body
    # many idle connections at once: no thread each, and all closed
    socks = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(200)]
    try:
        time.sleep(TIMEOUT_S + 1)
        assert all(_response(s, 2)[0] is None for s in socks)
    finally:
        for s in socks:
            s.close()
    _assert_still_fine(served)


def test_after_everything_200_good_requests_at_concurrency_8_succeed(served):
    bodies = [_generate(p, 8) for p in ("the", "the quick", "fox", "你好世界", " brown")]
    report = load_test(served.base + ":predict", bodies, requests=200, concurrency=8)
    assert report["status_counts"] == {"200": 200}, report
    _assert_still_fine(served)
