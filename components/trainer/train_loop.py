"""The outer training loop: setup, checkpoints, logs, progress (the step is `train_step.py`).

A custom loop rather than `model.fit`: Keras 3's `fit` fails under
MultiWorkerMirroredStrategy on TF 2.16 (see the project notes), and training
needs the router-bias update (DeepSeek-V3 §2.1.2), which is not a gradient step.

Setup (`train`): the model is built in the strategy's scope; a base model's
weights (warm start: `base_model`, a SavedModel or Hugging Face directory) are
copied in unless a checkpoint is resumed; `trainable.prepare` applies
`train.trainable` and LoRA; the optimizer (a fresh AdamW with the run's own
warmup and decay) is built on the trained variables only; a teacher
(distillation) is loaded in the same scope.

Checkpoints (model, optimizer, step) are written every `checkpoint_every`
steps and at the end, by the chief only (other workers write to a temporary
directory, as TensorFlow's multi-worker guide prescribes, since saving may run
collectives); every worker restores from the chief's directory. A checkpoint
is written only when every loss since the last one and every weight is finite.
A step whose loss or gradients are not finite changes nothing (`train_step.py`)
and is skipped and counted (log line, TensorBoard `train/skipped_steps`, the
run's figures); after `train.max_skipped_steps` consecutive skips training
stops with FloatingPointError; the checkpoints already written are kept.

The data position is not stored: a resumed run skips the global batches
already drawn (`data.distribute_global_batches`): the steps done plus the
skipped ones (`skipped_steps`, checkpointed).

XLA (`train.jit_compile`, `resolve_jit_compile`): the step is compiled and the
MoE layers use the static-capacity dispatch; the dropped fraction of (token,
expert) pairs is logged (`moe_dropped_fraction`).

TensorBoard (chief): loss terms, learning rate, grad norm, tokens/s, MFU, per
MoE layer the expert load max/mean over the logging window, the load itself
(`moe/<layer>/expert_load`: a float32 [n_routed_experts] tensor summary, the
(token, expert) pairs routed to each expert in the window; the run report's
heatmap), and router-bias min/max/mean |b|.

Progress (chief): a log line after the first step and every `log_every` steps,
always; in a terminal, also a progress bar (tqdm) with step/total, loss and
tokens/s, refreshed at most every `PROGRESS_INTERVAL_S` (`progress_enabled`:
not when neither stderr nor stdout is a terminal, e.g. a log file or a
notebook, nor when `CI` is set; `DEEPSEEK_TFX_PROGRESS=1`/`0` forces it
on/off). The bar draws on stderr, or on stdout when only stdout is a terminal
(`progress_stream`: the CLI sends stderr to its log file and keeps stdout on
the console). It reads the loss at most that often, so the steps between
refreshes run as without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import shutil
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf
from tqdm import tqdm

from components.trainer import data, trainable
from components.trainer import strategy as strategy_lib
from components.trainer.schedule import make_learning_rate_schedule, make_optimizer
from components.trainer.train_step import LOSS_TERMS, make_train_step
from config import PipelineConfig
from models.deepseek import DeepSeekCausalLM, flops
from savedmodel import base_model as base_model_lib

log = logging.getLogger(__name__)

PROGRESS_ENV = "DEEPSEEK_TFX_PROGRESS"
PROGRESS_INTERVAL_S = 1.0


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
    history: list[dict]
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

    def figures(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}


def build_model(config: PipelineConfig, dtype: str = "float32") -> DeepSeekCausalLM:
    """The model with its weights created (the constructor builds them)."""
    return DeepSeekCausalLM(config.model, dtype=dtype)


def progress_stream():
    """The stream the progress bar draws on: stderr when it is a terminal, else stdout
    when that is one (the CLI keeps stdout on the terminal and sends stderr to its
    log file), else stderr."""
    for stream in (sys.stderr, sys.stdout):
        try:
            if stream is not None and stream.isatty():
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return sys.stderr


def progress_enabled(stream=None) -> bool:
    """Whether to draw a progress bar on `stream` (default `progress_stream()`).

    `DEEPSEEK_TFX_PROGRESS=1` or `0` decides; otherwise only on a terminal and
    when `CI` is unset or empty (CI logs get the periodic log lines only).

    Raises:
      ValueError: `DEEPSEEK_TFX_PROGRESS` is set to something else.
    """
    forced = os.environ.get(PROGRESS_ENV, "").strip()
    if forced:
        if forced not in ("0", "1"):
            raise ValueError(f"{PROGRESS_ENV}={forced!r}: expected 1 (progress bar) or 0 (none)")
        return forced == "1"
    if os.environ.get("CI", "").strip():
        return False
    stream = progress_stream() if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _Progress:
    """The terminal progress bar of a training run (a no-op when disabled)."""

    def __init__(self, total: int, initial: int, tokens_per_step: int, enabled: bool,
                 stream=None):
        self.tokens_per_step = tokens_per_step
        self.stream = progress_stream() if stream is None else stream
        self.bar = tqdm(total=total, initial=initial, unit="step", desc="train",
                        file=self.stream, dynamic_ncols=True, mininterval=PROGRESS_INTERVAL_S,
                        disable=not enabled)
        self.last_time, self.last_step = time.perf_counter(), initial

    def step(self, step: int, loss: tf.Tensor) -> None:
        """After optimizer step `step`; reads `loss` only when the postfix is refreshed."""
        if self.bar.disable:
            return
        now = time.perf_counter()
        if now - self.last_time >= PROGRESS_INTERVAL_S or step == self.bar.total:
            tps = (step - self.last_step) * self.tokens_per_step / (now - self.last_time)
            self.bar.set_postfix_str(f"loss {float(loss):.4f}, {tps:,.0f} tok/s", refresh=False)
            self.last_time, self.last_step = now, step
        self.bar.update(1)

    def log(self, *args) -> None:
        """`log.info(*args)`, with the bar cleared while the line is written."""
        with self.suspended():
            log.info(*args)

    def suspended(self):
        """A context in which the bar is cleared (for other writers to the terminal)."""
        if self.bar.disable:
            return contextlib.nullcontext()
        return tqdm.external_write_mode(file=self.stream)

    def close(self) -> None:
        self.bar.close()


def all_finite(tensors) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


@dataclasses.dataclass
class TrainingState:
    """What `setup` builds in the strategy's scope."""

    model: DeepSeekCausalLM
    selection: trainable.Selection
    optimizer: keras.optimizers.Optimizer
    step: tf.Variable
    teacher: DeepSeekCausalLM | None
    skipped: tf.Variable  # steps skipped (not finite) so far: batches consumed = step + skipped


