"""The Trainer component: TFX's Trainer with this project's executor.

Identical to `tfx.components.Trainer` (same spec, inputs, outputs, `run_fn`),
but its executor also records the run's figures on the Model artifact in ML
Metadata (`executor.py`). TFX recommends subclassing over the deprecated
`custom_executor_spec` argument.
"""

from __future__ import annotations

from tfx.components.trainer import component as tfx_trainer
from tfx.dsl.components.base import executor_spec

from components.trainer.executor import Executor


class Trainer(tfx_trainer.Trainer):
    """`tfx.components.Trainer` whose executor records training figures in MLMD."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(Executor)
