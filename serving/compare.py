"""`deepseek-tfx compare`: two (or more) models measured side by side, in one process on
one machine, one model at a time (never two loaded at once).

For each model, in order:
  1. bits per byte and perplexity on the data (`serving/evaluate.py`, as `evaluate`);
  2. each task's scores (`evaluation/task_models.py`, as the LmEvaluator scores them);
  3. a load run against the model served as `deepseek-tfx serve` serves it (the same app:
     `serving/http_app.py`, on a free loopback port in a background thread, after the
     server's warm-up): `requests` POSTs to OpenAI's /v1/completions, at most
     `concurrency` at a time, greedy (temperature 0, seed 0), `max_tokens` each, cycling
     through fixed prompts (`load_prompts`). Latency is per request, client side (ms);
     tokens/s is the sum of the responses' `usage.completion_tokens` over the wall
     seconds of the timed run. Before it, `concurrency` untimed requests warm the path.
     The client threads run in the server's process (sharing its CPUs and GIL), as for
     both models alike: compare the two models' figures with each other, not with a
     server measured from another machine or process.

Everything is checked before a model is loaded: each directory is a SavedModel (or a
serving directory, whose newest version is used) with a tokenizer and a model config,
the data matches files, every task file loads, and `max_tokens` leaves room in each
model's context. `CompareError` (a `ValueError`) names the bad input in one line.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import time
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from evaluation.tasks import Task, TaskFileError, load_task

# Fixed prompts of a load run when there is no data (English and Chinese).
BUILTIN_PROMPTS = ("The quick brown fox", "Once upon a time, there was", "ROMEO:\nBut soft,",
                   "The capital of France is", "床前明月光，", "春眠不觉晓，",
                   "人工智能是", "今天天气很好，")
NUM_PROMPTS = 8
PROMPT_CHARS = 48  # at most this many characters of a data document per prompt
MODEL_NAME = "compare"
SEED = 0


class CompareError(ValueError):
    """Input `compare_models` refuses; the message is one line naming it."""


def machine() -> dict:
    """{"cpu_count", "cpu", "platform", "python", "tensorflow"} of this machine."""
    import tensorflow as tf

    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu_count": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version(), "tensorflow": tf.__version__}


def _check_model_dir(label: str, model_dir: str) -> tuple[str, int]:
    """(SavedModel path, context) of `model_dir`, or CompareError."""
    from savedmodel.layout import has_tokenizer, latest_version, read_model_config

    if not os.path.isdir(model_dir):
        raise CompareError(f"{label}: {model_dir}: no such directory")
    try:
        path, _ = latest_version(model_dir)
    except FileNotFoundError:
        raise CompareError(f"{label}: {model_dir}: not a SavedModel (no saved_model.pb) and "
                           "no numbered versions holding one") from None
    if not has_tokenizer(path):
        raise CompareError(f"{label}: {path}: the SavedModel has no tokenizer "
                           "(assets/tokenizer.json): it serves logits only, and compare "
                           "needs text")
    try:
        context = read_model_config(path).max_position_embeddings
    except (FileNotFoundError, ValueError) as e:
        raise CompareError(f"{label}: {path}: no readable model config: "
                           f"{str(e).splitlines()[0]}") from None
    return path, context


def _data_files(data_pattern: str) -> list[str]:
    import tensorflow as tf

    try:
        files = sorted(p for p in tf.io.gfile.glob(data_pattern) if not tf.io.gfile.isdir(p))
    except tf.errors.OpError as e:
        raise CompareError(f"data {data_pattern}: {e.message}") from None
    if not files:
        raise CompareError(f"data {data_pattern}: no files match")
    return files


def load_prompts(files: list[str] | None, n: int = NUM_PROMPTS,
                 chars: int = PROMPT_CHARS) -> list[str]:
    """The fixed prompts of a load run: the starts (at most `chars` characters, cut after
    the last whitespace when there is one) of `n` documents spread evenly over the data's
    documents (blank-line boundaries, as `DataConfig()`), or `BUILTIN_PROMPTS` without
    data or when the data has no text.

    Raises:
      OSError: a file cannot be read.
    """
    from corpus.documents import read_documents

    if not files:
        return list(BUILTIN_PROMPTS)
    texts = [d.text for path in files for d in read_documents(path, path)
             if not d.reject_reason and d.text.strip()]
    if not texts:
        return list(BUILTIN_PROMPTS)
    picks = sorted({int(i) for i in np.linspace(0, len(texts) - 1, min(n, len(texts)))})
    prompts = []
    for i in picks:
        cut = texts[i][:chars]
        space = max(cut.rfind(" "), cut.rfind("\n"))
        prompts.append(cut[:space + 1] if space > 0 and len(texts[i]) > chars else cut)
    return prompts


def fit_prompts(prompts: list[str], tokenizer, room: int) -> list[str]:
    """Each prompt cut (characters off its end) until its token count is at most `room`
    (`tokenizer`: a `tokenizers.Tokenizer`); most prompts are returned unchanged."""
    fitted = []
    for prompt in prompts:
        while prompt and len(tokenizer.encode(prompt, add_special_tokens=False).ids) > room:
            prompt = prompt[:-1]
        fitted.append(prompt)
    return fitted


def json_safe(value):
    """`value` with every NaN or infinite float (e.g. the stderr of a task with one example)
    replaced by None: strict JSON has no NaN."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def _completion_bodies(prompts: list[str], max_tokens: int) -> list[dict]:
    return [{"model": MODEL_NAME, "prompt": p, "max_tokens": max_tokens, "temperature": 0.0,
             "seed": SEED} for p in prompts]


