"""`deepseek-tfx evaluate`: a pushed model's perplexity and bits per byte on any text.

Uses only the pushed SavedModel (its `tokenize` and `logits` signatures) and the
config stored beside it, so text the pipeline never saw is scored exactly as
the pipeline's Evaluator scores its eval split (see `components/lm_evaluator/
scoring.py`). Files are cut into documents with the run's document boundary.

A model without the pipeline's config (`assets.extra/deepseek_tfx_config.json`), such
as one from `hf-import`, is read with the default `DataConfig()` (documents cut at
blank lines, NFC) and scored in windows of `min(max_position_embeddings, 1024)`
tokens (`DEFAULT_SEQ_LEN`; 1024 is the window of the usual Hugging Face perplexity
recipe); `seq_len` overrides the window for any model.

Bytes: for plain text files, the file's size in bytes (uncompressed) — every byte
of the file counts, blank-line separators included; for JSONL, CSV and Parquet, the
UTF-8 bytes of the texts plus one per separator.
"""

from __future__ import annotations

import gzip

import tensorflow as tf
import tensorflow_text  # noqa: F401

from config import DataConfig
from corpus.documents import file_format, read_documents
from savedmodel import scoring
from savedmodel.layout import (
    NoTokenizerError,
    read_model_config,
    read_pipeline_config,
    read_tokenizer,
)

DEFAULT_SEQ_LEN = 1024  # window of a model without a pipeline config (capped by its context)
LOGITS_BUDGET_BYTES = 256 * 1024**2  # float32 logits per scoring call (at least one window)


def _file_bytes(path: str) -> int:
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b""))
    return tf.io.gfile.stat(path).length


def evaluate_text_files(model_dir: str, pattern: str, batch_size: int = 64,
                        seq_len: int | None = None) -> dict:
    """Scores the files matching `pattern` with the SavedModel in `model_dir`.

    Args:
      model_dir: a SavedModel with `tokenize` and `logits` signatures.
      pattern: a file glob.
      batch_size: documents per `tokenize` call.
      seq_len: the scoring window in tokens; default: the pipeline's train.seq_len,
        or `min(max_position_embeddings, DEFAULT_SEQ_LEN)` without a pipeline config.

    Returns:
      {"bits_per_byte", "perplexity", "loss" (nats/token), "bits_per_token",
       "bytes_per_token", "tokens", "bytes", "documents", "files", "seq_len",
       "config" ("pipeline", or "defaults" without a pipeline config)}.

    Raises:
      FileNotFoundError: nothing matches `pattern`.
      NoTokenizerError: the SavedModel has no tokenizer (logits only).
      ValueError: seq_len beyond the model's max_position_embeddings.
    """
    tokenizer = read_tokenizer(model_dir)
    if tokenizer is None:
        raise NoTokenizerError(model_dir, "score text")
    files = sorted(p for p in tf.io.gfile.glob(pattern) if not tf.io.gfile.isdir(p))
    if not files:
        raise FileNotFoundError(f"no files match {pattern}")
    config = read_pipeline_config(model_dir)
    model_config = read_model_config(model_dir)
    max_positions = model_config.max_position_embeddings
    if seq_len is None:
        seq_len = config.train.seq_len if config else min(max_positions, DEFAULT_SEQ_LEN)
    if not 0 < seq_len <= max_positions:
        raise ValueError(f"seq_len={seq_len} must be in [1, max_position_embeddings="
                         f"{max_positions}] of {model_dir}")
    data_config = config.data if config else DataConfig()
    loaded = tf.saved_model.load(model_dir)
    tokenize, logits = loaded.signatures["tokenize"], loaded.signatures["logits"]

    docs: list[list[int]] = []
    num_bytes = 0
    for path in files:
        texts = [
            d.text
            for d in read_documents(path, path, data_config)
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
    # Windows per call: 16, fewer when their logits would pass the budget (large vocabularies).
    windows = max(1, min(16, LOGITS_BUDGET_BYTES // (seq_len * model_config.vocab_size * 4)))
    result = scoring.score_stream(
        lambda x: logits(input_ids=x)["logits"], stream, seq_len, batch_size=windows,
        pad_id=tokenizer.pad_id)
    metrics = scoring.summarize(result["nll"], result["tokens"], num_bytes)
    metrics.update(documents=len(docs), files=len(files), seq_len=seq_len,
                   config="pipeline" if config else "defaults")
    return metrics