def setup(config: PipelineConfig, strategy, precision: str, *, warm_start: bool,
          base_model: str = "", teacher_model: str = "") -> TrainingState:
    """Model (base weights when `warm_start`), trained variables, optimizer, step, teacher.

    Raises:
      ValueError: the base model's or teacher's config does not fit `config.model`
        (naming the fields), or `train.trainable` picks nothing.
    """
    tc = config.train
    keras.utils.set_random_seed(tc.seed)
    with strategy.scope():
        model = build_model(config, dtype=precision)
        if warm_start and base_model:
            base = base_model_lib.load_model(base_model)
            _check_same_architecture(config, base, base_model, "base model")
            trainable.assign_by_path(model, trainable.merged_values(base))
            log.info("warm start: weights from %s", base_model)
        selection = trainable.prepare(model, tc)
        optimizer = make_optimizer(tc, selection.variables, loss_scale=precision == "mixed_float16")
        step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_steps")
        teacher = None
        if teacher_model:
            teacher = base_model_lib.load_model(teacher_model)
            if teacher.config.vocab_size != config.model.vocab_size:
                raise ValueError(
                    f"teacher {teacher_model} has vocab_size={teacher.config.vocab_size}, the "
                    f"student {config.model.vocab_size}: distillation needs the same tokenizer")
            log.info("teacher: %s (%d parameters)", teacher_model, teacher.count_params())
    log.info("trainable parameters: %d of %d (%.2f%%; train.trainable=%s, lora_rank=%d)",
             selection.trainable_params, selection.total_params,
             100.0 * selection.trainable_params / selection.total_params, tc.trainable,
             tc.lora_rank)
    return TrainingState(model, selection, optimizer, step, teacher, skipped)


