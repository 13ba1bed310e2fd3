"""The Trainer's executor: TFX's generic one, plus the run's figures in ML Metadata.

`run_fn` writes `training_summary.json` beside the serving model; this
executor copies its scalar figures onto the output Model artifact as custom
properties (`MODEL_PROPERTIES`), so ML Metadata answers "how was this model
trained" without opening files: steps, resume point, tokens, wall time,
tokens/s, MFU, strategy, replicas, workers, precision, batch layout, XLA
(`jit_compile`), the MoE dropped fraction, the skipped (not finite) steps, the
restarts of the worker group and their reasons, the precision of each part
(frozen weights, trained weights, optimizer states, compute, the exported model),
the experts kept by pruning (before and after, and the eval tokens measured), and the
data mixture: each source's weight, tokens trained, realized token share and epochs
drawn (JSON {source: value}), and why a run stopped early (`stopped_early`).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from tfx.components.trainer import executor as tfx_trainer_executor
from tfx.types import artifact_utils, standard_component_specs

from common.json_file import read_json
from components.trainer.run_fn import TRAINING_SUMMARY

MODEL_PROPERTIES = {
    "train_steps": int, "resumed_from_step": int, "steps_run": int, "tokens_seen": int,
    "train_wall_s": float, "tokens_per_second": float, "mfu": float,
    "steady_tokens_per_second": float, "steady_mfu": float, "peak_flops": float,
    "peak_flops_source": str, "flops_per_token": int, "strategy": str, "num_replicas": int,
    "num_workers": int, "precision": str, "global_batch_size": int,
    "per_replica_batch_size": int, "grad_accum_steps": int, "final_train_loss": float,
    "trainer_eval_loss": float, "parameters": int, "checkpoint_dir": str,
    "trainable_params": int, "total_params": int, "sft_records": int, "sft_records_used": int,
    "sft_rejected_too_long": int, "sft_response_tokens": int, "jit_compile": bool,
    "moe_capacity_factor": float, "moe_dropped_fraction": float, "skipped_steps": int,
    # which precision each part is in (`run_records.precision_parts`, run_fn)
    "frozen_weights_dtype": str, "trainable_weights_dtype": str,
    "optimizer_states_dtype": str, "compute_dtype": str, "exported_weights_dtype": str,
    # elastic restarts of the worker group (`launcher.py`)
    "restarts": int, "restart_reasons": str,
    # experts pruned after training (`train.prune_keep_experts`, `pruning.py`)
    "pruned_experts_kept": int, "n_routed_experts_before": int, "pruning_tokens": int,
    "trainer_eval_loss_before_pruning": float,
    # data mixtures (issue 28): JSON {source: value} (`train_loop.TrainResult`, `job.py`)
    "source_weights": dict, "source_tokens": dict, "source_token_shares": dict,
    "source_epochs": dict, "stopped_early": str,
    # DPO and GRPO (issue 29): records used and too long, the last logging window's figures
    # (DPO: reward_accuracy, reward_margin, ...; GRPO: reward_mean, kl, ...), as JSON
    "dpo_records": int, "dpo_records_used": int, "dpo_rejected_too_long": int,
    "dpo_response_tokens": int, "grpo_records": int, "grpo_records_used": int,
    "grpo_rejected_too_long": int, "final_train_figures": dict,
}


def record_summary(model_artifact, summary: dict[str, Any]) -> None:
    """Sets `MODEL_PROPERTIES` found in `summary` as custom properties (non-finite floats
    skipped; a dict as its JSON text, keys sorted)."""
    for key, kind in MODEL_PROPERTIES.items():
        value = summary.get(key)
        if value is None:
            continue
        if kind is dict:
            model_artifact.set_string_custom_property(key, json.dumps(value, sort_keys=True))
        elif kind is bool:
            model_artifact.set_bool_custom_property(key, bool(value))
        elif kind is int:
            model_artifact.set_int_custom_property(key, int(value))
        elif kind is float:
            if math.isfinite(float(value)):
                model_artifact.set_float_custom_property(key, float(value))
        else:
            model_artifact.set_string_custom_property(key, str(value))


class Executor(tfx_trainer_executor.GenericExecutor):
    """GenericExecutor that records `training_summary.json` on the Model artifact."""

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        """Runs TFX's GenericExecutor (`run_fn`), then records its summary on the Model.

        Args:
          input_dict: TFX Trainer's inputs: "examples", "transform_graph",
            "schema" (read by GenericExecutor into `run_fn`'s FnArgs) and,
            optionally, "base_model" (a warm start: the first Model's URI is
            recorded here too).
          output_dict: "model" (one Model artifact; `run_fn` writes the
            SavedModel to `Format-Serving/` and `training_summary.json` beside
            it) and "model_run" (TensorBoard logs).
          exec_properties: TFX Trainer's properties, "train_args", "eval_args",
            "module_path" / "run_fn" and "custom_config" (dict or JSON:
            "pipeline_config", "num_workers", "checkpoint_root", optional
            "teacher_model", "replay_lineage", see `run_fn.run_fn`).

        Sets on the Model the custom properties `MODEL_PROPERTIES` found in
        `training_summary.json` (`record_summary`), and `base_model_uri`,
        `base_model_id` and `teacher_model_uri` for a warm start or distillation,
        `reference_model_uri` and `reference_model_id` for DPO and GRPO (the base model,
        which is the frozen reference policy), and
        `replay_examples_id` and `replay_base_model_id` when the base run's data is
        replayed through ML Metadata lineage (custom_config "replay_lineage").

        Raises:
          ValueError: from `run_fn` (which may raise others): TrainArgs.num_steps
            disagrees with train.train_steps, or the base model or teacher
            carries another tokenizer.
          FileNotFoundError: `run_fn` returned without writing
            `training_summary.json`.
        """
        super().Do(input_dict, output_dict, exec_properties)
        model = artifact_utils.get_single_instance(output_dict[standard_component_specs.MODEL_KEY])
        path = os.path.join(model.uri, TRAINING_SUMMARY)
        record_summary(model, read_json(path, "the Trainer's training summary"))
        bases = input_dict.get(standard_component_specs.BASE_MODEL_KEY) or []
        if bases:  # a warm start: the model it started from (also an input event in MLMD)
            model.set_string_custom_property("base_model_uri", bases[0].uri)
            if bases[0].id:
                model.set_int_custom_property("base_model_id", bases[0].id)
        custom_config = (exec_properties.get("custom_config") or {})
        if isinstance(custom_config, str):
            custom_config = json.loads(custom_config)
        task = json.loads(custom_config["pipeline_config"])["data"]["task"] if \
            custom_config.get("pipeline_config") else "pretrain"
        if bases and task in ("dpo", "grpo"):  # the frozen reference policy is the base model
            model.set_string_custom_property("reference_model_uri", bases[0].uri)
            if bases[0].id:
                model.set_int_custom_property("reference_model_id", bases[0].id)
        if custom_config.get("teacher_model"):
            model.set_string_custom_property("teacher_model_uri", custom_config["teacher_model"])
        replay = custom_config.get("replay_lineage") or {}
        if replay:  # the base run's data, replayed (pipeline/replay.py)
            model.set_int_custom_property("replay_examples_id", int(replay["examples_id"]))
            model.set_int_custom_property("replay_base_model_id", int(replay["base_model_id"]))
