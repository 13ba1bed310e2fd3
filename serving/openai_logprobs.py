"""Logprobs of the OpenAI endpoints: the `logits` signature on token sequences (batched
within the serving limits) and each token's logprob and most likely alternatives
(see the module docstring of `serving/openai_api.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from serving.openai_model import CONTEXT_LENGTH_EXCEEDED, OpenAIError, run_signature, text_of
from serving.server import ModelServer
from serving.server_checks import JSON_BYTES_PER_FLOAT


def logits_of(server: ModelServer, ids: list[int]) -> np.ndarray:
    """The logits signature on `ids`: float32 [len(ids), vocab]; 400 past the context."""
    if server.context and len(ids) > server.context:
        raise OpenAIError(400, f"{len(ids)} tokens to score do not fit the {server.context}-"
                          f"token context (max_position_embeddings) of model '{server.name}'",
                          param="prompt", code=CONTEXT_LENGTH_EXCEEDED)
    return run_signature(server, "logits", {"input_ids": np.array([ids], np.int32)}, 1)["logits"][0]


LOGITS_BUDGET_BYTES = 256 * 1024**2  # float32 logits of one batched `logits` call


def logits_of_many(server: ModelServer, seqs: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """The logits signature on each of `seqs` in as few calls as allowed: rows sorted by
    length, right-padded (causal attention and dropless routing: a row's logits do not
    depend on what follows it or on the other rows), at most `serve.max_batch_size` rows
    and LOGITS_BUDGET_BYTES of logits per call. Returns float32 [len(seq), V] each; 400
    for a sequence longer than the context."""
    for ids in seqs:
        if server.context and len(ids) > server.context:
            logits_of(server, list(ids))  # raises the 400 naming the prompt
    serve = getattr(server, "serve", None)
    vocab = server.vocab_size or len(text_of(server).surfaces)
    order = sorted((i for i in range(len(seqs)) if seqs[i]), key=lambda i: -len(seqs[i]))
    out: list[np.ndarray] = [np.zeros([0, vocab], np.float32)] * len(seqs)
    while order:
        width = len(seqs[order[0]])  # the longest row of this call
        most = LOGITS_BUDGET_BYTES // (width * vocab * 4)
        if serve is not None:  # and what `run` allows a logits call (as if sent as JSON)
            most = min(most, serve.max_batch_size,
                       serve.max_response_bytes // (width * vocab * JSON_BYTES_PER_FLOAT))
        rows = max(1, min(len(order), most))
        chunk, order = order[:rows], order[rows:]
        batch = np.full([rows, width], text_of(server).eos_id, np.int32)  # [B, T]
        for r, i in enumerate(chunk):
            batch[r, :len(seqs[i])] = seqs[i]
        logits = run_signature(server, "logits", {"input_ids": batch}, rows)["logits"]  # [B, T, V]
        for r, i in enumerate(chunk):
            out[i] = logits[r, :len(seqs[i])]
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log_softmax of one position's logits [vocab], in float64."""
    x = logits.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


def prompt_token_logprobs(server: ModelServer, ids: list[int], start: int, top: int,
                    null_first: bool = False, logits: np.ndarray | None = None
                    ) -> tuple[list[float | None], list[list[tuple[int, float]] | None]]:
    """Logprobs of ids[start:] given the ids before each (one `logits` call on ids[:-1],
    unless `logits` [len(ids) - 1, V] of it are given),
    and each one's `top` most likely (id, logprob), most likely first; ids[start]'s are
    None when `null_first` (OpenAI's first prompt token). Row by row: float64 memory is
    one vocabulary row, not [T, vocab]."""
    if start >= len(ids):
        return [], []
    # The last token's own logits predict nothing scored here: a sequence one token past
    # the context (a prompt that fills it, plus the token generated from its last
    # position) is scored within the context.
    if logits is None and len(ids) > 1:  # else given: the logits of ids[:-1]
        logits = logits_of(server, ids[:-1])  # [T - 1, V]
    values: list[float | None] = []
    alternatives: list[list[tuple[int, float]] | None] = []
    for position in range(start, len(ids)):
        if position == 0 or (null_first and position == start):
            values.append(None)
            alternatives.append(None)
            continue
        row = log_softmax(logits[position - 1])  # the distribution that predicted ids[position]
        values.append(float(row[ids[position]]))
        best = np.argpartition(-row, top - 1)[:top] if 0 < top < row.size else np.arange(
            min(top, row.size))
        best = best[np.argsort(-row[best], kind="stable")]
        alternatives.append([(int(i), float(row[i])) for i in best])
    return values, alternatives