def completion_load(url: str, bodies: list[dict], requests: int, concurrency: int,
                    timeout: float = 300.0) -> dict:
    """`requests` POSTs of `bodies` (cycled) to an OpenAI /v1/completions `url` (loopback),
    at most `concurrency` at a time.

    Returns:
      {"p50_ms", "p99_ms" (client-side request latency, every request), "tokens_per_second"
       (sum of usage.completion_tokens of the 200s / wall seconds), "completion_tokens",
       "requests", "concurrency", "errors" (answers other than 200, timeouts and
       connection errors), "status_counts" ({"200": n, "0": timeouts and connection
       errors, ...}), "wall_s"}.

    Raises:
      ValueError: `url` is not on the loopback interface.
    """
    from serving.load_test import LOOPBACK_HOSTS, post_json

    if urllib.parse.urlparse(url).hostname not in LOOPBACK_HOSTS:
        raise ValueError(f"{url}: load runs only target the loopback interface")

    def one(i: int) -> tuple[int, float, int]:
        start = time.perf_counter()
        try:
            status, reply = post_json(url, bodies[i % len(bodies)], timeout)
        except (OSError, ValueError):
            status, reply = 0, {}
        tokens = reply.get("usage", {}).get("completion_tokens", 0) if status == 200 else 0
        return status, time.perf_counter() - start, tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, range(requests)))
    wall = time.perf_counter() - start
    latencies = np.array([s for _, s, _ in results]) * 1000  # ms
    tokens = sum(t for _, _, t in results)
    statuses: dict[str, int] = {}
    for status, _, _ in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return {"p50_ms": round(float(np.percentile(latencies, 50)), 2),
            "p99_ms": round(float(np.percentile(latencies, 99)), 2),
            "tokens_per_second": round(tokens / wall, 2),
            "completion_tokens": int(tokens),
            "requests": requests, "concurrency": concurrency,
            "errors": sum(1 for s, _, _ in results if s != 200),
            "status_counts": statuses,
            "wall_s": round(wall, 3)}


def _measure(model_dir: str, files: list[str] | None, data_pattern: str | None,
             tasks: list[Task], prompts: list[str], *, requests: int, concurrency: int,
             max_tokens: int, batch_size: int) -> dict:
    """One model's figures (see `compare_models`); the model is released on return."""
    from config import ServeConfig
    from evaluation.task_models import from_saved_model, score_tasks
    from serving.evaluate import evaluate_text_files
    from serving.http_app import make_app, serving_in_thread
    from serving.server import ModelServer

    result: dict = {"dir": model_dir, "bits_per_byte": None, "perplexity": None}
    if files:
        metrics = evaluate_text_files(model_dir, data_pattern)
        result.update(bits_per_byte=metrics["bits_per_byte"], perplexity=metrics["perplexity"],
                      eval_tokens=metrics["tokens"], eval_bytes=metrics["bytes"])
        gc.collect()  # the SavedModel `evaluate` loaded goes before the server loads its own
    serve = ServeConfig()
    server = ModelServer(model_dir, MODEL_NAME, serve, warm=False)
    try:
        task_model = from_saved_model(server.path, loaded=server.model)
        result["tasks"] = score_tasks(task_model, tasks, batch_size)["tasks"] if tasks else {}
        room = task_model.context_len - 1 - max_tokens  # [EOS] + prompt + completion
        fitted = fit_prompts(prompts, task_model.tokenizer, room)
        del task_model
        server.warm_up()
        with serving_in_thread(make_app(server, openai=True), serve) as port:
            url = f"http://127.0.0.1:{port}/v1/completions"
            bodies = _completion_bodies(fitted, max_tokens)
            completion_load(url, bodies, concurrency, concurrency)  # warm the HTTP path
            latency = completion_load(url, bodies, requests, concurrency)
        latency.update(max_tokens=max_tokens, prompts=len(fitted),
                       prompts_cut=sum(a != b for a, b in zip(prompts, fitted, strict=True)))
        result["latency"] = latency
    finally:
        server.close()
        del server
        gc.collect()
    return result


