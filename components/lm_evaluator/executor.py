"""LmEvaluator's executor: score the candidate (and the baseline), decide the blessing.

Uses the candidate's pushed-to-be SavedModel (`logits` signature) on the eval
split of Transform's output, so what is blessed is exactly what would serve.
Bytes scored = the documents' UTF-8 bytes + one byte per `[EOS]` separator
(the blank line it stands for): every byte of the text, in any language (the
byte-level tokenizer has no `[UNK]` to hide bytes in).

A data mixture's eval split is scored per source (`source_scoring.py`): each source's
documents packed on their own, its bits per byte beside the mixture's, and
`eval.max_bits_per_byte_by_source` checked (`blessing.py`).

A baseline model whose tokenizer differs from the candidate's (another run that
learned another tokenizer) scores the same text: the candidate's ids are decoded
(lossless) and encoded again with the baseline's own `tokenize` signature.

Preference training (`data.task` dpo or grpo, issue 29; `preference_scoring.py`): the
eval split's chosen responses (dpo) or reference answers (grpo) are scored exactly as
SFT responses (bits per byte), and beside them
  dpo   the held-out implicit-reward figures of the candidate against its reference
        (the base model named by `training_summary.json["base_model"]`);
  grpo  pass@1 and the run's mean reward of greedy completions, the candidate's and,
        with a baseline, the baseline's (so the rise is visible), with a few samples
        in `grpo_samples.json`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence

import tensorflow as tf
import tensorflow_text  # noqa: F401  (regex ops of the SavedModel's tokenizer)
from tfx.components.evaluator import constants
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils, path_utils

from components.lm_evaluator.blessing import decide_blessing
from components.lm_evaluator.preference_evaluation import (
    baseline_task_model,
    evaluate_dpo_pairs,
    evaluate_grpo_prompts,
)
from components.lm_evaluator.source_scoring import evaluate_sources, read_eval_sources
from config import PipelineConfig
from config.data import CHAT_TASKS
from evaluation import task_models
from evaluation.task_models import score_tasks
from evaluation.tasks import Task, load_tasks
from savedmodel import scoring
from savedmodel.layout import read_tokenizer

METRICS_FILE = "metrics.json"
TASK_SAMPLES_FILE = "task_samples.json"
TASK_PROPERTY_METRICS = ("acc", "acc_norm", "acc_bytes", "exact_match", "chance")
GRPO_SAMPLES_FILE = "grpo_samples.json"
PREFERENCE_PROPERTIES = ("reward_accuracy", "reward_margin", "pass_at_1", "mean_reward")


def _flatten(sources: Mapping[str, tuple[list, int]]) -> tuple[list, int]:
    items = [item for docs, _ in sources.values() for item in docs]
    return items, sum(n for _, n in sources.values())


def read_eval_documents(transformed_examples, split: str = "eval") -> tuple[list[list[int]], int]:
    """(documents as token-id lists, total UTF-8 bytes) of one split, all sources
    together (grouped by source, in `read_eval_sources` order)."""
    return _flatten(read_eval_sources(transformed_examples, split))


def read_eval_records(transformed_examples, split: str = "eval") -> tuple[list, int]:
    """SFT records (ids, prompt_length, response bytes) of one split, and their bytes."""
    return _flatten(read_eval_sources(transformed_examples, split, sft=True))


def evaluate_saved_model(model_dir: str, sources: Mapping[str, tuple[list, int]],
                         config: PipelineConfig, tasks: Sequence[Task] = (),
                         loaded=None) -> tuple[dict, dict | None]:
    """(metrics, task samples) of the SavedModel: perplexity and bits per byte on
    `sources` ({source name: (its own token ids, or SFT records; UTF-8 bytes)}: see
    `evaluate_sources`, metrics["by_source"] included) and, with `tasks`,
    metrics["tasks"] = each task's scores (`evaluation.task_models.score_tasks`);
    samples None without tasks. `loaded`: the SavedModel if already loaded."""
    loaded = loaded if loaded is not None else tf.saved_model.load(model_dir)
    logits_fn = loaded.signatures["logits"]
    metrics = evaluate_sources(lambda x: logits_fn(input_ids=x)["logits"],
                               read_tokenizer(model_dir), sources, config)
    if not tasks:
        return metrics, None
    scored = score_tasks(task_models.from_saved_model(model_dir, loaded), tasks,
                         config.eval.batch_size)
    return {**metrics, "tasks": scored["tasks"]}, scored["samples"]


def evaluate_baseline(baseline_uri: str, candidate_dir: str,
                      sources: Mapping[str, tuple[list, int]], config: PipelineConfig,
                      tasks: Sequence[Task] = (),
                      model: task_models.TaskModel | None = None) -> tuple[dict, dict | None]:
    """`evaluate_saved_model` of a baseline: a Model artifact (a SavedModel in its
    `Format-Serving/`), an imported SavedModel directory, or a Hugging Face checkpoint
    directory (a warm start's `--base-model PATH`); `sources` hold the candidate's ids.
    A baseline SavedModel scores the same text in its own ids, and the tasks with its
    own tokenizer (task scores are measured on text); a Hugging Face one carries the
    candidate's. `model`: the baseline's `baseline_task_model`, if already loaded."""
    from savedmodel import base_model

    baseline_dir = base_model.model_dir(baseline_uri)
    if base_model.kind(baseline_dir) == base_model.SAVEDMODEL:
        if config.data.task in CHAT_TASKS and (read_tokenizer(baseline_dir).json
                                                   != read_tokenizer(candidate_dir).json):
            raise ValueError(f"baseline {baseline_dir} has another tokenizer; response-only "
                             f"scoring of {config.data.task} records needs the candidate's")
        if config.data.task not in CHAT_TASKS:
            sources = {name: (scoring.retokenize(docs, candidate_dir, baseline_dir), n)
                       for name, (docs, n) in sources.items()}
        return evaluate_saved_model(baseline_dir, sources, config,
                                    tasks, loaded=model.owner if model else None)
    model = model or baseline_task_model(baseline_uri, candidate_dir)
    metrics = evaluate_sources(model.logits_fn, read_tokenizer(candidate_dir), sources,
                               config)
    if not tasks:
        return metrics, None
    scored = score_tasks(model, tasks, config.eval.batch_size)
    return {**metrics, "tasks": scored["tasks"]}, scored["samples"]


class Executor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties):  # noqa: N802 (TFX API)
        """Scores the candidate (and the baseline) on the eval split; blesses or not.

        Args:
          input_dict: "examples" (one Examples artifact: Transform's
            transformed_examples, GZIP TFRecords in `Split-eval/`), "model" (one
            Model: the Trainer's, a SavedModel in `Format-Serving/`) and,
            optionally, "baseline_model" (the first Model is the baseline: the
            latest blessed model, or a warm start's base model).
          output_dict: "evaluation" (one ModelEvaluation) and "blessing" (one
            ModelBlessing).
          exec_properties: "pipeline_config" (PipelineConfig JSON; `data.task`
            picks whole documents, SFT responses, or DPO pairs / GRPO prompts (module
            docstring); the `eval` section holds the blessing rule, see
            `decide_blessing`).

        The eval split is scored per mixture source (each example's `source_name`,
        "default" without it; `evaluate_sources`): the candidate's and the
        baseline's figures on the whole split and on each source.

        Writes `evaluation/metrics.json` ({"candidate", "baseline", "by_source",
        "baseline_by_source", "blessed", "message"}; by_source: {source:
        {"bits_per_byte", "perplexity", "tokens", "bytes", "documents"}},
        baseline_by_source None without a baseline) and on `evaluation` the custom
        properties bits_per_byte, perplexity, loss (mean NLL per token, nats), for
        SFT response_perplexity and response_bits_per_byte, eval_tokens,
        eval_bytes, bits_per_byte_<source> and with a baseline
        baseline_bits_per_byte and baseline_bits_per_byte_<source>; for dpo
        reward_accuracy and reward_margin, for grpo pass_at_1 and mean_reward (and
        baseline_pass_at_1, baseline_mean_reward), on both artifacts, with the
        figures in metrics.json's "candidate" / "baseline" and grpo's samples in
        `evaluation/grpo_samples.json` ({"candidate", "baseline"}); and
        `blessing/BLESSED` or `blessing/NOT_BLESSED` with the custom properties
        TFX's Pusher reads (`blessed`, current and baseline model URI and id, the
        message), bits_per_byte and the same per-source properties.

        Raises:
          FileNotFoundError: the eval split has no transformed examples.
          ValueError: nothing to score (no tokens or no bytes, of the split or of
            one source), a malformed `source_name` feature, or the baseline
            cannot score the candidate's ids (an SFT baseline with another
            tokenizer, a Hugging Face baseline without the candidate's
            tokenizer.json); for dpo, no `rejected_ids` in the examples or no
            `base_model` in the candidate's training_summary.json; for grpo, a
            model without a generate signature, or no eval prompt that fits.
        """
        config = PipelineConfig.from_json(exec_properties["pipeline_config"])
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        model = artifact_utils.get_single_instance(input_dict["model"])
        baselines = input_dict.get("baseline_model") or []
        evaluation = artifact_utils.get_single_instance(output_dict["evaluation"])
        blessing = artifact_utils.get_single_instance(output_dict["blessing"])

        baseline = baselines[0] if baselines else None
        scores = score_models(examples, model, baseline, config)
        metrics, baseline_metrics = scores.metrics, scores.baseline_metrics
        blessed, message = decide_blessing(metrics, baseline_metrics, config)

        by_source = metrics.pop("by_source")
        baseline_by_source = baseline_metrics.pop("by_source") if baseline_metrics else None
        report = {"candidate": metrics, "baseline": baseline_metrics, "by_source": by_source,
                  "baseline_by_source": baseline_by_source, "blessed": blessed,
                  "message": message}
        write_evaluation(evaluation.uri, report, scores)
        set_evaluation_properties(evaluation, metrics, baseline_metrics)
        for artifact in (evaluation, blessing):
            set_source_properties(artifact, by_source, baseline_by_source)
            set_preference_properties(artifact, metrics, baseline_metrics)
        write_blessing(blessing, blessed, message, model, baseline, metrics["bits_per_byte"])


@dataclasses.dataclass
class Scores:
    """What `score_models` measured.

    Attributes:
      tasks: the benchmark tasks scored (`eval.tasks`), possibly none.
      metrics: the candidate's figures (`evaluate_saved_model`, with "by_source"; dpo's
        and grpo's figures added).
      samples: the candidate's task samples, None without tasks.
      baseline_metrics, baseline_samples: the same of the baseline, None without one.
      grpo_samples: grpo's completions {"candidate", "baseline" (None without a
        baseline)}, None for other tasks.
    """

    tasks: Sequence[Task]
    metrics: dict
    samples: dict | None
    baseline_metrics: dict | None
    baseline_samples: dict | None
    grpo_samples: dict | None


def score_models(examples, model, baseline, config: PipelineConfig) -> Scores:
    """Scores the candidate `model` (a Model artifact) and the `baseline` (a Model
    artifact, or None) on the eval split of `examples` (Transform's output), as the
    executor's `Do` describes.

    Raises:
      FileNotFoundError, ValueError: as `Executor.Do`.
    """
    task = config.data.task
    tasks = load_tasks(config.eval.tasks, config.eval.min_scores)
    sources = read_eval_sources(examples, sft=task in CHAT_TASKS)
    candidate_dir = path_utils.serving_model_path(model.uri)
    loaded = tf.saved_model.load(candidate_dir)
    metrics, samples = evaluate_saved_model(candidate_dir, sources,
                                            config, tasks, loaded)
    baseline_metrics = baseline_samples = None
    baseline_model = (baseline_task_model(baseline.uri, candidate_dir)
                      if baseline is not None and task == "grpo" else None)
    if baseline is not None:
        baseline_metrics, baseline_samples = evaluate_baseline(
            baseline.uri, candidate_dir, sources, config, tasks, baseline_model)
    grpo_samples = None
    if task in ("dpo", "grpo"):
        candidate = task_models.from_saved_model(candidate_dir, loaded)
        if task == "dpo":
            metrics.update(evaluate_dpo_pairs(candidate, model.uri, examples, config))
        else:
            records = [r for items, _ in sources.values() for r in items]
            grpo_samples = evaluate_grpo_models(
                candidate, candidate_dir, baseline_model,
                baseline.uri if baseline is not None else "", records, config, metrics,
                baseline_metrics)
    return Scores(tasks, metrics, samples, baseline_metrics, baseline_samples, grpo_samples)


def evaluate_grpo_models(candidate, candidate_dir: str, baseline, baseline_uri: str,
                         records: list, config: PipelineConfig, metrics: dict,
                         baseline_metrics: dict | None) -> dict:
    """GRPO's figures of the candidate and, with a `baseline` (`baseline_task_model` of
    `baseline_uri`, or None), of the baseline (`evaluate_grpo_prompts` on the eval
    `records`), added to `metrics` and `baseline_metrics`.

    Returns:
      The samples, {"candidate": [...], "baseline": [...] or None}.

    Raises:
      ValueError: as `evaluate_grpo_prompts` (no generate signature, no prompt that fits).
    """
    figures, candidate_samples = evaluate_grpo_prompts(candidate, records, config,
                                                       "candidate", candidate_dir)
    metrics.update(figures)
    grpo_samples = {"candidate": candidate_samples, "baseline": None}
    if baseline is not None:
        from savedmodel import base_model

        baseline_dir = base_model.model_dir(baseline_uri)
        figures, grpo_samples["baseline"] = evaluate_grpo_prompts(
            baseline, records, config, "baseline",
            baseline_dir if base_model.kind(baseline_dir) == base_model.SAVEDMODEL
            else None)
        baseline_metrics.update(figures)
    return grpo_samples


def write_evaluation(evaluation_uri: str, report: dict, scores: Scores) -> None:
    """Writes `report` to metrics.json in `evaluation_uri`, and the task samples
    (task_samples.json, with tasks) and grpo's samples (grpo_samples.json) of `scores`."""
    io_utils.write_string_file(
        os.path.join(evaluation_uri, METRICS_FILE), json.dumps(report, indent=2)
    )
    if scores.tasks:
        io_utils.write_string_file(
            os.path.join(evaluation_uri, TASK_SAMPLES_FILE),
            json.dumps({"candidate": scores.samples, "baseline": scores.baseline_samples},
                       ensure_ascii=False))
    if scores.grpo_samples is not None:
        io_utils.write_string_file(os.path.join(evaluation_uri, GRPO_SAMPLES_FILE),
                                   json.dumps(scores.grpo_samples, ensure_ascii=False, indent=2))


