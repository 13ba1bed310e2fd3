"""Loopback load test of `deepseek-tfx serve` on a pushed model: TF Serving's predict route
(optionally side by side with another commit's server), or OpenAI streaming (`--openai`:
the serving engine against the batcher).

  python benchmarks/serve_load.py --model SERVING_DIR [--requests 200]
      [--concurrency 8,32] [--max-new-tokens 16] [--serve-args "--num-batch-threads 1"]
      [--baseline-checkout DIR [--baseline-model SERVING_DIR]] [--json]

  python benchmarks/serve_load.py --openai --model SERVING_DIR [--context-prompt-tokens 32]
      [--requests 64] [--concurrency 1,8,32] [--decode-slots 32] [--seed 0]
      [--serve-args ...] [--json]

Predict load. Starts this checkout's server (`python -m cli serve`) as a subprocess on a
free loopback port and waits until it is ready (TF Serving's model status AVAILABLE: this
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

OpenAI streaming (`--openai`, `serve_stream.py`). The same model is served twice, one
server at a time: the engine (`serve --decode-slots 32`: continuous batching, tokens
streamed as they are made) and the batcher (`--decode-slots 0`: the whole reply is
generated, then replayed as a stream). Each request is a streamed /v1/completions over
plain HTTP (httpx): TTFT = the first chunk with non-empty text, inter-token latency (ITL)
= the gaps between text chunks, e2e = the stream's end, completion tokens from `usage`
(stream_options.include_usage). The prompt is Tiny Shakespeare (../shared/corpora) cut
to `--context-prompt-tokens` tokens with the model's tokenizer; temperature 1, fixed
seeds, and `logit_bias` {EOS: -100} so replies run to max_tokens. The batcher refuses
logit_bias (400), so its requests go without it; to keep its replies as long, each
request's seed is one whose `generate` reply (probed once: 128 seeds on the predict
route) reaches its max_tokens before EOS, when one does (`tok/reply` and `short` show
where not). Every prompt + max_tokens is clipped to the model's context
(assets.extra/config.json max_position_embeddings), and what was clipped is printed.

  1. TTFT at concurrency 1: 10 requests of max_tokens 256: TTFT p50/p99, and TTFT as a
     share of the reply's e2e (p50).
  2. Mixed lengths at each `--concurrency` level: `--requests` replies of max_tokens drawn
     (seeded) from 8..512: TTFT p50/p99, ITL p50/p99, e2e p50, tokens/s (completion
     tokens / the level's wall time).
  3. Continuous batching: (a) a long request (max_tokens 512) and the same one 0.3 s
     later: each one's e2e and second/first; (b) a 16-token request sent once two long
     ones have streamed their first token (at most 1 s after them): its e2e / alone.
  4. Per-token decode at concurrency 1: a long stream's ITL p50 against `generate`'s
     per-token time on the predict route ((t(N) - t(N/2)) / tokens in between).
  5. Disconnects (the engine only): 100 long streams dropped after their first chunk: the
     server's RSS (VmRSS) before and after, deepseek_tfx_num_requests_running (/metrics)
     right after the last and how soon it is 0, TTFT p50 of 10 requests before and after.
  6. Stop sequences: a greedy completion (max_tokens 64), then the same with `stop` = a
     character early in it: usage.completion_tokens (the engine stops at the stop string;
     the batcher cuts the text afterwards and counts every token).

It prints a block per server, then the engine/batcher ratios, and /proc/loadavg before
and after (the figures are wall-clock times on a shared machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serving.load_test import load_test, post_json, wait_until_ready

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))
from benchmarks import serve_stream  # noqa: E402

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


@contextlib.contextmanager
def served(label: str, python: str, checkout: Path, model: str, serve_args: list[str],
           log_dir: str):
    """Runs `checkout`'s `serve` on a free loopback port until the block ends (then Ctrl-C);
    yields (the server process, its base URL, its log's path)."""
    port = _free_port()
    log_path = os.path.join(log_dir, f"{label}.log")
    command = [python, "-m", "cli", "serve", "--model", model, "--port", str(port),
               *serve_args]
    print(f"[{label}] {' '.join(shlex.quote(c) for c in command)}  (cwd {checkout})",
          file=sys.stderr, flush=True)
    with open(log_path, "w") as log:
        server = subprocess.Popen(command, cwd=checkout, stdout=log, stderr=subprocess.STDOUT,
                                  env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    try:
        yield server, f"http://127.0.0.1:{port}", log_path
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def server_says(log_path: str) -> list[str]:
    """The server's batching statistics and readiness lines, and any error it logged."""
    with open(log_path) as log:
        lines = [line.rstrip("\n") for line in log if not line.startswith(("20", "WARNING"))]
    return [line for line in lines if line.startswith(("  batching:", "served ", "ready:"))
            or "' served " in line or "Traceback" in line or line.startswith("ERROR")]


def run_server_load(label: str, python: str, checkout: Path, model: str, args,
                    extra_serve_args: list[str], log_dir: str) -> dict:
    """Starts `checkout`'s server, loads it at each concurrency, stops it; the report.

    Raises:
      TimeoutError: the server did not answer within 300 s of starting.
    """
    report: dict = {"server": label, "checkout": str(checkout), "model": model}
    with served(label, python, checkout, model, extra_serve_args, log_dir) as (server, root,
                                                                              log_path):
        base = f"{root}/v1/models/{MODEL_NAME}"
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
    report["server_says"] = server_says(log_path)
    return report


def run_openai_server(label: str, serve_args: list[str], facts, plan, args,
                      log_dir: str) -> dict:
    """Starts this checkout's server with `serve_args`, runs the streaming scenarios
    (`serve_stream.py`), stops it; the report."""
    engine = label == "engine"
    report: dict = {"server": label, "serve_args": serve_args}
    with served(label, sys.executable, PROJECT_ROOT, args.model, serve_args,
                log_dir) as (server, root, log_path):
        status = f"{root}/v1/models/{MODEL_NAME}"
        report["startup_s"] = round(wait_until_ready(status, 300, lambda: server.poll() is None),
                                    1)
        report.update(serve_stream.run_scenarios(
            root, facts, plan, engine, server.pid, label,
            say=lambda m: print(f"{time.strftime('%H:%M:%S')} {m}", file=sys.stderr, flush=True)))
        report["rss_at_end_mib"] = serve_stream._rss_mib(server.pid)
    report["server_says"] = server_says(log_path)
    return report


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "?"


def run_openai(args) -> None:
    """Both servers, one at a time, on the same model: the engine, then the batcher."""
    facts = serve_stream.model_facts(args.model)
    plan = serve_stream.make_plan(facts, args.context_prompt_tokens, args.requests,
                                  args.concurrency, args.seed)
    extra = shlex.split(args.serve_args)
    servers = [("engine", ["--decode-slots", str(args.decode_slots), *extra]),
               ("batcher", ["--decode-slots", "0", *extra])]
    load_before = _loadavg()
    with tempfile.TemporaryDirectory(prefix="serve_load_") as log_dir:
        reports = [run_openai_server(label, serve_args, facts, plan, args, log_dir)
                   for label, serve_args in servers]
    load_after = _loadavg()
    if args.json:
        print(json.dumps({"model": str(facts.version_dir), "context": facts.context,
                          "prompt_tokens": plan.prompt_tokens, "clipped": plan.notes,
                          "seed_lengths": plan.seed_lengths, "loadavg_before": load_before,
                          "loadavg_after": load_after, "servers": reports}, indent=2))
    serve_stream.print_header(facts, plan)
    print(f"loadavg before: {load_before}; after: {load_after} (2 shared cores: other work "
          "running at the same time disturbs these figures)")
    serve_stream.print_report(reports)


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
    parser.add_argument("--openai", action="store_true", help="the OpenAI streaming scenarios "
                        "(engine and batcher) instead of the predict load")
    parser.add_argument("--requests", type=int, help="per concurrency level (default 200; "
                        "--openai: 64)")
    parser.add_argument("--concurrency", help="comma-separated levels (default 8,32; "
                        "--openai: 1,8,32)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--context-prompt-tokens", type=int, default=32,
                        help="--openai: the prompt's tokens (default 32)")
    parser.add_argument("--decode-slots", type=int, default=32,
                        help="--openai: the engine server's --decode-slots (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="--openai: the first seed of the "
                        "requests and of the reply-length draw (default 0)")
    parser.add_argument("--serve-args", default="",
                        help='more flags for this checkout\'s serve, e.g. "--num-batch-threads 1"')
    parser.add_argument("--baseline-checkout", type=Path,
                        help="another commit's clone with its own .venv: load it too")
    parser.add_argument("--baseline-model", help="the model the baseline serves "
                        "(default --model)")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON too")
    args = parser.parse_args()
    args.requests = args.requests or (64 if args.openai else 200)
    args.concurrency = [int(c) for c in (args.concurrency or (
        "1,8,32" if args.openai else "8,32")).split(",")]
    if args.openai:
        if args.baseline_checkout:
            raise SystemExit("error: --openai compares the engine with the batcher of this "
                             "checkout; --baseline-checkout is for the predict load")
        run_openai(args)
        return

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