def compare_models(dirs: dict[str, str], data_pattern: str | None, task_paths: list[str], *,
                   requests: int, concurrency: int, max_tokens: int, batch_size: int,
                   progress: Callable[[str], None] | None = None) -> dict:
    """Measures each model of `dirs` in turn (module docstring), in this process.

    Args:
      dirs: {label: a SavedModel directory, or a serving directory (its newest version)},
        in the order measured (and shown).
      data_pattern: a glob of text files (text, JSONL, CSV, Parquet, as `evaluate`
        reads them) for bits per byte and the load run's prompts; None: no bits per
        byte, built-in English and Chinese prompts.
      task_paths: task files (`evaluation/tasks.py`), loaded once for all models.
      requests: timed requests of the load run (>= 1).
      concurrency: requests at a time (>= 1).
      max_tokens: completion tokens per request (OpenAI's max_tokens, >= 1).
      batch_size: rows per forward pass when scoring tasks (>= 1).
      progress: called with one line as each model's measuring starts and ends.

    Returns:
      A JSON-serializable dict: {"models": {label: {"dir" (the SavedModel measured),
      "bits_per_byte", "perplexity" (None without data), "tasks": {task: metrics as
      `score_tasks`}, "latency": {"p50_ms", "p99_ms", "tokens_per_second", "requests",
      "concurrency", "max_tokens", "errors", ...}}}, "data": the pattern or None,
      "data_files", "tasks": [task names], "task_files", "prompts": the load run's
      prompts, "seed", "machine": `machine()`, "seconds"}; a NaN (the stderr of a task
      with one example) is None.

    Raises:
      CompareError: a directory that is not a SavedModel with a tokenizer and a model
        config, data that matches no file, a task file that does not load (the
        `TaskFileError` line), two task files naming one task, a count out of range,
        max_tokens that leaves a model no room for a prompt.
    """
    start = time.perf_counter()
    for name, value in (("requests", requests), ("concurrency", concurrency),
                        ("max_tokens", max_tokens), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CompareError(f"{name} {value!r}: must be an integer >= 1")
    if not dirs:
        raise CompareError("no models to compare")
    paths = {}
    for label, model_dir in dirs.items():
        path, context = _check_model_dir(label, model_dir)
        if max_tokens > context - 2:
            raise CompareError(f"max_tokens {max_tokens}: must be at most {context - 2} for "
                               f"{label} ({path}): its context is {context} positions "
                               "(max_position_embeddings), and [EOS] and a prompt token need "
                               "two")
        paths[label] = path
    files = _data_files(data_pattern) if data_pattern else None
    tasks = []
    for task_path in task_paths:
        try:
            tasks.append(load_task(task_path))
        except TaskFileError as e:
            raise CompareError(str(e)) from None
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise CompareError(f"two task files name the task {dupes[0]!r}: task names must differ")
    prompts = load_prompts(files)

    say = progress or (lambda line: None)
    models = {}
    for label, path in paths.items():
        began = time.perf_counter()
        say(f"{label}: measuring {path}")
        models[label] = _measure(path, files, data_pattern, tasks, prompts, requests=requests,
                                 concurrency=concurrency, max_tokens=max_tokens,
                                 batch_size=batch_size)
        say(f"{label}: done in {time.perf_counter() - began:.1f} s")
    return json_safe({"models": models, "data": data_pattern, "data_files": files or [],
            "tasks": names, "task_files": list(task_paths), "prompts": prompts,
            "seed": SEED, "machine": machine(),
            "seconds": round(time.perf_counter() - start, 1)})
