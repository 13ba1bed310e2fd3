"""The LmEvaluator's glue for DPO and GRPO (issue 29): which model is the reference, how
the candidate and the baseline generate from GRPO's prompts, and the figures of
`preference_scoring.py` for the executor (`executor.py`).
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from components.lm_evaluator.preference_scoring import (
    evaluate_dpo,
    evaluate_grpo,
    grpo_eval_records,
    read_eval_pairs,
)
from components.trainer.rewards import Reward
from components.trainer.run_fn import TRAINING_SUMMARY
from config import PipelineConfig
from evaluation import task_models
from savedmodel.layout import read_tokenizer
from tokenization.byte_level_bpe import ByteLevelBpe


def reference_dir(model_uri: str) -> str:
    """The DPO reference of the candidate Model artifact at `model_uri`: the directory
    its Trainer trained against, `training_summary.json["base_model"]`.

    Raises:
      ValueError: no training_summary.json, or one without "base_model" (naming the file).
    """
    path = os.path.join(model_uri, TRAINING_SUMMARY)
    if not tf.io.gfile.exists(path):
        raise ValueError(f"{path}: no such file; data.task=dpo scores the candidate against "
                         f"its reference, the Trainer's 'base_model' recorded there")
    with tf.io.gfile.GFile(path) as f:
        summary = json.loads(f.read())
    if not isinstance(summary, dict) or not summary.get("base_model"):
        raise ValueError(f"{path}: no 'base_model' (the reference model's directory); "
                         f"data.task=dpo needs it to score the implicit rewards")
    return summary["base_model"]


def baseline_task_model(baseline_uri: str, candidate_dir: str) -> task_models.TaskModel:
    """The baseline (`evaluate_baseline`'s kinds) as a `TaskModel`: a SavedModel with its
    own tokenizer, a Hugging Face checkpoint with the candidate's (refused when it does
    not carry the candidate's tokenizer.json, as `evaluate_baseline` refuses it)."""
    from savedmodel import base_model

    baseline_dir = base_model.model_dir(baseline_uri)
    if base_model.kind(baseline_dir) == base_model.SAVEDMODEL:
        return task_models.from_saved_model(baseline_dir)
    tokenizer_dir = base_model.tokenizer_path(baseline_dir)
    candidate = read_tokenizer(candidate_dir)
    if tokenizer_dir is None or ByteLevelBpe.from_file(tokenizer_dir).json != candidate.json:
        raise ValueError(f"baseline {baseline_dir} (a Hugging Face checkpoint) does not carry "
                         f"the candidate's tokenizer.json, so the two cannot score the same ids")
    return task_models.from_keras_model(base_model.load_model(baseline_dir), candidate)


def evaluate_dpo_pairs(candidate: task_models.TaskModel, model_uri: str, examples,
                       config: PipelineConfig) -> dict:
    """`preference_scoring.evaluate_dpo` of the candidate against its reference
    (`reference_dir`, loaded with `base_model.load_model`) on the eval split's pairs."""
    from savedmodel import base_model

    reference = base_model.load_model(base_model.model_dir(reference_dir(model_uri)))
    return evaluate_dpo(candidate.logits_fn, lambda x: reference(x, training=False),
                        read_eval_pairs(examples), config.train.dpo_beta,
                        config.eval.batch_size, seq_len=config.train.seq_len,
                        pad_id=candidate.pad_id)


def chat_generate_fn(model: task_models.TaskModel, model_dir: str | None):
    """Greedy completions of GRPO's rendered prompts as the Trainer sampled them.

    GRPO's prompts are rendered by the chat template (prefix + user text + suffix, as
    SFT renders them), and the Trainer samples right after their ids. A chat model's
    SavedModel renders a user text itself in its `generate` signature (the same affixes,
    `layout.read_chat_prompt`), while `generate_raw` (what `TaskModel.generate_fn` uses)
    starts a plain prompt from [EOS]: so for a chat SavedModel the affixes are taken off
    and the user text goes to `generate`, which gives the Trainer's ids. Otherwise (no
    chat template, or a Keras model) `model.generate_fn`.

    Raises:
      ValueError: (when called) a prompt without the chat template's affixes, naming it.
    """
    from savedmodel.layout import read_chat_prompt

    loaded = model.owner
    affixes = read_chat_prompt(model_dir) if model_dir else None
    signatures = getattr(loaded, "signatures", {})
    if affixes is None or "generate" not in signatures:
        return model.generate_fn
    prefix, suffix = affixes
    generate = signatures["generate"]

    def generate_fn(prompts, max_new_tokens: int) -> list[str]:
        users = []
        for p in prompts:
            if not (p.startswith(prefix) and p.endswith(suffix)):
                raise ValueError(f"GRPO eval prompt {p[:80]!r} is not rendered by the model's "
                                 f"chat template (prefix {prefix!r}, suffix {suffix!r})")
            users.append(p[len(prefix):len(p) - len(suffix)])
        n = len(users)
        out = generate(prompt=tf.constant(users), max_new_tokens=tf.fill([n], max_new_tokens),
                       temperature=tf.zeros([n]), top_k=tf.zeros([n], tf.int32),
                       top_p=tf.ones([n]), seed=tf.zeros([n], tf.int32))
        return [c.decode("utf-8", errors="replace") for c in out["completion"].numpy()]

    return generate_fn


def evaluate_grpo_prompts(model: task_models.TaskModel, records: list,
                          config: PipelineConfig, name: str,
                          model_dir: str | None = None) -> tuple[dict, list[dict]]:
    """`preference_scoring.evaluate_grpo` of `model` (`name`: "candidate" or "baseline",
    for the message) on the eval split's SFT-shaped records: prompts and answers decoded
    with the model's own tokenizer, its special tokens kept; the figures also hold
    "grpo_skipped_too_long".

    Raises:
      ValueError: the model cannot generate (no `generate` signature).
    """
    if model.generate_fn is None:
        raise ValueError(f"data.task=grpo: the {name} model has no generate signature, so "
                         f"its pass@1 cannot be measured")
    tokenizer, train = model.tokenizer, config.train
    texts, skipped = grpo_eval_records(
        records, lambda ids: tokenizer.decode(ids, skip_special_tokens=False), train.seq_len,
        train.grpo_max_new_tokens)
    metrics, samples = evaluate_grpo(
        chat_generate_fn(model, model_dir), texts, Reward(train.grpo_rewards, train.reward_module_file),
        train.grpo_max_new_tokens, config.eval.batch_size,
        count_tokens=lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids))
    return {**metrics, "grpo_skipped_too_long": skipped}, samples
