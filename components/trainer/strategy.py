"""Which tf.distribute strategy trains the model.

`train.distribution_strategy = "auto"` picks, in order:

  a TPU is present                        TPUStrategy
  TF_CONFIG names more than one task      MultiWorkerMirroredStrategy (one replica per
                                          local device on each worker; the launcher in
                                          `launcher.py` runs N workers on one machine)
  more than one local GPU                 MirroredStrategy
  otherwise                               one device (TensorFlow's default strategy)

and the other values force one of them. Every strategy is fed the same way
(`data.distribute_global_batches`): each input pipeline builds the same global
batches and keeps its replicas' rows, so the replicas together see exactly the
global batch of a one-device run.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from components.trainer import hardware


def tf_config() -> dict:
    """TF_CONFIG as a dict ({} when unset)."""
    raw = os.environ.get("TF_CONFIG", "")
    return json.loads(raw) if raw else {}


def cluster_size(config: dict | None = None) -> int:
    """Number of chief + worker tasks in TF_CONFIG (0 when there is none)."""
    cluster = (tf_config() if config is None else config).get("cluster", {})
    return sum(len(cluster.get(job, [])) for job in ("chief", "worker"))


def cluster_hosts(config: dict | None = None) -> int:
    """Distinct hosts among the chief + worker tasks (1 without TF_CONFIG).

    N workers on loopback share one machine: MFU on CPUs divides by the peak of
    the hosts, not of the workers.
    """
    cluster = (tf_config() if config is None else config).get("cluster", {})
    hosts = {addr.rsplit(":", 1)[0] for job in ("chief", "worker") for addr in cluster.get(job, [])}
    return max(len(hosts), 1)


def resolve_name(requested: str, accelerator: hardware.Accelerator) -> str:
    """The strategy "auto" stands for here (other values are returned as they are)."""
    if requested != "auto":
        return requested
    if accelerator.kind == "tpu":
        return "tpu"
    if cluster_size() > 1:
        return "multi_worker"
    if accelerator.kind == "gpu" and accelerator.count > 1:
        return "mirrored"
    return "one_device"


def make_strategy(name: str, devices: list[str] | None = None) -> tf.distribute.Strategy:
    """Creates the strategy `name` ("one_device", "mirrored", "multi_worker", "tpu").

    Create it before any other TensorFlow op runs in the process:
    MultiWorkerMirroredStrategy must configure collective ops at program startup.

    Args:
      name: a resolved strategy name (see `resolve_name`).
      devices: for "mirrored", the devices (default: all local GPUs).
    """
    if name == "one_device":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=devices)
    if name == "multi_worker":
        if not tf_config():
            raise ValueError("train.distribution_strategy='multi_worker' needs TF_CONFIG "
                             "(or run with --num-workers N)")
        return tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.AUTO))
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
            tpu=os.environ.get("TPU_NAME", "local"))
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise ValueError(f"unknown strategy {name!r}")


# TensorFlow's default strategy (one device, no distribution), a singleton:
# what `tf.distribute.get_strategy()` returns outside every strategy's scope.
# No scope is open while this module is imported: `make_strategy` creates ours.
_DEFAULT_STRATEGY = tf.distribute.get_strategy()


def describe(strategy: tf.distribute.Strategy) -> str:
    """A short name for logs and ML Metadata, e.g. "MultiWorkerMirroredStrategy".

    "OneDevice" for TensorFlow's default strategy; the public class name for
    MultiWorkerMirroredStrategy and TPUStrategy (whose classes are named
    CollectiveAllReduceStrategy and TPUStrategyV2); otherwise the class name.
    """
    if strategy is _DEFAULT_STRATEGY:
        return "OneDevice"
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "MultiWorkerMirroredStrategy"
    if isinstance(strategy, tf.distribute.TPUStrategy):
        return "TPUStrategy"
    return type(strategy).__name__


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """Worker processes taking part (1 unless multi-worker).

    For MultiWorkerMirroredStrategy, the chief and worker tasks of its cluster
    (`strategy.cluster_resolver`, TF_CONFIG's by default); 1 for every other
    strategy, a TPUStrategy included (one client process drives all its hosts).
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return 1
    return max(cluster_size({"cluster": strategy.cluster_resolver.cluster_spec().as_dict()}), 1)


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """Whether this process writes checkpoints, TensorBoard events and results."""
    return bool(strategy.extended.should_checkpoint)
