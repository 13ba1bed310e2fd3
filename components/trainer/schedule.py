"""The optimizer and its learning-rate schedule, from the Keras 3 library.

AdamW (Loshchilov & Hutter 2019; gradients are clipped by global norm in the
training step, which also logs the norm); the schedule is
linear warmup to the peak then cosine decay to `min_learning_rate`
(`keras.optimizers.schedules.CosineDecay` with `warmup_target`). Weight decay is
not applied to RMSNorm weights or biases.
"""

from __future__ import annotations

import keras

from pipeline.configs import TrainConfig

NO_DECAY_NAME_PARTS = ("norm", "bias", "e_score_correction_bias")


def make_learning_rate_schedule(train: TrainConfig) -> keras.optimizers.schedules.LearningRateSchedule:
    warmup = min(train.warmup_steps, train.train_steps - 1)
    return keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup > 0 else train.learning_rate,
        decay_steps=max(train.train_steps - warmup, 1),
        alpha=train.min_learning_rate / train.learning_rate,
        warmup_target=train.learning_rate if warmup > 0 else None,
        warmup_steps=warmup,
    )


def make_optimizer(train: TrainConfig) -> keras.optimizers.Optimizer:
    optimizer = keras.optimizers.AdamW(
        learning_rate=make_learning_rate_schedule(train),
        weight_decay=train.weight_decay,
        beta_1=train.beta_1,
        beta_2=train.beta_2,
        epsilon=1e-8,
    )
    optimizer.exclude_from_weight_decay(var_names=list(NO_DECAY_NAME_PARTS))
    return optimizer
