"""A model as task scoring sees it (`TaskModel`): its logits, greedy generation, tokenizer
and context, from a SavedModel of this project or from a Keras `DeepSeekCausalLM` (a
Hugging Face baseline), and `score_tasks`, which scores a list of tasks on one.

Both kinds score the same token ids: the tokenizer is the model's own tokenizer.json,
read with Hugging Face `tokenizers` (as lm-evaluation-harness reads the `hf-export`
directory's), and generation starts each prompt from [EOS], as `generate` does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from evaluation import task_scoring
from evaluation.tasks import GENERATION, Task
from tokenization.byte_level_bpe import ByteLevelBpe


@dataclass
class TaskModel:
    """What scoring a task needs of a model.

    logits_fn: int32 [B, T] -> logits [B, T, V].
    generate_fn: (prompts, max_new_tokens) -> greedy completions (str), or None (the model
      cannot generate: generation tasks are then refused by name).
    tokenizer: a `tokenizers.Tokenizer` of the model's tokenizer.json.
    context_len: max_position_embeddings, the most positions one row may hold.
    eos_id, pad_id: the tokenizer's [EOS] and padding ids.
    owner: what the functions belong to (the loaded SavedModel), kept alive with them.
    """
    logits_fn: task_scoring.LogitsFn
    generate_fn: task_scoring.GenerateFn | None
    tokenizer: object
    context_len: int
    eos_id: int
    pad_id: int
    owner: object = None


def from_saved_model(model_dir: str, loaded=None) -> TaskModel:
    """The `TaskModel` of a SavedModel with text signatures (`logits`, `generate`; a chat
    model's `generate_raw`, so that prompts are scored as given, without the template).

    Args:
      model_dir: the SavedModel directory.
      loaded: the `tf.saved_model.load(model_dir)` result, if already loaded.

    Raises:
      savedmodel.layout.NoTokenizerError: the SavedModel has no tokenizer.
      FileNotFoundError: no model config beside it (its context is unknown).
    """
    from savedmodel.layout import NoTokenizerError, read_model_config, read_tokenizer

    bpe = read_tokenizer(model_dir)
    if bpe is None:
        raise NoTokenizerError(model_dir, "score benchmark tasks")
    loaded = loaded if loaded is not None else tf.saved_model.load(model_dir)
    logits = loaded.signatures["logits"]
    name = "generate_raw" if "generate_raw" in loaded.signatures else "generate"
    generate = loaded.signatures.get(name)

    def generate_fn(prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        n = len(prompts)
        out = generate(prompt=tf.constant(list(prompts)),
                       max_new_tokens=tf.fill([n], max_new_tokens),
                       temperature=tf.zeros([n]), top_k=tf.zeros([n], tf.int32),
                       top_p=tf.ones([n]), seed=tf.zeros([n], tf.int32))
        return [c.decode("utf-8", errors="replace") for c in out["completion"].numpy()]

    return TaskModel(lambda x: logits(input_ids=x)["logits"],
                     generate_fn if generate is not None else None,
                     task_scoring.hf_tokenizer(json.dumps(bpe.json)),
                     read_model_config(model_dir).max_position_embeddings,
                     bpe.eos_id, bpe.pad_id, owner=loaded)


def from_keras_model(model, bpe: ByteLevelBpe) -> TaskModel:
    """The `TaskModel` of a Keras DeepSeekCausalLM (e.g. a Hugging Face checkpoint loaded
    by `base_model.load_model`) with the tokenizer `bpe`; generation is greedy
    `models.deepseek.generation.generate` with the latent KV cache."""
    from models.deepseek.generation import generate

    tokenizer = task_scoring.hf_tokenizer(json.dumps(bpe.json))
    context = model.config.max_position_embeddings

    def generate_fn(prompts: Sequence[str], max_new_tokens: int) -> list[str]:
        keep = max(context - max_new_tokens, 1)
        rows = [([bpe.eos_id] + tokenizer.encode(p, add_special_tokens=False).ids)[-keep:]
                for p in prompts]
        width = max(len(r) for r in rows)
        ids = np.full([len(rows), width], bpe.pad_id, np.int32)  # [B, P]
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
        lengths = np.array([len(r) for r in rows], np.int32)  # [B]
        tokens, ends = generate(model, ids, max_new_tokens, temperature=0.0,
                                stop_token_id=bpe.eos_id, prompt_lengths=lengths)
        out = []
        for row, start, end in zip(tokens.numpy(), lengths, ends.numpy(), strict=True):
            new = [t for t in row[start:end] if t != bpe.eos_id]
            out.append(tokenizer.decode(new, skip_special_tokens=False))
        return out

    return TaskModel(lambda x: model(x, training=False), generate_fn, tokenizer, context,
                     bpe.eos_id, bpe.pad_id, owner=model)


def score_tasks(model: TaskModel, tasks: Sequence[Task], batch_size: int) -> dict:
    """Scores every task on `model`.

    Returns:
      {"tasks": {name: metrics (task_scoring's)}, "samples": {name: {"loglikelihoods",
       "is_greedy"} or {"completions"}}}: metrics are what metrics.json keeps; samples
       are each example's raw scores (nats), in the task file's order.

    Raises:
      ValueError: two tasks with one name, or a generation task on a model that
        cannot generate.
    """
    names = [t.name for t in tasks]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"two task files name the task {dupes[0]!r}: task names must differ")
    scorer = task_scoring.choice_scorer(model.logits_fn)
    results, samples = {}, {}
    for task in tasks:
        if task.type == GENERATION:
            if model.generate_fn is None:
                raise ValueError(f"task {task.name!r} is a generation task and the model has "
                                 "no generate signature")
            max_new = max(1, min(task.max_gen_toks, model.context_len - 2))
            scored = task_scoring.score_generation(model.generate_fn, task,
                                                   max_new_tokens=max_new, batch_size=batch_size)
            samples[task.name] = {"completions": scored["completions"]}
        else:
            scored = task_scoring.score_multiple_choice(
                model.logits_fn, model.tokenizer, task, context_len=model.context_len,
                batch_size=batch_size, eos_id=model.eos_id, pad_id=model.pad_id, scorer=scorer)
            samples[task.name] = {"loglikelihoods": scored["loglikelihoods"],
                                  "is_greedy": scored["is_greedy"]}
        results[task.name] = scored["metrics"]
    return {"tasks": results, "samples": samples}
