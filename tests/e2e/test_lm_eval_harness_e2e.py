"""End to end: lm-evaluation-harness (`local-completions`, its own environment, harness/)
against `deepseek-tfx serve` on the shared run's pushed model gives the per-choice
log-likelihoods and the acc/acc_norm of our in-graph scorer (savedmodel/task_models.py).

The model is hf-exported (the harness loads its tokenizer.json), the harness environment is
installed with `uv sync --project harness --locked`, serve runs in a subprocess on a free
loopback port, and `lm_eval run` scores the ARC-Easy fixture (100 examples) converted by
`savedmodel.harness_tasks`.

Truncation, honestly: the harness sends at most `max_length - 1` tokens after serve's
[EOS] (max_length = C - 1, C = max_position_embeddings, so that the token it asks for fits),
while our scorer keeps [EOS] + the last C - 1 tokens. The two agree exactly on every
example the harness does not truncate. The tiny preset's C is 64, so most ARC-Easy examples
(~68 of 100 with the shared run's tokenizer) are truncated; so:
  - on the examples that fit (neither side truncates; at least 20 asserted), the harness's
    log-likelihoods equal ours at context C (what the LmEvaluator computes) within 1e-4, and
    so do acc and acc_norm over those examples, exactly;
  - on all 100, they equal ours at context C - 1 (the harness's own truncation), and the
    harness's task-level acc and acc_norm equal ours exactly.
A small generation task (greedy, Chinese too) checks that the harness's completions are
ours.
"""

from __future__ import annotations

import dataclasses
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

import numpy as np
import pytest

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARC_EASY = os.path.join(PROJECT_ROOT, "tests", "fixtures", "tasks", "arc_easy.jsonl")
TOLERANCE = 1e-4
MIN_UNTRUNCATED = 20


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
    from savedmodel.harness_tasks import write_harness_task
    from savedmodel.tasks import load_task

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
def ours(served):
    """Our scores of the same task at context C (the LmEvaluator's) and C - 1 (the
    harness's truncation), and which examples neither side truncates."""
    from savedmodel import task_scoring
    from savedmodel.task_models import from_saved_model, score_tasks
    from savedmodel.tasks import load_task

    task = load_task(ARC_EASY)
    model = from_saved_model(served["model_dir"])
    short = dataclasses.replace(model, context_len=model.context_len - 1)
    rows = task_scoring.choice_rows(model.tokenizer, task, short.context_len, model.eos_id)
    truncated = {r.example for r in rows if r.truncated}
    return {"task": task, "context": model.context_len,
            "full": score_tasks(model, [task], 32), "short": score_tasks(short, [task], 32),
            "untruncated": [e for e in range(len(task.examples)) if e not in truncated]}


def _max_difference(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_harness_scored_every_example(harness, ours):
    assert sorted(harness["samples"]) == list(range(len(ours["task"].examples))) == \
        list(range(100))
    for e, example in enumerate(ours["task"].examples):
        assert len(harness["samples"][e]) == len(example.choices)
        assert harness["per_doc"][e]["doc"]["label"] == example.label
    print(f"harness environment synced in {harness['install_seconds']:.2f} s; "
          f"context C={ours['context']}: {len(ours['untruncated'])} of 100 ARC-Easy examples "
          "fit untruncated")


def test_untruncated_examples_match_the_lm_evaluator_scorer(harness, ours):
    """Where nothing is truncated, the harness's numbers are the LmEvaluator's."""
    untruncated = ours["untruncated"]
    assert len(untruncated) >= MIN_UNTRUNCATED, untruncated
    lls = ours["full"]["samples"]["arc_easy"]["loglikelihoods"]
    worst = max(_max_difference(harness["samples"][e], lls[e]) for e in untruncated)
    assert worst <= TOLERANCE, worst
    choices = [ours["task"].examples[e].choices for e in untruncated]
    labels = [ours["task"].examples[e].label for e in untruncated]
    ours_acc = [float(np.argmax(lls[e]) == y) for e, y in zip(untruncated, labels, strict=True)]
    ours_norm = [float(np.argmax(np.array(lls[e]) / [len(c) for c in cs]) == y)
                 for e, cs, y in zip(untruncated, choices, labels, strict=True)]
    assert [harness["per_doc"][e]["acc"] for e in untruncated] == ours_acc
    assert [harness["per_doc"][e]["acc_norm"] for e in untruncated] == ours_norm


def test_every_example_matches_at_the_harness_truncation(harness, ours):
    """All 100 examples (truncated ones too) at the harness's context, C - 1 after [EOS]:
    per-choice log-likelihoods within 1e-4, task acc and acc_norm exactly."""
    lls = ours["short"]["samples"]["arc_easy"]["loglikelihoods"]
    worst = max(_max_difference(harness["samples"][e], lls[e]) for e in range(len(lls)))
    assert worst <= TOLERANCE, worst
    metrics = ours["short"]["tasks"]["arc_easy"]
    assert harness["results"]["acc,none"] == metrics["acc"]
    assert harness["results"]["acc_norm,none"] == metrics["acc_norm"]
    assert harness["results"]["acc_bytes,none"] == metrics["acc_bytes"]
    # Our count of truncated examples is the harness's.
    truncated = 100 - len(ours["untruncated"])
    assert metrics["truncated"] == truncated
    assert ours["full"]["tasks"]["arc_easy"]["truncated"] <= truncated


def test_matches_the_lm_evaluator_artifact_when_it_has_the_task(run, harness, ours):
    """The LmEvaluator's own task_samples.json (when the shared run scores arc_easy)."""
    from reporting.run_summary import latest_run

    runs = {r.component: r for r in latest_run(run["metadata_path"])}
    evaluation = runs.get("LmEvaluator")
    path = evaluation and os.path.join(evaluation.outputs["ModelEvaluation"]["uri"],
                                       "task_samples.json")
    if not path or not os.path.isfile(path):
        return  # the shared run scores no tasks (yet)
    with open(path, encoding="utf-8") as f:
        candidate = json.load(f)["candidate"]
    if "arc_easy" not in (candidate or {}):
        return
    lls = candidate["arc_easy"]["loglikelihoods"]
    worst = max(_max_difference(harness["samples"][e], lls[e]) for e in ours["untruncated"])
    assert worst <= TOLERANCE, worst


GENERATION_EXAMPLES = [("ROMEO:\n", "I"), ("JULIET:\nO ", "Romeo"), ("春眠不觉晓，", "处处闻啼鸟。"),
                       ("First Citizen:\n", "Before")]


def test_generation_completions_match(served, harness_env, tmp_path):
    """A generation task (greedy, stop at a newline, Chinese too): the harness's
    completions, stripped, are ours (`score_tasks`), and so is exact_match."""
    from savedmodel.task_models import from_saved_model, score_tasks
    from savedmodel.tasks import load_task

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
