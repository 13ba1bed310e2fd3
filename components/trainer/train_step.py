"""One optimizer step, apart from the outer loop (as MaxText's `train_step`).

One step on a global batch of B sequences, R replicas, k micro-batches:

  N = all-reduce(SUM) of the target tokens of every micro-batch      (1 + D,)
  each replica, for each of its k micro-batches of b = B/(kR) sequences:
      terms_i  = losses.causal_lm_loss(forward_train(x_i), y_i, targets=N, teacher_i)
                 summed cross-entropies divided by the *global* N
      grads   += d(loss_i) / dw                       (x loss scale under mixed_float16)
  all-reduce (sum) grads, loss terms and expert load -> global per-token means, load
  finite = the loss terms and the global gradient norm are finite
  if finite:   clip by the global norm; AdamW on the trained variables only;
               router biases b_i -= gamma * sign(load_i - mean load) (global load,
               trained routers only); step counter + 1
  else:        nothing changes (weights, optimizer slots and step, hence the
               learning-rate schedule, router biases, step counter); the skip is
               counted. Under mixed_float16 the loss-scale optimizer still halves
               its scale (its own rule for an overflow).

Dividing sums by the global count makes the loss the mean over the target
tokens of the whole global batch however they fall on micro-batches and
replicas (SFT: only response tokens are targets, and their number varies);
with packed pretraining data every micro-batch has b T targets and this is
the mean of the per-micro-batch means, as before. The balance loss is a mean
over sequences and is scaled by 1/(kR).

A teacher (distillation) runs in inference mode inside the same step, on the
same replica's micro-batch.

XLA (`jit_compile=True`): with one replica the whole step above is one XLA
cluster (forward, losses, backward, accumulation, clipping, the optimizer's
apply, the router-bias update and the skip). With several replicas on CPUs/GPUs
the per-replica part (forward, losses, backward, accumulation over micro-batches)
is compiled and the all-reduce, clipping and apply run outside it (cross-replica
collectives are not compiled there); under TPUStrategy `strategy.run` compiles
everything. XLA needs static shapes, so the MoE layers then dispatch with a
static capacity (`moe_capacity_factor`; DeepSeekMoE's capacity path), and the
pairs dropped by it are counted per MoE layer.
"""

from __future__ import annotations

import tensorflow as tf

from components.trainer.data import IGNORE_LABEL
from components.trainer.mixture import SOURCE_KEY
from models.deepseek import losses

LOSS_TERMS = ("loss", "lm_loss", "mtp_loss", "balance_loss", "distill_loss", "indexer_loss")