def _check_same_architecture(config: PipelineConfig, other: DeepSeekCausalLM, source: str,
                             what: str) -> None:
    mine, theirs = config.model.to_dict(), other.config.to_dict()
    differ = [f"{k}: {theirs.get(k)!r} in the {what}, {v!r} in this run"
              for k, v in mine.items() if theirs.get(k) != v]
    if differ:
        raise ValueError(f"{what} {source} has another architecture: " + "; ".join(differ))


def train(
    config: PipelineConfig,
    dataset_fn,
    checkpoint_dir: str,
    log_dir: str | None,
    strategy: tf.distribute.Strategy | None = None,
    precision: str = "float32",
    peak_flops: float = 0.0,
    base_model: str = "",
    teacher_model: str = "",
) -> TrainResult:
    """Trains `config.model` until `config.train.train_steps` optimizer steps are done.

    Args:
      config: the pipeline config (model + train sections are used).
      dataset_fn: () -> infinite dataset of global batches {"input_ids",
        "labels"}: int32 [train.batch_size, train.seq_len], deterministic
        (called once per input pipeline; a resumed run skips batches of it).
        Labels < 0 are not targets.
      checkpoint_dir: checkpoints are restored from and (chief) written to it.
      log_dir: TensorBoard event directory (chief), or None for none.
      strategy: a tf.distribute strategy (default: the current/default one).
      precision: Keras dtype policy ("float32", "mixed_bfloat16", "mixed_float16").
      peak_flops: peak FLOP/s of all the hardware taking part, for MFU (0: MFU
        is reported as 0).
      base_model: a directory to warm-start from (`base_model.py`): its weights
        are the starting point when no checkpoint exists yet; "" for random.
      teacher_model: a directory holding a teacher for distillation, or "".

    Returns:
      TrainResult with the trained model (its variables belong to `strategy`).

    Raises:
      ValueError: the global batch does not split over replicas and micro-batches;
        a base model or teacher that does not fit (see `setup`).
      FloatingPointError: the loss became NaN or Inf (checkpoints written
        before are kept).
    """
    tc = config.train
    strategy = strategy or tf.distribute.get_strategy()
    replicas = strategy.num_replicas_in_sync
    micro = tc.grad_accum_steps
    if tc.batch_size % (micro * replicas):
        raise ValueError(
            f"train.batch_size={tc.batch_size} must be divisible by grad_accum_steps "
            f"({micro}) x replicas ({replicas})"
        )
    per_replica = tc.batch_size // (micro * replicas)
    chief = strategy_lib.is_chief(strategy)
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    state = setup(config, strategy, precision, warm_start=latest is None,
                  base_model=base_model, teacher_model=teacher_model)
    model, optimizer, step_var = state.model, state.optimizer, state.step
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var,
                                     skipped_steps=state.skipped)
    write_dir = checkpoint_dir if chief else tempfile.mkdtemp(prefix="ckpt-worker-")
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=3)
    resumed_from = 0
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        resumed_from = int(step_var.numpy())
        log.info("resumed from %s (step %d)", latest, resumed_from)
    skipped_before = int(state.skipped.numpy())
    jit = resolve_jit_compile(tc.jit_compile)
    capacity = tc.moe_capacity_factor if jit else None

    tokens_per_step = tc.batch_size * tc.seq_len
    fpt = flops.flops_per_token(config.model, tc.seq_len)
    schedule = make_learning_rate_schedule(tc)
    strategy_name = strategy_lib.describe(strategy)
    workers = strategy_lib.num_workers(strategy)
    log.info(
        "strategy %s: %d replica(s) on %d worker(s); global batch %d sequences = %d micro-batch(es) "
        "x %d replica(s) x %d per replica (x %d tokens = %d tokens/step); precision %s; "
        "learning-rate schedule in steps of the global batch; XLA %s",
        strategy_name, replicas, workers, tc.batch_size, micro, replicas, per_replica,
        tc.seq_len, tokens_per_step, precision,
        f"on (MoE capacity factor {capacity})" if jit else "off (dropless MoE dispatch)",
    )
    train_step = make_train_step(
        model, optimizer, state.selection.variables, strategy, micro_batches=micro,
        grad_clip_norm=tc.grad_clip_norm, recompute=tc.recompute_activations,
        loss_scaling=precision == "mixed_float16", teacher=state.teacher,
        distill_alpha=tc.distill_alpha, distill_temperature=tc.distill_temperature,
        moe_mask=state.selection.moe_mask, step_counter=step_var, jit_compile=jit,
        moe_capacity_factor=capacity)

    @tf.function
    def weights_finite():
        return all_finite([tf.convert_to_tensor(v) for v in model.weights])

    writer = (tf.summary.create_file_writer(log_dir) if chief and log_dir
              else tf.summary.create_noop_writer())
    # Skipped steps consumed their batch too: resume after every batch already drawn.
    dist_ds = data.distribute_global_batches(strategy, dataset_fn, micro,
                                             skip_steps=resumed_from + skipped_before)
    iterator = iter(dist_ds)
    moe_names = [layer.name for layer in _moe_block_names(model)]
    history: list[dict] = []
    pending_losses: list[tuple[int, tf.Tensor]] = []
    window_load = window_dropped = None  # (M, E) routed and (M,) dropped pairs, summed
    dropped_total, pairs_total, consecutive_skips = 0.0, 0.0, 0
    start = time.perf_counter()
    first_step_done = None
    window_start, window_steps = start, 0
    last_terms, last_norm = None, None
    saving_s = 0.0  # checkpoint writing, left out of the steady-state throughput
    step = resumed_from
    stream = progress_stream()
    progress = _Progress(tc.train_steps, resumed_from, tokens_per_step,
                         enabled=chief and progress_enabled(stream), stream=stream)
    try:
        while step < tc.train_steps:
            out = train_step(iterator)
            if bool(out["skipped"]):
                consecutive_skips = _skip(state.skipped, consecutive_skips, tc.max_skipped_steps,
                                          step, out, progress,
                                          manager.latest_checkpoint if chief else latest)
                continue
            consecutive_skips = 0
            terms, grad_norm, load = out["terms"], out["grad_norm"], out["expert_load"]
            step += 1
            window_steps += 1
            progress.step(step, terms[0])
            pending_losses.append((step, terms[0]))
            window_load = load if window_load is None else window_load + load
            dropped = out["moe_dropped"]  # pairs the capacity dropped (0 without XLA)
            window_dropped = dropped if window_dropped is None else window_dropped + dropped
            last_terms, last_norm = terms, grad_norm
            is_first = first_step_done is None
            if is_first:
                terms.numpy()  # the first step includes tracing: time it apart
                first_step_done = time.perf_counter()
            is_log = is_first or step % tc.log_every == 0 or step == tc.train_steps
            is_ckpt = step % tc.checkpoint_every == 0 or step == tc.train_steps
            if not (is_log or is_ckpt):
                continue
            _raise_if_not_finite(pending_losses, manager.latest_checkpoint if chief else latest)
            pending_losses = []
            if is_log:
                now = time.perf_counter()
                load_np = window_load.numpy()  # routed pairs = the load before dropping
                window_pairs, window_drops = float(load_np.sum()), float(window_dropped.numpy().sum())
                timed = window_steps if not is_first else 0  # the first step: tracing
                tps = timed * tokens_per_step / (now - window_start) if timed else float("nan")
                record = {"step": step,
                          **dict(zip(LOSS_TERMS, map(float, last_terms.numpy()), strict=True)),
                          "grad_norm": float(last_norm), "learning_rate": float(schedule(step - 1)),
                          "tokens_per_second": tps,
                          "mfu": flops.mfu(tps, fpt, peak_flops) if peak_flops and timed
                          else float("nan"),
                          "moe_dropped_fraction": (window_drops / window_pairs
                                                   if window_pairs else 0.0),
                          "skipped_steps": int(state.skipped.numpy())}
                history.append(record)
                _log_record(progress, record, tc.train_steps, timed)
                with writer.as_default(step=step):
                    for key in (*LOSS_TERMS, "grad_norm", "learning_rate", "tokens_per_second", "mfu",
                                "moe_dropped_fraction", "skipped_steps"):
                        if math.isfinite(record[key]):
                            tf.summary.scalar(f"train/{key}", record[key])
                    _write_moe_summaries(model, moe_names, load_np)
                window_start, window_steps = time.perf_counter(), 0
                window_load = window_dropped = None
                dropped_total, pairs_total = dropped_total + window_drops, pairs_total + window_pairs
            if is_ckpt:
                if not bool(weights_finite()):
                    raise FloatingPointError(
                        f"a weight is NaN/Inf after step {step}; training stopped (not "
                        f"checkpointed); last good checkpoint: "
                        f"{manager.latest_checkpoint if chief else latest}")
                save_start = time.perf_counter()
                with progress.suspended():  # TensorFlow logs while it saves
                    manager.save(checkpoint_number=step)
                saving_s += time.perf_counter() - save_start
                if is_log:
                    window_start = time.perf_counter()  # tokens/s of the steps, not of the saving
    finally:
        progress.close()
    end = time.perf_counter()
    writer.flush()
    if not chief:
        shutil.rmtree(write_dir, ignore_errors=True)

    steps_run = tc.train_steps - resumed_from
    wall = end - start
    tps = steps_run * tokens_per_step / wall if steps_run else 0.0
    steady_steps = steps_run - 1
    steady_wall = end - first_step_done - saving_s if first_step_done else 0.0
    steady_tps = steady_steps * tokens_per_step / steady_wall if steady_steps > 0 else tps
    return TrainResult(
        model=model,
        train_steps=tc.train_steps,
        resumed_from_step=resumed_from,
        steps_run=steps_run,
        tokens_seen=tc.train_steps * tokens_per_step,
        train_wall_s=wall,
        tokens_per_second=tps,
        steady_tokens_per_second=steady_tps,
        mfu=flops.mfu(tps, fpt, peak_flops) if peak_flops else 0.0,
        steady_mfu=flops.mfu(steady_tps, fpt, peak_flops) if peak_flops else 0.0,
        final_loss=float(last_terms[0]) if last_terms is not None else float("nan"),
        history=history,
        strategy=strategy_name,
        num_replicas=replicas,
        num_workers=workers,
        precision=precision,
        global_batch_size=tc.batch_size,
        per_replica_batch_size=per_replica,
        grad_accum_steps=micro,
        flops_per_token=fpt,
        peak_flops=peak_flops,
        checkpoint_dir=checkpoint_dir,
        last_checkpoint=tf.train.latest_checkpoint(checkpoint_dir),
        trainable_params=state.selection.trainable_params,
        total_params=state.selection.total_params,
        base_model=base_model,
        teacher_model=teacher_model,
        jit_compile=jit,
        moe_capacity_factor=capacity or 0.0,
        moe_dropped_fraction=dropped_total / pairs_total if pairs_total else 0.0,
        skipped_steps=int(state.skipped.numpy()),
    )


