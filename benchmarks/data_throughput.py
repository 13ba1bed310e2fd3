"""Data path throughput: ingestion + cleaning + Transform, next to the raw tokenizer.

  python benchmarks/data_throughput.py [--data PATH | --size-mb N] [--preset cpu_small]

Runs the pipeline up to Transform (LocalDagRunner, Beam DirectRunner, no cache)
on the corpus (default: Tiny Shakespeare; `--size-mb N` generates an N MB JSONL
corpus of distinct documents with planted duplicates and bad records, as
`benchmarks/data_memory.py` does), reads each
component's wall time from ML Metadata, and then times the learned byte-level
BPE alone (the in-graph `BytePairEncoder` over the transform graph's tables, one
`tf.function`, batches of 1024 documents) on the same documents. Prints one JSON object: MB/s and
records/s per stage, and the tokenizer's MB/s.

Transform's time includes both of its passes (analyze: counting space-delimited
units and learning the tokenizer; transform: tokenizing and writing TFRecords)
and its start-up (tracing the preprocessing_fn several times, writing the
transform graph: about 14 s here), so its MB/s grows with the corpus; compare
with the tokenizer at 100 MB or more (`--size-mb 100`).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import tensorflow as tf

from cli import default_corpus, split_data_path
from config import get_config
from corpus.documents import read_documents
from pipeline.local_runner import run_local
from reporting.run_summary import latest_run
from tokenization import tokenizer
from tokenization.byte_pair_encoder import BytePairEncoder

STAGES = ("TextExampleGen", "StatisticsGen", "ExampleValidator", "TextCleaner", "DriftValidator",
          "Transform")


def make_corpus(source: str, size_mb: float, out_dir: str) -> str:
    """`source` itself, or a generated JSONL corpus of `size_mb` MB made from it."""
    if not size_mb:
        return source
    from data_memory import generate_jsonl  # benchmarks/data_memory.py, beside this file

    path = os.path.join(out_dir, f"corpus_{size_mb:g}mb.jsonl")
    generate_jsonl(path, int(size_mb * 1e6), open(source, encoding="utf-8").read())
    return path


def tokenizer_throughput(texts: list[str], transform_graph: str,
                         max_bytes: int = 20_000_000) -> float:
    """MB/s of the transform graph's tokenizer on `texts` (best of 3 passes over
    the first `max_bytes` of them: the tokenizer alone has no start-up cost to
    amortize, so a 20 MB sample measures it as well as the whole corpus)."""
    sample, size = [], 0
    for text in texts:
        if size >= max_bytes:
            break
        sample.append(text)
        size += len(text.encode("utf-8"))
    texts = sample
    spec = tokenizer.load_tokenizer(transform_graph)
    encoder = BytePairEncoder(spec.pre_tokenizer_config, spec.added_tokens,
                              tokenizer.find_asset(transform_graph, tokenizer.TABLES_ASSET_PREFIX))
    encode = tf.function(lambda t: encoder.encode(t).flat_values,
                         input_signature=[tf.TensorSpec([None], tf.string)])
    batches = [tf.constant(texts[i:i + 1024]) for i in range(0, len(texts), 1024)]
    encode(batches[0])  # trace
    total_bytes = sum(len(t.encode("utf-8")) for t in texts)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for batch in batches:
            encode(batch).numpy()
        best = min(best, time.perf_counter() - start)
    return total_bytes / best / 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", help="corpus file (default: Tiny Shakespeare)")
    parser.add_argument("--preset", default="cpu_small")
    parser.add_argument("--size-mb", type=float, default=0,
                        help="generate a JSONL corpus of this size from --data")
    args = parser.parse_args()
    config = get_config(args.preset)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = make_corpus(args.data or str(default_corpus()), args.size_mb, tmp)
        input_base, pattern = split_data_path(corpus)
        paths = run_local(config, input_base, pattern, os.path.join(tmp, "run"),
                          enable_cache=False, until="Transform")
        runs = {r.component: r for r in latest_run(paths["metadata_path"])}
        texts = [d.text for d in read_documents(corpus, corpus, config.data) if d.text]
        size_mb = os.path.getsize(corpus) / 1e6
        stages = {}
        for name in STAGES:
            seconds = runs[name].duration_s
            stages[name] = {"seconds": round(seconds, 2), "mb_per_s": round(size_mb / seconds, 3),
                            "records_per_s": round(len(texts) / seconds, 1)}
        data_path_s = sum(runs[name].duration_s for name in STAGES)
        graph = runs["Transform"].outputs["TransformGraph"]["uri"]
        raw = tokenizer_throughput(texts, graph)
    print(json.dumps({
        "corpus_mb": round(size_mb, 3),
        "records": len(texts),
        "cores": os.cpu_count(),
        "stages": stages,
        "data_path_mb_per_s": round(size_mb / data_path_s, 3),
        "tokenizer_alone_mb_per_s": round(raw, 2),
        "transform_over_tokenizer": round(stages["Transform"]["mb_per_s"] / raw, 4),
    }, indent=2))


if __name__ == "__main__":
    main()
