"""Multiple-choice scoring speed: in graph (`score_tasks`) vs lm-evaluation-harness
(`local-completions`) against `deepseek-tfx serve`, side by side in one run.

  python benchmarks/task_scoring_speed.py [--task tests/fixtures/tasks/arc_easy.jsonl]
      [--preset cpu_small] [--batch-size 32] [--harness-batch-sizes 1,32] [--repeats 2]
      [--data /work/shared/corpora/tinyshakespeare.txt] [--cold-install] [--json]

The model is the preset's architecture with random weights (speed does not depend on the
weights; its scores are chance) and a byte-level BPE of the preset's vocabulary size learned
on `--data`, saved as a servable SavedModel (`save_text_model`) in a temporary directory.

  in graph   `score_tasks(from_saved_model(dir), [task], --batch-size)`: one `logits` call per
             batch of (example, choice) rows; the first call (tracing) is not timed, then
             the best of `--repeats` runs.
  harness    the task converted (`evaluation.harness_tasks`), serve started on a free
             loopback port (timed until `ready`), then `lm_eval run --model
             local-completions` once per `--harness-batch-sizes` (prompts per request);
             examples/s from the harness's own `total_evaluation_time_seconds` (requests
             and its bookkeeping) and, separately, the process's wall time (its imports and
             dataset loading included).

The harness environment's setup (`uv sync --project harness --locked` into a fresh
environment; `--cold-install`: with an empty uv cache too, so everything is downloaded) is
timed and printed separately. Both sides share the 2 CPU cores of the machine with nothing
else of this benchmark running: in graph runs before serve starts.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cli.harness import HARNESS_ENV, HARNESS_PROJECT, lm_eval_command

PROJECT_ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TASK = PROJECT_ROOT / "tests" / "fixtures" / "tasks" / "arc_easy.jsonl"
DEFAULT_DATA = PROJECT_ROOT.parent / "shared" / "corpora" / "tinyshakespeare.txt"


def _uv() -> list[str]:
    uv = shutil.which("uv")
    return [uv] if uv else ["python3", "-m", "uv"]


def _child_env(**extra) -> dict:
    return {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(out: Path, preset: str, data: Path, task_texts: list[str]) -> tuple[str, dict]:
    """A random-weight SavedModel of `preset`'s architecture at `out` with a BPE learned on
    `data` (+ the task's texts); returns (its path, a description)."""
    import keras
    import tensorflow as tf

    from config import GenerationConfig, get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from savedmodel.export import save_text_model
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    config = get_config(preset).model
    text = data.read_text(encoding="utf-8") if data.is_file() else ""
    counts = collections.Counter(re.findall(r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+",
                                            text + "\n".join(task_texts)))
    tokenizer = ByteLevelBpe(learn(counts, config.vocab_size).json)
    keras.utils.set_random_seed(0)
    model = DeepSeekCausalLM(config)
    model(tf.zeros([1, 4], tf.int32))
    save_text_model(model, tokenizer, GenerationConfig(max_new_tokens=16), str(out))
    return str(out), {"preset": preset, "weights": "random (seed 0)",
                      "parameters": int(model.count_params()),
                      "vocab_size": config.vocab_size, "tokenizer_size": len(tokenizer.surfaces()),
                      "max_position_embeddings": config.max_position_embeddings,
                      "hidden_size": config.hidden_size, "layers": config.num_hidden_layers}


def in_graph(model_dir: str, task, batch_size: int, repeats: int) -> dict:
    from evaluation.task_models import from_saved_model, score_tasks

    model = from_saved_model(model_dir)
    start = time.perf_counter()
    scores = score_tasks(model, [task], batch_size)
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        scores = score_tasks(model, [task], batch_size)
        best = min(best, time.perf_counter() - start)
    metrics = scores["tasks"][task.name]
    return {"seconds": best, "examples_per_second": len(task.examples) / best,
            "first_call_seconds": first, "acc": metrics["acc"], "acc_norm": metrics["acc_norm"],
            "truncated": metrics["truncated"], "context": model.context_len}


def setup_harness(cold: bool) -> dict:
    """Times `uv sync --project harness --locked` into a fresh environment."""
    with tempfile.TemporaryDirectory() as tmp:
        env = _child_env(UV_PROJECT_ENVIRONMENT=os.path.join(tmp, "venv"))
        if cold:
            env["UV_CACHE_DIR"] = os.path.join(tmp, "cache")
        start = time.perf_counter()
        done = subprocess.run([*_uv(), "sync", "--project", HARNESS_PROJECT, "--locked"],
                              env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"error: uv sync --project harness failed: {done.stderr[-2000:]}")
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in
                   os.walk(os.path.join(tmp, "venv")) for f in fs
                   if not os.path.islink(os.path.join(d, f)))
    # The environment the runs below use (harness/.venv).
    done = subprocess.run([*_uv(), "sync", "--project", HARNESS_PROJECT, "--locked"],
                          env=_child_env(), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"error: uv sync --project harness failed: {done.stderr[-2000:]}")
    return {"seconds": seconds, "megabytes": size / 1e6,
            "cache": "empty (downloads)" if cold else "warm uv cache"}


