"""The outer training loop (the step is `train_step.py`): setup, then steps until done.

A custom loop rather than `model.fit`: Keras 3's `fit` fails under
MultiWorkerMirroredStrategy on TF 2.16 (see the project notes), and training
needs the router-bias update (DeepSeek-V3 §2.1.2), which is not a gradient step.

Setup (`setup`): the model is built in the strategy's scope; a base model's
weights (warm start: `base_model`, a SavedModel or Hugging Face directory) are
copied in unless a checkpoint is resumed; `trainable.prepare` applies
`train.trainable` and LoRA; the optimizer (a fresh AdamW with the run's own
warmup and decay) is built on the trained variables only; a teacher
(distillation) is loaded in the same scope.

The loop (`train`; the steps' loop: `step_loop.py`), as nanoGPT's train.py and
torchtitan's `Trainer.train`:

    restore the latest checkpoint, if any               checkpointer.py
    while step < train.train_steps:
        out = train_step(batches)                       train_step.py
        not finite: skip (nothing changed), count it    finite_guard.py
        add out to the logging window; progress bar     metrics.py, progress.py
        every log_every steps (and after the first):
            check the losses; log line; TensorBoard     progress.py, summaries.py
        every checkpoint_every steps (and at the end):
            check losses and weights; checkpoint        finite_guard.py, checkpointer.py
    before each step: heartbeat; on SIGTERM (any worker)  heartbeat.py, preemption.py
        checkpoint this step, raise Preempted

Checkpoints (model, optimizer, step, skipped steps) are written every
`checkpoint_every` steps and at the end, by the chief only (`checkpointer.py`),
only when every loss since the last check and every weight is finite. After
`train.max_skipped_steps` consecutive skipped steps, or a non-finite loss or
weight, training stops with FloatingPointError; the checkpoints already written
are kept.

The data position is not stored: a resumed run skips the global batches
already drawn (`data.distribute_global_batches`): the steps done plus the
skipped ones (`skipped_steps`, checkpointed).

Mixtures (issue 28, `mixture.py`): the tokens trained and sequences drawn per source
are counted on the global batch (`train_step`'s all-reduced counts, `metrics.SourceCounts`),
logged with each window (the log line, `data/token_share/<source>` in TensorBoard),
checkpointed (so a resumed run's totals are an uninterrupted run's) and returned
(`source_tokens`, `source_token_shares`, `source_sequences`). With
`train.on_source_exhausted="stop"` the stream may end before `train.train_steps`:
training then ends at the last full global batch, checkpointed there, and the result
says so (`stopped_early`). With "repeat" a stream that ends is an error, as before.

XLA (`train.jit_compile`, `resolve_jit_compile`): the step is compiled and the
MoE layers use the static-capacity dispatch; the dropped fraction of (token,
expert) pairs is logged (`moe_dropped_fraction`).

The log lines of the loop (this module's logger) and the progress bar:
`progress.py`; the figures of a logging window and of the run: `metrics.py`;
TensorBoard (chief): `summaries.py`; the model copies that leave training:
`model_io.py`; the state `setup` builds and the result `train` returns:
`run_records.py`.
"""

from __future__ import annotations

import dataclasses
import logging

import keras
import tensorflow as tf

from components.trainer import data, hash_tables, metrics, mixture, preference_objectives, trainable
from components.trainer import precision as precision_lib
from components.trainer import strategy as strategy_lib
from components.trainer.checkpointer import Checkpointer
from components.trainer.model_io import build_model
from components.trainer.run_records import TrainingState, TrainResult, train_result
from components.trainer.schedule import make_learning_rate_schedule, make_optimizer
from components.trainer.step_loop import StepLoop
from components.trainer.summaries import TrainSummaries
from components.trainer.train_step import make_train_step
from config import PipelineConfig
from models import families
from models.deepseek import DeepSeekCausalLM
from savedmodel import base_model as base_model_lib

log = logging.getLogger(__name__)
PREFERENCE_TASKS = ("dpo", "grpo")  # from a base model, which is also the frozen reference


