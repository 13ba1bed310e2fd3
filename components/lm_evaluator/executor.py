"""LmEvaluator's executor: score the candidate (and the baseline), decide the blessing.

Uses the candidate's pushed-to-be SavedModel (`logits` signature) on the eval
split of Transform's output, so what is blessed is exactly what would serve.
Bytes scored = the documents' UTF-8 bytes + one byte per `[EOS]` separator
(the blank line it stands for): every byte of the text, in any language (the
byte-level tokenizer has no `[UNK]` to hide bytes in).

A baseline model whose tokenizer differs from the candidate's (another run that
learned another tokenizer) scores the same text: the candidate's ids are decoded
(lossless) and encoded again with the baseline's own `tokenize` signature.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

import tensorflow as tf
import tensorflow_text  # noqa: F401  (regex ops of the SavedModel's tokenizer)
from tfx.components.evaluator import constants
from tfx.dsl.components.base import base_executor
from tfx.types import artifact_utils
from tfx.utils import io_utils, path_utils

from components.lm_evaluator.blessing import decide_blessing
from components.trainer.data import PROMPT_LENGTH_KEY
from components.transform.preprocessing import INPUT_IDS_KEY, NUM_BYTES_KEY
from config import PipelineConfig
from savedmodel import scoring, task_models
from savedmodel.layout import read_tokenizer
from savedmodel.task_models import score_tasks
from savedmodel.tasks import Task, load_tasks
from tokenization.byte_level_bpe import ByteLevelBpe

METRICS_FILE = "metrics.json"
TASK_SAMPLES_FILE = "task_samples.json"
TASK_PROPERTY_METRICS = ("acc", "acc_norm", "acc_bytes", "exact_match", "chance")


def _eval_features(transformed_examples, split: str):
    """The feature maps of one split's transformed examples, in file order."""
    pattern = os.path.join(transformed_examples.uri, f"Split-{split}", "*")
    files = sorted(tf.io.gfile.glob(pattern))
    if not files:
        raise FileNotFoundError(f"no transformed examples in {pattern}")
    for record in tf.data.TFRecordDataset(files, compression_type="GZIP"):
        yield tf.train.Example.FromString(record.numpy()).features.feature


def read_eval_documents(transformed_examples, split: str = "eval") -> tuple[list[list[int]], int]:
    """(documents as token-id lists, total UTF-8 bytes) of one split."""
    docs, num_bytes = [], 0
    for f in _eval_features(transformed_examples, split):
        docs.append(list(f[INPUT_IDS_KEY].int64_list.value))
        num_bytes += int(f[NUM_BYTES_KEY].int64_list.value[0])
    return docs, num_bytes


def read_eval_records(transformed_examples, split: str = "eval") -> tuple[list, int]:
    """SFT records (ids, prompt_length, response bytes) of one split, and their bytes."""
    records = [(list(f[INPUT_IDS_KEY].int64_list.value),
                int(f[PROMPT_LENGTH_KEY].int64_list.value[0]),
                int(f[NUM_BYTES_KEY].int64_list.value[0]))
               for f in _eval_features(transformed_examples, split)]
    return records, sum(r[2] for r in records)


def evaluate_saved_model(model_dir: str, docs, num_bytes: int, config: PipelineConfig,
                         tasks: Sequence[Task] = (), loaded=None) -> tuple[dict, dict | None]:
    """(metrics, task samples) of the SavedModel: perplexity and bits per byte on `docs`
    (its own token ids) and, with `tasks`, metrics["tasks"] = each task's scores
    (`savedmodel.task_models.score_tasks`); samples None without tasks. `loaded`: the
    SavedModel if already loaded."""
    loaded = loaded if loaded is not None else tf.saved_model.load(model_dir)
    logits_fn = loaded.signatures["logits"]
    metrics = evaluate_logits(lambda x: logits_fn(input_ids=x)["logits"],
                              read_tokenizer(model_dir), docs, num_bytes, config)
    if not tasks:
        return metrics, None
    scored = score_tasks(task_models.from_saved_model(model_dir, loaded), tasks,
                         config.eval.batch_size)
    return {**metrics, "tasks": scored["tasks"]}, scored["samples"]


def evaluate_baseline(baseline_uri: str, candidate_dir: str, docs, num_bytes: int,
                      config: PipelineConfig, tasks: Sequence[Task] = ()) -> tuple[dict, dict | None]:
    """`evaluate_saved_model` of a baseline: a Model artifact (a SavedModel in its
    `Format-Serving/`), an imported SavedModel directory, or a Hugging Face checkpoint
    directory (a warm start's `--base-model PATH`); `docs` are the candidate's ids. A
    baseline SavedModel scores the tasks with its own tokenizer (task scores are
    measured on text); a Hugging Face one carries the candidate's."""
    from savedmodel import base_model

    baseline_dir = base_model.model_dir(baseline_uri)
    if base_model.kind(baseline_dir) == base_model.SAVEDMODEL:
        if config.data.task == "sft" and (read_tokenizer(baseline_dir).json
                                          != read_tokenizer(candidate_dir).json):
            raise ValueError(f"baseline {baseline_dir} has another tokenizer; response-only "
                             f"scoring of SFT records needs the candidate's")
        baseline_docs = scoring.retokenize(docs, candidate_dir, baseline_dir)
        return evaluate_saved_model(baseline_dir, baseline_docs, num_bytes, config, tasks)
    tokenizer_dir = base_model.tokenizer_path(baseline_dir)
    candidate = read_tokenizer(candidate_dir)
    if tokenizer_dir is None or ByteLevelBpe.from_file(tokenizer_dir).json != candidate.json:
        raise ValueError(f"baseline {baseline_dir} (a Hugging Face checkpoint) does not carry "
                         f"the candidate's tokenizer.json, so the two cannot score the same ids")
    model = base_model.load_model(baseline_dir)
    metrics = evaluate_logits(lambda x: model(x, training=False), candidate, docs, num_bytes, config)
    if not tasks:
        return metrics, None
    scored = score_tasks(task_models.from_keras_model(model, candidate), tasks,
                         config.eval.batch_size)
    return {**metrics, "tasks": scored["tasks"]}, scored["samples"]


