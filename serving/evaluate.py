"""`deepseek-tfx evaluate`: a pushed model's perplexity and bits per byte on any text.

Uses only the pushed SavedModel (its `tokenize` and `logits` signatures) and the
config stored beside it, so text the pipeline never saw is scored exactly as
the pipeline's Evaluator scores its eval split (see `components/lm_evaluator/
scoring.py`). Files are cut into documents with the run's document boundary.

Bytes: for plain text files, the file's size in bytes (uncompressed) — every byte
of the file counts, blank-line separators included; for JSONL, CSV and Parquet, the
UTF-8 bytes of the texts plus one per separator.
"""

from __future__ import annotations

import gzip
import json
import os

import tensorflow as tf
import tensorflow_text  # noqa: F401

from components.lm_evaluator import scoring
from components.text_example_gen.documents import file_format, read_documents
from pipeline.configs import PipelineConfig
from serving.export import CONFIG_ASSET, savedmodel_tokenizer


def load_config(model_dir: str) -> PipelineConfig:
    with tf.io.gfile.GFile(os.path.join(model_dir, "assets.extra", CONFIG_ASSET)) as f:
        return PipelineConfig.from_dict(json.load(f))


def _file_bytes(path: str) -> int:
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
    return tf.io.gfile.stat(path).length


def evaluate_text_files(model_dir: str, pattern: str, batch_size: int = 64) -> dict:
    """Scores the files matching `pattern` with the SavedModel in `model_dir`.

    Returns:
      {"bits_per_byte", "perplexity", "loss" (nats/token), "bits_per_token",
       "bytes_per_token", "tokens", "bytes", "documents", "files"}.

    Raises:
      FileNotFoundError: nothing matches `pattern`.
    """
    files = sorted(p for p in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(p))
    if not files:
        raise FileNotFoundError(f"no files match {pattern}")
    config = load_config(model_dir)
    tokenizer = savedmodel_tokenizer(model_dir)
    if tokenizer is None:
        raise ValueError(f"{model_dir} has no tokenizer (assets/tokenizer.json): it serves "
                         "logits only, so it cannot score text")
    loaded = tf.saved_model.load(model_dir)
    tokenize, logits = loaded.signatures["tokenize"], loaded.signatures["logits"]

    docs: list[list[int]] = []
    num_bytes = 0
    for path in files:
        texts = [
            d.text
            for d in read_documents(path, path, config.data)
            if not d.reject_reason and d.text
        ]
        if file_format(path) != "text":
            num_bytes += sum(len(t.encode("utf-8")) for t in texts) + max(len(texts) - 1, 0)
        else:
            num_bytes += _file_bytes(path)
        for i in range(0, len(texts), batch_size):
            out = tokenize(text=tf.constant(texts[i : i + batch_size]))
            ids, lengths = out["input_ids"].numpy(), out["lengths"].numpy()
            docs.extend(row[:n].tolist() for row, n in zip(ids, lengths, strict=True))
    stream = scoring.token_stream(docs, eos_id=tokenizer.eos_id)
    result = scoring.score_stream(
        lambda x: logits(input_ids=x)["logits"], stream, config.train.seq_len, batch_size=16,
        pad_id=tokenizer.pad_id)
    metrics = scoring.summarize(result["nll"], result["tokens"], num_bytes)
    metrics.update(documents=len(docs), files=len(files))
    return metrics
