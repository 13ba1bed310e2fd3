"""DPO and GRPO after SFT on two-digit addition, for several seeds: the e2e test's runs
(`tests/e2e/test_preference_e2e.py`, `run_preference`), whose margins these figures back.

  python benchmarks/preference.py [--seeds 1,2,3] [--workdir DIR]

For each seed (`train.seed` of all three runs: the SFT model's initialization and data
order, GRPO's sampling, DPO's data order) it runs SFT, GRPO from the SFT model and DPO
from it, three whole pipelines, and prints one JSON object per seed and a last one with
the means and sample standard deviations:

  sft_pass_at_1, grpo_pass_at_1, grpo_rise   held-out greedy pass@1 (the GRPO run's
                                             LmEvaluator: baseline = the SFT model)
  dpo_reward_accuracy, dpo_reward_margin     held-out, against the SFT model as reference
  seconds                                    wall time of each run on this machine
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _candidate_and_baseline(output: pathlib.Path) -> tuple[dict, dict | None]:
    from pipeline.local_runner import run_paths
    from reporting.run_summary import open_store

    store = open_store(run_paths(str(output))["metadata_path"])
    evaluation = max(store.get_artifacts_by_type("ModelEvaluation"), key=lambda a: a.id)
    with open(pathlib.Path(evaluation.uri) / "metrics.json", encoding="utf-8") as f:
        metrics = json.load(f)
    return metrics["candidate"], metrics["baseline"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "e2e")]
    from test_preference_e2e import run_preference

    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="preference-"))
    rows = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        d = workdir / f"seed-{seed}"
        os.makedirs(d, exist_ok=True)
        runs = run_preference(d, seed)
        grpo, sft = _candidate_and_baseline(runs["out"])
        dpo, _ = _candidate_and_baseline(runs["out_dpo"])
        row = {"seed": seed, "sft_pass_at_1": sft["pass_at_1"],
               "grpo_pass_at_1": grpo["pass_at_1"],
               "grpo_rise": grpo["pass_at_1"] - sft["pass_at_1"],
               "held_out_prompts": grpo["prompts"],
               "dpo_reward_accuracy": dpo["reward_accuracy"],
               "dpo_reward_margin": dpo["reward_margin"], "dpo_pairs": dpo["pairs"],
               "seconds": {k: round(v, 1) for k, v in runs["seconds"].items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
    summary = {}
    for key in ("sft_pass_at_1", "grpo_pass_at_1", "grpo_rise", "dpo_reward_accuracy"):
        values = [r[key] for r in rows]
        summary[key] = {"mean": statistics.mean(values),
                        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                        "min": min(values)}
    print(json.dumps({"seeds": [r["seed"] for r in rows], **summary}))


if __name__ == "__main__":
    main()
