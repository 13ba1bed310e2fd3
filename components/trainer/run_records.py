"""The records of a training run (`train_loop.py`): what `train_loop.setup` builds
(`TrainingState`), and what a finished run returns (`TrainResult`, made by
`train_result`; the dtypes of its parts: `precision_parts`).
"""

from __future__ import annotations

import dataclasses

import keras
import tensorflow as tf

from components.trainer import metrics, trainable
from components.trainer import precision as precision_lib
from components.trainer.checkpointer import Checkpointer
from config import PipelineConfig
from models.deepseek import DeepSeekCausalLM


@dataclasses.dataclass
class TrainingState:
    """What `setup` builds in the strategy's scope."""

    model: DeepSeekCausalLM
    selection: trainable.Selection
    optimizer: keras.optimizers.Optimizer
    step: tf.Variable
    teacher: DeepSeekCausalLM | None
    skipped: tf.Variable  # steps skipped (not finite) so far: batches consumed = step + skipped
    source_tokens: tf.Variable | None = None  # int64 [S]: tokens trained per source
    source_sequences: tf.Variable | None = None  # int64 [S]: sequences drawn per source
    reference: DeepSeekCausalLM | None = None  # DPO, GRPO: the frozen base model


@dataclasses.dataclass
class TrainResult:
    """What a training run did. `figures()` is the JSON-able part."""

    model: DeepSeekCausalLM
    train_steps: int
    resumed_from_step: int
    steps_run: int
    tokens_seen: int
    train_wall_s: float
    tokens_per_second: float
    steady_tokens_per_second: float
    mfu: float
    steady_mfu: float
    final_loss: float
    history: list[dict]  # the whole run's window records, from step 1 across restarts
    strategy: str
    num_replicas: int
    num_workers: int
    precision: str
    global_batch_size: int
    per_replica_batch_size: int
    grad_accum_steps: int
    flops_per_token: int
    peak_flops: float
    checkpoint_dir: str
    last_checkpoint: str | None
    trainable_params: int = 0
    total_params: int = 0
    base_model: str = ""
    teacher_model: str = ""
    jit_compile: bool = False
    moe_capacity_factor: float = 0.0
    moe_dropped_fraction: float = 0.0
    skipped_steps: int = 0
    frozen_weights_dtype: str = "none"
    trainable_weights_dtype: str = "float32"
    optimizer_states_dtype: str = "float32"
    compute_dtype: str = "float32"
    source_weights: dict = dataclasses.field(default_factory=dict)
    source_tokens: dict = dataclasses.field(default_factory=dict)
    source_token_shares: dict = dataclasses.field(default_factory=dict)
    # V4 from scratch: how the hash layers' tid2eid were built (`hash_tables.build_tid2eid`).
    tid2eid: dict = dataclasses.field(default_factory=dict)
    source_sequences: dict = dataclasses.field(default_factory=dict)
    stopped_early: str = ""

    def figures(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}


def train_result(config: PipelineConfig, plan, state: TrainingState, resumed_from: int,
                 step: int, window: metrics.MetricWindow, clock: metrics.RunClock,
                 checkpoints: Checkpointer, base_model: str, teacher_model: str) -> TrainResult:
    """The `TrainResult` of a finished run (`clock` stopped) that ended at `step`
    (`train.train_steps`, or fewer when the data ran out); `plan`: its
    `train_loop.RunPlan`."""
    tc = config.train
    tokens_per_step = tc.batch_size * tc.seq_len
    steps_run = step - resumed_from
    return TrainResult(
        model=state.model, train_steps=step, resumed_from_step=resumed_from,
        steps_run=steps_run, tokens_seen=step * tokens_per_step,
        **clock.figures(steps_run, tokens_per_step, plan.flops_per_token, plan.peak_flops),
        final_loss=window.final_loss, history=window.history, **dataclasses.asdict(plan),
        checkpoint_dir=checkpoints.checkpoint_dir, last_checkpoint=checkpoints.final(),
        trainable_params=state.selection.trainable_params,
        total_params=state.selection.total_params, base_model=base_model,
        teacher_model=teacher_model, moe_dropped_fraction=window.run_dropped_fraction,
        skipped_steps=int(state.skipped.numpy()), **precision_parts(state))


def precision_parts(state: TrainingState) -> dict[str, str]:
    """The dtype of each part of the trained model (`precision.dtype_breakdown`):
    `frozen_weights_dtype` (the weights not trained; "none" when all train),
    `trainable_weights_dtype`, `optimizer_states_dtype` (the slots, e.g. AdamW's
    moments; not its step counter), `compute_dtype` (the matmuls')."""
    trained = {id(v) for v in state.selection.variables}
    frozen = [v for v in state.model.weights if id(v) not in trained]
    slots = [v for v in state.optimizer.variables if len(v.shape) > 0]
    return {
        "frozen_weights_dtype": precision_lib.dtype_breakdown(frozen),
        "trainable_weights_dtype": precision_lib.dtype_breakdown(state.selection.variables),
        "optimizer_states_dtype": precision_lib.dtype_breakdown(slots),
        "compute_dtype": state.model.compute_dtype,
    }