def _log_record(progress: _Progress, record: dict, total_steps: int, timed_steps: int) -> None:
    speed = (f"  {record['tokens_per_second']:.0f} tok/s  MFU {100 * record['mfu']:.1f}%"
             if timed_steps else "  (first step: tracing)")
    distill = (f"  distill_loss {record['distill_loss']:.4f}" if record["distill_loss"] else "")
    dropped = (f"  MoE dropped {100 * record['moe_dropped_fraction']:.2f}%"
               if record["moe_dropped_fraction"] else "")
    skipped = f"  skipped {record['skipped_steps']}" if record["skipped_steps"] else ""
    progress.log("step %5d/%d  loss %.4f  lm_loss %.4f%s  lr %.2e  grad_norm %.3f%s%s%s",
                 record["step"], total_steps, record["loss"], record["lm_loss"], distill,
                 record["learning_rate"], record["grad_norm"], speed, dropped, skipped)


def resolve_jit_compile(setting: str) -> bool:
    """`train.jit_compile` for this machine: "true"/"false", or "auto" = on for GPUs and
    TPUs, off on CPUs (where XLA measured slower: README, `benchmarks/train_throughput.py`)."""
    if setting == "auto":
        from components.trainer import hardware

        return hardware.detect().kind in ("gpu", "tpu")
    return setting == "true"