def make_train_step(model, optimizer, variables, strategy, *, micro_batches: int,
                    grad_clip_norm: float, recompute: bool = False, loss_scaling: bool = False,
                    teacher=None, distill_alpha: float = 0.5, distill_temperature: float = 1.0,
                    moe_mask: list[bool] | None = None, step_counter=None,
                    jit_compile: bool = False, moe_capacity_factor: float | None = None,
                    num_sources: int = 1, objective=None):
    """Returns `train_step(iterator) -> dict`, a `tf.function` running one optimizer step.

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
      step_counter: an int64 variable incremented by each applied step
        (checkpointed), or None.
      jit_compile: compile the step with XLA (see the module docstring).
      moe_capacity_factor: None for the dropless MoE dispatch; a float cf for the
        static-capacity dispatch (required by XLA).
      num_sources: S, the mixture's sources; a batch's optional "source" (int32
        (k, b), an index < S per sequence; absent: all source 0) is counted per source.
      objective: what a micro-batch's loss is (`LanguageModelObjective` when None, built
        from the arguments above; DPO and GRPO: `preference_objectives.py`). It has
        `figure_names` (F names), `prepare(batch) -> aux` (no gradient) and
        `loss(batch, aux, targets, scale) -> dict` with "loss" (the scalar differentiated),
        the LOSS_TERMS, "expert_load" (M, E), optionally "moe_dropped" (M,) and "figures"
        float32 (F,), each already multiplied by `scale` = 1 / (k R) so that their sum over
        micro-batches and replicas is the global batch's mean.

    Returns:
      The step function (`train_step(iterator)`; `train_step.step_on(batch)` takes the
      per-replica batch itself). Each call runs one step and returns a dict of tensors:
        terms: float32 (len(LOSS_TERMS),) loss terms (global means);
        grad_norm: float32 scalar, the unscaled global gradient norm before clipping;
        expert_load: float32 (M, E), tokens routed to each expert in the global batch;
        moe_dropped: float32 (M,), (token, expert) pairs the capacity dropped;
        skipped: bool scalar, True when the step changed nothing (not finite);
        figures: float32 (F,), the objective's figures (global means; DPO's reward
          accuracy, GRPO's KL, ...);
        source_tokens: float32 (S,), the global batch's target tokens per source;
        source_sequences: float32 (S,), its sequences per source (float32: exact,
          a step's counts being far below 2^24; summed over replicas as the terms).
    """
    mtp_depths = len(model.mtp_layers)
    mtp_weight = model.config.mtp_loss_weight
    moe_mask = [True] * len(model.moe_layers) if moe_mask is None else list(moe_mask)
    n_moe, n_experts = model.num_moe_layers, model.config.n_routed_experts
    replicas = strategy.num_replicas_in_sync
    whole_step_compiled = jit_compile and replicas == 1
    forward_kwargs = {} if moe_capacity_factor is None or not n_moe else {
        "moe_capacity_factor": moe_capacity_factor}

    if objective is None:
        objective = LanguageModelObjective(
            model, mtp_weight, teacher, distill_alpha, distill_temperature, recompute,
            forward_kwargs)
    num_figures = len(objective.figure_names)

    def micro_step(batch, targets):
        """Loss terms (6,), figures (F,), expert load (M, E), dropped (M,) and gradients of
        one micro-batch (`batch`: this micro-batch's rows of every key)."""
        scale = 1.0 / (micro_batches * tf.distribute.get_replica_context().num_replicas_in_sync)
        aux = objective.prepare(batch)  # no gradient: a teacher's logits, a reference's log-probs
        with tf.GradientTape() as tape:
            out = objective.loss(batch, aux, targets, scale)
            scaled = optimizer.scale_loss(out["loss"]) if loss_scaling else out["loss"]
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, variables)]
        terms = tf.stack([out.get(name, tf.constant(0.0)) for name in LOSS_TERMS])  # (6,)
        figures = out.get("figures", tf.zeros([num_figures]))  # (F,) scaled: sums are means
        dropped = out.get("moe_dropped")
        dropped = tf.zeros([n_moe]) if dropped is None else tf.cast(dropped, tf.float32)  # (M,)
        return terms, figures, out["expert_load"], dropped, grads

    def accumulate(batch, targets):
        """Sums over this replica's k micro-batches: terms, figures, load, dropped, gradients."""
        if micro_batches == 1:
            return micro_step({k: v[0] for k, v in batch.items()}, targets)

        def body(i, terms, figures, load, dropped, grads):
            t_i, f_i, l_i, d_i, g_i = micro_step({k: v[i] for k, v in batch.items()}, targets)
            return (i + 1, terms + t_i, figures + f_i, load + l_i, dropped + d_i,
                    [g + gi for g, gi in zip(grads, g_i, strict=True)])

        zeros = (tf.zeros([len(LOSS_TERMS)]), tf.zeros([num_figures]),
                 tf.zeros([n_moe, n_experts]), tf.zeros([n_moe]),
                 [tf.zeros(v.shape, v.dtype) for v in variables])
        _, terms, figures, load, dropped, grads = tf.while_loop(
            lambda i, *_: i < micro_batches, body, (0, *zeros))
        return terms, figures, load, dropped, grads

    if jit_compile and not whole_step_compiled:  # several replicas: compile the replica's part
        accumulate = tf.function(accumulate, jit_compile=True, autograph=False)

    def update_router_biases(load):
        speed = model.config.router_bias_update_speed
        for i, (moe, update) in enumerate(zip(model.moe_layers, moe_mask, strict=True)):
            if update:  # every replica's copy gets the same update (the global load)
                moe.update_bias(load[i], speed)

    def count_step():
        if step_counter is not None:
            step_counter.assign_add(1)

    def replica_step(batch):
        """One optimizer step on this replica's [k, b, T] slice of the global batch."""
        labels = batch["labels"]  # (k, b, T), or (k, b, 2, T): DPO pairs
        source = batch.get(SOURCE_KEY)  # (k, b) or None (one source)
        if source is None:
            source = tf.zeros(tf.shape(labels)[:2], tf.int32)  # (k, b)
        per_row = tf.reduce_sum(tf.cast(labels != IGNORE_LABEL, tf.float32),
                                axis=list(range(2, labels.shape.rank)))  # (k, b)
        source_ids = tf.reshape(source, [-1])  # (k b,)
        counts = tf.stack([
            tf.math.unsorted_segment_sum(tf.reshape(per_row, [-1]), source_ids, num_sources),
            tf.math.unsorted_segment_sum(tf.ones_like(source_ids, tf.float32), source_ids,
                                         num_sources)])  # (2, S): tokens, sequences
        ctx = tf.distribute.get_replica_context()
        rows = tf.reshape(labels, [micro_batches, -1, labels.shape[-1]])  # (k, rows, T)
        local = tf.add_n([losses.num_targets(rows[i], mtp_depths)
                          for i in range(micro_batches)])  # (1 + D,)
        targets = ctx.all_reduce(tf.distribute.ReduceOp.SUM, local)  # (1 + D,) global
        terms, figures, load, dropped, grads = accumulate(batch, targets)
        terms, figures, load, dropped, counts, grads = ctx.all_reduce(
            tf.distribute.ReduceOp.SUM, (terms, figures, load, dropped, counts, grads))
        grad_norm = tf.linalg.global_norm(grads)  # of the (loss-scaled) global gradient
        finite = tf.logical_and(tf.math.is_finite(grad_norm),
                                tf.reduce_all(tf.math.is_finite(terms)))
        if loss_scaling:  # the LossScaleOptimizer skips a non-finite step itself (and
            scale = tf.identity(optimizer.dynamic_scale)  # halves its scale): it must see
            apply(grads, grad_norm, scale)  # the overflow
            grad_norm = grad_norm / scale  # the unscaled norm
        elif replicas == 1:  # (several replicas: applied from the cross-replica context)
            tf.cond(finite, lambda: _then(apply(grads, grad_norm)), tf.no_op)
        if whole_step_compiled:  # one replica: the rest of the step in the same XLA cluster
            tf.cond(finite, lambda: _then(update_router_biases(load), count_step()), tf.no_op)
        out = {"terms": terms, "grad_norm": grad_norm, "expert_load": load,
               "moe_dropped": dropped, "skipped": tf.logical_not(finite), "figures": figures,
               "source_tokens": counts[0], "source_sequences": counts[1]}
        return out, (grads if replicas > 1 and not loss_scaling else [])

    def apply(grads, grad_norm, scale=None):
        """Clips the global gradient (its norm `grad_norm`) and applies it (replica context).
        With loss scaling, `scale` is the loss scale the gradients carry."""
        clip = grad_clip_norm
        if loss_scaling:
            clip *= scale  # clipping scaled grads at clip*s = unscaled at clip
        clipped, _ = tf.clip_by_global_norm(grads, clip, use_norm=grad_norm)
        optimizer.apply(clipped, variables)

    if whole_step_compiled:
        replica_step = tf.function(replica_step, jit_compile=True, autograph=False)

    # No autograph: the step has no Python control flow on tensors, and
    # converting Keras' code costs seconds of tracing.
    @tf.function(autograph=False)
    def step_on(batch):
        """One step on `batch`: per-replica values of this step's micro-batch stacks."""
        out, grads = strategy.run(replica_step, args=(batch,))
        # All replicas hold the same all-reduced values: take the first local one.
        out = {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}
        if not whole_step_compiled:
            def update():  # cross-replica context: one update for every copy
                if grads:  # several replicas: the optimizer's apply runs on each (a cond in
                    # the replica context could not hold the optimizer's merge_call)
                    norm = out["grad_norm"]
                    strategy.run(lambda g: _then(apply(g, norm)), args=(grads,))
                update_router_biases(out["expert_load"])
                count_step()
                return tf.no_op()

            tf.cond(out["skipped"], tf.no_op, update)
        return out

    @tf.function(autograph=False)
    def train_step(iterator):
        return step_on(next(iterator))

    # The XLA-compiled whole step (one replica), for compile-only checks of large shapes:
    # `train_step.xla_step.experimental_get_compiler_ir(batch)(stage="hlo")`; else None.
    train_step.xla_step = replica_step if whole_step_compiled else None
    # One step on a batch already made (GRPO's sampled completions): `step_on(batch)`.
    train_step.step_on = step_on
    return train_step


