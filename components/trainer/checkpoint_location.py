"""Where a training run keeps its checkpoints: a directory that outlives the run.

TFX gives every Trainer execution a fresh `model_run/<execution id>/`
directory, so checkpoints written there would be lost to a re-run after a
crash. They go instead to

    <pipeline_root>/Trainer/checkpoints/<fingerprint>/

where the fingerprint is a hash of what determines the trained weights: the
content of the transformed training files (names and bytes) and the model,
tokenizer and train config, minus the train fields that only say how to run
(`RUNTIME_ONLY_TRAIN_FIELDS`: strategy, micro-batches, recomputation, logging
and checkpoint intervals, eval batches; the number of workers is not in the
config at all) and those that only change what is done with the trained weights
(`AFTER_TRAINING_TRAIN_FIELDS`: expert pruning and the precision of the export). A re-run of the pipeline with the same inputs and config, after
`kill -9` or on another number of workers, finds the same directory and
resumes from its latest checkpoint; a run with other data or settings starts
fresh in its own directory. A finished run leaves its final checkpoint, so
re-running it (e.g. with `--no-cache`) trains zero steps; delete the directory
to train again from scratch.

Each execution's `model_run/<id>/checkpoints.txt` names the directory it used.
Not a symbolic link: when an execution fails (a preemption, a non-finite loss),
TFX removes its output directories with `fileio.rmtree`, which follows a link
into the directory and would delete the very checkpoints to resume from.
What goes into the directory, and when, is the training loop's
(`checkpointer.Checkpointer`).
"""

from __future__ import annotations

import hashlib
import json
import os

import tensorflow as tf

from config import PipelineConfig

RUNTIME_ONLY_TRAIN_FIELDS = ("distribution_strategy", "grad_accum_steps", "recompute_activations",
                             "checkpoint_every", "log_every", "eval_batches", "max_skipped_steps",
                             "max_restarts", "min_workers", "heartbeat_timeout_s",
                             "preemption_grace_s")
# Applied to the trained model after training (`pruning.py`): adding one to a finished
# run re-exports without retraining. (The Trainer's cache key still changes: it holds the
# whole config.)
AFTER_TRAINING_TRAIN_FIELDS = ("prune_keep_experts", "export_dtype")
_CHUNK = 1 << 20


def fingerprint(config: PipelineConfig, train_files: list[str],
                starts: dict[str, str] | None = None) -> str:
    """16 hex digits identifying (training data content, model/tokenizer/train config,
    the models the run starts or learns from).

    Args:
      config: the pipeline config.
      train_files: file patterns (globs) of the transformed training examples.
      starts: role ("base model", "teacher") -> the fingerprint of its weights
        (`base_model.fingerprint`), so a resume never mixes two starts.

    Raises:
      FileNotFoundError: a pattern matches no file.
    """
    d = config.to_dict()
    ignored = RUNTIME_ONLY_TRAIN_FIELDS + AFTER_TRAINING_TRAIN_FIELDS
    train = {k: v for k, v in d["train"].items() if k not in ignored}
    h = hashlib.sha256(json.dumps(
        {"model": d["model"], "tokenizer": d["tokenizer"], "train": train,
         **({"starts": starts} if starts else {})},
        sort_keys=True).encode())
    for pattern in train_files:
        files = sorted(tf.io.gfile.glob(pattern))
        if not files:
            raise FileNotFoundError(f"no training files match {pattern}")
        for path in files:
            h.update(os.path.basename(path).encode() + b"\0")
            with tf.io.gfile.GFile(path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
    return h.hexdigest()[:16]


def stable_checkpoint_dir(model_run_dir: str, config: PipelineConfig, train_files: list[str],
                          root: str | None = None, starts: dict[str, str] | None = None) -> str:
    """`<root>/<fingerprint>`; root defaults to `<pipeline_root>/Trainer/checkpoints`.

    Args:
      model_run_dir: the execution's `.../<component id>/model_run/<execution id>`.
      config, train_files, starts: see `fingerprint`.
      root: another parent directory for the checkpoints.
    """
    if root is None:
        component_dir = os.path.dirname(os.path.dirname(model_run_dir.rstrip("/")))
        root = os.path.join(component_dir, "checkpoints")
    return os.path.join(root, fingerprint(config, train_files, starts))


CHECKPOINTS_FILE = "checkpoints.txt"


def link_from_model_run(model_run_dir: str, checkpoint_dir: str) -> None:
    """Creates checkpoint_dir and writes `model_run_dir/checkpoints.txt` naming it (one
    line; see the module docstring for why not a symbolic link)."""
    tf.io.gfile.makedirs(checkpoint_dir)
    tf.io.gfile.makedirs(model_run_dir)
    with tf.io.gfile.GFile(os.path.join(model_run_dir, CHECKPOINTS_FILE), "w") as f:
        f.write(checkpoint_dir + "\n")
