"""The training loop: a custom `tf.function` step under a tf.distribute strategy.

A custom loop rather than `model.fit`: Keras 3's `fit` fails under
MultiWorkerMirroredStrategy on TF 2.16 (see the project notes), and the loop
needs the router-bias update (DeepSeek-V3 §2.1.2), which is not a gradient step.

One optimizer step on a global batch of B sequences, R replicas, k micro-batches:

  each replica, for each of its k micro-batches of b = B/(kR) sequences:
      loss_i   = model.compute_loss(...)             per-token mean over b sequences
      grads   += d(loss_i / (k R)) / dw              (x loss scale under mixed_float16)
  all-reduce (sum) grads, losses and expert load    -> global per-token mean, global load
  clip by the global norm; AdamW (weight decay on matrices only)
  router biases: b_i -= gamma * sign(load_i - mean load), with the load of the global batch

Packed training data has no ignored label, so every micro-batch on every
replica holds the same number of tokens and the mean of the k R per-micro-batch
means is the per-token mean over the global batch: the update equals the one
of a single device on the whole batch (`tests/components/test_trainer_loop.py`).

Checkpoints (model, optimizer, step) are written every `checkpoint_every`
steps and at the end, by the chief only (other workers write to a temporary
directory, as TensorFlow's multi-worker guide prescribes, since saving may run
collectives); every worker restores from the chief's directory. A checkpoint
is written only when every loss since the last one and every weight is finite.
A NaN/Inf loss stops training with FloatingPointError; the checkpoints already
written are kept.

The data position is not stored: a resumed run skips the global batches
already trained on (`data.distribute_global_batches`).

TensorBoard (chief): loss terms, learning rate, grad norm, tokens/s, MFU, per
MoE layer the expert load max/mean over the logging window, and router-bias
min/max/mean |b|.

Progress (chief): a log line every `log_every` steps, always; in a terminal, also
a progress bar (tqdm) with step/total, loss and tokens/s, refreshed at most
every `PROGRESS_INTERVAL_S` (`progress_enabled`: not when stderr is not a
terminal, e.g. a log file or a notebook, nor when `CI` is set;
`DEEPSEEK_TFX_PROGRESS=1`/`0` forces it on/off). It reads the loss at most that
often, so the steps between refreshes run as without it.
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

from components.trainer import data
from components.trainer import strategy as strategy_lib
from components.trainer.schedule import make_learning_rate_schedule, make_optimizer
from models.deepseek import DeepSeekCausalLM, flops
from pipeline.configs import PipelineConfig

log = logging.getLogger(__name__)

LOSS_TERMS = ("loss", "lm_loss", "mtp_loss", "balance_loss")
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

    def figures(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "model"}


def build_model(config: PipelineConfig, dtype: str = "float32") -> DeepSeekCausalLM:
    """The model with its weights created (the constructor builds them)."""
    return DeepSeekCausalLM(config.model, dtype=dtype)


def progress_enabled(stream=None) -> bool:
    """Whether to draw a progress bar on `stream` (default stderr).

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
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class _Progress:
    """The terminal progress bar of a training run (a no-op when disabled)."""

    def __init__(self, total: int, initial: int, tokens_per_step: int, enabled: bool):
        self.tokens_per_step = tokens_per_step
        self.bar = tqdm(total=total, initial=initial, unit="step", desc="train",
                        file=sys.stderr, dynamic_ncols=True, mininterval=PROGRESS_INTERVAL_S,
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
        """A context in which the bar is cleared (for other writers to stderr)."""
        if self.bar.disable:
            return contextlib.nullcontext()
        return tqdm.external_write_mode(file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def all_finite(tensors) -> tf.Tensor:
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])


