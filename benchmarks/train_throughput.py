"""Training throughput of a preset on this machine: tokens/s, step time, MFU.

  python benchmarks/train_throughput.py [--preset cpu_small] [--steps 30]

Runs the real training step (`components/trainer/train_loop.py`) on random
tokens (throughput does not depend on the data) and prints one JSON object.
MFU = tokens/s x FLOPs/token (models/deepseek/flops.py) / peak FLOP/s, the
peak measured by a float32 matmul probe on this machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import tensorflow as tf

from components.trainer import train_loop
from models.deepseek import flops
from pipeline.configs import get_config


def matmul_peak_flops(n: int = 2048, repeats: int = 10) -> float:
    """float32 FLOP/s of an n x n matmul, best of `repeats` (2 n^3 FLOPs each)."""
    a = tf.random.normal([n, n])
    b = tf.random.normal([n, n])
    mm = tf.function(lambda x, y: tf.matmul(x, y))
    mm(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        mm(a, b).numpy()
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="cpu_small")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    config = get_config(args.preset, {"train.train_steps": args.steps, "train.log_every": args.steps,
                                      "train.checkpoint_every": 10**9, "train.warmup_steps": 1})
    tc = config.train
    vocab = config.model.vocab_size
    ds = tf.data.Dataset.from_tensors(0).repeat().map(
        lambda _: {
            "input_ids": tf.random.uniform([tc.batch_size, tc.seq_len], 0, vocab, tf.int32),
            "labels": tf.random.uniform([tc.batch_size, tc.seq_len], 0, vocab, tf.int32),
        }
    )
    # Warm up (tracing) with a separate short run, then time a fresh one.
    with tempfile.TemporaryDirectory() as d:
        result = train_loop.train(config, ds, None, d + "/ckpt", d + "/logs")
    peak = matmul_peak_flops()
    fpt = flops.flops_per_token(config.model, tc.seq_len)
    print(json.dumps({
        "preset": args.preset,
        "steps": args.steps,
        "tokens_per_second": round(result.tokens_per_second, 1),
        "step_time_s": round(tc.batch_size * tc.seq_len / result.tokens_per_second, 4),
        "flops_per_token": fpt,
        "matmul_peak_gflops": round(peak / 1e9, 1),
        "mfu": round(flops.mfu(result.tokens_per_second, fpt, peak), 4),
    }, indent=2))


if __name__ == "__main__":
    main()