def setup(config: PipelineConfig, strategy, precision: str, *, warm_start: bool,
          base_model: str = "", teacher_model: str = "", num_sources: int = 1) -> TrainingState:
    """Model (base weights when `warm_start`), trained variables, optimizer, step, teacher,
    and the per-source counters (int64 [num_sources]).

    Raises:
      ValueError: the base model's or teacher's config does not fit `config.model`
        (naming the fields), or `train.trainable` picks nothing.
    """
    tc = config.train
    keras.utils.set_random_seed(tc.seed)
    with strategy.scope():
        if warm_start and base_model:  # one model: the base's tensors cast into it as they load
            _check_same_architecture(config, base_model_lib.read_model_config(base_model),
                                     base_model, "base model")
            model = base_model_lib.load_model(base_model, dtype=precision)
            log.info("warm start: weights from %s (stored %s, trained in %s)", base_model,
                     base_model_lib.weight_dtype(base_model), precision)
        else:
            model = build_model(config, dtype=precision)
        selection = trainable.prepare(model, tc)
        if config.data.task in PREFERENCE_TASKS:
            selection = trainable.without_indexers(model, trainable.without_mtp(model, selection))
        optimizer = make_optimizer(tc, selection.variables, loss_scale=precision == "mixed_float16")
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        source_tokens = tf.Variable(tf.zeros([num_sources], tf.int64), trainable=False,
                                    name="source_tokens")
        source_sequences = tf.Variable(tf.zeros([num_sources], tf.int64), trainable=False,
                                       name="source_sequences")
        teacher = None
        if teacher_model:
            teacher = base_model_lib.load_model(teacher_model)
            if teacher.config.vocab_size != config.model.vocab_size:
                raise ValueError(
                    f"teacher {teacher_model} has vocab_size={teacher.config.vocab_size}, the "
                    f"student {config.model.vocab_size}: distillation needs the same tokenizer")
            log.info("teacher: %s (%d parameters)", teacher_model, teacher.count_params())
        reference = None
        if config.data.task in PREFERENCE_TASKS:
            if not base_model:
                raise ValueError(f"data.task={config.data.task} starts from a base model (usually "
                                 "an SFT model), which is also the frozen reference policy: "
                                 "give --base-model latest|PATH")
            reference = base_model_lib.load_model(base_model, dtype=precision)
            reference.trainable = False
            log.info("reference policy (frozen): %s", base_model)
    log.info("trainable parameters: %d of %d (%.2f%%; train.trainable=%s, lora_rank=%d)",
             selection.trainable_params, selection.total_params,
             100.0 * selection.trainable_params / selection.total_params, tc.trainable,
             tc.lora_rank)
    return TrainingState(model, selection, optimizer, step, teacher, skipped, source_tokens,
                         source_sequences, reference)


