"""The optimizer and its learning-rate schedule, from the Keras 3 library.

AdamW (Loshchilov & Hutter 2019) with beta_2 = 0.95 (DeepSeek-V3 §4.2); the
schedule is linear warmup from 0 to the peak, then cosine decay to
`min_learning_rate` (`keras.optimizers.schedules.CosineDecay` with
`warmup_target`), in optimizer steps of the global batch: the same schedule
whatever the number of replicas or micro-batches.

Weight decay applies to matrices and embeddings only: variables of rank < 2
(RMSNorm scales, biases) are excluded by variable, since Keras matches
`var_names` against a variable's short name ("weight", "kernel"), which does
not say "norm".

The training step (`train_loop.py`) all-reduces the gradients itself, once, so
that it can clip by the norm of the *global* gradient; `AdamW` here therefore
skips the all-reduce Keras would do again inside `apply` under tf.distribute.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from config import TrainConfig


class AdamW(keras.optimizers.AdamW):
    """keras.optimizers.AdamW, with fused updates, applying already all-reduced gradients.

    Same math as Keras' AdamW (decoupled weight decay w -= w * wd * lr, then
    Adam with bias correction), two differences in how it runs:

    - the Adam update of each variable is TensorFlow's fused kernel
      (`ResourceApplyAdam`: the formula of `keras.optimizers.Adam.update_step`
      in one pass over m, v and w, instead of ~15 elementwise ops, with the
      learning-rate schedule evaluated once per step instead of once per
      variable for the decay): less memory traffic, and a step graph that
      traces in seconds less;
    - Keras 3's TensorFlow optimizer sums the gradients over replicas in
      `apply` when called in a replica context (`_all_reduce_sum_gradients`).
      The training step has done that already (to clip by the global norm and
      check it for NaN/Inf), so a second all-reduce would multiply the update
      by the number of replicas.

    Private Keras hooks. m and v are this class's own `momentums` and
    `velocities` (public `add_variable_from_reference`, the same variables,
    names and order as `Adam.build`, so checkpoints are unchanged). Four
    private hooks of Keras 3.6 remain, for want of a public route that keeps
    both the numerics and the step graph: `_all_reduce_sum_gradients` (no
    public switch turns the all-reduce off), `_apply_weight_decay` (Keras'
    own, with the public `weight_decay`, gives bit-identical weights but
    evaluates the schedule once per variable and traces a tiny model's step
    3-4x slower), `_use_weight_decay` (the query of the public
    `exclude_from_weight_decay`) and `_get_variable_index` (which maps the
    per-replica tf.Variable that `update_step` receives to its m and v).
    tests/components/test_optimizer_internals.py pins each (existence,
    signature, calls per step, results) on the pinned keras==3.6.0 and fails
    with the hook's name if an upgrade changes one.
    """

    def build(self, variables):
        """Creates m and v, zeros shaped like each variable, as `keras.optimizers.Adam.build` does.

        Raises:
          NotImplementedError: `amsgrad` is set (no v_hat here).
        """
        if self.built:
            return
        if self.amsgrad:
            raise NotImplementedError("amsgrad")
        keras.optimizers.Optimizer.build(self, variables)  # Adam.build would add private _momentums
        self.momentums, self.velocities = [], []
        for variable in variables:
            self.momentums.append(self.add_variable_from_reference(variable, name="momentum"))
            self.velocities.append(self.add_variable_from_reference(variable, name="velocity"))

    def _all_reduce_sum_gradients(self, grads_and_vars):
        return list(grads_and_vars)

    def _apply_weight_decay(self, variables):
        return  # in update_step, with the step's learning rate (same order: decay, then Adam)

    def update_step(self, gradient, variable, learning_rate):
        var = variable.value if isinstance(variable, keras.Variable) else variable  # tf.Variable
        dtype = var.dtype
        lr = tf.cast(learning_rate, dtype)
        if self.weight_decay is not None and self._use_weight_decay(variable):
            var.assign(var - var * tf.cast(self.weight_decay, dtype) * lr)
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=var.handle, m=self.momentums[index].value.handle,
            v=self.velocities[index].value.handle,
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step), lr=lr,
            beta1=beta_1, beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(gradient, dtype))


def make_learning_rate_schedule(train: TrainConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    """Linear warmup to `learning_rate`, then cosine decay to `min_learning_rate`.

    With s the optimizer step (`optimizer.iterations`: one per global batch,
    after its `grad_accum_steps` micro-batches are summed, whatever the number
    of replicas; a skipped step, not finite, does not count), peak =
    `learning_rate`, floor = `min_learning_rate`, W = min(`warmup_steps`,
    `train_steps` - 1) and D = max(`train_steps` - W, 1):

      lr(s) = peak * s / W                                             s < W
      lr(s) = floor + (peak - floor) * (1 + cos(pi * min(s - W, D) / D)) / 2
                                                                       s >= W

    so lr(0) = 0, lr(W) = peak and lr(s) = floor from s = `train_steps` on;
    with W = 0 there is no warmup and the decay starts at the peak. Keras
    reads the schedule before it counts the step: the n-th update (n = 1, 2,
    ...) uses lr(n - 1), so with warmup the first update has learning rate 0.

    The cosine is SGDR's annealing (Loshchilov & Hutter, ICLR 2017,
    arXiv:1608.03983, Eq. 5) as one cycle without restarts; warmup, then
    cosine to a floor, as in nanoGPT's `get_lr`. Implemented by
    `keras.optimizers.schedules.CosineDecay` (`warmup_target` = peak,
    `alpha` = floor / peak).

    Args:
      train: `learning_rate`, `min_learning_rate` (0 < floor <= peak, which
        `TrainConfig` checks), `warmup_steps` and `train_steps`.

    Returns:
      A Keras LearningRateSchedule: step (int or scalar tensor) -> float32
      learning rate.
    """
    warmup = min(train.warmup_steps, train.train_steps - 1)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup > 0 else train.learning_rate,
        decay_steps=max(train.train_steps - warmup, 1),
        alpha=train.min_learning_rate / train.learning_rate,
        warmup_target=train.learning_rate if warmup > 0 else None,
        warmup_steps=warmup,
    )


def no_decay_variables(variables) -> list:
    """The variables AdamW must not decay: rank < 2 (norm scales, biases)."""
    return [v for v in variables if len(v.shape) < 2]


def make_optimizer(train: TrainConfig, variables, loss_scale: bool = False) -> keras.optimizers.Optimizer:
    """AdamW over `variables` (built), wrapped in a dynamic loss scale if `loss_scale`.

    Args:
      train: the train config (peak/min learning rate, warmup, decay, betas).
      variables: the trainable variables; the optimizer is built on them.
      loss_scale: wrap in `keras.optimizers.LossScaleOptimizer` (mixed_float16).
        The training step then multiplies the loss by `dynamic_scale` and
        clips by `grad_clip_norm * dynamic_scale`; `apply` unscales, skips
        steps with non-finite gradients and adapts the scale.
    """
    optimizer = AdamW(
        learning_rate=make_learning_rate_schedule(train),
        weight_decay=train.weight_decay,
        beta_1=train.beta_1,
        beta_2=train.beta_2,
        epsilon=1e-8,
    )
    optimizer.exclude_from_weight_decay(var_list=no_decay_variables(variables))
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(variables)
    return optimizer