def set_evaluation_properties(evaluation, metrics: dict, baseline_metrics: dict | None) -> None:
    """The ModelEvaluation's figures as its custom properties: bits_per_byte, perplexity,
    loss, response_perplexity, response_bits_per_byte (those in `metrics`), eval_tokens,
    eval_bytes, the tasks' (`set_task_properties`) and, with a baseline, its
    baseline_bits_per_byte and tasks'."""
    for key in ("bits_per_byte", "perplexity", "loss", "response_perplexity",
                "response_bits_per_byte"):
        if key in metrics:
            evaluation.set_float_custom_property(key, metrics[key])
    evaluation.set_int_custom_property("eval_tokens", metrics["tokens"])
    evaluation.set_int_custom_property("eval_bytes", metrics["bytes"])
    set_task_properties(evaluation, metrics.get("tasks", {}), "task_")
    if baseline_metrics:
        evaluation.set_float_custom_property("baseline_bits_per_byte", baseline_metrics["bits_per_byte"])
        set_task_properties(evaluation, baseline_metrics.get("tasks", {}), "baseline_task_")


def write_blessing(blessing, blessed: bool, message: str, model, baseline,
                   bits_per_byte: float) -> None:
    """Writes `blessing/BLESSED` or `blessing/NOT_BLESSED` and sets the custom properties
    TFX's Pusher reads: `blessed`, the current `model`'s URI and id, the `baseline`'s
    (a Model artifact, or None) and the message; and the candidate's `bits_per_byte`."""
    io_utils.write_string_file(
        os.path.join(
            blessing.uri,
            constants.BLESSED_FILE_NAME if blessed else constants.NOT_BLESSED_FILE_NAME,
        ),
        "",
    )
    blessing.set_int_custom_property(
        constants.ARTIFACT_PROPERTY_BLESSED_KEY,
        constants.BLESSED_VALUE if blessed else constants.NOT_BLESSED_VALUE,
    )
    blessing.set_string_custom_property(constants.ARTIFACT_PROPERTY_CURRENT_MODEL_URI_KEY, model.uri)
    blessing.set_int_custom_property(constants.ARTIFACT_PROPERTY_CURRENT_MODEL_ID_KEY, model.id)
    if baseline is not None:
        blessing.set_string_custom_property(
            constants.ARTIFACT_PROPERTY_BASELINE_MODEL_URI_KEY, baseline.uri
        )
        blessing.set_int_custom_property(
            constants.ARTIFACT_PROPERTY_BASELINE_MODEL_ID_KEY, baseline.id
        )
    blessing.set_string_custom_property(constants.ARTIFACT_PROPERTY_BLESSING_MESSAGE_KEY, message)
    blessing.set_float_custom_property("bits_per_byte", bits_per_byte)