def _check_same_architecture(config: PipelineConfig, other, source: str, what: str) -> None:
    """Raises ValueError naming the fields where `other` (a DeepSeekConfig) differs."""
    mine, theirs = config.model.to_dict(), other.to_dict()
    differ = [f"{k}: {theirs.get(k)!r} in the {what}, {v!r} in this run"
              for k, v in mine.items() if theirs.get(k) != v]
    if differ:
        raise ValueError(f"{what} {source} has another architecture: " + "; ".join(differ))


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """How a run's global batch and step are laid out on its strategy (fields named as
    in `TrainResult`).

    Attributes:
      strategy: `strategy.describe` of the strategy, e.g. "OneDevice".
      num_replicas, num_workers: replicas in sync, and the worker processes they are on.
      precision: the Keras dtype policy.
      global_batch_size: sequences per optimizer step (`train.batch_size`) =
        grad_accum_steps x num_replicas x per_replica_batch_size.
      per_replica_batch_size, grad_accum_steps: sequences per micro-batch on a
        replica, and micro-batches per step.
      flops_per_token: training FLOPs per token (`flops.flops_per_token`).
      peak_flops: peak FLOP/s of all the hardware taking part (0: no MFU).
      jit_compile: whether the step is XLA-compiled (`resolve_jit_compile`).
      moe_capacity_factor: the MoE capacity factor under XLA, 0.0 without it
        (dropless dispatch).
    """

    strategy: str
    num_replicas: int
    num_workers: int
    precision: str
    global_batch_size: int
    per_replica_batch_size: int
    grad_accum_steps: int
    flops_per_token: int
    peak_flops: float
    jit_compile: bool
    moe_capacity_factor: float

    @classmethod
    def make(cls, config: PipelineConfig, strategy: tf.distribute.Strategy, precision: str,
             peak_flops: float) -> RunPlan:
        """The plan of `config` on `strategy`.

        Raises:
          ValueError: `train.batch_size` does not split into grad_accum_steps x
            replicas equal parts.
        """
        tc = config.train
        replicas, micro = strategy.num_replicas_in_sync, tc.grad_accum_steps
        if tc.batch_size % (micro * replicas):
            raise ValueError(
                f"train.batch_size={tc.batch_size} must be divisible by grad_accum_steps "
                f"({micro}) x replicas ({replicas})"
            )
        jit = resolve_jit_compile(tc.jit_compile)
        return cls(strategy_lib.describe(strategy), replicas, strategy_lib.num_workers(strategy),
                   precision, tc.batch_size, tc.batch_size // (micro * replicas), micro,
                   families.family_of(config.model).flops_per_token(config.model, tc.seq_len),
                   peak_flops, jit,
                   tc.moe_capacity_factor if jit else 0.0)

    def log(self, seq_len: int) -> None:
        """Logs the plan (one line)."""
        log.info(
            "strategy %s: %d replica(s) on %d worker(s); global batch %d sequences = %d "
            "micro-batch(es) x %d replica(s) x %d per replica (x %d tokens = %d tokens/step); "
            "precision %s; learning-rate schedule in steps of the global batch; XLA %s",
            self.strategy, self.num_replicas, self.num_workers, self.global_batch_size,
            self.grad_accum_steps, self.num_replicas, self.per_replica_batch_size, seq_len,
            self.global_batch_size * seq_len, self.precision,
            f"on (MoE capacity factor {self.moe_capacity_factor})" if self.jit_compile
            else "off (dropless MoE dispatch)",
        )


