"""The planner's memory (`models/deepseek/memory_plan.py`) against measured peak RSS, on CPU.

  python benchmarks/plan_vs_measured.py [--steps 5] [--cases tiny,cpu_small,...]

Each case runs in a fresh child process, which

1. imports TensorFlow, Keras and the Trainer's modules, builds nothing, and reads
   its peak RSS (`resource.getrusage(RUSAGE_SELF).ru_maxrss`): the runtime baseline;
2. trains `--steps` optimizer steps of the preset with the project's own training
   loop (`components/trainer/train_loop.train`, float32, no XLA, the same
   tf.function step, optimizer and router-bias update as the pipeline) on random
   tokens (`data.random_token_batches`);
3. reads its peak RSS again. measured = peak - baseline.

The plan is `memory_plan.plan` of the same model, batch, sequence, precision
(float32 weights and compute), optimizer (AdamW) and recomputation, on one
device. The table gives measured, planned and their ratio; the marginal rows
compare the difference between two cases that differ only in the batch (what
the runtime adds, tracing and thread pools included, cancels out there).
Peak RSS is in MiB (2**20 bytes), as the planner's bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (preset, overrides of the pipeline config)
CASES: dict[str, tuple[str, dict]] = {
    "tiny": ("tiny", {}),
    "cpu_small": ("cpu_small", {}),
    "cpu_small_b32": ("cpu_small", {"train.batch_size": 32}),
    "cpu_small_recompute": ("cpu_small", {"train.recompute_activations": True}),
    "cpu_small_recompute_b32": ("cpu_small", {"train.recompute_activations": True,
                                              "train.batch_size": 32}),
    "cpu_small_lora": ("cpu_small", {"train.lora_rank": 8}),
}


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def run_one(name: str, steps: int) -> dict:
    """In this (fresh) process: the baseline, then training; both peaks in bytes."""
    import tensorflow as tf  # noqa: F401  (the runtime baseline includes it)

    from components.trainer import data, train_loop
    from config import get_config

    baseline = _peak_rss_bytes()
    preset, overrides = CASES[name]
    config = get_config(preset, {
        **overrides, "train.train_steps": steps, "train.log_every": 1,
        "train.checkpoint_every": 10**9, "train.warmup_steps": 1, "train.jit_compile": "false"})
    tc = config.train

    def dataset_fn():
        return data.random_token_batches(tc.batch_size, tc.seq_len, config.model.vocab_size)

    with tempfile.TemporaryDirectory() as d:
        train_loop.train(config, dataset_fn, d, None, precision="float32", peak_flops=0.0)
    return {"baseline": baseline, "peak": _peak_rss_bytes()}


def planned(name: str):
    """The memory_plan.Plan of case `name` (float32, AdamW, one device)."""
    from config import get_config
    from models.deepseek import memory_plan

    preset, overrides = CASES[name]
    config = get_config(preset, overrides)
    tc = config.train
    lora = tc.lora_rank > 0
    return memory_plan.plan(memory_plan.PlanInput(
        config.model, name=name, mode="lora" if lora else "full",
        lora_rank=tc.lora_rank or 16, lora_targets=tc.lora_targets,
        weights_dtype="float32", compute_dtype="float32", optimizer="adamw",
        batch_per_device=tc.batch_size // tc.grad_accum_steps, seq_len=tc.seq_len,
        grad_accum_steps=tc.grad_accum_steps,
        recompute="full" if tc.recompute_activations else "none",
        devices=1, memory_gib=24, peak_flops=2.4e11, mfu=0.3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args.steps)))
        return

    mib = 2**20
    rows, measured = [], {}
    for name in args.cases.split(","):
        if name not in CASES:
            sys.exit(f"--cases: unknown case {name!r}; choose from {sorted(CASES)}")
        cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--steps",
               str(args.steps)]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT,
                             env={**os.environ, "PYTHONPATH": PROJECT_ROOT})
        if out.returncode != 0:
            sys.exit(f"{name}: failed:\n{out.stderr[-3000:]}")
        r = json.loads(out.stdout.split("RESULT ", 1)[1])
        p = planned(name)
        measured[name] = (r["peak"] - r["baseline"], p.total)
        rows.append({
            "case": name, "baseline_mib": round(r["baseline"] / mib, 1),
            "peak_mib": round(r["peak"] / mib, 1),
            "measured_mib": round((r["peak"] - r["baseline"]) / mib, 1),
            "planned_mib": round(p.total / mib, 1),
            "ratio": round((r["peak"] - r["baseline"]) / p.total, 3),
            "planned_parts_mib": {k: round(getattr(p, k) / mib, 1) for k in (
                "weights", "gradients", "optimizer_states", "activations")},
        })
    print(f"{'case':<20} {'baseline':>9} {'peak':>9} {'measured':>9} {'planned':>9} "
          f"{'meas/plan':>9}   planned parts (MiB)")
    for row in rows:
        print(f"{row['case']:<20} {row['baseline_mib']:>9} {row['peak_mib']:>9} "
              f"{row['measured_mib']:>9} {row['planned_mib']:>9} {row['ratio']:>9}   "
              f"{row['planned_parts_mib']}")
    for big, small in (("cpu_small_b32", "cpu_small"),
                       ("cpu_small_recompute_b32", "cpu_small_recompute")):
        if big in measured and small in measured:
            m = measured[big][0] - measured[small][0]
            p = measured[big][1] - measured[small][1]
            print(f"{'marginal ' + big:<20} {'':>9} {'':>9} {m / mib:>9.1f} {p / mib:>9.1f} "
                  f"{m / p:>9.3f}   ({big} - {small}: 16 more sequences)")
    if "tiny" in measured:
        # What a training process holds beyond the model's bytes (traced graphs, Keras,
        # tf.data, allocator arenas), taken from tiny, whose plan is 11 MiB.
        runtime = measured["tiny"][0] - measured["tiny"][1]
        print(f"\ntraining runtime (tiny: measured - planned) = {runtime / mib:.1f} MiB; "
              "measured - runtime vs planned:")
        for name, (m, p) in measured.items():
            if name != "tiny":
                print(f"  {name:<24} {(m - runtime) / mib:9.1f} {p / mib:9.1f} "
                      f"{(m - runtime) / p:9.3f}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
