"""The TensorBoard summaries of a training run (the chief's; other workers write none).

At the end of each logging window (`metrics.MetricWindow`), at its last step:

    train/<name>                      scalars: the loss terms, grad_norm, learning_rate,
                                      tokens_per_second, mfu, moe_dropped_fraction,
                                      skipped_steps (a NaN one, e.g. the first
                                      window's tokens/s, is left out)
    moe/<layer>/load_max_over_mean    scalar: the busiest expert's load over the mean
                                      (1.0 = balanced; 0 when nothing was routed)
    moe/<layer>/expert_load           tensor: float32 [n_routed_experts], the tokens
                                      routed to each expert in the window (the run
                                      report's heatmap)
    router_bias/<layer>/min|max|mean_abs   the router's bias b (DeepSeek-V3 §2.1.2)
    data/token_share/<source>         scalar: the source's share of the tokens trained so
                                      far (a record's "token_share"; issue 28)
    data/tokens/<source>              scalar: its tokens trained so far

<layer> is the name of the block holding the MoE layer (a decoder block, or an
MTP module), in the order of the step's `expert_load` rows.
"""

from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from components.trainer.train_step import LOSS_TERMS
from models.deepseek import DeepSeekCausalLM

SCALARS = (*LOSS_TERMS, "grad_norm", "learning_rate", "tokens_per_second", "mfu",
           "moe_dropped_fraction", "skipped_steps")


def moe_block_names(model: DeepSeekCausalLM) -> list[str]:
    """The name of the block (or MTP module) of each MoE layer, in `expert_load` row order."""
    blocks = [b for b in model.decoder_layers if b.is_moe]
    return [layer.name for layer in blocks + [m for m in model.mtp_layers if m.block.is_moe]]


class TrainSummaries:
    """Writes a run's summaries to `log_dir` (None: writes nothing).

    Args:
      log_dir: the TensorBoard event directory, or None (other workers than the
        chief, or no TensorBoard).
      model: the model trained (its MoE layers and router biases).
    """

    def __init__(self, log_dir: str | None, model: DeepSeekCausalLM):
        self.model = model
        self.moe_names = moe_block_names(model)
        self.writer = (tf.summary.create_file_writer(log_dir) if log_dir
                       else tf.summary.create_noop_writer())

    def write(self, record: dict, load: np.ndarray) -> None:
        """The summaries of a window: its `record` (`MetricWindow.close`; written at
        `record["step"]`) and its expert load, float32 [M, E] on the host."""
        with self.writer.as_default(step=record["step"]):
            for key in SCALARS:
                if math.isfinite(record[key]):
                    tf.summary.scalar(f"train/{key}", record[key])
            for name, value in record.get("figures", {}).items():  # DPO, GRPO
                tf.summary.scalar(f"train/{name}", value)
            for name, share in record.get("token_share", {}).items():
                tf.summary.scalar(f"data/token_share/{name}", share)
                tf.summary.scalar(f"data/tokens/{name}", record["source_tokens"][name])
            self._write_moe(load)

    def _write_moe(self, load: np.ndarray) -> None:
        for name, layer_load, moe in zip(self.moe_names, load, self.model.moe_layers,
                                         strict=True):
            mean = float(layer_load.mean())
            tf.summary.scalar(f"moe/{name}/load_max_over_mean",
                              float(layer_load.max()) / mean if mean > 0 else 0.0)
            tf.summary.write(f"moe/{name}/expert_load", layer_load.astype(np.float32))
            if moe.gate.e_score_correction_bias is None:  # DeepSeek-V2 routers: no bias
                continue
            bias = moe.gate.e_score_correction_bias.numpy()
            tf.summary.scalar(f"router_bias/{name}/min", float(bias.min()))
            tf.summary.scalar(f"router_bias/{name}/max", float(bias.max()))
            tf.summary.scalar(f"router_bias/{name}/mean_abs", float(np.abs(bias).mean()))

    def flush(self) -> None:
        """Writes what is buffered to disk."""
        self.writer.flush()
