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
from models.layers import losses

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
    moe_mask = [True] * len(model.moe_layers) if moe_mask is None else list(moe_mask)
    forward_kwargs = {} if moe_capacity_factor is None or not model.num_moe_layers else {
        "moe_capacity_factor": moe_capacity_factor}
    if objective is None:
        objective = LanguageModelObjective(
            model, model.config.mtp_loss_weight, teacher, distill_alpha, distill_temperature,
            recompute, forward_kwargs)
    return TrainStep(model, optimizer, variables, strategy, objective,
                     micro_batches=micro_batches, grad_clip_norm=grad_clip_norm,
                     loss_scaling=loss_scaling, moe_mask=moe_mask, step_counter=step_counter,
                     jit_compile=jit_compile, num_sources=num_sources).build()


class TrainStep:
    """The parts of one optimizer step (`make_train_step`), traced into its tf.functions.

    Each method is one part of the step in the module docstring; `build` wraps them in
    the tf.functions of the step (which parts XLA compiles: `jit_compile`).

    Attributes:
      whole_step_compiled: one replica under XLA: `replica_step` holds the whole step.
      accumulate_fn: `accumulate`, or its XLA-compiled tf.function (several replicas under
        XLA: the replica's part of the step).
      replica_step_fn: `replica_step`, or its XLA-compiled tf.function (the whole step).
    """

    def __init__(self, model, optimizer, variables, strategy, objective, *,
                 micro_batches: int, grad_clip_norm: float, loss_scaling: bool,
                 moe_mask: list[bool], step_counter, jit_compile: bool, num_sources: int):
        """Arguments as `make_train_step`'s (`moe_mask`: one bool per MoE layer;
        `objective` given)."""
        self.model, self.optimizer, self.variables = model, optimizer, variables
        self.strategy, self.objective = strategy, objective
        self.micro_batches, self.grad_clip_norm = micro_batches, grad_clip_norm
        self.loss_scaling, self.moe_mask, self.step_counter = loss_scaling, moe_mask, step_counter
        self.num_sources = num_sources
        self.mtp_depths = len(model.mtp_layers)
        self.n_moe, self.n_experts = model.num_moe_layers, model.config.n_routed_experts
        self.replicas = strategy.num_replicas_in_sync
        self.whole_step_compiled = jit_compile and self.replicas == 1
        self.num_figures = len(objective.figure_names)
        self.accumulate_fn = self.accumulate
        if jit_compile and not self.whole_step_compiled:  # several replicas: the replica's part
            self.accumulate_fn = tf.function(self.accumulate, jit_compile=True, autograph=False)
        self.replica_step_fn = self.replica_step
        if self.whole_step_compiled:
            self.replica_step_fn = tf.function(self.replica_step, jit_compile=True,
                                               autograph=False)
        self.step_on_fn = None  # `build`

    def build(self):
        """The step function `make_train_step` returns: `train_step(iterator)`, with
        `train_step.step_on` and `train_step.xla_step`."""
        # No autograph: the step has no Python control flow on tensors, and
        # converting Keras' code costs seconds of tracing.
        self.step_on_fn = tf.function(self.step_on, autograph=False)
        train_step = tf.function(self.train_step, autograph=False)
        # The XLA-compiled whole step (one replica), for compile-only checks of large shapes:
        # `train_step.xla_step.experimental_get_compiler_ir(batch)(stage="hlo")`; else None.
        train_step.xla_step = self.replica_step_fn if self.whole_step_compiled else None
        # One step on a batch already made (GRPO's sampled completions): `step_on(batch)`.
        train_step.step_on = self.step_on_fn
        return train_step

    def micro_step(self, batch, targets):
        """Loss terms (6,), figures (F,), expert load (M, E), dropped (M,) and gradients of
        one micro-batch (`batch`: this micro-batch's rows of every key; `targets`: int
        (1 + D,), the global batch's target counts)."""
        objective, optimizer = self.objective, self.optimizer
        scale = 1.0 / (self.micro_batches
                       * tf.distribute.get_replica_context().num_replicas_in_sync)
        aux = objective.prepare(batch)  # no gradient: a teacher's logits, a reference's log-probs
        with tf.GradientTape() as tape:
            out = objective.loss(batch, aux, targets, scale)
            scaled = optimizer.scale_loss(out["loss"]) if self.loss_scaling else out["loss"]
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(scaled, self.variables)]
        terms = tf.stack([out.get(name, tf.constant(0.0)) for name in LOSS_TERMS])  # (6,)
        figures = out.get("figures", tf.zeros([self.num_figures]))  # (F,) scaled: sums are means
        dropped = out.get("moe_dropped")
        dropped = (tf.zeros([self.n_moe]) if dropped is None
                   else tf.cast(dropped, tf.float32))  # (M,)
        return terms, figures, out["expert_load"], dropped, grads

    def accumulate(self, batch, targets):
        """Sums over this replica's k micro-batches (`batch`: {key: (k, ...)}): terms (6,),
        figures (F,), load (M, E), dropped (M,), gradients (as `variables`)."""
        micro_batches = self.micro_batches
        if micro_batches == 1:
            return self.micro_step({k: v[0] for k, v in batch.items()}, targets)

        def body(i, terms, figures, load, dropped, grads):
            t_i, f_i, l_i, d_i, g_i = self.micro_step({k: v[i] for k, v in batch.items()},
                                                      targets)
            return (i + 1, terms + t_i, figures + f_i, load + l_i, dropped + d_i,
                    [g + gi for g, gi in zip(grads, g_i, strict=True)])

        zeros = (tf.zeros([len(LOSS_TERMS)]), tf.zeros([self.num_figures]),
                 tf.zeros([self.n_moe, self.n_experts]), tf.zeros([self.n_moe]),
                 [tf.zeros(v.shape, v.dtype) for v in self.variables])
        _, terms, figures, load, dropped, grads = tf.while_loop(
            lambda i, *_: i < micro_batches, body, (0, *zeros))
        return terms, figures, load, dropped, grads

    def update_router_biases(self, load):
        """Moves the trained routers' biases by the global expert load (float32 (M, E))."""
        speed = self.model.config.router_bias_update_speed
        for i, (moe, update) in enumerate(zip(self.model.moe_layers, self.moe_mask, strict=True)):
            if update:  # every replica's copy gets the same update (the global load)
                moe.update_bias(load[i], speed)

    def count_step(self):
        """Adds 1 to the step counter (if any)."""
        if self.step_counter is not None:
            self.step_counter.assign_add(1)

    def replica_step(self, batch):
        """One optimizer step on this replica's [k, b, T] slice of the global batch.

        Returns:
          (the step's outputs (`make_train_step`), the all-reduced gradients when the
          cross-replica context applies them (several replicas, no loss scaling), else []).
        """
        counts = source_counts(batch, self.num_sources)  # (2, S)
        ctx = tf.distribute.get_replica_context()
        targets = global_targets(ctx, batch["labels"], self.micro_batches, self.mtp_depths)
        terms, figures, load, dropped, grads = self.accumulate_fn(batch, targets)
        terms, figures, load, dropped, counts, grads = ctx.all_reduce(
            tf.distribute.ReduceOp.SUM, (terms, figures, load, dropped, counts, grads))
        grad_norm = tf.linalg.global_norm(grads)  # of the (loss-scaled) global gradient
        finite = tf.logical_and(tf.math.is_finite(grad_norm),
                                tf.reduce_all(tf.math.is_finite(terms)))
        if self.loss_scaling:  # the LossScaleOptimizer skips a non-finite step itself (and
            scale = tf.identity(self.optimizer.dynamic_scale)  # halves its scale): it must
            self.apply(grads, grad_norm, scale)  # see the overflow
            grad_norm = grad_norm / scale  # the unscaled norm
        elif self.replicas == 1:  # (several replicas: applied from the cross-replica context)
            tf.cond(finite, lambda: _then(self.apply(grads, grad_norm)), tf.no_op)
        if self.whole_step_compiled:  # one replica: the rest of the step in the same XLA cluster
            tf.cond(finite, lambda: _then(self.update_router_biases(load), self.count_step()),
                    tf.no_op)
        out = {"terms": terms, "grad_norm": grad_norm, "expert_load": load,
               "moe_dropped": dropped, "skipped": tf.logical_not(finite), "figures": figures,
               "source_tokens": counts[0], "source_sequences": counts[1]}
        return out, (grads if self.replicas > 1 and not self.loss_scaling else [])

    def apply(self, grads, grad_norm, scale=None):
        """Clips the global gradient (its norm `grad_norm`) and applies it (replica context).
        With loss scaling, `scale` is the loss scale the gradients carry."""
        clip = self.grad_clip_norm
        if self.loss_scaling:
            clip *= scale  # clipping scaled grads at clip*s = unscaled at clip
        clipped, _ = tf.clip_by_global_norm(grads, clip, use_norm=grad_norm)
        self.optimizer.apply(clipped, self.variables)

    def step_on(self, batch):
        """One step on `batch`: per-replica values of this step's micro-batch stacks."""
        strategy = self.strategy
        out, grads = strategy.run(self.replica_step_fn, args=(batch,))
        # All replicas hold the same all-reduced values: take the first local one.
        out = {k: strategy.experimental_local_results(v)[0] for k, v in out.items()}
        if not self.whole_step_compiled:
            tf.cond(out["skipped"], tf.no_op, lambda: self.cross_replica_update(out, grads))
        return out

    def cross_replica_update(self, out, grads):
        """The applied step's updates in the cross-replica context, one for every copy:
        the gradients `grads` (several replicas; else []), the router biases and the
        step counter. Returns a no-op (the end of a `tf.cond` branch)."""
        if grads:  # several replicas: the optimizer's apply runs on each (a cond in
            # the replica context could not hold the optimizer's merge_call)
            norm = out["grad_norm"]
            self.strategy.run(lambda g: _then(self.apply(g, norm)), args=(grads,))
        self.update_router_biases(out["expert_load"])
        self.count_step()
        return tf.no_op()

    def train_step(self, iterator):
        """One step on the next element of `iterator` (`step_on`)."""
        return self.step_on_fn(next(iterator))


