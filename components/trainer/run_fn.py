"""Trainer's module: `run_fn`, the entry point TFX calls. Thin by design.

It reads the config from `custom_config`, trains (`job.run` in this process,
or `launcher.run_workers` on N local worker processes when
`custom_config["num_workers"] > 1`), with checkpoints in a directory that
survives re-runs (`checkpoint_location.py`), then evaluates and exports a plain copy
of the trained model (float32, or bfloat16 / int8 for LoRA on a bf16 / int8 base;
adapters merged), its experts pruned (`train.prune_keep_experts`) and in
`train.export_dtype`: the servable SavedModel (`savedmodel.export`) to `fn_args.serving_model_dir`, and `training_summary.json` beside it with the
run's figures (which the Trainer's executor also records in ML Metadata).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import tensorflow as tf

from common.json_file import read_json
from components.trainer import checkpoint_location, data, hardware, model_io, precision, train_loop
from components.trainer import job as job_lib
from components.trainer.cluster_worker import is_chief, platform_cluster, run_platform_worker
from components.trainer.pruning import prune_trained_model, pruning_figures, write_pruning_record
from config import PipelineConfig
from savedmodel import base_model
from savedmodel.export import export_serving_model
from tokenization.byte_level_bpe import TOKENIZER_FILE
from tokenization.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

TRAINING_SUMMARY = "training_summary.json"
TRAIN_RESULT = "train_result.json"


def run_fn(fn_args) -> None:
    """TFX Trainer entry point (generic trainer, `run_fn`).

    Args:
      fn_args: `tfx.components.FnArgs`; uses train_files, eval_files,
        transform_output, serving_model_dir, model_run_dir, train_steps and
        custom_config: "pipeline_config" (JSON), optional "num_workers" (int,
        default 1) and "checkpoint_root" (default
        `<pipeline_root>/Trainer/checkpoints`).
    """
    logging.getLogger().setLevel(logging.INFO)
    custom = fn_args.custom_config or {}
    config = PipelineConfig.from_json(custom["pipeline_config"])
    num_workers = int(custom.get("num_workers", 1))
    tc = config.train
    if fn_args.train_steps and fn_args.train_steps != tc.train_steps:
        raise ValueError(
            f"TrainArgs.num_steps={fn_args.train_steps} disagrees with "
            f"train.train_steps={tc.train_steps}; set the step count in the config"
        )
    tokenizer = load_tokenizer(fn_args.transform_output)
    base = fn_args.base_model or ""
    teacher = custom.get("teacher_model", "")
    check_starts(config, base, teacher, tokenizer)
    job = training_job(fn_args, config, tokenizer, base, teacher, num_workers)
    job_lib.check_mixture(config)  # before any work: what the Trainer cannot sample
    sft = record_counts(config, fn_args.train_files)
    model = train_model(job, config)
    if model is None:  # a platform cluster's replica other than the chief: it only trains
        return
    figures = read_json(job.result_path, "the training job's result")
    model, pruned, eval_loss = evaluate_and_export(fn_args, config, model, tokenizer, figures)
    write_training_summary(fn_args.serving_model_dir, figures, model, eval_loss, sft, pruned)


def check_starts(config: PipelineConfig, base: str, teacher: str, tokenizer) -> None:
    """Checks what the run starts from: a base model for the preference tasks, and the
    base model's and the teacher's tokenizers (`check_tokenizer`).

    Args:
      config: the pipeline config.
      base: the base model (a directory or a Model artifact's URI), or "".
      teacher: the teacher's directory, or "".
      tokenizer: this run's tokenizer (Transform's).

    Raises:
      ValueError: a DPO or GRPO run without a base model; a base model or teacher
        without this run's tokenizer.
    """
    if config.data.task in train_loop.PREFERENCE_TASKS and not base:
        raise ValueError(f"data.task={config.data.task} starts from a base model (usually an SFT "
                         "model), which is also the frozen reference policy: give the Trainer "
                         "a base_model (deepseek-tfx run --base-model latest|PATH)")
    for role, path in (("base model", base), ("teacher", teacher)):
        if path:
            check_tokenizer(path, role, tokenizer)


def training_job(fn_args, config: PipelineConfig, tokenizer, base: str, teacher: str,
                 num_workers: int) -> job_lib.TrainingJob:
    """The run's `TrainingJob`, its checkpoints in the stable directory of this config,
    data and start (`checkpoint_location.stable_checkpoint_dir`, linked from the model run
    directory).

    Args:
      fn_args: the Trainer's `FnArgs` (`run_fn`).
      config: the pipeline config.
      tokenizer: this run's tokenizer (Transform's).
      base, teacher: the base model and the teacher, or "".
      num_workers: the worker processes to train on.
    """
    custom = fn_args.custom_config or {}
    # What identifies the start: the weights' fingerprints `create_pipeline` computed for a
    # directory and a teacher; the artifact's URI (never rewritten) for the latest blessed model.
    starts = {role: value for role, value in (
        ("base model", custom.get("base_model_fingerprint") or base),
        ("teacher", custom.get("teacher_fingerprint", ""))) if value}
    checkpoint_dir = checkpoint_location.stable_checkpoint_dir(
        fn_args.model_run_dir, config, fn_args.train_files, custom.get("checkpoint_root"),
        starts=starts)
    checkpoint_location.link_from_model_run(fn_args.model_run_dir, checkpoint_dir)
    logging.info("checkpoints: %s", checkpoint_dir)
    return job_lib.TrainingJob(
        pipeline_config=config.to_json(),
        train_files=list(fn_args.train_files),
        checkpoint_dir=checkpoint_dir,
        log_dir=fn_args.model_run_dir,
        result_path=os.path.join(fn_args.model_run_dir, TRAIN_RESULT),
        num_workers=num_workers,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
        base_model=base_model.model_dir(base) if base else "",
        teacher_model=base_model.model_dir(teacher) if teacher else "",
        tokenizer_dir=fn_args.transform_output,
    )


def evaluate_and_export(fn_args, config: PipelineConfig, model, tokenizer, figures: dict):
    """Prunes the trained `model`'s experts (`train.prune_keep_experts`), casts it to
    `train.export_dtype`, evaluates it on the eval split (logged, and the TensorBoard
    scalar `eval/loss` at the step where training ended: the training job's `figures`'
    `train_steps`) and exports the servable SavedModel to `fn_args.serving_model_dir`
    with its pruning record.

    Returns:
      (the exported Keras model, the pruning (`prune_trained_model`), the eval loss in
      nats per token).
    """
    tc = config.train
    if config.data.task in ("sft", "dpo", "grpo"):  # DPO: the chosen responses; GRPO: answers
        eval_ds = data.make_sft_eval_dataset(fn_args.eval_files, tc.seq_len, tc.batch_size,
                                             tokenizer.pad_id)
    else:
        eval_ds = data.make_eval_dataset(fn_args.eval_files, tc.seq_len, tc.batch_size,
                                         tokenizer.eos_id)
    model, pruned = prune_trained_model(model, eval_ds, config)  # train.prune_keep_experts
    model = model_io.to_export_dtype(config, model)  # train.export_dtype
    eval_loss, eval_tokens = train_loop.evaluate(model, eval_ds, tc.eval_batches)
    logging.info("trainer eval loss %.4f nats/token (%d tokens)", eval_loss, eval_tokens)
    # At the step training ended (fewer than train.train_steps when a source ran out).
    with tf.summary.create_file_writer(fn_args.model_run_dir).as_default(
            step=figures["train_steps"]):
        tf.summary.scalar("eval/loss", eval_loss)
    export_serving_model(model, fn_args.transform_output, config, fn_args.serving_model_dir)
    write_pruning_record(fn_args.serving_model_dir, pruned)
    return model, pruned, eval_loss


def write_training_summary(serving_model_dir: str, figures: dict, model, eval_loss: float,
                           sft: dict, pruned) -> None:
    """Writes `training_summary.json` beside the servable SavedModel (`serving_model_dir`):
    the training job's `figures` (rounded; the windows' history last), the eval loss, the
    exported `model`'s parameters and weight dtype, the restarts, the records used
    (`sft`: `record_counts`) and the pruning's figures."""
    summary = {
        **{k: v for k, v in figures.items() if k != "history"},
        "train_wall_s": round(figures["train_wall_s"], 2),
        "tokens_per_second": round(figures["tokens_per_second"], 1),
        "final_train_loss": figures["final_loss"],
        "trainer_eval_loss": eval_loss,
        "parameters": int(model.count_params()),
        "exported_weights_dtype": model_io.export_weight_dtype(model),
        "restarts": figures.get("restarts", 0),
        "restart_reasons": "; ".join(r["reason"] for r in figures.get("restart_log", [])),
        **sft,
        **({"final_train_figures": figures["history"][-1]["figures"]}
           if figures["history"] and "figures" in figures["history"][-1] else {}),
        **pruning_figures(pruned),
        "history": figures["history"],
    }
    model_dir = os.path.dirname(serving_model_dir.rstrip("/"))
    with tf.io.gfile.GFile(os.path.join(model_dir, TRAINING_SUMMARY), "w") as f:
        json.dump(summary, f, indent=2)