def start_serve(model_dir: str, log_dir: str):
    port = _free_port()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--model", model_dir,
                             "--port", str(port), "--log-dir", log_dir],
                            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("ready"):
            break
    else:
        raise SystemExit("error: serve exited before `ready`:\n" + "".join(seen))
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, f"http://127.0.0.1:{port}/v1/completions", time.perf_counter() - start


def harness_run(task, name: str, tasks_dir: str, hf_dir: str, base_url: str, context: int,
                batch_size: int, out: str) -> dict:
    command = lm_eval_command([name], tasks_dir, tokenizer=hf_dir, max_length=context,
                              base_url=base_url, output_path=out, batch_size=batch_size,
                              uv=tuple(_uv()))
    start = time.perf_counter()
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env=_child_env(HF_HOME=os.path.join(out, "hf_home"), **HARNESS_ENV))
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"error: lm_eval failed: {done.stderr[-3000:]}")
    (results_file,) = glob.glob(os.path.join(out, "*", "results_*.json"))
    with open(results_file, encoding="utf-8") as f:
        results = json.load(f)
    seconds = float(results["total_evaluation_time_seconds"])
    n = len(task.examples)
    return {"batch_size": batch_size, "seconds": seconds, "examples_per_second": n / seconds,
            "wall_seconds": wall, "examples_per_second_wall": n / wall,
            "acc": results["results"][name]["acc,none"],
            "acc_norm": results["results"][name]["acc_norm,none"],
            "truncation_warnings": done.stderr.count("Left truncating context")}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default=str(DEFAULT_TASK))
    parser.add_argument("--preset", default="cpu_small")
    parser.add_argument("--batch-size", type=int, default=32, help="in-graph rows per call")
    parser.add_argument("--harness-batch-sizes", default="1,32",
                        help="prompts per request, comma-separated")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="text to learn the BPE on")
    parser.add_argument("--cold-install", action="store_true",
                        help="time the harness install with an empty uv cache too")
    parser.add_argument("--json", action="store_true", help="also print one JSON object")
    args = parser.parse_args(argv)

    from evaluation.harness_tasks import write_harness_task
    from evaluation.tasks import continuations, fewshot_prompt, load_task

    task = load_task(args.task)
    n_choices = sum(len(ex.choices) for ex in task.examples)
    texts = [fewshot_prompt(task, ex) + c for ex in task.examples for c in continuations(task, ex)]
    report: dict = {"task": task.name, "examples": len(task.examples), "choices": n_choices}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir, report["model"] = build_model(tmp / "saved", args.preset, Path(args.data),
                                                 texts)
        report["in_graph"] = in_graph(model_dir, task, args.batch_size, args.repeats)
        print(f"model: {args.preset} architecture, random weights, "
              f"{report['model']['parameters']:,} parameters, context "
              f"{report['in_graph']['context']}; task {task.name}: {len(task.examples)} "
              f"examples, {n_choices} choices ({report['in_graph']['truncated']} truncated)",
              flush=True)
        g = report["in_graph"]
        print(f"in graph (score_tasks, batch {args.batch_size} rows): "
              f"{g['examples_per_second']:.1f} examples/s ({g['seconds']:.2f} s; first call "
              f"with tracing {g['first_call_seconds']:.2f} s); acc {g['acc']:.2f}", flush=True)

        report["harness_setup"] = setup_harness(args.cold_install)
        s = report["harness_setup"]
        print(f"harness environment: uv sync --project harness --locked into a fresh venv "
              f"({s['cache']}): {s['seconds']:.1f} s, {s['megabytes']:.0f} MB", flush=True)

        hf_dir = str(tmp / "hf")
        done = subprocess.run([sys.executable, "-m", "cli", "hf-export", model_dir, hf_dir],
                              cwd=PROJECT_ROOT, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"error: hf-export failed: {done.stdout}{done.stderr}")
        name = write_harness_task(task, str(tmp / "tasks"))
        proc, base_url, ready_s = start_serve(model_dir, str(tmp / "serve_logs"))
        report["serve_ready_seconds"] = ready_s
        try:
            report["harness"] = []
            for b in (int(x) for x in args.harness_batch_sizes.split(",")):
                h = harness_run(task, name, str(tmp / "tasks"), hf_dir, base_url,
                                g["context"], b, str(tmp / f"out{b}"))
                report["harness"].append(h)
                print(f"harness (local-completions against serve, {b} prompt(s)/request): "
                      f"{h['examples_per_second']:.1f} examples/s ({h['seconds']:.1f} s of "
                      f"evaluation; {h['wall_seconds']:.1f} s wall with its start-up = "
                      f"{h['examples_per_second_wall']:.1f} examples/s); acc {h['acc']:.2f}",
                      flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    print(f"serve start-up until ready: {ready_s:.1f} s (not in the harness figures)")
    best = max(report["harness"], key=lambda h: h["examples_per_second"])
    print(f"in graph / harness (best batch, evaluation time): "
          f"{g['examples_per_second'] / best['examples_per_second']:.1f}x")
    if args.json:
        print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
