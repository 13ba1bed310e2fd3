"""End to end: lm-evaluation-harness (`local-completions`, its own environment, harness/)
against `deepseek-tfx serve` on the shared run's pushed model gives the LmEvaluator's
per-choice log-likelihoods (within 1e-4) and its acc, acc_norm and acc_bytes (exactly).

The model is hf-exported (the harness loads its tokenizer.json), the harness environment is
installed with `uv sync --project harness --locked`, serve runs in a subprocess on a free
loopback port, and `lm_eval run` scores the ARC-Easy fixture (100 examples) converted by
`evaluation.harness_tasks`, with `max_length` = the model's context C. The harness then
sends at most C - 1 prompt tokens, serve puts [EOS] first, and the LmEvaluator's rows are
[EOS] + the last C - 1 tokens as well: the tiny preset's C is 64, so most ARC-Easy
examples are truncated, and they must agree too.
A small generation task (greedy, Chinese too) checks that the harness's completions are
ours.
"""

from __future__ import annotations

import glob
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARC_EASY = os.path.join(PROJECT_ROOT, "tests", "fixtures", "tasks", "arc_easy.jsonl")
TOLERANCE = 1e-4


def _uv() -> list[str]:
    uv = shutil.which("uv")
    return [uv] if uv else ["python3", "-m", "uv"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def served(run, tmp_path_factory):
    """The pushed model behind `deepseek-tfx serve` (stopped after the module)."""
    from cli import resolve_model_dir

    model_dir = resolve_model_dir(run["serving_model_dir"])
    port = _free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--model", run["serving_model_dir"],
         "--port", str(port), "--log-dir", str(log.parent)],
        cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)],
                     daemon=True).start()
    seen = []
    deadline = time.monotonic() + 300
    try:
        while True:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            assert line is not None, "serve exited before `ready`:\n" + "".join(seen)
            seen.append(line)
            if line.startswith("ready"):
                break
        yield {"base_url": f"http://127.0.0.1:{port}/v1/completions", "model_dir": model_dir}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _lm_eval(task_path: str, work, hf_dir, base_url: str) -> dict:
    """Runs `lm_eval` on one task file: {"name", "rows": samples by doc_id, "results",
    "stderr"}."""
    from cli.harness import HARNESS_ENV, lm_eval_command, max_length_of
    from evaluation.harness_tasks import write_harness_task
    from evaluation.tasks import load_task

    name = write_harness_task(load_task(task_path), str(work / "tasks"))
    command = lm_eval_command([name], str(work / "tasks"), tokenizer=str(hf_dir),
                              max_length=max_length_of(str(hf_dir)), base_url=base_url,
                              output_path=str(work / "out"), uv=tuple(_uv()))
    done = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=900, env=_child_env(HF_HOME=str(work / "hf_home"),
                                                      **HARNESS_ENV))
    assert done.returncode == 0, done.stderr[-5000:]
    (samples_file,) = glob.glob(str(work / "out" / "*" / f"samples_{name}_*.jsonl"))
    (results_file,) = glob.glob(str(work / "out" / "*" / "results_*.json"))
    rows = [json.loads(line) for line in open(samples_file, encoding="utf-8")]
    with open(results_file, encoding="utf-8") as f:
        results = json.load(f)["results"][name]
    return {"name": name, "rows": {r["doc_id"]: r for r in rows}, "results": results,
            "stderr": done.stderr}