def record_counts(config: PipelineConfig, train_files: list[str]) -> dict:
    """The training records of an SFT, DPO or GRPO run: used, and rejected as too long
    for `train.seq_len` (GRPO: prompt + `train.grpo_max_new_tokens`), logged and returned
    as summary figures ({} for pretraining, whose documents are packed).

    Raises:
      ValueError: no record fits (`data.count_*_records`).
    """
    task, tc = config.data.task, config.train
    if task == "sft":
        counts = data.count_sft_records(train_files, tc.seq_len)
    elif task == "dpo":
        counts = data.count_dpo_records(train_files, tc.seq_len)
    elif task == "grpo":
        counts = data.count_grpo_records(train_files, tc.seq_len, tc.grpo_max_new_tokens)
    else:
        return {}
    logging.info("%s records: %d used, %d rejected as too long for train.seq_len=%d", task,
                 counts["used"], counts["rejected"]["too_long"], tc.seq_len)
    figures = {f"{task}_records": counts["records"], f"{task}_records_used": counts["used"],
               f"{task}_rejected_too_long": counts["rejected"]["too_long"]}
    if "response_tokens" in counts:
        figures[f"{task}_response_tokens"] = counts["response_tokens"]
    return figures


def check_tokenizer(path: str, role: str, tokenizer) -> None:
    """A base model or teacher must carry this run's tokenizer (Transform's): the same
    tokenizer.json content. (Its architecture is checked when its weights load,
    `train_loop.setup`.)

    Raises:
      ValueError: naming the model, and what differs.
    """
    directory = base_model.model_dir(path)
    tokenizer_dir = base_model.tokenizer_path(directory)
    if tokenizer_dir is None:
        raise ValueError(f"{role} {directory} carries no tokenizer.json; it must have this "
                         f"run's tokenizer ({tokenizer.source})")
    theirs = read_json(os.path.join(tokenizer_dir, TOKENIZER_FILE), f"the {role}'s tokenizer")
    if theirs != tokenizer.json:
        raise ValueError(f"{role} {directory}: its tokenizer.json differs from this run's "
                         f"({tokenizer.source}); both must tokenize alike")


