"""Loopback load test of `deepseek-tfx serve` on a pushed model, optionally side by side
with another commit's server.

  python benchmarks/serve_load.py --model SERVING_DIR [--requests 200]
      [--concurrency 8,32] [--max-new-tokens 16] [--serve-args "--num-batch-threads 1"]
      [--baseline-checkout DIR [--baseline-model SERVING_DIR]] [--json]

Starts this checkout's server (`python -m cli serve`) as a subprocess on a free
loopback port and waits until it is ready (TF Serving's model status AVAILABLE: this
checkout's server warms up before it says so). Then the cold start: the first 8
concurrent requests, timed (p50/p99, "first 8 after ready"). Then it warms up
further (the first call of a signature is slow on a server without warm-up), then for each
concurrency level sends `--requests` predict requests (`generate`, greedy,
`--max-new-tokens`, prompts from a small list), at most that many at a time, and
prints requests/s and p50/p90/p99 latency (ms). Then a few malformed requests check
for 4xx while the server keeps serving, and the server is stopped (Ctrl-C: it prints
how many requests shared each model call).

With `--baseline-checkout DIR` (a clone of another commit with its own `.venv`), DIR's
server runs the same load afterwards (`DIR/.venv/bin/python -m cli serve`,
on `--baseline-model`, default `--model`), one server at a time so they do not share
the CPU, and the ratio of requests/s is printed per level. Every request is one
`instances` row with its own max_new_tokens, temperature, top_k, top_p and seed: valid
whether `generate` takes them as scalars (older exports) or one per prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from serving.load_test import load_test, post_json, wait_until_ready

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["ROMEO:", "JULIET:\nO", "First Citizen:\n", "KING RICHARD III:\nNow is the",
           "To be, or not", "MENENIUS:\nWhy, masters,", "", "The"]
MODEL_NAME = "deepseek"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bodies(max_new_tokens: int) -> list[dict]:
    """One greedy `generate` instance per request (valid for scalar and per-row inputs)."""
    return [{"signature_name": "generate", "instances": [{
        "prompt": p, "max_new_tokens": max_new_tokens, "temperature": 0.0, "top_k": 0,
        "top_p": 1.0, "seed": 0}]} for p in PROMPTS]


def run_server_load(label: str, python: str, checkout: Path, model: str, args,
                    extra_serve_args: list[str], log_dir: str) -> dict:
    """Starts `checkout`'s server, loads it at each concurrency, stops it; the report.

    Raises:
      TimeoutError: the server did not answer within 300 s of starting.
    """
    port = _free_port()
    log_path = os.path.join(log_dir, f"{label}.log")
    command = [python, "-m", "cli", "serve", "--model", model, "--port", str(port),
               *extra_serve_args]
    print(f"[{label}] {' '.join(shlex.quote(c) for c in command)}  (cwd {checkout})",
          file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=checkout, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    base = f"http://127.0.0.1:{port}/v1/models/{MODEL_NAME}"
    report: dict = {"server": label, "checkout": str(checkout), "model": model}
    try:
        report["startup_s"] = round(wait_until_ready(base, 300, lambda: server.poll() is None), 1)
        load = bodies(args.max_new_tokens)
        report["first_8_after_ready"] = load_test(base + ":predict", load, 8, 8, timeout=300)
        for body in load[:2]:  # the first calls trace and optimize the graph
            post_json(base + ":predict", body, timeout=300)
        load_test(base + ":predict", load, requests=max(args.concurrency), concurrency=max(
            args.concurrency), timeout=300)
        report["levels"] = [load_test(base + ":predict", load, args.requests, c, timeout=300)
                            for c in args.concurrency]
        malformed = [b"not json", {"instances": "x"}, {"signature_name": "nope", "instances": ["a"]},
                     {"inputs": {"input_ids": "wrong"}, "signature_name": "logits"}]
        report["malformed_statuses"] = [post_json(base + ":predict", b)[0] for b in malformed]
        report["still_serving"] = post_json(base + ":predict", load[0])[0] == 200
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    with open(log_path) as log:
        lines = [line.rstrip("\n") for line in log if not line.startswith(("20", "WARNING"))]
    report["server_says"] = [line for line in lines
                             if line.startswith(("  batching:", "served ", "ready:"))]
    return report


def _print_table(reports: list[dict]) -> None:
    print(f"{'server':<10} {'conc':>4} {'req/s':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
          f"{'errors':>6}")
    for report in reports:
        for level in report["levels"]:
            print(f"{report['server']:<10} {level['concurrency']:>4} "
                  f"{level['requests_per_second']:>7.2f} {level['p50_ms']:>8.0f} "
                  f"{level['p90_ms']:>8.0f} {level['p99_ms']:>8.0f} {level['errors']:>6}")
        first = report["first_8_after_ready"]
        print(f"{report['server']:<10} first 8 concurrent requests after ready: p50 "
              f"{first['p50_ms']:.0f} ms, p99 {first['p99_ms']:.0f} ms, errors {first['errors']}"
              f" (startup {report['startup_s']} s)")
        for line in report["server_says"]:
            print(f"  {report['server']}: {line.strip()}")
    if len(reports) == 2:
        this, base = reports
        for mine, theirs in zip(this["levels"], base["levels"], strict=True):
            ratio = mine["requests_per_second"] / max(theirs["requests_per_second"], 1e-9)
            print(f"concurrency {mine['concurrency']}: this {mine['requests_per_second']:.2f} "
                  f"req/s vs baseline {theirs['requests_per_second']:.2f} req/s = {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="serving dir (newest version is served)")
    parser.add_argument("--requests", type=int, default=200, help="per concurrency level")
    parser.add_argument("--concurrency", default="8,32",
                        help="comma-separated levels, e.g. 8,32 (default)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--serve-args", default="",
                        help='more flags for this checkout\'s serve, e.g. "--num-batch-threads 1"')
    parser.add_argument("--baseline-checkout", type=Path,
                        help="another commit's clone with its own .venv: load it too")
    parser.add_argument("--baseline-model", help="the model the baseline serves "
                        "(default --model)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON too")
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]

    with tempfile.TemporaryDirectory(prefix="serve_load_") as log_dir:
        reports = [run_server_load("this", sys.executable, PROJECT_ROOT, args.model, args,
                                   shlex.split(args.serve_args), log_dir)]
        if args.baseline_checkout:
            python = args.baseline_checkout / ".venv" / "bin" / "python"
            if not python.exists():
                raise SystemExit(f"error: {python} not found (the baseline needs its .venv)")
            reports.append(run_server_load("baseline", str(python), args.baseline_checkout,
                                           args.baseline_model or args.model, args, [], log_dir))
    if args.json:
        print(json.dumps(reports, indent=2))
    _print_table(reports)


if __name__ == "__main__":
    main()
