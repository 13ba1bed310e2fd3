"""The LmEvaluator's figures for preference optimization (`data.task = "dpo"`) and
group-relative RL (`data.task = "grpo"`), issue 29, apart from the executor so that they
are tested without importing TFX.

DPO (Rafailov et al. 2023, "Direct Preference Optimization", §5 and eq. 7)
--------------------------------------------------------------------------
Each eval pair (chosen ids, rejected ids, prompt_length; ids = prompt ++ response ++
[EOS]) is scored as SFT scoring scores a record (`savedmodel.scoring.score_responses`):
one row per sequence, the targets the response tokens and the [EOS], given the prompt
and the response before them. With log pi(y|x) the summed log-probability of those
targets under the candidate (the trained policy) and log pi_ref(y|x) under the reference
(the frozen base model the Trainer trained against), the implicit reward of a response is

    r(x, y) = beta * (log pi(y|x) - log pi_ref(y|x))                 (nats, times beta)

and a pair is ranked right when r(x, y_chosen) > r(x, y_rejected), strictly (TRL's
`rewards/accuracies`: `chosen_rewards > rejected_rewards`): a tie, e.g. a policy still
equal to its reference, counts as a failure, so an untrained policy scores 0, not 0.5.
Pairs whose chosen or rejected sequence is longer than seq_len + 1 ids are skipped and
counted, as SFT scoring and the Trainer skip such records.

GRPO (Shao et al. 2024, "DeepSeekMath", §4.1; DeepSeek-R1 §2.2.2)
----------------------------------------------------------------
Each held-out record's prompt (its ids before prompt_length, decoded with the model's
own tokenizer, special tokens kept) is completed greedily, and

    pass@1       mean over prompts of `rewards.exact_match(prompt, completion, answer)`
    mean_reward  mean of the run's reward (`rewards.Reward`: train.grpo_rewards and
                 train.reward_module_file), the figure the Trainer maximizes

with the answer = the record's ids after the prompt, without the [EOS], decoded. A record
whose prompt_length + max_new_tokens exceeds seq_len is skipped and counted, as the
Trainer leaves it out (its completion would not fit the model's window).

Standard errors are sqrt(sample variance / n), the harness's `mean_stderr`
(`evaluation/task_scoring.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from components.lm_evaluator.source_scoring import _eval_features, source_name
from components.trainer.preference import IGNORE_LABEL, sequence_logps
from components.trainer.rewards import exact_match
from components.transform.preprocessing import INPUT_IDS_KEY, PROMPT_LENGTH_KEY, REJECTED_IDS_KEY
from tokenization.tokenizer import PAD_ID

LogitsFn = Callable[[tf.Tensor], tf.Tensor]
# prompts -> greedy completions (without their EOS), each at most max_new_tokens tokens
GenerateFn = Callable[[Sequence[str], int], list[str]]
Pair = tuple[Sequence[int], Sequence[int], int]  # (chosen ids, rejected ids, prompt_length)


def mean_stderr(values: np.ndarray) -> tuple[float, float]:
    """(mean, sqrt(sample variance / n)) of `values` (float64 [n], n >= 1): the
    harness's `mean` and `mean_stderr`, as `task_scoring`; NaN stderr for one value."""
    n = len(values)
    mean = float(values.mean())
    return mean, (math.sqrt(float(values.var(ddof=1)) / n) if n >= 2 else float("nan"))


def read_eval_pairs(transformed_examples, split: str = "eval") -> list[Pair]:
    """The DPO pairs of one split of Transform's output, in file order: (chosen ids =
    `input_ids`, rejected ids = `rejected_ids`, `prompt_length`), every source together.

    Raises:
      FileNotFoundError: the split has no transformed examples.
      ValueError: an example has no `rejected_ids` (not a DPO example), naming the file
        and record; or a malformed `source_name`.
    """
    pairs = []
    for where, f in _eval_features(transformed_examples, split):
        source_name(f, where)  # checked as the SFT reading checks it
        if REJECTED_IDS_KEY not in f:
            raise ValueError(f"{where}: no {REJECTED_IDS_KEY!r} feature: data.task=dpo needs "
                             f"the DPO Transform output (input_ids = chosen, rejected_ids)")
        pairs.append((list(f[INPUT_IDS_KEY].int64_list.value),
                      list(f[REJECTED_IDS_KEY].int64_list.value),
                      int(f[PROMPT_LENGTH_KEY].int64_list.value[0])))
    return pairs


