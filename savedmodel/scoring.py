"""Language-model scoring: perplexity and bits per byte over a token stream.

Documents are joined into one stream `[EOS] d1 [EOS] d2 ... [EOS] dN` (the
Trainer's packing; `[EOS]` is the tokenizer's end-of-sequence id), cut into non-overlapping windows of `seq_len`, and every
token after the leading `[EOS]` is scored given the tokens before it in its
window (0 to seq_len - 1 tokens of context, as in training).

  nll           summed negative log-likelihood, nats
  perplexity    exp(nll / tokens)
  bits_per_byte nll / ln 2 / bytes  (bytes: UTF-8 bytes of the text scored)

Bits per byte does not depend on the tokenizer, so models with different
vocabularies (and character-level baselines) compare directly.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import tensorflow as tf

from tokenization.tokenizer import EOS_ID, PAD_ID

LogitsFn = Callable[[tf.Tensor], tf.Tensor]


def token_stream(documents: Iterable[Iterable[int]], max_tokens: int = 0,
                 eos_id: int = EOS_ID) -> np.ndarray:
    """`[EOS] d1 [EOS] d2 ... dN` as int32; cut at `max_tokens` + 1 if > 0."""
    parts = []
    for i, doc in enumerate(documents):
        if i:
            parts.append([eos_id])
        parts.append(list(doc))
    stream = np.concatenate([[eos_id]] + [np.asarray(p, np.int32) for p in parts]).astype(np.int32)
    if max_tokens > 0:
        stream = stream[: max_tokens + 1]
    return stream


def score_stream(logits_fn: LogitsFn, stream: np.ndarray, seq_len: int, batch_size: int,
                 pad_id: int = PAD_ID) -> dict:
    """Scores every token of `stream` but the first.

    Args:
      logits_fn: int32 [B, T] -> float32 logits [B, T, V].
      stream: int32 [N] token ids.
      seq_len: window length T.
      batch_size: windows per call.
      pad_id: the id that fills the last window (its positions are not scored).

    Returns:
      {"nll": nats (float), "tokens": N - 1 (int)}.
    """
    n_windows = max(math.ceil((len(stream) - 1) / seq_len), 0)
    inputs = np.full([n_windows, seq_len], pad_id, np.int32)
    labels = np.full([n_windows, seq_len], -1, np.int32)
    for w in range(n_windows):
        chunk = stream[w * seq_len : w * seq_len + seq_len + 1]
        inputs[w, : len(chunk) - 1] = chunk[:-1]
        labels[w, : len(chunk) - 1] = chunk[1:]
    nll, tokens = 0.0, 0
    for start in range(0, n_windows, batch_size):
        x = tf.constant(inputs[start : start + batch_size])
        y = labels[start : start + batch_size]
        logits = tf.cast(logits_fn(x), tf.float32)
        mask = y >= 0
        per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(np.maximum(y, 0), logits).numpy()
        nll += float(per_token[mask].astype(np.float64).sum())
        tokens += int(mask.sum())
    return {"nll": nll, "tokens": tokens}


def score_responses(logits_fn: LogitsFn, records, seq_len: int, batch_size: int,
                    pad_id: int = PAD_ID) -> dict:
    """Response-only scoring of SFT records (`data.task = "sft"`).

    Each record (ids = prompt ++ response ++ [EOS], prompt_length) is one row, as the
    Trainer feeds it: the response tokens and the EOS are scored given the prompt
    and the response before them. Records longer than seq_len + 1 ids are skipped
    and counted (the Trainer leaves them out too).

    Args:
      logits_fn: int32 [B, T] -> float32 logits [B, T, V].
      records: iterable of (ids: list[int], prompt_length: int, num_bytes: int),
        num_bytes being the response's UTF-8 bytes.
      seq_len: T.
      batch_size: rows per call.
      pad_id: fills rows shorter than T (not scored).

    Returns:
      {"nll": nats over response targets, "tokens": response targets (EOS included),
       "bytes": response bytes of the records scored, "records": scored,
       "skipped_too_long": skipped}.
    """
    records = list(records)
    rows = [(ids, p, b) for ids, p, b in records if len(ids) <= seq_len + 1]
    skipped = len(records) - len(rows)
    nll, tokens = 0.0, 0
    for start in range(0, len(rows), batch_size):
        batch = rows[start:start + batch_size]
        inputs = np.full([len(batch), seq_len], pad_id, np.int32)  # (B, T)
        labels = np.full([len(batch), seq_len], -1, np.int32)  # (B, T)
        for r, (ids, p, _) in enumerate(batch):
            n = len(ids) - 1
            inputs[r, :n] = ids[:-1]
            labels[r, max(p - 1, 0):n] = ids[max(p, 1):]  # targets: response tokens and EOS
        logits = tf.cast(logits_fn(tf.constant(inputs)), tf.float32)  # (B, T, V)
        mask = labels >= 0
        per_token = tf.nn.sparse_softmax_cross_entropy_with_logits(
            np.maximum(labels, 0), logits).numpy()  # (B, T)
        nll += float(per_token[mask].astype(np.float64).sum())
        tokens += int(mask.sum())
    return {"nll": nll, "tokens": tokens, "bytes": sum(b for _, _, b in rows),
            "records": len(rows), "skipped_too_long": skipped}


def summarize(nll: float, tokens: int, num_bytes: int) -> dict:
    """Perplexity, bits per byte, bits per token and the counts of one scoring.

    With N = `nll` (summed negative log-likelihood, nats), T = `tokens` and
    B = `num_bytes` (UTF-8 bytes of the text scored):

      loss            N / T              mean NLL per token, nats
      perplexity      exp(N / T)
      bits_per_token  N / (ln 2 * T)
      bits_per_byte   N / (ln 2 * B)     nats -> bits: divide by ln 2
      bytes_per_token B / T

    Bits per byte is the figure that does not depend on the tokenizer (see
    the module docstring), as in Gao et al. 2020 (The Pile, arXiv:2101.00027).

    Args:
      nll: summed NLL over the scored tokens, nats (float).
      tokens: tokens scored (int).
      num_bytes: bytes of text those tokens stand for (int).

    Returns:
      {"bits_per_byte", "perplexity", "loss", "bits_per_token",
      "bytes_per_token"} (floats) and {"tokens", "bytes"} (the ints given).

    Raises:
      ValueError: `tokens` or `num_bytes` is 0 ("nothing to score"); negative
        counts are not checked.
      OverflowError: the mean NLL is above ~709 nats per token, where exp
        overflows a float64 (a uniform guess over V tokens scores ln V, ~11
        nats for V = 64k).
    """
    if tokens == 0 or num_bytes == 0:
        raise ValueError(f"nothing to score: {tokens} tokens, {num_bytes} bytes")
    return {
        "bits_per_byte": nll / math.log(2) / num_bytes,
        "perplexity": math.exp(nll / tokens),
        "loss": nll / tokens,
        "bits_per_token": nll / math.log(2) / tokens,
        "bytes_per_token": num_bytes / tokens,
        "tokens": tokens,
        "bytes": num_bytes,
    }


def retokenize(docs: list[list[int]], from_dir: str, to_dir: str,
               batch_size: int = 64) -> list[list[int]]:
    """`docs` (ids of `from_dir`'s tokenizer) as ids of `to_dir`'s tokenizer.

    The same list when both SavedModels carry the same tokenizer.json; otherwise
    decoded with one model's `detokenize` and encoded with the other's `tokenize`.
    """
    from savedmodel.layout import read_tokenizer

    source, target = read_tokenizer(from_dir), read_tokenizer(to_dir)
    if source.json == target.json:
        return docs
    detokenize = tf.saved_model.load(from_dir).signatures["detokenize"]
    tokenize = tf.saved_model.load(to_dir).signatures["tokenize"]
    out: list[list[int]] = []
    for start in range(0, len(docs), batch_size):
        batch = tf.ragged.constant(docs[start:start + batch_size], dtype=tf.int32)
        texts = detokenize(input_ids=batch.to_tensor(default_value=source.pad_id))["text"]
        encoded = tokenize(text=texts)
        out.extend(row[:n].tolist() for row, n in zip(encoded["input_ids"].numpy(),
                                                       encoded["lengths"].numpy(), strict=True))
    return out
