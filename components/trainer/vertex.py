"""The Trainer on N workers: a Vertex AI CustomJob with worker pools, through TFX's own
Trainer extension (`tfx.extensions.google_cloud_ai_platform`).

`deepseek-tfx compile-kfp --trainer-workers N` compiles `VertexTrainer`. Its task in the
pipeline runs `VertexExecutor`, which submits one CustomJob and waits for it:

  worker_pool_specs[0]  replica_count 1      the chief
  worker_pool_specs[1]  replica_count N - 1  the workers

both in the pipeline's image and on the same `machine_spec`. Vertex AI sets TF_CONFIG
(`cluster: {chief: [...], worker: [...]}`) in every replica, and each replica runs
`ReplicaExecutor`: this project's Trainer executor, whose `run_fn` sees the multi-task
TF_CONFIG and trains as one MultiWorkerMirroredStrategy worker (`cluster_worker.py`), the
same code path as `--num-workers N` on one machine. The chief evaluates, exports and
writes `training_summary.json` beside the Model; when the job has succeeded,
`VertexExecutor` records its figures on the Model artifact in ML Metadata, as the
one-machine Trainer does (`executor.record_summary`).

`scheduling.restart_job_on_worker_restart` is on: a MultiWorkerMirroredStrategy group
cannot take back a restarted worker, so Vertex AI restarts all replicas, which resume
from the last checkpoint under the pipeline root.
"""

from __future__ import annotations

import json
import os

from tfx.components.util import udf_utils
from tfx.dsl.components.base import executor_spec
from tfx.extensions.google_cloud_ai_platform import constants as vertex_constants
from tfx.extensions.google_cloud_ai_platform.trainer import executor as vertex_executor
from tfx.types import artifact_utils, standard_component_specs

from common.json_file import read_json
from components.trainer.cluster_worker import is_chief, platform_cluster
from components.trainer.component import Trainer
from components.trainer.executor import Executor, record_summary
from components.trainer.preemption import PREEMPTED_EXIT_CODE, Preempted
from components.trainer.run_fn import TRAINING_SUMMARY

DEFAULT_REGION = "us-central1"
DEFAULT_MACHINE_TYPE = "n1-standard-8"
TRAINING_ARGS_KEY = vertex_executor.TRAINING_ARGS_KEY  # "ai_platform_training_args"


def worker_pool_specs(num_workers: int, image: str, machine_type: str = DEFAULT_MACHINE_TYPE,
                      accelerator_type: str = "", accelerator_count: int = 0) -> list[dict]:
    """Vertex AI `worker_pool_specs` of N MultiWorkerMirroredStrategy workers: pool 0 the
    chief (replica_count 1), pool 1 the other N - 1; the same image and machine_spec.

    TFX sets each pool's `container_spec.command` (its `run_executor` entry point).

    Raises:
      ValueError: num_workers < 2, an empty image or machine type, an accelerator type
        without a count >= 1 or a count without a type.
    """
    if num_workers < 2:
        raise ValueError(f"num_workers={num_workers}: a CustomJob of worker pools needs >= 2 "
                         f"(1 worker trains in the pipeline's own task)")
    if not image or not machine_type:
        raise ValueError(f"image={image!r}, machine_type={machine_type!r}: both are required")
    if bool(accelerator_type) != (accelerator_count > 0):
        raise ValueError(f"accelerator_type={accelerator_type!r}, accelerator_count="
                         f"{accelerator_count}: give both (e.g. NVIDIA_TESLA_T4 and 1) or neither")
    machine_spec = {"machine_type": machine_type}
    if accelerator_type:
        machine_spec.update(accelerator_type=accelerator_type, accelerator_count=accelerator_count)

    def pool(replicas: int) -> dict:
        return {"machine_spec": dict(machine_spec), "replica_count": replicas,
                "container_spec": {"image_uri": image}}

    return [pool(1), pool(num_workers - 1)]