def _skip(skipped: tf.Variable, consecutive: int, limit: int, step: int, out: dict,
          progress: _Progress, last_checkpoint) -> int:
    """Counts a skipped (not finite) step; raises after `limit` in a row.

    Returns:
      The consecutive skips so far.

    Raises:
      FloatingPointError: `limit` consecutive steps were not finite.
    """
    skipped.assign_add(1)
    consecutive += 1
    terms = dict(zip(LOSS_TERMS, map(float, out["terms"].numpy()), strict=True))
    progress.log("step %d skipped: not finite (loss %s, grad_norm %s); nothing changed "
                 "(%d in a row, %d in all; train.max_skipped_steps=%d)", step + 1,
                 terms["loss"], float(out["grad_norm"]), consecutive, int(skipped.numpy()),
                 limit)
    if consecutive >= limit:
        raise FloatingPointError(
            f"loss is {terms['loss']} and grad_norm {float(out['grad_norm'])} at step {step + 1}:"
            f" {consecutive} consecutive steps were not finite (train.max_skipped_steps="
            f"{limit}); training stopped; last good checkpoint: {last_checkpoint}")
    return consecutive


def _raise_if_not_finite(pending_losses, last_checkpoint) -> None:
    if not pending_losses:
        return
    values = np.array([float(v) for _, v in pending_losses])
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        step, value = pending_losses[bad[0]][0], values[bad[0]]
        raise FloatingPointError(
            f"loss is {value} at step {step}; training stopped; last good checkpoint: "
            f"{last_checkpoint}"
        )