def source_counts(batch, num_sources: int):
    """The target tokens and sequences of each source in this replica's batch.

    Args:
      batch: {"labels": int32 (k, b, T), or (k, b, 2, T) (DPO pairs); optionally
        "source": int32 (k, b), each sequence's source (absent: all source 0)}.
      num_sources: S.

    Returns:
      float32 (2, S): tokens (labels other than IGNORE_LABEL), sequences.
    """
    labels = batch["labels"]  # (k, b, T), or (k, b, 2, T): DPO pairs
    source = batch.get(SOURCE_KEY)  # (k, b) or None (one source)
    if source is None:
        source = tf.zeros(tf.shape(labels)[:2], tf.int32)  # (k, b)
    per_row = tf.reduce_sum(tf.cast(labels != IGNORE_LABEL, tf.float32),
                            axis=list(range(2, labels.shape.rank)))  # (k, b)
    source_ids = tf.reshape(source, [-1])  # (k b,)
    return tf.stack([
        tf.math.unsorted_segment_sum(tf.reshape(per_row, [-1]), source_ids, num_sources),
        tf.math.unsorted_segment_sum(tf.ones_like(source_ids, tf.float32), source_ids,
                                     num_sources)])  # (2, S): tokens, sequences


def global_targets(ctx, labels, micro_batches: int, mtp_depths: int):
    """N: the global batch's target tokens (`losses.num_targets`), all-reduced over `ctx`'s
    replicas.

    Args:
      ctx: the replica context.
      labels: int32 (k, b, T) or (k, b, 2, T), this replica's labels.
      micro_batches: k.
      mtp_depths: D, the MTP modules.

    Returns:
      (1 + D,) the main and each MTP depth's target counts over the global batch.
    """
    rows = tf.reshape(labels, [micro_batches, -1, labels.shape[-1]])  # (k, rows, T)
    local = tf.add_n([losses.num_targets(rows[i], mtp_depths)
                      for i in range(micro_batches)])  # (1 + D,)
    return ctx.all_reduce(tf.distribute.ReduceOp.SUM, local)  # (1 + D,) global


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