def set_source_properties(artifact, by_source: dict, baseline_by_source: dict | None) -> None:
    """`bits_per_byte_<source>` float custom properties of each source's bits per byte
    (`by_source`: {name: {"bits_per_byte", ...}}), and `baseline_bits_per_byte_<source>`
    of the baseline's."""
    for name, values in by_source.items():
        artifact.set_float_custom_property(f"bits_per_byte_{name}", values["bits_per_byte"])
    for name, values in (baseline_by_source or {}).items():
        artifact.set_float_custom_property(f"baseline_bits_per_byte_{name}",
                                           values["bits_per_byte"])


def set_preference_properties(artifact, metrics: dict, baseline: dict | None) -> None:
    """The float custom properties of preference training's figures that `metrics`
    holds (`PREFERENCE_PROPERTIES`: reward_accuracy, reward_margin for dpo; pass_at_1,
    mean_reward for grpo), and `baseline_pass_at_1` / `baseline_mean_reward` of the
    baseline's."""
    for key in PREFERENCE_PROPERTIES:
        if key in metrics:
            artifact.set_float_custom_property(key, metrics[key])
        if baseline and key in baseline:
            artifact.set_float_custom_property(f"baseline_{key}", baseline[key])


def set_task_properties(artifact, task_metrics: dict, prefix: str) -> None:
    """`{prefix}{task}_{metric}` float custom properties (acc, acc_norm, acc_bytes,
    exact_match, chance) and `{prefix}{task}_n` of each task's metrics."""
    for name, values in task_metrics.items():
        for metric in TASK_PROPERTY_METRICS:
            if metric in values:
                artifact.set_float_custom_property(f"{prefix}{name}_{metric}", values[metric])
        artifact.set_int_custom_property(f"{prefix}{name}_n", values["n"])