def custom_config(num_workers: int, image: str, project: str, region: str = DEFAULT_REGION,
                  machine_type: str = DEFAULT_MACHINE_TYPE, accelerator_type: str = "",
                  accelerator_count: int = 0) -> dict:
    """The Trainer's custom_config keys that make `VertexTrainer` submit the CustomJob:
    `ai_platform_training_args` (project, job_spec with `worker_pool_specs` and
    `scheduling`), `ai_platform_enable_vertex`, `ai_platform_vertex_region`.

    Raises:
      ValueError: an empty project or region, or see `worker_pool_specs`.
    """
    if not project or not region:
        raise ValueError(f"project={project!r}, region={region!r}: a Vertex AI CustomJob "
                         f"needs both")
    pools = worker_pool_specs(num_workers, image, machine_type, accelerator_type,
                              accelerator_count)
    return {
        TRAINING_ARGS_KEY: {
            "project": project,
            "job_spec": {"worker_pool_specs": pools,
                         "scheduling": {"restart_job_on_worker_restart": True}},
        },
        vertex_constants.ENABLE_VERTEX_KEY: True,
        vertex_constants.VERTEX_REGION_KEY: region,
    }


class ReplicaExecutor(Executor):
    """What each CustomJob replica runs (`run_executor --executor_class_path ...`).

    The chief runs this project's Trainer executor whole (`run_fn`, which evaluates and
    exports, then the figures). The other replicas only call `run_fn`, which returns after
    training: TFX's GenericExecutor would fail them for the serving model that only the
    chief writes.
    """

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        """Runs `run_fn` as this replica of the platform's cluster.

        Raises:
          SystemExit(143): the training worker was preempted (SIGTERM) and saved a
            checkpoint, so the replica exits with the same status.
          WorkerExitError: the training worker failed otherwise; ValueError and others
            from `run_fn`, see `Executor.Do`.
        """
        try:
            cluster = platform_cluster()
            if cluster is None or is_chief(cluster):
                super().Do(input_dict, output_dict, exec_properties)
                return
            self._log_startup(input_dict, output_dict, exec_properties)
            fn_args = self._GetFnArgs(input_dict, output_dict, exec_properties)
            udf_utils.get_fn(exec_properties, "run_fn")(fn_args)
        except Preempted as e:
            raise SystemExit(PREEMPTED_EXIT_CODE) from e


class VertexExecutor(vertex_executor.GenericExecutor):
    """TFX's Vertex AI Trainer executor, whose replicas run `ReplicaExecutor`, and which
    records the chief's `training_summary.json` on the Model artifact afterwards."""

    def _GetExecutorClass(self):
        return ReplicaExecutor

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        """Submits the CustomJob, waits for it, then records the run's figures.

        Raises:
          RuntimeError: the CustomJob failed or was cancelled (from TFX's runner).
          ValueError: no `ai_platform_training_args` in custom_config.
          FileNotFoundError: the job succeeded without a `training_summary.json`.
        """
        super().Do(input_dict, output_dict, exec_properties)
        model = artifact_utils.get_single_instance(output_dict[standard_component_specs.MODEL_KEY])
        record_summary(model, read_json(os.path.join(model.uri, TRAINING_SUMMARY),
                                        "the Trainer's training summary"))
        bases = input_dict.get(standard_component_specs.BASE_MODEL_KEY) or []
        if bases:  # as `Executor.Do`: the model it started from
            model.set_string_custom_property("base_model_uri", bases[0].uri)
            if bases[0].id:
                model.set_int_custom_property("base_model_id", bases[0].id)
        custom = exec_properties.get("custom_config") or {}
        if isinstance(custom, str):
            custom = json.loads(custom)
        if custom.get("teacher_model"):
            model.set_string_custom_property("teacher_model_uri", custom["teacher_model"])


class VertexTrainer(Trainer):
    """This project's Trainer, trained on N workers as a Vertex AI CustomJob (give it
    `custom_config(...)`'s keys in its custom_config)."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VertexExecutor)
