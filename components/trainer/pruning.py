"""Expert pruning in the pipeline (`train.prune_keep_experts`): the Trainer prunes the
trained model before its own eval and the export, so the Evaluator scores and gates,
and the Pusher pushes, the pruned model.

`run_fn` calls, after training:

  prune_trained_model(model, eval_ds, config)   -> (model to evaluate and export, Pruning
                                                or None). Measures each MoE layer's router
                                                load (`models.layers.expert_load`) on the
                                                eval batches the Trainer scores (the first
                                                train.eval_batches of `eval_ds`), keeps the
                                                prune_keep_experts most-routed experts of
                                                each (`select_experts`, `prune_experts`).
  write_pruning_record(export_dir, pruning)     assets.extra/expert_pruning.json in the
                                                SavedModel: `cli/prune.py`'s record (kept
                                                experts and load per MoE layer, tokens).
  pruning_figures(pruning)                      training_summary.json's (and ML Metadata's)
                                                pruned_experts_kept,
                                                n_routed_experts_before, pruning_tokens,
                                                trainer_eval_loss_before_pruning.

The exported SavedModel's config.json and pipeline config say the pruned
n_routed_experts (`export_serving_model` records the exported model's own config), so
`serve`, `evaluate` and `hf-export` rebuild it right. The checkpoints hold the unpruned
trained model (`checkpoint_location.AFTER_TRAINING_TRAIN_FIELDS`): adding the option to a
finished run re-exports without retraining.

Every position of the eval batches is measured: packed windows for pre-training, and
for SFT the padded rows, padding included (its routings are counted as any token's).

Reference: Lu et al. 2024, "Not All Experts are Equal", arXiv 2402.14800.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np

from common.json_file import write_json
from config import PipelineConfig
from savedmodel.layout import EXPERT_PRUNING_ASSET, extra_path

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Pruning:
    """What was pruned and on what.

    Attributes:
      keep: routed experts kept per MoE layer.
      n_routed_experts: routed experts per MoE layer before pruning.
      tokens: positions whose routing was counted (main blocks; B * T per batch).
      seq_len: the length of the measured windows.
      kept: per MoE layer (`model.moe_layers` order), the kept original expert indices.
      load: float64 (num_moe_layers, n_routed_experts), the measured routings.
      eval_loss_before: the Trainer's eval loss (nats/token) of the unpruned model, on
        the same batches as the pruned model's `trainer_eval_loss`: what pruning cost.
    """

    keep: int
    n_routed_experts: int
    tokens: int
    seq_len: int
    kept: list[np.ndarray]
    load: np.ndarray
    eval_loss_before: float

    def record(self) -> dict:
        """`expert_pruning.json`'s content (the format of `deepseek-tfx prune`'s file)."""
        return {"keep": self.keep, "n_routed_experts": self.n_routed_experts,
                "tokens": self.tokens, "seq_len": self.seq_len, "measured_on": "eval split",
                "eval_loss_before": self.eval_loss_before,
                "layers": [{"kept": k.tolist(), "load": row.tolist()}
                           for k, row in zip(self.kept, self.load, strict=True)]}


def prune_trained_model(model, eval_ds, config: PipelineConfig):
    """(the model to evaluate and export, its Pruning), or (model, None) when
    `train.prune_keep_experts` is 0.

    Args:
      model: the trained DeepSeekCausalLM or DeepSeekV4CausalLM (the plain copy `run_fn`
        exports); a V4 model's hash layers keep valid `tid2eid` rows
        (`models/deepseek_v4/expert_pruning.py`).
      eval_ds: the Trainer's eval dataset (batches with "input_ids" int32 (B, T)).
      config: the run's config.

    Raises:
      ValueError: no eval batch to measure on; a keep `select_experts` refuses (the
        config refuses it first).
    """
    keep = config.train.prune_keep_experts
    if not keep:
        return model, None
    from components.trainer.train_loop import evaluate
    from models import families
    from models.layers.expert_load import expert_load

    # The family's expert_pruning (V4's: hash layers keep a valid tid2eid).
    pruning = families.family_of(model.config).module("expert_pruning")
    prune_experts, select_experts = pruning.prune_experts, pruning.select_experts

    batches = [batch["input_ids"] for batch in eval_ds.take(config.train.eval_batches)]
    if not batches:
        raise ValueError(f"train.prune_keep_experts={keep}: the eval split has no batch to "
                         "measure the router load on")
    load = expert_load(model, batches)  # (M, E)
    before = model.config.n_routed_experts
    pruning = Pruning(keep=int(keep), n_routed_experts=before,
                      tokens=int(sum(int(np.prod(b.shape)) for b in batches)),
                      seq_len=int(batches[0].shape[1]),
                      kept=select_experts(model.config, keep, load), load=load,
                      eval_loss_before=evaluate(model, eval_ds, config.train.eval_batches)[0])
    pruned = prune_experts(model, keep, load)
    log.info("experts pruned: %d -> %d per MoE layer (router load on %d eval tokens); "
             "eval loss before pruning %.4f nats/token", before, keep, pruning.tokens,
             pruning.eval_loss_before)
    return pruned, pruning


def write_pruning_record(export_dir: str, pruning: Pruning | None) -> None:
    """Writes `assets.extra/expert_pruning.json` into the exported SavedModel (nothing
    without pruning)."""
    if pruning is not None:
        write_json(extra_path(export_dir, EXPERT_PRUNING_ASSET), pruning.record())


def pruning_figures(pruning: Pruning | None) -> dict:
    """training_summary.json's pruning figures ({} without pruning)."""
    if pruning is None:
        return {}
    return {"pruned_experts_kept": pruning.keep,
            "n_routed_experts_before": pruning.n_routed_experts,
            "pruning_tokens": pruning.tokens,
            "trainer_eval_loss_before_pruning": pruning.eval_loss_before}