def evaluate_logits(logits_fn, tokenizer, docs, num_bytes: int, config: PipelineConfig) -> dict:
    """Perplexity and bits per byte of `logits_fn` (int32 [B, T] -> float32 [B, T, V]) on
    `docs` (token ids of `tokenizer`), packed as the Trainer packs them; for SFT
    (`data.task = "sft"`, docs from `read_eval_records`), of the responses only
    (`scoring.score_responses`): also `response_perplexity`, `response_bits_per_byte`."""
    if config.data.task == "sft":
        scored = scoring.score_responses(logits_fn, docs, config.train.seq_len,
                                         config.eval.batch_size, pad_id=tokenizer.pad_id)
        metrics = scoring.summarize(scored["nll"], scored["tokens"], scored["bytes"])
        return {**metrics, "response_perplexity": metrics["perplexity"],
                "response_bits_per_byte": metrics["bits_per_byte"],
                "records": scored["records"], "skipped_too_long": scored["skipped_too_long"]}
    stream = scoring.token_stream(docs, config.eval.max_eval_tokens, eos_id=tokenizer.eos_id)
    result = scoring.score_stream(
        logits_fn, stream, config.train.seq_len,
        config.eval.batch_size, pad_id=tokenizer.pad_id)
    if config.eval.max_eval_tokens and result["tokens"] < sum(len(d) for d in docs) + len(docs) - 1:
        # Scored a prefix: scale bytes by the fraction of tokens scored.
        total_tokens = sum(len(d) for d in docs) + len(docs) - 1
        num_bytes = round((num_bytes + len(docs) - 1) * result["tokens"] / total_tokens)
    else:
        num_bytes += len(docs) - 1
    return scoring.summarize(result["nll"], result["tokens"], num_bytes)


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
            picks whole documents or SFT responses, the `eval` section holds the
            blessing rule, see `decide_blessing`).

        Writes `evaluation/metrics.json` ({"candidate", "baseline", "blessed",
        "message"}) and on `evaluation` the custom properties bits_per_byte,
        perplexity, loss (mean NLL per token, nats), for SFT
        response_perplexity and response_bits_per_byte, eval_tokens, eval_bytes
        and with a baseline baseline_bits_per_byte; and `blessing/BLESSED` or
        `blessing/NOT_BLESSED` with the custom properties TFX's Pusher reads
        (`blessed`, current and baseline model URI and id, the message) and
        bits_per_byte.

        Raises:
          FileNotFoundError: the eval split has no transformed examples.
          ValueError: nothing to score (no tokens or no bytes), or the baseline
            cannot score the candidate's ids (an SFT baseline with another
            tokenizer, a Hugging Face baseline without the candidate's
            tokenizer.json).
        """
        config = PipelineConfig.from_json(exec_properties["pipeline_config"])
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        model = artifact_utils.get_single_instance(input_dict["model"])
        baselines = input_dict.get("baseline_model") or []
        evaluation = artifact_utils.get_single_instance(output_dict["evaluation"])
        blessing = artifact_utils.get_single_instance(output_dict["blessing"])

        tasks = load_tasks(config.eval.tasks, config.eval.min_scores)
        if config.data.task == "sft":
            docs, num_bytes = read_eval_records(examples)
        else:
            docs, num_bytes = read_eval_documents(examples)
        candidate_dir = path_utils.serving_model_path(model.uri)
        metrics, samples = evaluate_saved_model(candidate_dir, docs, num_bytes, config, tasks)
        baseline_metrics = baseline_samples = None
        if baselines:
            baseline_metrics, baseline_samples = evaluate_baseline(
                baselines[0].uri, candidate_dir, docs, num_bytes, config, tasks)
        blessed, message = decide_blessing(metrics, baseline_metrics, config)

        report = {"candidate": metrics, "baseline": baseline_metrics, "blessed": blessed,
                  "message": message}
        io_utils.write_string_file(
            os.path.join(evaluation.uri, METRICS_FILE), json.dumps(report, indent=2)
        )
        if tasks:
            io_utils.write_string_file(
                os.path.join(evaluation.uri, TASK_SAMPLES_FILE),
                json.dumps({"candidate": samples, "baseline": baseline_samples},
                           ensure_ascii=False))
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
        if baselines:
            blessing.set_string_custom_property(
                constants.ARTIFACT_PROPERTY_BASELINE_MODEL_URI_KEY, baselines[0].uri
            )
            blessing.set_int_custom_property(
                constants.ARTIFACT_PROPERTY_BASELINE_MODEL_ID_KEY, baselines[0].id
            )
        blessing.set_string_custom_property(constants.ARTIFACT_PROPERTY_BLESSING_MESSAGE_KEY, message)
        blessing.set_float_custom_property("bits_per_byte", metrics["bits_per_byte"])


def set_task_properties(artifact, task_metrics: dict, prefix: str) -> None:
    """`{prefix}{task}_{metric}` float custom properties (acc, acc_norm, acc_bytes,
    exact_match, chance) and `{prefix}{task}_n` of each task's metrics."""
    for name, values in task_metrics.items():
        for metric in TASK_PROPERTY_METRICS:
            if metric in values:
                artifact.set_float_custom_property(f"{prefix}{name}_{metric}", values[metric])
        artifact.set_int_custom_property(f"{prefix}{name}_n", values["n"])
