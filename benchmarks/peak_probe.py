"""The Trainer's CPU peak probe: one warm-up against a warm-up per shape, side by side.

  python benchmarks/peak_probe.py [--rounds 3]

`hardware.probe_matmul_peak` warms up once (PROBE_WARMUP_S seconds, the first shape),
then gives each shape PROBE_SHAPE_WARMUP_RUNS untimed runs before its timed ones. The
rule before it warmed each shape up for PROBE_WARMUP_S seconds; here that is one
`probe_matmul_peak` call per shape (each warms its one shape up), the best median kept.
The two alternate for `--rounds` rounds in one process; each prints its peak GFLOP/s,
every shape's median and its wall seconds. The probe runs in every Trainer, so its wall
time is part of every pipeline run's fixed cost (issue 49).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    from components.trainer import hardware

    def warm_up_each_shape():
        start, shapes = time.perf_counter(), {}
        for shape in hardware.PROBE_SHAPES:
            shapes.update(hardware.probe_matmul_peak(shapes=(shape,)).shapes)
        peak = max(median for median, _, _ in shapes.values())
        return peak, shapes, time.perf_counter() - start

    def warm_up_once():
        probe = hardware.probe_matmul_peak()
        return probe.peak_flops / 1e9, probe.shapes, probe.wall_s

    results = {"warm-up per shape": [], "one warm-up": []}
    for _ in range(args.rounds):
        for name, probe in (("warm-up per shape", warm_up_each_shape),
                            ("one warm-up", warm_up_once)):
            peak, shapes, wall = probe()
            results[name].append({"peak_gflops": round(peak, 1), "wall_s": round(wall, 2),
                                  "shape_medians": {k: v[0] for k, v in shapes.items()}})
            print(f"{name:<18} peak {peak:6.1f} GFLOP/s  wall {wall:5.2f} s  "
                  f"{results[name][-1]['shape_medians']}", flush=True)
    print(json.dumps(results))
    return results


if __name__ == "__main__":
    main()
