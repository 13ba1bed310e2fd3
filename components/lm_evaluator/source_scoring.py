"""The LmEvaluator's scoring by mixture source (issue 28), apart from the executor so
that it is tested without importing TFX.

The eval split's transformed examples are grouped by their `source_name` feature
("default" without it), and each source's documents are packed and scored on their own
(`score_documents`): every token is scored with context from its own source only. The
mixture's figure is the sources' summed NLL over their summed bytes (`evaluate_sources`),
so every document is scored once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import tensorflow as tf

from components.transform.preprocessing import (
    INPUT_IDS_KEY,
    NUM_BYTES_KEY,
    PROMPT_LENGTH_KEY,
    SOURCE_NAME_KEY,
)
from config import DEFAULT_SOURCE, PipelineConfig
from config.data import CHAT_TASKS
from savedmodel import scoring


def _eval_features(transformed_examples, split: str):
    """(where, feature map) of one split's transformed examples, in file order; `where`
    is "FILE record N" for error messages."""
    pattern = os.path.join(transformed_examples.uri, f"Split-{split}", "*")
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no transformed examples in {pattern}")
    for path in files:
        for i, record in enumerate(tf.data.TFRecordDataset(path, compression_type="GZIP")):
            yield f"{path} record {i}", tf.train.Example.FromString(record.numpy()).features.feature


def source_name(features, where: str = "a transformed example") -> str:
    """The mixture source of one transformed example: its `source_name` feature (bytes,
    one value), or DEFAULT_SOURCE ("default") for an example without it (made before
    mixtures, or by a one-source run's tests).

    Raises:
      ValueError: `source_name` holds not exactly one value, or not UTF-8; the message
        names `where`.
    """
    if SOURCE_NAME_KEY not in features:
        return DEFAULT_SOURCE
    values = features[SOURCE_NAME_KEY].bytes_list.value
    if len(values) != 1:
        raise ValueError(f"{where}: feature {SOURCE_NAME_KEY!r} has {len(values)} values, "
                         f"expected exactly one (the source's name)")
    try:
        return values[0].decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: feature {SOURCE_NAME_KEY!r} is not UTF-8 ({e})") from e


def read_eval_sources(transformed_examples, split: str = "eval",
                      sft: bool = False) -> dict[str, tuple[list, int]]:
    """One split's documents grouped by source: {source name: (items, UTF-8 bytes)}, the
    names sorted, each source's items in file order. Items are token-id lists
    (list[int]) or, with `sft`, SFT records (ids, prompt_length, response bytes) as
    `scoring.score_responses` takes them. A one-source run gives {"default": ...}.

    Raises:
      FileNotFoundError: the split has no transformed examples.
      ValueError: an example's `source_name` is malformed (`source_name`).
    """
    grouped: dict[str, tuple[list, list[int]]] = {}
    for where, f in _eval_features(transformed_examples, split):
        ids = list(f[INPUT_IDS_KEY].int64_list.value)
        num_bytes = int(f[NUM_BYTES_KEY].int64_list.value[0])
        item = (ids, int(f[PROMPT_LENGTH_KEY].int64_list.value[0]), num_bytes) if sft else ids
        items, sizes = grouped.setdefault(source_name(f, where), ([], []))
        items.append(item)
        sizes.append(num_bytes)
    return {name: (grouped[name][0], sum(grouped[name][1])) for name in sorted(grouped)}


def source_token_caps(max_tokens: int, tokens: Mapping[str, int]) -> dict[str, int]:
    """`eval.max_eval_tokens` shared among the sources in proportion to their scorable
    tokens ({source: tokens}), so every source stays in the figure: source s may score
    max(1, max_tokens * tokens[s] // sum(tokens)). 0 (no cap) stays 0 for every source;
    one source gets the whole cap."""
    if max_tokens <= 0:
        return dict.fromkeys(tokens, 0)
    total = max(sum(tokens.values()), 1)
    return {name: max(1, max_tokens * n // total) for name, n in tokens.items()}


def score_documents(logits_fn, tokenizer, docs: list, num_bytes: int, config: PipelineConfig,
                    max_tokens: int = 0) -> dict:
    """Summed NLL of one source's documents, packed on their own as the Trainer packs
    them (`[EOS] d1 [EOS] d2 ... dN`, `scoring.token_stream`, cut at `max_tokens` + 1
    when > 0), so every token is scored with context from its own source only; for SFT
    (`data.task = "sft"`, docs from `read_eval_sources(..., sft=True)`) of the
    responses only (`scoring.score_responses`; `max_tokens` does not apply).

    Returns:
      {"nll" (nats), "tokens", "bytes" (the documents' UTF-8 bytes + one per [EOS]
      separator, the blank line it stands for; scaled by the share of tokens scored
      when cut), "documents"} and for SFT "records", "skipped_too_long".
    """
    if config.data.task in CHAT_TASKS:  # prompt ++ response ++ [EOS] records
        scored = scoring.score_responses(logits_fn, docs, config.train.seq_len,
                                         config.eval.batch_size, pad_id=tokenizer.pad_id)
        return {**scored, "documents": len(docs)}
    stream = scoring.token_stream(docs, max_tokens, eos_id=tokenizer.eos_id)
    result = scoring.score_stream(logits_fn, stream, config.train.seq_len,
                                  config.eval.batch_size, pad_id=tokenizer.pad_id)
    total_tokens = sum(len(d) for d in docs) + len(docs) - 1
    if max_tokens and result["tokens"] < total_tokens:
        # Scored a prefix: scale bytes by the fraction of tokens scored.
        num_bytes = round((num_bytes + len(docs) - 1) * result["tokens"] / total_tokens)
    else:
        num_bytes += len(docs) - 1
    return {**result, "bytes": num_bytes, "documents": len(docs)}


def evaluate_sources(logits_fn, tokenizer, sources: Mapping[str, tuple[list, int]],
                     config: PipelineConfig) -> dict:
    """Perplexity and bits per byte of `logits_fn` (int32 [B, T] -> float32 [B, T, V]) on
    each source's documents (`score_documents`: each source packed on its own) and on
    them all (the mixture's figure: the sources' summed NLL over their summed bytes;
    every document is scored once). For SFT also `response_perplexity`,
    `response_bits_per_byte`, `records`, `skipped_too_long`.

    With one source this is exactly the figure of packing the whole split in one
    stream. With several, the tokens right after a change of source no longer see
    the other source's text as context, and the S - 1 [EOS] separators between
    sources (and their bytes) are not scored, so the mixture's figure differs
    slightly from one stream of all sources.

    Args:
      sources: {source name: (token-id lists or SFT records, their UTF-8 bytes)}.

    Returns:
      `scoring.summarize`'s metrics of the mixture, and "by_source": {name:
      {"bits_per_byte", "perplexity", "tokens", "bytes", "documents"}}.

    Raises:
      ValueError: no sources, or a source with nothing to score (its name in the
        message).
    """
    if not sources:
        raise ValueError("nothing to score: the eval split has no documents")
    tokens = {name: sum(len(d) for d in docs) + len(docs) - 1
              for name, (docs, _) in sources.items()}
    caps = source_token_caps(config.eval.max_eval_tokens, tokens)
    scored = {name: score_documents(logits_fn, tokenizer, docs, n, config, caps[name])
              for name, (docs, n) in sources.items()}
    by_source = {}
    for name, s in scored.items():
        try:
            m = scoring.summarize(s["nll"], s["tokens"], s["bytes"])
        except ValueError as e:
            raise ValueError(f"source {name!r} of the eval split: {e}") from e
        by_source[name] = {"bits_per_byte": m["bits_per_byte"], "perplexity": m["perplexity"],
                           "tokens": m["tokens"], "bytes": m["bytes"],
                           "documents": s["documents"]}
    first, *rest = scored.values()
    nll, n_tokens, n_bytes = first["nll"], first["tokens"], first["bytes"]
    for s in rest:
        nll, n_tokens, n_bytes = nll + s["nll"], n_tokens + s["tokens"], n_bytes + s["bytes"]
    metrics = {**scoring.summarize(nll, n_tokens, n_bytes), "by_source": by_source}
    if config.data.task in CHAT_TASKS:  # prompt ++ response ++ [EOS] records
        metrics.update(response_perplexity=metrics["perplexity"],
                       response_bits_per_byte=metrics["bits_per_byte"],
                       records=sum(s["records"] for s in scored.values()),
                       skipped_too_long=sum(s["skipped_too_long"] for s in scored.values()))
    return metrics