def _moe_block_names(model: DeepSeekCausalLM) -> list:
    """The block (or MTP module) of each MoE layer, in `expert_load` row order."""
    blocks = [b for b in model.decoder_layers if b.is_moe]
    return blocks + [m for m in model.mtp_layers if m.block.is_moe]


def _write_moe_summaries(model: DeepSeekCausalLM, names: list[str], load: np.ndarray) -> None:
    """Expert load max/mean per MoE layer (1.0 = balanced), the load vector of the window
    (pairs routed per expert, already on the host) and router-bias statistics."""
    for name, layer_load, moe in zip(names, load, model.moe_layers, strict=True):
        mean = float(layer_load.mean())
        tf.summary.scalar(f"moe/{name}/load_max_over_mean",
                          float(layer_load.max()) / mean if mean > 0 else 0.0)
        tf.summary.write(f"moe/{name}/expert_load", layer_load.astype(np.float32))
        bias = moe.gate.e_score_correction_bias.numpy()
        tf.summary.scalar(f"router_bias/{name}/min", float(bias.min()))
        tf.summary.scalar(f"router_bias/{name}/max", float(bias.max()))
        tf.summary.scalar(f"router_bias/{name}/mean_abs", float(np.abs(bias).mean()))


def evaluate(model: DeepSeekCausalLM, eval_dataset: tf.data.Dataset, max_batches: int) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats/token) over up to `max_batches` batches, and the
    number of target tokens (labels < 0, e.g. SFT prompts and padding, are not targets)."""
    from models.deepseek.losses import token_cross_entropy_sum

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


def copy_to_float32_model(config: PipelineConfig, model: DeepSeekCausalLM) -> DeepSeekCausalLM:
    """A float32 model, outside any strategy, with `model`'s weights (for eval and export).

    LoRA adapters are merged into their kernels (`trainable.merged_values`), so the
    copy is a plain model of `config.model`. Call it outside `strategy.scope()`. The
    weights of a distributed model are read from its first local replica (all
    replicas hold the same values).

    Raises:
      ValueError: a weight's shape differs between the two models.
    """
    fresh = build_model(config, dtype="float32")
    trainable.assign_by_path(fresh, trainable.merged_values(model))
    return fresh


def build_trained_model(config: PipelineConfig) -> DeepSeekCausalLM:
    """A float32 model shaped as training shapes it (LoRA adapters enabled per
    `config.train`), to read a training checkpoint into; `copy_to_float32_model`
    then merges it."""
    model = build_model(config, dtype="float32")
    if config.train.lora_rank:
        trainable.prepare(model, config.train)
    return model