def response_rows(sequences: Sequence[tuple[Sequence[int], int]], rows: int, seq_len: int,
                  pad_id: int = PAD_ID) -> tuple[np.ndarray, np.ndarray]:
    """Model inputs and response targets of (ids, prompt_length) sequences, one per row,
    as `scoring.score_responses` and the Trainer's `sft_example` lay them out.

    Args:
      sequences: at most `rows` (ids = prompt ++ response ++ [EOS], prompt_length), each
        of at most seq_len + 1 ids.
      rows: the batch's fixed row count; rows past the sequences are padding.
      seq_len: T.
      pad_id: fills the inputs past each sequence.

    Returns:
      (inputs int32 [rows, T], labels int32 [rows, T]): labels are the response ids and
      the [EOS] at the positions that predict them, IGNORE_LABEL elsewhere (prompt,
      padding, filler rows).
    """
    inputs = np.full([rows, seq_len], pad_id, np.int32)  # (R, T)
    labels = np.full([rows, seq_len], IGNORE_LABEL, np.int32)  # (R, T)
    for r, (ids, p) in enumerate(sequences):
        n = len(ids) - 1
        inputs[r, :n] = ids[:-1]
        labels[r, max(p - 1, 0):n] = ids[max(p, 1):]  # targets: response tokens and EOS
    return inputs, labels


def _logps_fn(logits_fn: LogitsFn):
    """One tf.function: (inputs int32 [R, T], labels int32 [R, T]) -> float32 [R], the
    summed target log-probabilities (`preference.sequence_logps`); traced once for the
    fixed batch shape."""
    return tf.function(lambda x, y: sequence_logps(logits_fn(x), y))


def evaluate_dpo(candidate_logits_fn: LogitsFn, reference_logits_fn: LogitsFn,
                 pairs: Sequence[Pair], beta: float, batch_size: int, *, seq_len: int,
                 pad_id: int = PAD_ID) -> dict:
    """Held-out DPO figures of the candidate against the reference (module docstring).

    Args:
      candidate_logits_fn, reference_logits_fn: int32 [B, T] -> logits [B, T, V], the
        trained policy and the frozen reference (same tokenizer).
      pairs: (chosen ids, rejected ids, prompt_length), ids = prompt ++ response ++ [EOS].
      beta: train.dpo_beta, > 0.
      batch_size: pairs per forward pass; every call is [2 * batch_size, seq_len] (chosen
        rows, then rejected rows; the last batch padded with filler rows), so a traced
        model is traced once.
      seq_len: T, train.seq_len; longer pairs are skipped.
      pad_id: the tokenizer's padding id.

    Returns:
      {"reward_accuracy" (share of pairs with chosen reward > rejected reward, strictly),
      "reward_accuracy_stderr", "reward_margin" (mean chosen - rejected reward),
      "reward_margin_stderr", "chosen_reward", "rejected_reward" (means), "policy_chosen_logp",
      "policy_rejected_logp" (mean log pi, nats), "pairs" (scored), "skipped_too_long"}.

    Raises:
      ValueError: beta is not > 0, or no pair fits seq_len (with the longest pair's length).
    """
    if not beta > 0:
        raise ValueError(f"train.dpo_beta={beta!r}: DPO needs beta > 0")
    pairs = list(pairs)
    kept = [pair for pair in pairs if max(len(pair[0]), len(pair[1])) <= seq_len + 1]
    if not kept:
        longest = max((max(len(c), len(r)) for c, r, _ in pairs), default=0)
        raise ValueError(f"no DPO eval pair fits train.seq_len={seq_len} (of {len(pairs)} "
                         f"pairs, the longest sequence has {longest} ids; a pair needs at "
                         f"most seq_len + 1)")
    policy, reference = _logps_fn(candidate_logits_fn), _logps_fn(reference_logits_fn)
    logps = np.zeros([4, len(kept)], np.float64)  # policy chosen/rejected, ref chosen/rejected
    for start in range(0, len(kept), batch_size):
        batch = kept[start:start + batch_size]
        b = len(batch)
        chosen, chosen_labels = response_rows([(c, p) for c, _, p in batch], batch_size,
                                              seq_len, pad_id)  # (B, T) each
        rejected, rejected_labels = response_rows([(r, p) for _, r, p in batch], batch_size,
                                                  seq_len, pad_id)  # (B, T) each
        x = tf.constant(np.concatenate([chosen, rejected]))  # (2B, T)
        y = tf.constant(np.concatenate([chosen_labels, rejected_labels]))  # (2B, T)
        pi = policy(x, y).numpy().astype(np.float64)  # (2B,)
        ref = reference(x, y).numpy().astype(np.float64)  # (2B,)
        logps[:, start:start + b] = [pi[:b], pi[batch_size:batch_size + b],
                                     ref[:b], ref[batch_size:batch_size + b]]
    chosen_reward = beta * (logps[0] - logps[2])  # (N,)
    rejected_reward = beta * (logps[1] - logps[3])  # (N,)
    margin = chosen_reward - rejected_reward  # (N,)
    accuracy, accuracy_se = mean_stderr((margin > 0).astype(np.float64))
    mean_margin, margin_se = mean_stderr(margin)
    return {"reward_accuracy": accuracy, "reward_accuracy_stderr": accuracy_se,
            "reward_margin": mean_margin, "reward_margin_stderr": margin_se,
            "chosen_reward": float(chosen_reward.mean()),
            "rejected_reward": float(rejected_reward.mean()),
            "policy_chosen_logp": float(logps[0].mean()),
            "policy_rejected_logp": float(logps[1].mean()),
            "pairs": len(kept), "skipped_too_long": len(pairs) - len(kept)}