def _then(*_):
    """A no-op to end a `tf.cond` branch whose work is its side effects."""
    return tf.no_op()


class LanguageModelObjective:
    """Next-token cross-entropy (+ MTP, balance, distillation): `losses.causal_lm_loss`.

    Batches {"input_ids", "labels"}: int32 (b, T). A teacher (distillation) runs in
    inference mode on the same micro-batch (`prepare`).
    """

    figure_names: tuple[str, ...] = ()

    def __init__(self, model, mtp_weight: float, teacher=None, distill_alpha: float = 0.5,
                 distill_temperature: float = 1.0, recompute: bool = False,
                 forward_kwargs: dict | None = None):
        self.model, self.mtp_weight, self.teacher = model, mtp_weight, teacher
        self.distill_alpha, self.distill_temperature = distill_alpha, distill_temperature
        self.recompute, self.forward_kwargs = recompute, dict(forward_kwargs or {})

    def prepare(self, batch):
        if self.teacher is None:
            return None
        return tf.stop_gradient(self.teacher(batch["input_ids"], training=False))  # (b, T, V)

    def loss(self, batch, teacher_logits, targets, scale):
        outputs = self.model.forward_train(batch["input_ids"], training=True,
                                           recompute_blocks=self.recompute, **self.forward_kwargs)
        # Token means are global already (sums / N); the balance loss is a mean over this
        # micro-batch's sequences: average it over the k R of them.
        return losses.causal_lm_loss(outputs, batch["labels"], self.mtp_weight, targets=targets,
                                     teacher_logits=teacher_logits,
                                     distill_alpha=self.distill_alpha,
                                     distill_temperature=self.distill_temperature,
                                     balance_weight=scale)
