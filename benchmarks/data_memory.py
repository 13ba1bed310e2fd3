"""Peak memory of ingestion + cleaning on a large generated JSONL corpus.

  python benchmarks/data_memory.py [--size-mb 1024] [--keep DIR]

Generates a JSONL corpus of `--size-mb` MB (`generate_jsonl`: documents made of
Tiny Shakespeare paragraphs with words substituted, so they are distinct, plus
planted exact duplicates, near-duplicates, unparsable lines, records without the
text field and whitespace-only texts), then runs what `deepseek-tfx validate`
runs: the pipeline up to TextCleaner (TextExampleGen, StatisticsGen,
ImportSchemaGen, ExampleValidator, TextCleaner; LocalDagRunner, Beam
DirectRunner, no cache) in a child process, sampling the resident set size of
that process and all its descendants every 0.5 s (psutil). Prints one JSON
object: corpus size and records, what generation planted, the cleaning report's
counts, each component's seconds and MB/s (from ML Metadata), the wall time and
the peak RSS (sum over the process tree, and of its largest process), in MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

import psutil

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

STAGES = ("TextExampleGen", "StatisticsGen", "ExampleValidator", "TextCleaner")


def generate_jsonl(path: str, size_bytes: int, source_text: str, seed: int = 0) -> dict[str, int]:
    """Writes about `size_bytes` of JSONL to `path`; returns what was planted.

    Each record is `{"id": n, "text": ...}` with 2-12 paragraphs of `source_text`,
    15% of whose words are replaced by random words of the same text. Per 1,000
    records about 10 are exact copies of an earlier record, 5 near-duplicates (one
    word changed in an earlier record), 2 lines of broken JSON, 2 records
    without `text` and 1 whitespace-only text.
    """
    rng = random.Random(seed)
    paragraphs = [p for p in source_text.split("\n\n") if p.strip()]
    vocabulary = sorted(set(source_text.split()))
    planted = {"records": 0, "exact_duplicate": 0, "near_duplicate": 0, "invalid_json": 0,
               "missing_text_field": 0, "whitespace_only": 0}
    recent: list[str] = []
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size_bytes:
            roll = rng.random()
            n = planted["records"]
            if roll < 0.010 and recent:
                line = json.dumps({"id": n, "text": rng.choice(recent)})
                planted["exact_duplicate"] += 1
            elif roll < 0.015 and recent:
                words = rng.choice(recent).split(" ")
                words[rng.randrange(len(words))] = rng.choice(vocabulary)
                line = json.dumps({"id": n, "text": " ".join(words)})
                planted["near_duplicate"] += 1
            elif roll < 0.017:
                line = f'{{"id": {n}, "text": "an unterminated string'
                planted["invalid_json"] += 1
            elif roll < 0.019:
                line = json.dumps({"id": n, "body": "no text field here"})
                planted["missing_text_field"] += 1
            elif roll < 0.020:
                line = json.dumps({"id": n, "text": " \n\t "})
                planted["whitespace_only"] += 1
            else:
                parts = []
                for p in rng.sample(paragraphs, rng.randint(2, 12)):
                    words = p.split(" ")
                    for i in range(len(words)):
                        if rng.random() < 0.15:
                            words[i] = rng.choice(vocabulary)
                    parts.append(" ".join(words))
                text = "\n\n".join(parts)
                line = json.dumps({"id": n, "text": text})
                if len(recent) < 1000:
                    recent.append(text)
                else:
                    recent[rng.randrange(1000)] = text
            f.write(line + "\n")
            written += len(line.encode("utf-8")) + 1
            planted["records"] += 1
    return planted


class PeakRss:
    """Samples the RSS of a process and its descendants in a background thread."""

    def __init__(self, pid: int, interval_s: float = 0.5):
        self._process = psutil.Process(pid)
        self._interval = interval_s
        self.peak_tree = 0
        self.peak_single = 0
        self.samples: list[tuple[float, int]] = []  # (unix time, tree RSS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                procs = [self._process, *self._process.children(recursive=True)]
                rss = []
                for p in procs:
                    try:
                        rss.append(p.memory_info().rss)
                    except psutil.Error:
                        pass
                self.samples.append((time.time(), sum(rss)))
                self.peak_tree = max(self.peak_tree, sum(rss))
                self.peak_single = max(self.peak_single, max(rss, default=0))
            except psutil.Error:
                pass
            self._stop.wait(self._interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


_CHILD = """
import json, sys
sys.path.insert(0, {root!r})
from config import get_config
from pipeline.local_runner import run_local
config = get_config({preset!r})
run_local(config, {base!r}, {pattern!r}, {out!r}, enable_cache=False, until="TextCleaner")
"""


def stage_peak(samples: list[tuple[float, int]], run) -> int:
    """Peak tree RSS (MiB) sampled while one component ran (its MLMD start and end)."""
    inside = [rss for t, rss in samples if run.start_s <= t <= run.start_s + run.duration_s]
    return round(max(inside, default=0) / 2**20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-mb", type=float, default=1024)
    parser.add_argument("--preset", default="cpu_small")
    parser.add_argument("--keep", help="work here and keep the corpus and outputs")
    args = parser.parse_args()
    from cli import default_corpus
    from reporting.run_summary import latest_run

    work = args.keep or tempfile.mkdtemp(prefix="data_memory_")
    os.makedirs(os.path.join(work, "corpus"), exist_ok=True)
    corpus = os.path.join(work, "corpus", "corpus.jsonl")
    source = open(default_corpus(), encoding="utf-8").read()
    start = time.perf_counter()
    planted = generate_jsonl(corpus, int(args.size_mb * 1e6), source)
    generate_s = time.perf_counter() - start
    size_mb = os.path.getsize(corpus) / 1e6

    out = os.path.join(work, "run")
    code = _CHILD.format(root=_ROOT, preset=args.preset, base=os.path.dirname(corpus),
                         pattern="corpus.jsonl", out=out)
    start = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-c", code])
    with PeakRss(child.pid) as peak:
        rc = child.wait()
    wall = time.perf_counter() - start
    if rc != 0:
        raise SystemExit(f"the pipeline failed (exit code {rc}); outputs in {work}")

    runs = {r.component: r for r in latest_run(os.path.join(out, "metadata.db"))}
    cleaned = runs["TextCleaner"].outputs["Examples"]
    counts = {k: v for k, v in cleaned.items() if k.startswith(("records_", "dropped_", "repaired_"))}
    print(json.dumps({
        "corpus_mb": round(size_mb, 1),
        "generate_s": round(generate_s, 1),
        "planted": planted,
        "cleaning": counts,
        "stages": {name: {"seconds": round(runs[name].duration_s, 1),
                          "mb_per_s": round(size_mb / runs[name].duration_s, 2),
                          "peak_rss_tree_mib": stage_peak(peak.samples, runs[name])}
                   for name in STAGES},
        "wall_s": round(wall, 1),
        "peak_rss_tree_mib": round(peak.peak_tree / 2**20),
        "peak_rss_largest_process_mib": round(peak.peak_single / 2**20),
        "cores": os.cpu_count(),
        "work_dir": work,
    }, indent=2))


if __name__ == "__main__":
    main()
