"""Benchmark task scores of a language model, computed as lm-evaluation-harness computes
them: multiple choice by the log-likelihood of each choice, generation by exact match.

Multiple choice (lm_eval/api/task.py, `ConfigurableTask.process_results`)
---------------------------------------------------------------------------
Each (example, choice) is one request `(prompt, target_delimiter + choice)` (`tasks.py`
renders the prompt). It is tokenized as the harness's `_encode_pair` does: trailing
whitespace of the context moves to the continuation, `whole = encode(context +
continuation)`, `context_ids = encode(context)`, `continuation_ids =
whole[len(context_ids):]` (Hugging Face `tokenizers` on the model's own tokenizer.json,
no special tokens added: the harness's `add_special_tokens=False`). The row the model
reads is `[EOS] + (context_ids + continuation_ids)[-(C - 1):]` (C = the model's context,
max_position_embeddings; the harness truncates on the left too), because the model was
trained on documents that each follow an [EOS] and `deepseek-tfx serve` scores an echoed
prompt after [EOS] as well. The log-likelihood of a choice is

    ll = sum over continuation tokens t of log_softmax(logits[t - 1])[id_t]      (nats)

and is_greedy says whether every continuation token is the argmax of its row. Then, with
`lls` the choices' log-likelihoods of one example:

    acc        argmax(lls) == label
    acc_norm   argmax(lls / characters of each choice) == label   (the harness's
               `completion_len = len(choice)`: characters, not bytes)
    acc_bytes  argmax(lls / UTF-8 bytes of each choice) == label  (the harness's acc_bytes)

Each metric is the mean over examples, with its standard error sqrt(var / n) (sample
variance, as the harness's `mean_stderr`). `chance` is the mean of 1 / len(choices).

Generation (harness `generate_until` with `exact_match`)
--------------------------------------------------------
Each example's prompt is generated greedily (temperature 0) up to the task's
`max_gen_toks` tokens, at most what the model's context leaves; the completion is cut
before the first of the example's stop strings, and `exact_match` is whether it equals
the answer after both are stripped of surrounding whitespace. `chance` is 0.

In graph, batched
-----------------
`choice_scorer(logits_fn)` is one tf.function over a batch of rows [B, T]: the logits,
a log-softmax gathered at the target ids and the greedy check run in TensorFlow, and only
the per-token log-likelihoods [B, T] come back (summed in float64 here). Rows are sorted
by length and cut into batches of `batch_size`, so a 4-choice example costs 4 rows of one
forward pass each, never a `generate` call. Generation tasks make one `generate` call per
batch of examples.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from evaluation.tasks import GENERATION, MULTIPLE_CHOICE, Task, continuations, fewshot_prompt

LogitsFn = Callable[[tf.Tensor], tf.Tensor]
# prompts -> completions (greedy, each at most max_new_tokens tokens)
GenerateFn = Callable[[Sequence[str], int], list[str]]

DEFAULT_MAX_GEN_TOKS = 256  # the harness's default `max_gen_toks`


@dataclass(frozen=True)
class ChoiceRow:
    """One (example, choice) request as the model reads it.

    input_ids: [EOS] + the last C - 1 tokens of context + continuation (int ids).
    first_target: the position in `input_ids` of the first continuation token.
    truncated: the context (or the continuation) lost tokens on the left to fit C.
    """
    example: int
    choice: int
    input_ids: tuple[int, ...]
    first_target: int
    truncated: bool


def hf_tokenizer(tokenizer_json: str):
    """A Hugging Face `tokenizers.Tokenizer` from tokenizer.json text."""
    import tokenizers

    return tokenizers.Tokenizer.from_str(tokenizer_json)


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lm-evaluation-harness's `_encode_pair` makes them
    (module docstring); `tokenizer` is a `tokenizers.Tokenizer`."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenizer.encode(context + continuation, add_special_tokens=False).ids
    context_ids = tokenizer.encode(context, add_special_tokens=False).ids
    return context_ids, whole[len(context_ids):]


def choice_rows(tokenizer, task: Task, context_len: int, eos_id: int) -> list[ChoiceRow]:
    """The rows of every (example, choice) of a multiple-choice task, in example order.

    Raises:
      ValueError: the task is not multiple choice, or context_len < 2.
    """
    if task.type != MULTIPLE_CHOICE:
        raise ValueError(f"task {task.name!r} is {task.type}, not {MULTIPLE_CHOICE}")
    if context_len < 2:
        raise ValueError(f"context_len={context_len}: needs room for [EOS] and one token")
    rows = []
    for e, example in enumerate(task.examples):
        prompt = fewshot_prompt(task, example)
        for c, continuation in enumerate(continuations(task, example)):
            context_ids, continuation_ids = encode_pair(tokenizer, prompt, continuation)
            if not continuation_ids:  # cannot happen for a non-empty choice; never silent
                raise ValueError(f"task {task.name!r} example {e} choice {c}: "
                                 "the continuation has no tokens")
            ids = (context_ids + continuation_ids)[-(context_len - 1):]
            first = 1 + max(len(ids) - len(continuation_ids), 0)
            rows.append(ChoiceRow(e, c, (eos_id, *ids), first,
                                  len(ids) < len(context_ids) + len(continuation_ids)))
    return rows


def choice_scorer(logits_fn: LogitsFn):
    """A tf.function (input_ids int32 [B, T], targets int32 [B, T]) -> (token_logprobs
    float32 [B, T], greedy bool [B]): token_logprobs[b, t] = log_softmax(logits[b, t])
    [targets[b, t]] where targets[b, t] >= 0 (the id at position t + 1), else 0; greedy[b]
    = every scored target is its row's argmax. `logits_fn`: int32 [B, T] -> logits
    [B, T, V] (any float dtype; read as float32)."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                                  tf.TensorSpec([None, None], tf.int32, name="targets")])
    def score(input_ids, targets):
        logits = tf.cast(logits_fn(input_ids), tf.float32)  # [B, T, V]
        scored = targets >= 0  # [B, T]
        ids = tf.maximum(targets, 0)  # [B, T]
        picked = tf.gather(logits, ids, batch_dims=2)  # [B, T]
        logprobs = picked - tf.reduce_logsumexp(logits, axis=-1)  # [B, T]
        best = tf.argmax(logits, axis=-1, output_type=tf.int32)  # [B, T]
        greedy = tf.reduce_all(tf.logical_or(~scored, tf.equal(best, ids)), axis=-1)  # [B]
        return tf.where(scored, logprobs, 0.0), greedy

    return score


