"""One optimizer step, apart from the outer loop (as MaxText's `train_step`).

One step on a global batch of B sequences, R replicas, k micro-batches:

  N = all-reduce(SUM) of the target tokens of every micro-batch      (1 + D,)
  each replica, for each of its k micro-batches of b = B/(kR) sequences:
      terms_i  = losses.causal_lm_loss(forward_train(x_i), y_i, targets=N, teacher_i)
                 summed cross-entropies divided by the *global* N
      grads   += d(loss_i) / dw                       (x loss scale under mixed_float16)
  all-reduce (sum) grads, loss terms and expert load -> global per-token means, load
  clip by the global norm; AdamW on the trained variables only
  router biases: b_i -= gamma * sign(load_i - mean load), global load, trained routers only

Dividing sums by the global count makes the loss the mean over the target
tokens of the whole global batch however they fall on micro-batches and
replicas (SFT: only response tokens are targets, and their number varies);
with packed pretraining data every micro-batch has b T targets and this is
the mean of the per-micro-batch means, as before. The balance loss is a mean
over sequences and is scaled by 1/(kR).

A teacher (distillation) runs in inference mode inside the same step, on the
same replica's micro-batch.
"""

from __future__ import annotations

import tensorflow as tf

from models.deepseek import losses

LOSS_TERMS = ("loss", "lm_loss", "mtp_loss", "balance_loss", "distill_loss")


def make_train_step(model, optimizer, variables, strategy, *, micro_batches: int,
                    grad_clip_norm: float, recompute: bool = False, loss_scaling: bool = False,
                    teacher=None, distill_alpha: float = 0.5, distill_temperature: float = 1.0,
                    moe_mask: list[bool] | None = None, step_counter=None):
    """Returns `train_step(iterator) -> (terms, grad_norm, load)`, a `tf.function`.

    Args:
      model: the `DeepSeekCausalLM` (its variables belong to `strategy`).
      optimizer: a Keras optimizer built on `variables`.
      variables: the variables that train (`trainable.prepare`).
      strategy: the tf.distribute strategy.
      micro_batches: k; the iterator's elements are per-replica stacks
        {"input_ids", "labels"}: int32 (k, b, T) (`data.distribute_global_batches`).
      grad_clip_norm: global-norm clipping of the global gradient.
      recompute: recompute block activations in the backward pass.
      loss_scaling: dynamic loss scaling (mixed_float16; the optimizer is a
        `LossScaleOptimizer`).
      teacher: a `DeepSeekCausalLM` with the same vocabulary, or None.
      distill_alpha, distill_temperature: a and tau (`losses.causal_lm_loss`).
      moe_mask: per MoE layer, whether its router bias is updated (default all).
      step_counter: an int64 variable incremented by each step (checkpointed), or None.

    Returns:
      The step function. Each call runs one optimizer step and returns
      float32 (len(LOSS_TERMS),) loss terms (global means), the unscaled global
      gradient norm (before clipping) and the expert load (M, E) of the global batch.
    """
    mtp_depths = len(model.mtp_layers)
    mtp_weight = model.config.mtp_loss_weight
    moe_mask = [True] * len(model.moe_layers) if moe_mask is None else list(moe_mask)

    def micro_step(input_ids, labels, targets):
        """Loss terms (5,), expert load (M, E) and gradients of one micro-batch."""
        scale = 1.0 / (micro_batches * tf.distribute.get_replica_context().num_replicas_in_sync)
        teacher_logits = (None if teacher is None else
                          tf.stop_gradient(teacher(input_ids, training=False)))  # (b, T, V)
        with tf.GradientTape() as tape:
            outputs = model.forward_train(input_ids, training=True, recompute_blocks=recompute)
            out = losses.causal_lm_loss(outputs, labels, mtp_weight, targets=targets,
                                        teacher_logits=teacher_logits,
                                        distill_alpha=distill_alpha,
                                        distill_temperature=distill_temperature,
                                        # Token means are global already (sums / N); the
                                        # balance loss is a mean over this micro-batch's
                                        # sequences: average it over the k R of them.
                                        balance_weight=scale)
            objective = out["loss"]
            scaled = optimizer.scale_loss(objective) if loss_scaling else objective
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]
        terms = tf.stack([out[name] for name in LOSS_TERMS])  # (5,)
        return terms, out["expert_load"], grads

    def replica_step(batch):
        """One optimizer step on this replica's [k, b, T] slice of the global batch."""
        ids, labels = batch["input_ids"], batch["labels"]  # (k, b, T)
        ctx = tf.distribute.get_replica_context()
        local = tf.add_n([losses.num_targets(labels[i], mtp_depths)
                          for i in range(micro_batches)])  # (1 + D,)
        targets = ctx.all_reduce(tf.distribute.ReduceOp.SUM, local)  # (1 + D,) global
        if micro_batches == 1:
            terms, load, grads = micro_step(ids[0], labels[0], targets)
        else:
            def body(i, terms, load, grads):
                t_i, l_i, g_i = micro_step(ids[i], labels[i], targets)
                return (i + 1, terms + t_i, load + l_i,
                        [g + gi for g, gi in zip(grads, g_i, strict=True)])

            zeros = (tf.zeros([len(LOSS_TERMS)]),
                     tf.zeros([model.num_moe_layers, model.config.n_routed_experts]),
                     [tf.zeros(v.shape, v.dtype) for v in variables])
            _, terms, load, grads = tf.while_loop(lambda i, *_: i < micro_batches, body,
                                                  (0, *zeros))
        terms, load, grads = ctx.all_reduce(tf.distribute.ReduceOp.SUM, (terms, load, grads))
        grad_norm = tf.linalg.global_norm(grads)
        clip = grad_clip_norm
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
        speed = model.config.router_bias_update_speed
        for i, (moe, update) in enumerate(zip(model.moe_layers, moe_mask, strict=True)):
            if update:  # cross-replica: every copy gets the same update
                moe.update_bias(load[i], speed)
        if step_counter is not None:
            step_counter.assign_add(1)
        return terms, grad_norm, load

    return train_step
