"""The training loop: a custom `tf.function` step under a tf.distribute strategy.

A custom loop rather than `model.fit`: Keras 3's `fit` fails under
MultiWorkerMirroredStrategy on TF 2.16, and the loop needs the router-bias
update (DeepSeek-V3 §2.1.2), which is not a gradient step.

Each step: forward (`model.compute_loss`), gradients, global-norm clipping,
AdamW, then the auxiliary-loss-free bias update from the step's expert load.
Checkpoints (model, optimizer, step) go to `checkpoint_dir` every
`checkpoint_every` steps; an existing checkpoint is resumed from. TensorBoard
gets loss, lr, grad norm, tokens/s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

import keras
import tensorflow as tf

from components.trainer.schedule import make_optimizer
from models.deepseek import DeepSeekCausalLM
from pipeline.configs import PipelineConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainResult:
    model: DeepSeekCausalLM
    train_steps: int
    resumed_from_step: int
    tokens_seen: int
    train_wall_s: float
    tokens_per_second: float
    final_loss: float
    eval_loss: float
    history: list[dict]


def build_model(config: PipelineConfig) -> DeepSeekCausalLM:
    """Builds the model and creates its weights (a forward pass on one token)."""
    model = DeepSeekCausalLM(config.model)
    model(tf.zeros([1, 1], tf.int32))
    return model


def train(
    config: PipelineConfig,
    train_dataset: tf.data.Dataset,
    eval_dataset: tf.data.Dataset | None,
    checkpoint_dir: str,
    log_dir: str,
    strategy: tf.distribute.Strategy | None = None,
) -> TrainResult:
    """Trains `config.model` for `config.train.train_steps` optimizer steps.

    Args:
      config: the pipeline config (model + train sections are used).
      train_dataset: infinite batches {"input_ids", "labels"}: int32 [B, T].
      eval_dataset: finite batches of the same form, or None.
      checkpoint_dir: where checkpoints are written and resumed from.
      log_dir: TensorBoard event directory.
      strategy: a tf.distribute strategy (default: the current/default one).

    Returns:
      TrainResult with the trained model and the run's figures.

    Raises:
      FloatingPointError: the loss became NaN or Inf (the last good checkpoint is kept).
    """
    tc = config.train
    strategy = strategy or tf.distribute.get_strategy()
    keras.utils.set_random_seed(tc.seed)
    with strategy.scope():
        model = build_model(config)
        optimizer = make_optimizer(tc)
        optimizer.build(model.trainable_variables)
        step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
    manager = tf.train.CheckpointManager(checkpoint, checkpoint_dir, max_to_keep=3)
    resumed_from = 0
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
        resumed_from = int(step_var.numpy())
        log.info("resumed from %s (step %d)", manager.latest_checkpoint, resumed_from)

    tokens_per_step = tc.batch_size * tc.seq_len
    variables = model.trainable_variables

    @tf.function
    def train_step(batch):
        with tf.GradientTape() as tape:
            out = model.compute_loss(batch["input_ids"], batch["labels"], training=True)
        grads = tape.gradient(out["loss"], variables)
        grad_norm = tf.linalg.global_norm(grads)
        grads, _ = tf.clip_by_global_norm(grads, tc.grad_clip_norm, use_norm=grad_norm)
        optimizer.apply_gradients(zip(grads, variables, strict=True))
        model.update_router_biases(out["expert_load"])
        step_var.assign_add(1)
        return out["loss"], out["lm_loss"], grad_norm

    @tf.function
    def eval_step(batch):
        logits = model(batch["input_ids"], training=False)
        nll = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["labels"], tf.cast(logits, tf.float32))
        return tf.reduce_sum(nll), tf.cast(tf.size(nll), tf.float32)

    writer = tf.summary.create_file_writer(log_dir)
    history: list[dict] = []
    iterator = iter(train_dataset)
    start = time.perf_counter()
    window_start, window_steps = start, 0
    loss_value = float("nan")
    step = resumed_from
    while step < tc.train_steps:
        loss, lm_loss, grad_norm = train_step(next(iterator))
        step += 1
        window_steps += 1
        if step % tc.log_every == 0 or step == tc.train_steps:
            loss_value = float(loss)
            if not math.isfinite(loss_value):
                raise FloatingPointError(
                    f"loss is {loss_value} at step {step}; last good checkpoint: "
                    f"{manager.latest_checkpoint}"
                )
            now = time.perf_counter()
            tps = window_steps * tokens_per_step / (now - window_start)
            lr = float(optimizer.learning_rate)
            record = {
                "step": step,
                "loss": loss_value,
                "lm_loss": float(lm_loss),
                "grad_norm": float(grad_norm),
                "learning_rate": lr,
                "tokens_per_second": tps,
            }
            history.append(record)
            log.info(
                "step %5d/%d  loss %.4f  lm_loss %.4f  lr %.2e  grad_norm %.3f  %.0f tok/s",
                step, tc.train_steps, loss_value, record["lm_loss"], lr, record["grad_norm"], tps,
            )
            with writer.as_default(step=step):
                for k in ("loss", "lm_loss", "grad_norm", "learning_rate", "tokens_per_second"):
                    tf.summary.scalar(f"train/{k}", record[k])
            window_start, window_steps = now, 0
        if step % tc.checkpoint_every == 0 or step == tc.train_steps:
            manager.save(checkpoint_number=step)
    wall = time.perf_counter() - start
    steps_run = tc.train_steps - resumed_from

    eval_loss = float("nan")
    if eval_dataset is not None:
        total, count = 0.0, 0.0
        for i, batch in enumerate(eval_dataset):
            if i >= tc.eval_batches:
                break
            s, n = eval_step(batch)
            total, count = total + float(s), count + float(n)
        eval_loss = total / max(count, 1.0)
        with writer.as_default(step=tc.train_steps):
            tf.summary.scalar("eval/loss", eval_loss)
        log.info("eval loss %.4f nats/token (%d tokens)", eval_loss, int(count))
    writer.flush()
    return TrainResult(
        model=model,
        train_steps=tc.train_steps,
        resumed_from_step=resumed_from,
        tokens_seen=tc.train_steps * tokens_per_step,
        train_wall_s=wall,
        tokens_per_second=steps_run * tokens_per_step / max(wall, 1e-9),
        final_loss=loss_value,
        eval_loss=eval_loss,
        history=history,
    )