def score_rows(scorer, rows: Sequence[ChoiceRow], batch_size: int,
               pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(loglikelihood float64 [len(rows)], is_greedy bool [len(rows)]) of each row, in the
    order given; batches of `batch_size` rows of similar length, right-padded with
    `pad_id` (causal attention: padding after a row changes nothing before it)."""
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i].input_ids))
    lls = np.zeros(len(rows), np.float64)
    greedy = np.zeros(len(rows), bool)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        width = max(len(rows[i].input_ids) for i in batch)
        inputs = np.full([len(batch), width], pad_id, np.int32)  # [B, T]
        targets = np.full([len(batch), width], -1, np.int32)  # [B, T]
        for r, i in enumerate(batch):
            ids = rows[i].input_ids
            inputs[r, :len(ids)] = ids
            first = rows[i].first_target
            targets[r, first - 1:len(ids) - 1] = ids[first:]
        logprobs, is_greedy = scorer(tf.constant(inputs), tf.constant(targets))
        lls[batch] = logprobs.numpy().astype(np.float64).sum(axis=1)
        greedy[batch] = is_greedy.numpy()
    return lls, greedy


def _mean_stderr(values: np.ndarray) -> tuple[float, float]:
    """(mean, sqrt(sample variance / n)): the harness's `mean` and `mean_stderr`."""
    n = len(values)
    mean = float(values.mean())
    if n < 2:
        return mean, float("nan")
    return mean, math.sqrt(float(values.var(ddof=1)) / n)


def multiple_choice_metrics(task: Task, lls: Sequence[Sequence[float]]) -> dict:
    """acc, acc_norm, acc_bytes (each with `_stderr`), chance and n of one multiple-choice
    task from each example's choice log-likelihoods (module docstring)."""
    hits = {"acc": [], "acc_norm": [], "acc_bytes": []}
    for example, values in zip(task.examples, lls, strict=True):
        values = np.asarray(values, np.float64)
        chars = np.array([len(c) for c in example.choices], np.float64)
        nbytes = np.array([len(c.encode("utf-8")) for c in example.choices], np.float64)
        hits["acc"].append(int(np.argmax(values)) == example.label)
        hits["acc_norm"].append(int(np.argmax(values / chars)) == example.label)
        hits["acc_bytes"].append(int(np.argmax(values / nbytes)) == example.label)
    metrics = {}
    for name, values in hits.items():
        metrics[name], metrics[f"{name}_stderr"] = _mean_stderr(np.asarray(values, np.float64))
    metrics["chance"] = float(np.mean([1 / len(e.choices) for e in task.examples]))
    metrics["n"] = len(task.examples)
    return metrics


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` before the first occurrence of any of `stops` (all of it if none occurs)."""
    at = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:at]


def score_multiple_choice(logits_fn: LogitsFn, tokenizer, task: Task, *, context_len: int,
                          batch_size: int, eos_id: int, pad_id: int, scorer=None) -> dict:
    """{"metrics": {acc, acc_norm, acc_bytes, ..._stderr, chance, n, truncated, type,
    num_fewshot, seconds, examples_per_second}, "loglikelihoods": [[ll per choice] per
    example] (nats), "is_greedy": [[bool per choice] per example]}.

    Args:
      logits_fn: int32 [B, T] -> logits [B, T, V]; `scorer` (a `choice_scorer`) may be
        given instead to reuse its trace.
      tokenizer: a `tokenizers.Tokenizer` of the model's tokenizer.json.
      task: a multiple-choice `Task`.
      context_len: C, the most positions the model reads (max_position_embeddings).
      batch_size: rows per forward pass.
      eos_id, pad_id: the tokenizer's [EOS] (put first) and padding ids.

    Raises:
      ValueError: see `choice_rows`.
    """
    start = time.perf_counter()
    rows = choice_rows(tokenizer, task, context_len, eos_id)
    scorer = scorer or choice_scorer(logits_fn)
    lls, greedy = score_rows(scorer, rows, batch_size, pad_id)
    per_example: list[list[float]] = [[] for _ in task.examples]
    per_greedy: list[list[bool]] = [[] for _ in task.examples]
    for row, ll, g in zip(rows, lls, greedy, strict=True):
        per_example[row.example].append(float(ll))
        per_greedy[row.example].append(bool(g))
    metrics = multiple_choice_metrics(task, per_example)
    seconds = time.perf_counter() - start
    metrics.update(type=task.type, num_fewshot=task.num_fewshot,
                   truncated=len({r.example for r in rows if r.truncated}),
                   seconds=seconds, examples_per_second=len(task.examples) / seconds)
    return {"metrics": metrics, "loglikelihoods": per_example, "is_greedy": per_greedy}


def score_generation(generate_fn: GenerateFn, task: Task, *, max_new_tokens: int,
                     batch_size: int) -> dict:
    """{"metrics": {exact_match, exact_match_stderr, chance (0), n, type, num_fewshot,
    seconds, examples_per_second}, "completions": [str per example] (cut at the stop
    strings)}.

    Args:
      generate_fn: (prompts, max_new_tokens) -> greedy completions, one call per batch.
      task: a generation `Task`.
      max_new_tokens: tokens generated at most per example.
      batch_size: prompts per call.

    Raises:
      ValueError: the task is not a generation task.
    """
    if task.type != GENERATION:
        raise ValueError(f"task {task.name!r} is {task.type}, not {GENERATION}")
    start = time.perf_counter()
    prompts = [fewshot_prompt(task, e) for e in task.examples]
    completions: list[str] = []
    for i in range(0, len(prompts), batch_size):
        completions.extend(generate_fn(prompts[i:i + batch_size], max_new_tokens))
    cut = [cut_at_stop(text, e.stop) for text, e in zip(completions, task.examples, strict=True)]
    hits = np.array([c.strip() == e.answer.strip() for c, e in zip(cut, task.examples, strict=True)],
                    np.float64)
    metrics = {}
    metrics["exact_match"], metrics["exact_match_stderr"] = _mean_stderr(hits)
    seconds = time.perf_counter() - start
    metrics.update(chance=0.0, n=len(task.examples), type=task.type,
                   num_fewshot=task.num_fewshot, seconds=seconds,
                   examples_per_second=len(task.examples) / seconds)
    return {"metrics": metrics, "completions": cut}