def grpo_eval_records(records: Sequence[tuple[Sequence[int], int, int]], decode,
                      seq_len: int, max_new_tokens: int) -> tuple[list[tuple[str, str]], int]:
    """(prompt text, answer text) of GRPO eval records, and how many were skipped.

    Args:
      records: SFT-shaped records (ids = prompt ++ answer ++ [EOS], prompt_length,
        num_bytes), as `source_scoring.read_eval_sources(..., sft=True)` reads them.
      decode: ids (list[int]) -> text, the model's tokenizer with its special tokens kept
        (the chat template's BOS text is part of the prompt).
      seq_len, max_new_tokens: a record with prompt_length + max_new_tokens > seq_len is
        skipped (the Trainer's rule).

    Returns:
      ([(prompt, answer)], skipped): the answer without its [EOS].
    """
    kept = [(list(ids), p) for ids, p, _ in records if p + max_new_tokens <= seq_len]
    texts = [(decode(ids[:p]), decode(ids[p:-1])) for ids, p in kept]
    return texts, len(records) - len(kept)


def evaluate_grpo(generate_fn: GenerateFn, records: Sequence[tuple[str, str]], reward,
                  max_new_tokens: int, batch_size: int, samples: int = 8,
                  count_tokens: Callable[[str], int] = len) -> tuple[dict, list[dict]]:
    """Held-out pass@1 and mean reward of greedy completions (module docstring).

    Args:
      generate_fn: (prompts, max_new_tokens) -> greedy completions, one call per batch
        (`evaluation.task_models.TaskModel.generate_fn`); every call gets `batch_size`
        prompts (the last batch is filled up with its last prompt, whose extra
        completions are dropped).
      records: (prompt text, answer text) per held-out prompt (`grpo_eval_records`).
      reward: the run's reward, (prompts, completions, answers) -> list[float]
        (`components.trainer.rewards.Reward`).
      max_new_tokens: train.grpo_max_new_tokens.
      batch_size: prompts per call.
      samples: how many (prompt, completion, answer, reward) rows to return, the first.
      count_tokens: completion text -> its length; the executor passes the model's
        tokenizer (tokens), the default counts characters.

    Returns:
      ({"pass_at_1", "pass_at_1_stderr", "mean_reward", "mean_reward_stderr",
      "completion_length" (mean count_tokens), "prompts"}, [{"prompt", "completion",
      "answer", "reward", "exact_match"}]).

    Raises:
      ValueError: no records (nothing to score).
    """
    if not records:
        raise ValueError("nothing to score: no GRPO eval prompt fits train.seq_len - "
                         "train.grpo_max_new_tokens")
    prompts = [p for p, _ in records]
    answers = [a for _, a in records]
    completions: list[str] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start:start + batch_size]
        filled = batch + [batch[-1]] * (batch_size - len(batch))
        completions.extend(generate_fn(filled, max_new_tokens)[:len(batch)])
    hits = np.array([exact_match(p, c, a) for p, c, a in zip(prompts, completions, answers,
                                                              strict=True)], np.float64)
    rewards = np.asarray(reward(prompts, completions, answers), np.float64)
    pass_at_1, pass_se = mean_stderr(hits)
    mean_reward, reward_se = mean_stderr(rewards)
    metrics = {"pass_at_1": pass_at_1, "pass_at_1_stderr": pass_se,
               "mean_reward": mean_reward, "mean_reward_stderr": reward_se,
               "completion_length": float(np.mean([count_tokens(c) for c in completions])),
               "prompts": len(prompts)}
    rows = [{"prompt": p, "completion": c, "answer": a, "reward": float(r),
             "exact_match": float(h)}
            for p, c, a, r, h in list(zip(prompts, completions, answers, rewards, hits,
                                          strict=True))[:samples]]
    return metrics, rows