def train_model(job: job_lib.TrainingJob, config: PipelineConfig):
    """Trains `job` and returns a single-device, plain copy of the trained model
    (`model_io.copy_for_export`: float32, or bfloat16 for LoRA on a bf16 base, with the
    adapters merged).

    One worker: in this process. A platform's cluster (a multi-task TF_CONFIG in the
    environment: Vertex AI worker pools): one worker process per replica
    (`cluster_worker.py`); None on replicas other than the chief. N workers: N local processes
    (`launcher.run_workers`, which restarts the group after a lost, hung or preempted
    worker; the restarts are added to the figures as `restarts` and `restart_log`); the
    model is then read back from the final checkpoint. Either way the chief writes the
    run's figures to `job.result_path`.

    Raises:
      Preempted: SIGTERM; the step reached was checkpointed (`preemption.py`).
      RuntimeError: a worker failed and was not (or no longer) restarted
        (`cluster_worker.WorkerExitError` on a platform's cluster).
    """
    measure_cpu_peak(job)  # once per run, before training, on an otherwise idle CPU
    cluster = platform_cluster()
    if cluster is not None:  # TF_CONFIG from the platform: Vertex AI worker pools, a TFJob
        run_platform_worker(job)
        if not is_chief(cluster):
            return None
        return read_back_model(config, read_json(job.result_path, "the training job's result"))
    if job.num_workers <= 1:
        result = job_lib.run(job)
        if (result.precision == "float32" and result.strategy == "OneDevice"
                and not config.train.lora_rank):
            return result.model
        return model_io.copy_for_export(config, result.model)

    from components.trainer import launcher

    restarts = launcher.run_workers(job, job.num_workers, job_dir=job.log_dir)
    figures = read_json(job.result_path, "the training job's result")
    figures["restarts"] = len(restarts)
    figures["restart_log"] = [dataclasses.asdict(r) for r in restarts]
    with tf.io.gfile.GFile(job.result_path, "w") as f:
        json.dump(figures, f, indent=2)
    return read_back_model(config, figures)


def read_back_model(config: PipelineConfig, figures: dict):
    """The plain copy of the model that worker processes trained, read from the final
    checkpoint the run's figures name (`last_checkpoint`, in their `precision`)."""
    last = figures["last_checkpoint"]
    int8 = tf.int8 in tf.train.load_checkpoint(last).get_variable_to_dtype_map().values()
    model = model_io.build_trained_model(config, dtype=figures.get("precision", "float32"),
                                         int8=int8)  # int8: LoRA on an int8 base
    tf.train.Checkpoint(model=model).read(last).expect_partial().assert_existing_objects_matched()
    if config.train.lora_rank or model.dtype_policy.name != "float32":
        return model_io.copy_for_export(config, model)
    return model


def measure_cpu_peak(job: job_lib.TrainingJob) -> None:
    """On CPUs, probe the matmul peak for MFU (`hardware.peak_flops`) into `job`.

    Called once per run before training (and before any worker starts: loopback
    workers share this host and its probe); the probe comes from the per-user cache
    when one younger than a day matches this machine (`hardware.cached_cpu_probe`)."""
    accelerator, _, policy, _ = job_lib.plan(job)
    if accelerator.kind == "cpu":
        job.peak_flops_per_device, job.peak_flops_source, job.peak_probe = hardware.peak_flops(
            accelerator, precision.compute_dtype(policy))
        log.info("peak: %.1f GFLOP/s (%s, %s %s; per shape median/min/max GFLOP/s %s)",
                 job.peak_flops_per_device / 1e9, job.peak_flops_source,
                 "cached, measured" if job.peak_probe["cached"] else "measured",
                 job.peak_probe["measured_at"], job.peak_probe["shapes_gflops_median_min_max"])