def train(config: PipelineConfig, dataset_fn, checkpoint_dir: str, log_dir: str | None,
          strategy: tf.distribute.Strategy | None = None, precision: str = "float32",
          peak_flops: float = 0.0, base_model: str = "", teacher_model: str = "",
          source_names: list[str] | None = None, tokenizer=None) -> TrainResult:
    """Trains `config.model` until `config.train.train_steps` optimizer steps are done
    (or, with `train.on_source_exhausted="stop"`, until the data ends).

    Args:
      config: the pipeline config (model + train sections are used).
      dataset_fn: () -> infinite dataset of global batches {"input_ids", "labels"}:
        int32 [train.batch_size, train.seq_len], and optionally "source": int32
        [train.batch_size], each sequence's index in `source_names`; deterministic
        (called once per input pipeline; a resumed run skips batches of it). Labels
        < 0 are not targets. Finite only with `train.on_source_exhausted="stop"`.
      checkpoint_dir: checkpoints are restored from and (chief) written to it.
      log_dir: TensorBoard event directory (chief), or None for none.
      strategy: a tf.distribute strategy (default: the current/default one).
      precision: Keras dtype policy ("float32", "mixed_bfloat16", "mixed_float16");
        with a bf16 `base_model` and LoRA it becomes "bfloat16"
        (`precision.model_policy`).
      peak_flops: peak FLOP/s of all the hardware taking part, for MFU (0: MFU is 0).
      base_model: a directory to warm-start from (`base_model.py`) when no checkpoint
        exists yet; "" for random weights.
      teacher_model: a directory holding a teacher for distillation, or "".
      source_names: the sources a batch's "source" indexes (default: the names of
        `config.data.source_weights()`, sorted: `mixture.source_names`).
      tokenizer: GRPO only: the run's `ByteLevelBpe` (completions are decoded and
        rewarded as text).

    Tasks: `data.task` "pretrain" and "sft" train the language-model loss; "dpo" the DPO
    loss on pairs and "grpo" GRPO on completions sampled in the loop (`grpo.py`), both
    against `base_model` as the frozen reference (`preference_objectives.py`).

    Returns:
      TrainResult with the trained model (its variables belong to `strategy`).

    Raises:
      ValueError: the global batch does not split over replicas and micro-batches;
        a base model or teacher that does not fit (see `setup`).
      FloatingPointError: the loss or a weight became NaN or Inf, or too many steps
        in a row were skipped (checkpoints written before are kept).
      Preempted: SIGTERM reached this process or another worker; the step reached
        was checkpointed first (`preemption.py`).
      tf.errors.OutOfRangeError: the data ended with `train.on_source_exhausted="repeat"`.
    """
    tc = config.train
    weights = config.data.source_weights()
    names = list(source_names) if source_names else mixture.source_names(weights)
    strategy = strategy or tf.distribute.get_strategy()
    if base_model:  # LoRA on a bf16 base keeps it bf16 (as `job.plan` decides too)
        precision, _ = precision_lib.model_policy(
            precision, "", base_model_lib.weight_dtype(base_model), tc)
    plan = RunPlan.make(config, strategy, precision, peak_flops)
    checkpoints = Checkpointer(checkpoint_dir, chief=strategy_lib.is_chief(strategy))
    state = setup(config, strategy, precision, warm_start=checkpoints.latest is None,
                  base_model=base_model, teacher_model=teacher_model, num_sources=len(names))
    run, resumed_from, tid2eid = _start(config, plan, strategy, state, checkpoints, dataset_fn,
                                        names, log_dir, base_model, tokenizer)
    run.loop(strategy, plan.num_workers)
    run.clock.stop()
    run.tensorboard.flush()
    checkpoints.close()
    sources = run.sources
    sources.sync()
    result = train_result(config, plan, state, resumed_from, run.step, run.window, run.clock,
                          checkpoints, base_model, teacher_model)
    return dataclasses.replace(
        result, source_weights=weights if set(weights) == set(names) else {},
        source_tokens=sources.token_counts(), source_token_shares=sources.shares(),
        source_sequences=sources.sequence_counts(), stopped_early=run.stopped_early,
        tid2eid=tid2eid)