def train(
    config: PipelineConfig,
    dataset_fn,
    checkpoint_dir: str,
    log_dir: str | None,
    strategy: tf.distribute.Strategy | None = None,
    precision: str = "float32",
    peak_flops: float = 0.0,
) -> TrainResult:
    """Trains `config.model` until `config.train.train_steps` optimizer steps are done.

    Args:
      config: the pipeline config (model + train sections are used).
      dataset_fn: () -> infinite dataset of global batches {"input_ids",
        "labels"}: int32 [train.batch_size, train.seq_len], deterministic
        (called once per input pipeline; a resumed run skips batches of it).
      checkpoint_dir: checkpoints are restored from and (chief) written to it.
      log_dir: TensorBoard event directory (chief), or None for none.
      strategy: a tf.distribute strategy (default: the current/default one).
      precision: Keras dtype policy ("float32", "mixed_bfloat16", "mixed_float16").
      peak_flops: peak FLOP/s of all the hardware taking part, for MFU (0: MFU
        is reported as 0).

    Returns:
      TrainResult with the trained model (its variables belong to `strategy`).

    Raises:
      ValueError: the global batch does not split over replicas and micro-batches.
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
    loss_scaling = precision == "mixed_float16"

    keras.utils.set_random_seed(tc.seed)
    with strategy.scope():
        model = build_model(config, dtype=precision)
        variables = model.trainable_variables
        optimizer = make_optimizer(tc, variables, loss_scale=loss_scaling)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    write_dir = checkpoint_dir if chief else tempfile.mkdtemp(prefix="ckpt-worker-")
    manager = tf.train.CheckpointManager(checkpoint, write_dir, max_to_keep=3)
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    resumed_from = 0
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        resumed_from = int(step_var.numpy())
        log.info("resumed from %s (step %d)", latest, resumed_from)

    tokens_per_step = tc.batch_size * tc.seq_len
    fpt = flops.flops_per_token(config.model, tc.seq_len)
    schedule = make_learning_rate_schedule(tc)
    strategy_name = strategy_lib.describe(strategy)
    workers = strategy_lib.num_workers(strategy)
    log.info(
        "strategy %s: %d replica(s) on %d worker(s); global batch %d sequences = %d micro-batch(es) "
        "x %d replica(s) x %d per replica (x %d tokens = %d tokens/step); precision %s; "
        "learning-rate schedule in steps of the global batch",
        strategy_name, replicas, workers, tc.batch_size, micro, replicas, per_replica,
        tc.seq_len, tokens_per_step, precision,
    )

    def micro_step(input_ids, labels):
        """Scaled loss terms (4,), expert load (M, E) and gradients of one micro-batch."""
        scale = 1.0 / (micro * tf.distribute.get_replica_context().num_replicas_in_sync)
        with tf.GradientTape() as tape:
            out = model.compute_loss(input_ids, labels, training=True,
                                     recompute_blocks=tc.recompute_activations)
            objective = out["loss"] * scale
            if loss_scaling:
                objective = optimizer.scale_loss(objective)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(objective, variables)]
        terms = tf.stack([out[name] for name in LOSS_TERMS]) * scale  # (4,)
        return terms, out["expert_load"], grads

    def replica_step(batch):
        """One optimizer step on this replica's [k, b, T] slice of the global batch."""
        ids, labels = batch["input_ids"], batch["labels"]  # (k, b, T)
        if micro == 1:
            terms, load, grads = micro_step(ids[0], labels[0])
        else:
            def body(i, terms, load, grads):
                t_i, l_i, g_i = micro_step(ids[i], labels[i])
                return (i + 1, terms + t_i, load + l_i,
                        [g + gi for g, gi in zip(grads, g_i, strict=True)])

            zeros = (tf.zeros([len(LOSS_TERMS)]),
                     tf.zeros([model.num_moe_layers, config.model.n_routed_experts]),
                     [tf.zeros(v.shape, v.dtype) for v in variables])
            _, terms, load, grads = tf.while_loop(lambda i, *_: i < micro, body, (0, *zeros))
        ctx = tf.distribute.get_replica_context()
        terms, load, grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, (terms, load, grads))
        grad_norm = tf.linalg.global_norm(grads)
        clip = tc.grad_clip_norm
        if loss_scaling:
            clip *= optimizer.dynamic_scale  # clipping scaled grads at clip*s = unscaled at clip
            grad_norm_unscaled = grad_norm / optimizer.dynamic_scale
        else:
            grad_norm_unscaled = grad_norm
        grads, _ = tf.clip_by_global_norm(grads, clip, use_norm=grad_norm)
        optimizer.apply(grads, variables)
        return terms, grad_norm_unscaled, load

    # No autograph: the step has no Python control flow on tensors, and
    # converting Keras' code costs seconds of tracing.
    @tf.function(autograph=False)
    def train_step(iterator):
        terms, grad_norm, load = strategy.run(replica_step, args=(next(iterator),))
        # All replicas hold the same all-reduced values: take the first local one.
        terms, grad_norm, load = (strategy.experimental_local_results(t)[0]
                                  for t in (terms, grad_norm, load))
        model.update_router_biases(load)  # cross-replica: every copy gets the same update
        step_var.assign_add(1)
        return terms, grad_norm, load

    @tf.function
    def weights_finite():
        return all_finite([tf.convert_to_tensor(v) for v in model.weights])

    writer = (tf.summary.create_file_writer(log_dir) if chief and log_dir
              else tf.summary.create_noop_writer())
    dist_ds = data.distribute_global_batches(strategy, dataset_fn, micro, skip_steps=resumed_from)
    iterator = iter(dist_ds)
    moe_names = [layer.name for layer in _moe_block_names(model)]
    history: list[dict] = []
    pending_losses: list[tuple[int, tf.Tensor]] = []
    window_load = None
    start = time.perf_counter()
    first_step_done = None
    window_start, window_steps = start, 0
    last_terms, last_norm = None, None
    saving_s = 0.0  # checkpoint writing, left out of the steady-state throughput
    step = resumed_from
    progress = _Progress(tc.train_steps, resumed_from, tokens_per_step,
                         enabled=chief and progress_enabled())
    try:
        while step < tc.train_steps:
            terms, grad_norm, load = train_step(iterator)
            step += 1
            window_steps += 1
            progress.step(step, terms[0])
            pending_losses.append((step, terms[0]))
            window_load = load if window_load is None else window_load + load
            last_terms, last_norm = terms, grad_norm
            if first_step_done is None:
                terms.numpy()  # the first step includes tracing: time it apart
                first_step_done = time.perf_counter()
                window_start, window_steps = first_step_done, 0
            is_log = step % tc.log_every == 0 or step == tc.train_steps
            is_ckpt = step % tc.checkpoint_every == 0 or step == tc.train_steps
            if not (is_log or is_ckpt):
                continue
            _raise_if_not_finite(pending_losses, manager.latest_checkpoint if chief else latest)
            pending_losses = []
            if is_log:
                now = time.perf_counter()
                tps = (window_steps * tokens_per_step / (now - window_start)
                       if window_steps else float("nan"))
                record = {"step": step,
                          **dict(zip(LOSS_TERMS, map(float, last_terms.numpy()), strict=True)),
                          "grad_norm": float(last_norm), "learning_rate": float(schedule(step - 1)),
                          "tokens_per_second": tps,
                          "mfu": flops.mfu(tps, fpt, peak_flops) if peak_flops and window_steps
                          else float("nan")}
                history.append(record)
                speed = (f"  {tps:.0f} tok/s  MFU {100 * record['mfu']:.1f}%" if window_steps
                         else "  (first step: tracing)")
                progress.log("step %5d/%d  loss %.4f  lm_loss %.4f  lr %.2e  grad_norm %.3f%s",
                             step, tc.train_steps, record["loss"], record["lm_loss"],
                             record["learning_rate"], record["grad_norm"], speed)
                with writer.as_default(step=step):
                    for key in (*LOSS_TERMS, "grad_norm", "learning_rate", "tokens_per_second", "mfu"):
                        if math.isfinite(record[key]):
                            tf.summary.scalar(f"train/{key}", record[key])
                    _write_moe_summaries(model, moe_names, window_load.numpy())
                window_start, window_steps, window_load = time.perf_counter(), 0, None
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
    )


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
    """Expert load max/mean per MoE layer (1.0 = balanced) and router-bias statistics."""
    for name, layer_load, moe in zip(names, load, model.moe_layers, strict=True):
        mean = float(layer_load.mean())
        tf.summary.scalar(f"moe/{name}/load_max_over_mean",
                          float(layer_load.max()) / mean if mean > 0 else 0.0)
        bias = moe.gate.e_score_correction_bias.numpy()
        tf.summary.scalar(f"router_bias/{name}/min", float(bias.min()))
        tf.summary.scalar(f"router_bias/{name}/max", float(bias.max()))
        tf.summary.scalar(f"router_bias/{name}/mean_abs", float(np.abs(bias).mean()))