@pytest.fixture(scope="module")
def harness_env(served, tmp_path_factory):
    """The hf-export directory of the served model, and the harness environment installed."""
    from cli.harness import HARNESS_PROJECT

    hf_dir = tmp_path_factory.mktemp("hf") / "hf"
    done = subprocess.run([sys.executable, "-m", "cli", "hf-export", served["model_dir"],
                           str(hf_dir)], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    start = time.perf_counter()
    done = subprocess.run([*_uv(), "sync", "--project", HARNESS_PROJECT, "--locked"],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900,
                          env=_child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return {"hf_dir": hf_dir, "install_seconds": time.perf_counter() - start}


@pytest.fixture(scope="module")
def harness(served, harness_env, tmp_path_factory):
    """`lm_eval run --model local-completions` on the ARC-Easy fixture against `served`:
    {"samples": {doc_id: per-choice log-likelihoods}, "per_doc": {doc_id: sample row},
     "results": the task's results, "install_seconds"}."""
    out = _lm_eval(ARC_EASY, tmp_path_factory.mktemp("harness"), harness_env["hf_dir"],
                   served["base_url"])
    return {"samples": {e: [float(ll) for ll, _ in r["filtered_resps"]]
                        for e, r in out["rows"].items()},
            "per_doc": out["rows"], "results": out["results"],
            "install_seconds": harness_env["install_seconds"]}


@pytest.fixture(scope="module")
def evaluator(run):
    """The LmEvaluator's ARC-Easy scores in the shared run: metrics.json's and
    task_samples.json's."""
    from reporting.run_summary import latest_run

    uri = {r.component: r for r in latest_run(run["metadata_path"])}[
        "LmEvaluator"].outputs["ModelEvaluation"]["uri"]
    with open(os.path.join(uri, "metrics.json"), encoding="utf-8") as f:
        metrics = json.load(f)["candidate"]["tasks"]["arc_easy"]
    with open(os.path.join(uri, "task_samples.json"), encoding="utf-8") as f:
        samples = json.load(f)["candidate"]["arc_easy"]
    return {"metrics": metrics, "loglikelihoods": samples["loglikelihoods"]}


def _max_difference(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_harness_scored_every_example(harness, evaluator):
    from evaluation.tasks import load_task

    task = load_task(ARC_EASY)
    assert sorted(harness["samples"]) == list(range(len(task.examples))) == list(range(100))
    for e, example in enumerate(task.examples):
        assert len(harness["samples"][e]) == len(example.choices)
        assert harness["per_doc"][e]["doc"]["label"] == example.label
    print(f"harness environment synced in {harness['install_seconds']:.2f} s; "
          f"{evaluator['metrics']['truncated']} of 100 ARC-Easy examples truncated to the "
          "context")


def test_per_choice_loglikelihoods_equal_the_lm_evaluators(harness, evaluator):
    """Every choice of every example, truncated ones included (most, at C = 64)."""
    lls = evaluator["loglikelihoods"]
    worst = max(_max_difference(harness["samples"][e], lls[e]) for e in range(len(lls)))
    print(f"largest per-choice log-likelihood difference, harness vs LmEvaluator: {worst:.2e}"
          f" nats over {sum(len(x) for x in lls)} choices")
    assert worst <= TOLERANCE, worst
    assert evaluator["metrics"]["truncated"] > 0  # the truncated rows are compared too


def test_acc_equals_the_lm_evaluators(harness, evaluator):
    metrics = evaluator["metrics"]
    assert harness["results"]["acc,none"] == metrics["acc"]
    assert harness["results"]["acc_norm,none"] == metrics["acc_norm"]
    assert harness["results"]["acc_bytes,none"] == metrics["acc_bytes"]
    per_doc = [harness["per_doc"][e]["acc"] for e in range(100)]
    assert sum(per_doc) / 100 == metrics["acc"]


GENERATION_EXAMPLES = [("ROMEO:\n", "I"), ("JULIET:\nO ", "Romeo"), ("春眠不觉晓，", "处处闻啼鸟。"),
                       ("First Citizen:\n", "Before")]


def test_generation_completions_match(served, harness_env, tmp_path):
    """A generation task (greedy, stop at a newline, Chinese too): the harness's
    completions, stripped, are ours (`score_tasks`), and so is exact_match."""
    from evaluation.task_models import from_saved_model, score_tasks
    from evaluation.tasks import load_task

    path = tmp_path / "gen.jsonl"
    lines = [{"task": "gen", "type": "generation", "max_gen_toks": 8}] + \
        [{"context": c, "answer": a, "stop": ["\n"]} for c, a in GENERATION_EXAMPLES]
    path.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines),
                    encoding="utf-8")
    out = _lm_eval(str(path), tmp_path, harness_env["hf_dir"], served["base_url"])
    ours = score_tasks(from_saved_model(served["model_dir"]), [load_task(str(path))], 8)
    theirs = [out["rows"][e]["filtered_resps"][0] for e in range(len(GENERATION_EXAMPLES))]
    assert theirs == [c.strip() for c in ours["samples"]["gen"]["completions"]]
    assert out["results"]["exact_match,strip"] == ours["tasks"]["gen"]["exact_match"]
