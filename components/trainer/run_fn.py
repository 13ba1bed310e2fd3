"""Trainer's module: `run_fn`, the entry point TFX calls. Thin by design.

It reads the config from `custom_config`, builds the packed datasets from
Transform's output, trains (`train_loop.train`), writes the servable SavedModel
(`serving.export`) to `fn_args.serving_model_dir`, and a `training_summary.json`
beside it with the run's figures.
"""

from __future__ import annotations

import json
import logging
import os

import tensorflow as tf

from components.trainer import data, train_loop
from pipeline.configs import PipelineConfig
from serving.export import export_serving_model

TRAINING_SUMMARY = "training_summary.json"


def run_fn(fn_args) -> None:
    """TFX Trainer entry point (generic trainer, `run_fn`).

    Args:
      fn_args: `tfx.components.FnArgs`; uses train_files, eval_files,
        transform_output, serving_model_dir, model_run_dir, train_steps and
        custom_config["pipeline_config"].
    """
    logging.getLogger().setLevel(logging.INFO)
    config = PipelineConfig.from_json(fn_args.custom_config["pipeline_config"])
    tc = config.train
    if fn_args.train_steps and fn_args.train_steps != tc.train_steps:
        raise ValueError(
            f"TrainArgs.num_steps={fn_args.train_steps} disagrees with "
            f"train.train_steps={tc.train_steps}; set the step count in the config"
        )
    train_ds = data.make_train_dataset(
        fn_args.train_files, tc.seq_len, tc.batch_size, tc.shuffle_buffer, tc.seed
    )
    eval_ds = data.make_eval_dataset(fn_args.eval_files, tc.seq_len, tc.batch_size)
    result = train_loop.train(
        config,
        train_ds,
        eval_ds,
        checkpoint_dir=os.path.join(fn_args.model_run_dir, "checkpoints"),
        log_dir=fn_args.model_run_dir,
    )
    export_serving_model(result.model, fn_args.transform_output, config, fn_args.serving_model_dir)
    summary = {
        "train_steps": result.train_steps,
        "resumed_from_step": result.resumed_from_step,
        "tokens_seen": result.tokens_seen,
        "train_wall_s": round(result.train_wall_s, 2),
        "tokens_per_second": round(result.tokens_per_second, 1),
        "final_train_loss": result.final_loss,
        "trainer_eval_loss": result.eval_loss,
        "parameters": int(result.model.count_params()),
        "history": result.history,
    }
    model_dir = os.path.dirname(fn_args.serving_model_dir.rstrip("/"))
    with tf.io.gfile.GFile(os.path.join(model_dir, TRAINING_SUMMARY), "w") as f:
        json.dump(summary, f, indent=2)