def _start(config: PipelineConfig, plan: RunPlan, strategy, state: TrainingState,
           checkpoints: Checkpointer, dataset_fn, names: list[str], log_dir: str | None,
           base_model: str, tokenizer) -> tuple[StepLoop, int, dict]:
    """Restores the latest checkpoint (if any) into `state` and readies the loop: V4's
    hash tables from scratch, the step, the batches after those already drawn, the
    logging window, TensorBoard and the clock. Arguments as `train`'s (`names`: the
    sources).

    Returns:
      (the `StepLoop`, the step resumed from (0: a fresh run), how V4's hash layers'
      tid2eid were built ({}: not built)).
    """
    tc = config.train
    # The history's records, checkpointed with the run. Not under the strategy's scope: a
    # string is not broadcast between workers (each holds the same records).
    stored_history = tf.Variable("[]", dtype=tf.string, trainable=False, name="history")
    step = resumed_from = checkpoints.restore(
        state.model, state.optimizer, state.step, state.skipped,
        {"source_tokens": state.source_tokens, "source_sequences": state.source_sequences,
         "history": stored_history})
    if checkpoints.latest:
        log.info("resumed from %s (step %d)", checkpoints.latest, resumed_from)
    tid2eid = {}
    if checkpoints.latest is None and not base_model:  # from scratch: V4's hash tables
        tid2eid = hash_tables.build_tid2eid(state.model, dataset_fn, tc.seed) or {}
    plan.log(tc.seq_len)
    consumed = step + int(state.skipped.numpy())
    train_step, figure_names = _make_step(config, plan, strategy, state, len(names),
                                          tokenizer=tokenizer, consumed=consumed)
    sources = metrics.SourceCounts(names, state.source_tokens, state.source_sequences)
    # Skipped steps consumed their batch too: resume after every batch already drawn
    # (GRPO: one batch of prompts per train.grpo_inner_steps steps).
    per_batch = tc.grpo_inner_steps if config.data.task == "grpo" else 1
    batches = iter(data.distribute_global_batches(
        strategy, dataset_fn, plan.grad_accum_steps, skip_steps=consumed // per_batch))
    window = metrics.MetricWindow(make_learning_rate_schedule(tc), tc.batch_size * tc.seq_len,
                                  plan.flops_per_token, plan.peak_flops, figure_names)
    window.resume(stored_history)
    tensorboard = TrainSummaries(log_dir if checkpoints.chief else None, state.model)
    return StepLoop(config, state, checkpoints, train_step, batches, sources, window,
                    tensorboard, metrics.RunClock(), log, step), resumed_from, tid2eid


def _make_step(config: PipelineConfig, plan: RunPlan, strategy, state: TrainingState,
               num_sources: int, tokenizer=None, consumed: int = 0):
    """(step, figure names): `train_step.make_train_step` for this run, with the task's
    objective; for GRPO wrapped in a `grpo.GRPOStep` (sampling and rewards)."""
    tc = config.train
    task = config.data.task
    forward_kwargs = ({"moe_capacity_factor": plan.moe_capacity_factor}
                      if plan.jit_compile and state.model.num_moe_layers else {})
    objective = None
    if task == "dpo":
        objective = preference_objectives.DPOObjective(
            state.model, state.reference, tc.dpo_beta, tc.recompute_activations, forward_kwargs)
    elif task == "grpo":
        objective = preference_objectives.GRPOObjective(
            state.model, state.reference, tc.grpo_group_size, tc.grpo_clip_epsilon,
            tc.grpo_kl_beta, tc.recompute_activations, forward_kwargs)
    step = make_train_step(
        state.model, state.optimizer, state.selection.variables, strategy,
        micro_batches=plan.grad_accum_steps, grad_clip_norm=tc.grad_clip_norm,
        recompute=tc.recompute_activations, loss_scaling=plan.precision == "mixed_float16",
        teacher=state.teacher, distill_alpha=tc.distill_alpha,
        distill_temperature=tc.distill_temperature, moe_mask=state.selection.moe_mask,
        step_counter=state.step, jit_compile=plan.jit_compile,
        moe_capacity_factor=plan.moe_capacity_factor if plan.jit_compile else None,
        num_sources=num_sources, objective=objective)
    names = objective.figure_names if objective is not None else ()
    if task != "grpo":
        return step, names
    if tokenizer is None:
        raise ValueError("data.task=grpo needs the run's tokenizer (train(..., tokenizer=))")
    from components.trainer.grpo import GRPOStep
    from components.trainer.rewards import Reward

    reward = Reward(tc.grpo_rewards, tc.reward_module_file)
    return GRPOStep(state.model, strategy, step, tokenizer, reward, config,
                    micro_batches=plan.grad_accum_steps, eos_id=tokenizer.eos_id,
                    pad_id=tokenizer.pad_id, consumed=consumed), names


def resolve_jit_compile(setting: str, accelerator=None) -> bool:
    """`train.jit_compile` for this machine (`accelerator`, a `hardware.Accelerator`;
    detected when None): "true"/"false", or "auto" = on for GPUs and TPUs, off on CPUs
    (where XLA measured slower: `benchmarks/train_throughput.py`,
    docs/benchmarks/train-throughput.md)."""
    if setting == "auto":
        from components.trainer import hardware

        return (accelerator or hardware.detect()).kind in ("gpu", "tpu")
    return setting == "true"


def evaluate(model: DeepSeekCausalLM, eval_dataset: tf.data.Dataset, max_batches: int) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats/token) over up to `max_batches` batches, and the
    number of target tokens (labels < 0, e.g. SFT prompts and padding, are not targets)."""
    from models.layers.losses import token_cross_entropy_sum

    @tf.function
    def eval_step(batch):
        logits = model(batch["input_ids"], training=False)
        return token_cross_entropy_sum(logits, batch["labels"])

    total, count = 0.0, 0.0
    for i, batch in enumerate(eval_dataset):
        if i >= max_batches:
            break
        s, n = eval_step(batch)
        total, count = total + float(s), count + float(n)
    return total / max(count, 1.0), int(count)
