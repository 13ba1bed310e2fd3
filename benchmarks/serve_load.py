"""Loopback load test of `deepseek-tfx serve` on a pushed model.

  python benchmarks/serve_load.py --model SERVING_DIR [--requests 200] [--concurrency 8]
      [--max-new-tokens 16]

Starts the server in this process on a free loopback port, sends `--requests`
predict requests (`generate` signature, a prompt from a small list, greedy,
`--max-new-tokens`), at most `--concurrency` at a time, then a few malformed
requests to check they get 4xx while the server keeps serving. Prints JSON:
p50/p90/p99 latency, requests/s, status counts.
"""

from __future__ import annotations

import argparse
import json
import threading

from serving.load_test import load_test, post_json
from serving.server import make_http_server

PROMPTS = ["ROMEO:", "JULIET:\nO", "First Citizen:\n", "KING RICHARD III:\nNow is the",
           "To be, or not", "MENENIUS:\nWhy, masters,", "", "The"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True, help="serving dir (newest version is served)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()

    httpd = make_http_server(args.model, port=0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{httpd.server_address[1]}/v1/models/deepseek"
    try:
        bodies = [{"signature_name": "generate", "instances": [{
            "prompt": p, "max_new_tokens": args.max_new_tokens, "temperature": 0.0,
            "top_k": 0, "top_p": 1.0, "seed": 0}]} for p in PROMPTS]
        report = load_test(base + ":predict", bodies, args.requests, args.concurrency)
        malformed = [b"not json", {"instances": "x"}, {"signature_name": "nope", "instances": ["a"]},
                     {"inputs": {"input_ids": "wrong"}, "signature_name": "logits"}]
        report["malformed_statuses"] = [post_json(base + ":predict", b)[0] for b in malformed]
        report["still_serving"] = post_json(base + ":predict", {"instances": ["ROMEO:"]})[0] == 200
    finally:
        httpd.shutdown()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