def evaluate(model: DeepSeekCausalLM, eval_dataset: tf.data.Dataset, max_batches: int) -> tuple[float, int]:
    """Mean next-token cross-entropy (nats/token) over up to `max_batches` batches, and tokens."""

    @tf.function
    def eval_step(batch):
        logits = model(batch["input_ids"], training=False)
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["labels"], tf.cast(logits, tf.float32))
        return tf.reduce_sum(nll), tf.cast(tf.size(nll), tf.float32)

    total, count = 0.0, 0.0
    for i, batch in enumerate(eval_dataset):
        if i >= max_batches:
            break
        s, n = eval_step(batch)
        total, count = total + float(s), count + float(n)
    return total / max(count, 1.0), int(count)


def copy_to_float32_model(config: PipelineConfig, model: DeepSeekCausalLM) -> DeepSeekCausalLM:
    """A float32 model, outside any strategy, with `model`'s weights (for eval and export).

    Call it outside `strategy.scope()`. The weights of a distributed model are
    read from its first local replica (all replicas hold the same values).
    """
    fresh = build_model(config, dtype="float32")
    source = model.get_weights()
    for target, value in zip(fresh.weights, source, strict=True):
        if tuple(target.shape) != value.shape:
            raise ValueError(f"weight {target.path}: shape {target.shape} != {value.shape}")
    fresh.set_weights(source)
    return fresh
