"""Training throughput of a preset on this machine: tokens/s, step time, MFU, peak memory.

  python benchmarks/train_throughput.py [--preset cpu_small] [--steps 20]
      [--precision float32] [--jit-compile false,true] [--grad-accum-steps K] [--recompute]

Runs the real training loop (`components/trainer/train_loop.py`: the same
tf.function step, optimizer and router-bias update as the pipeline) on random
tokens (throughput does not depend on the data), once per (precision policy,
XLA setting), each in a fresh process (so peak memory and thread pools are its
own), one after the other, and prints one JSON object: the runs side by side.

  step_time_s        median wall time of one optimizer step, over the timed
                     steps (the first `--skip` steps, which include tracing and
                     XLA compilation, are left out)
  tokens_per_second  global batch x seq_len / step_time_s
  mfu                tokens_per_second x flops_per_token / peak, where
                     flops_per_token = 6 N_active + attention
                     (models/deepseek/flops.py; models/deepseek_v4/flops.py for
                     V4 presets, as the Trainer counts them) and peak = the matmul probe of
                     the run's compute dtype (`hardware.probe_matmul_peak`,
                     warmed up, repeated, best shape's median), taken once per
                     run before training: the same probe and rule as the
                     Trainer's (`run_fn.measure_cpu_peak`), so the two MFUs
                     share a denominator
  trainer_steady_mfu the Trainer's own steady-state MFU figure for the same run
  moe_dropped_fraction  (token, expert) pairs the MoE capacity dropped (XLA runs)
  peak_memory_mb     the process's peak resident memory (CPU; whole process,
                     TensorFlow runtime included), or the device's peak (GPU)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_one(args: argparse.Namespace) -> dict:
    """Trains `args.steps + args.skip` steps in this process; the figures of one precision."""
    import tensorflow as tf

    from components.trainer import data, hardware, precision, train_loop
    from config import get_config
    from models import families
    from models.deepseek import flops

    overrides = {"train.train_steps": args.skip + args.steps, "train.log_every": 1,
                 "train.checkpoint_every": 10**9, "train.warmup_steps": 1,
                 "train.grad_accum_steps": args.grad_accum_steps,
                 "train.recompute_activations": args.recompute,
                 "train.jit_compile": args.jit_compile}
    config = get_config(args.preset, overrides)
    tc = config.train
    vocab = config.model.vocab_size
    policy = args.precision
    dtype = precision.compute_dtype(policy)
    accelerator = hardware.detect()
    peak, source, probe_figures = hardware.peak_flops(accelerator, dtype)  # as the Trainer

    def dataset_fn():
        return data.random_token_batches(tc.batch_size, tc.seq_len, vocab)

    with tempfile.TemporaryDirectory() as d:
        result = train_loop.train(config, dataset_fn, d, None, precision=policy, peak_flops=peak)

    tokens_per_step = tc.batch_size * tc.seq_len
    timed = [tokens_per_step / h["tokens_per_second"] for h in result.history[args.skip:]]
    step_time = statistics.median(timed)
    tps = tokens_per_step / step_time
    fpt = families.family_of(config.model).flops_per_token(config.model, tc.seq_len)  # as the Trainer
    if accelerator.kind == "gpu":
        peak_memory = tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2**20
    else:
        peak_memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    return {
        "precision": policy,
        "jit_compile": result.jit_compile,
        "tokens_per_second": round(tps, 1),
        "step_time_s": round(step_time, 4),
        "step_time_s_mean": round(statistics.mean(timed), 4),
        "step_time_s_min": round(min(timed), 4),
        "mfu": round(flops.mfu(tps, fpt, peak), 4),
        "trainer_steady_mfu": round(result.steady_mfu, 4),
        "achieved_gflops": round(tps * fpt / 1e9, 2),
        "peak_gflops": round(peak / 1e9, 1),
        "peak_source": source,
        "peak_probe": probe_figures,
        "moe_dropped_fraction": round(result.moe_dropped_fraction, 4),
        "peak_memory_mb": round(peak_memory, 1),
        "final_loss": round(result.final_loss, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="cpu_small")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--skip", type=int, default=3, help="untimed first steps (tracing)")
    parser.add_argument("--precision", default="float32",
                        help="comma-separated dtype policies, each run in its own process")
    parser.add_argument("--jit-compile", default="false,true",
                        help="comma-separated train.jit_compile settings, each run in its own "
                             "process, side by side")
    parser.add_argument("--grad-accum-steps", type=int, default=1)
    parser.add_argument("--recompute", action="store_true", help="activation recomputation")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    if args.one:
        print("RESULT " + json.dumps(run_one(args)))
        return

    from components.trainer import hardware
    from config import get_config
    from models import families

    config = get_config(args.preset)
    counts = families.family_of(config.model).module("flops")
    runs = []
    for policy in args.precision.split(","):
        for jit in args.jit_compile.split(","):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", "--preset", args.preset,
                   "--steps", str(args.steps), "--skip", str(args.skip), "--precision", policy,
                   "--jit-compile", jit, "--grad-accum-steps", str(args.grad_accum_steps)] + (
                       ["--recompute"] if args.recompute else [])
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT,
                                 env={**os.environ, "PYTHONPATH": PROJECT_ROOT})
            if out.returncode != 0:
                sys.exit(f"{policy}, jit_compile={jit}: benchmark failed:\n{out.stderr[-3000:]}")
            runs.append(json.loads(out.stdout.split("RESULT ", 1)[1]))
    accelerator = hardware.detect()
    print(json.dumps({
        "preset": args.preset,
        "device": f"{accelerator.kind}: {accelerator.name} ({os.cpu_count()} CPUs)",
        "global_batch": config.train.batch_size,
        "seq_len": config.train.seq_len,
        "grad_accum_steps": args.grad_accum_steps,
        "recompute_activations": args.recompute,
        "flops_per_token": counts.flops_per_token(config.model, config.train.seq_len),
        "activated_params": counts.activated_params(config.model, include_mtp=True),
        "timed_steps": args.steps,
        "runs": runs,
    }, indent=2))


if __name__ == "__main__":
    main()
