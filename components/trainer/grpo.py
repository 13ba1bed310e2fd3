"""One GRPO step (DeepSeekMath §4.1, Algorithm 1): sample a group of completions per
prompt with the policy, score them, and update on the group-relative advantages.

The outer loop (`train_loop.train`) calls a `GRPOStep` once per optimizer step, as it
calls the step of any other task. Every `train.grpo_inner_steps` (mu) calls it draws one
global batch of prompts and makes its rollout; the mu calls from there each run one
optimizer update on that rollout (`train_step.make_train_step(...).step_on`, with
`preference_objectives.GRPOObjective`):

  prompts      p per replica and micro-batch, from `data.make_grpo_train_dataset`
  sample       each prompt repeated G times (`train.grpo_group_size`); the batched,
               cached `generation.generate` samples up to `train.grpo_max_new_tokens`
               tokens per row at `train.grpo_temperature`, stopping at EOS, in graph,
               on each replica
  reward       on the host: the completions decoded (lossless byte-level BPE) and
               scored by `rewards.Reward` (exact match, R1 format, a user's reward_fn)
  rollout      input_ids = the prompt and completion (T tokens, right-padded), labels =
               the completion's tokens (its EOS included) and IGNORE_LABEL elsewhere,
               rewards; with mu > 1 also the sampling policy's per-token log-probs
  update       the clipped surrogate with group-normalized advantages and beta * k3 KL
               to the frozen reference (which runs inside the step, as in DPO)

Sampling randomness is a function of the run's seed and the rollout's index (row b of
rollout r samples with the stateless seed (seed_b, t), seed_b = (train.seed * 1000003 +
r * 65537 + row) mod 2^31 - 1; `generation.generate`). The rollout index is the number of
batches consumed so far, (steps + skipped steps) // mu, which the checkpoint holds, so a
run resumed from a checkpoint samples exactly the completions an uninterrupted run
would have (when the checkpoint falls at a multiple of mu; mid-rollout it re-samples that
rollout with the weights reached). Rows of different replicas and workers get different
seeds (the global row index), so N workers sample what one device would.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from components.trainer.data import IGNORE_LABEL
from models.deepseek.generation import generate

_SEED_MODULUS = 2**31 - 1


def rollout_seeds(seed: int, rollout: tf.Tensor, rows: tf.Tensor) -> tf.Tensor:
    """int32 [n]: the per-row sampling seeds of rollout `rollout` (int64 scalar) for the
    global row indices `rows` (int64 [n]); see the module docstring."""
    base = (tf.constant(seed, tf.int64) * 1_000_003 + rollout * 65_537) % _SEED_MODULUS
    return tf.cast((base + rows) % _SEED_MODULUS, tf.int32)


def completion_labels(tokens: np.ndarray, prompt_lengths: np.ndarray,
                      lengths: np.ndarray, seq_len: int, pad_id: int) -> dict:
    """The rollout's model inputs from sampled rows.

    Args:
      tokens: int [n, W] (W <= seq_len + 1 after padding below), each row its prompt then
        its completion then padding.
      prompt_lengths, lengths: int [n]: where each completion starts and ends (its EOS
        included when it stopped).
      seq_len: T.
      pad_id: the id written after each row's end.

    Returns:
      {"input_ids": int32 [n, T], "labels": int32 [n, T]}: labels[j] = tokens[j + 1] for
      the completion's positions (j + 1 in [prompt_length, length)), IGNORE_LABEL elsewhere.
    """
    n, width = tokens.shape
    full = np.full((n, seq_len + 1), pad_id, np.int32)
    full[:, :min(width, seq_len + 1)] = tokens[:, :seq_len + 1]
    columns = np.arange(seq_len + 1)[None, :]
    full = np.where(columns < lengths[:, None], full, pad_id)
    target = columns[:, 1:]  # the position each label predicts
    is_completion = (target >= prompt_lengths[:, None]) & (target < lengths[:, None])
    labels = np.where(is_completion, full[:, 1:], IGNORE_LABEL).astype(np.int32)
    return {"input_ids": full[:, :-1], "labels": labels}


class GRPOStep:
    """`step(batches) -> out`: one GRPO optimizer step (see the module docstring).

    Args:
      model: the policy being trained; strategy: its tf.distribute strategy.
      update: `train_step.make_train_step(..., objective=GRPOObjective)` (uses `step_on`).
      tokenizer: the run's `ByteLevelBpe` (decodes prompts, completions, answers).
      reward: a `rewards.Reward`.
      config: the `PipelineConfig` (train.grpo_*, train.seq_len, train.seed).
      micro_batches: k; eos_id, pad_id: the tokenizer's.
      consumed: optimizer steps + skipped steps already done (a resumed run's position):
        the rollout index is consumed // mu, and a run resumed mid-rollout samples that
        rollout again and runs the updates left of it.

    With mu > 1 the policy's per-token log-probs of each rollout are computed once, before
    its first update ("old_logps", the ratio's denominator).
    """

    def __init__(self, model, strategy, update, tokenizer, reward, config, *, micro_batches: int,
                 eos_id: int, pad_id: int, consumed: int = 0):
        tc = config.train
        self.model, self.strategy, self.update = model, strategy, update
        self.reward, self.micro_batches = reward, micro_batches
        self.group, self.inner = tc.grpo_group_size, tc.grpo_inner_steps
        self.seq_len, self.seed, self.eos_id, self.pad_id = tc.seq_len, tc.seed, eos_id, pad_id
        self.max_new_tokens, self.temperature = tc.grpo_max_new_tokens, tc.grpo_temperature
        self.surfaces = tokenizer.surfaces(skip_special=False)
        self.surfaces_plain = tokenizer.surfaces()
        self.position = consumed % self.inner  # updates already run on the current rollout
        self.rollout_index = consumed // self.inner
        self.rollout = None  # the current rollout's per-replica batch, once sampled
        self._sample = tf.function(self._sample_replica, autograph=False)
        self._old_logps = tf.function(self._old_logps_replica, autograph=False)

    # ------------------------------------------------------------------ graph parts

    def _sample_replica(self, batch, rollout):
        """Per replica: the batch's prompts, G samples each -> tokens, lengths, prompt lengths."""
        ctx = tf.distribute.get_replica_context()
        prompts = tf.reshape(batch["prompt_ids"], [-1, self.seq_len])  # (k b, T)
        prompt_len = tf.reshape(batch["prompt_length"], [-1])  # (k b,)
        prompts = tf.repeat(prompts, self.group, axis=0)  # (n, T), n = k b G
        prompt_len = tf.repeat(prompt_len, self.group, axis=0)  # (n,)
        n = tf.shape(prompts, out_type=tf.int64)[0]
        rows = tf.cast(ctx.replica_id_in_sync_group, tf.int64) * n + tf.range(n)  # (n,)
        seeds = rollout_seeds(self.seed, rollout, rows)  # (n,)
        tokens, lengths = generate(self.model, prompts, self.max_new_tokens,
                                   temperature=self.temperature, seed=seeds,
                                   stop_token_id=self.eos_id, prompt_lengths=prompt_len)
        return tokens, lengths, prompt_len  # (n, P' + N), (n,), (n,)

    def _old_logps_replica(self, batch):
        from components.trainer import preference

        ids = tf.reshape(batch["input_ids"], [-1, self.seq_len])
        labels = tf.reshape(batch["labels"], [-1, self.seq_len])
        logits = self.model(ids, training=False)  # (n, T, V)
        return tf.reshape(preference.token_logps(logits, labels),
                          tf.shape(batch["labels"]))  # (k, n/k, T)

    # ------------------------------------------------------------------ host parts

    def _decode(self, ids, surfaces) -> str:
        """Text of `ids`; an id past the tokenizer's vocabulary (the model's may be larger
        when the tokenizer learned fewer merges) stands for no bytes."""
        n = len(surfaces)
        return b"".join(surfaces[i] if i < n else b"" for i in ids).decode("utf-8",
                                                                           errors="replace")

    def _rewards(self, local: dict, sampled) -> dict:
        """One replica's rollout (numpy, [k, n/k, ...]) from its prompts and samples."""
        tokens, lengths, prompt_len = (x.numpy() for x in sampled)
        answers = np.repeat(local["answer_ids"].numpy().reshape(-1, self.seq_len),
                            self.group, axis=0)  # (n, T)
        answer_len = np.repeat(local["answer_length"].numpy().reshape(-1), self.group)  # (n,)
        prompts, completions, texts = [], [], []
        for i in range(len(tokens)):
            end = int(lengths[i])
            body = tokens[i, int(prompt_len[i]):end]
            if end > prompt_len[i] and body[-1] == self.eos_id:  # stopped: the EOS is no text
                body = body[:-1]
            prompts.append(self._decode(tokens[i, :prompt_len[i]], self.surfaces))
            completions.append(self._decode(body, self.surfaces_plain))
            texts.append(self._decode(answers[i, :answer_len[i]], self.surfaces_plain))
        rewards = np.asarray(self.reward(prompts, completions, texts), np.float32)  # (n,)
        inputs = completion_labels(tokens, prompt_len, lengths, self.seq_len, self.pad_id)
        k = self.micro_batches
        rollout = {key: value.reshape(k, -1, self.seq_len) for key, value in inputs.items()}
        rollout["rewards"] = rewards.reshape(k, -1)
        return rollout

    def _make_rollout(self, batches) -> None:
        strategy = self.strategy
        batch = next(batches)
        rollout_index = tf.constant(self.rollout_index, tf.int64)
        sampled = strategy.run(self._sample, args=(batch, rollout_index))
        local_batches = [{key: v for key, v in zip(batch, values, strict=True)} for values in
                         zip(*(strategy.experimental_local_results(batch[key]) for key in batch),
                             strict=True)]
        local_samples = list(zip(*(strategy.experimental_local_results(x) for x in sampled),
                                 strict=True))
        rollouts = [self._rewards(b, s) for b, s in zip(local_batches, local_samples,
                                                         strict=True)]
        per_replica = len(rollouts)

        def value_fn(ctx):
            local = rollouts[ctx.replica_id_in_sync_group % per_replica]
            return {key: tf.constant(v) for key, v in local.items()}

        self.rollout = strategy.experimental_distribute_values_from_function(value_fn)
        if self.inner > 1:  # the sampling policy's log-probs, fixed for the mu updates
            old = strategy.run(self._old_logps, args=(self.rollout,))
            self.rollout = {**self.rollout, "old_logps": old}

    def __call__(self, batches) -> dict:
        if self.rollout is None:
            self._make_rollout(batches)
        out = self.update.step_on(self.rollout)
        self.position = (self.position + 1) % self.inner
        if self.position == 0:
            self.rollout_index += 1
            self.rollout = None
        return out
