"""What the Trainer runs on, and its peak FLOP/s (the denominator of MFU).

`detect()` reports the accelerator kind (TPU, GPU or CPU), its name and count
without creating TensorFlow's eager context (so it can run before
MultiWorkerMirroredStrategy configures collective ops), plus the CPU's
feature flags (AMX decides whether bfloat16 pays off on a CPU).

Peak FLOP/s: GPUs and TPUs from the published table next to the model
(`models.deepseek.flops.PEAK_FLOPS_TABLE`); CPUs, and accelerators missing
from the table, by a matmul probe: the best FLOP/s that TensorFlow's own
matmul reaches on a few matrix shapes (`PROBE_SHAPES`), in the compute dtype.
The probe is what MFU on a CPU is measured against: what the BLAS actually
reaches here, not a data-sheet number (on the 2-core AMD EPYC of the project
notes, ~155-170 GFLOP/s float32, against a theoretical 2 cores x 32 FLOP/cycle
x ~3 GHz ~ 190 GFLOP/s).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time

from models.deepseek import flops


@dataclasses.dataclass(frozen=True)
class Accelerator:
    """The devices one training process sees.

    Attributes:
      kind: "tpu", "gpu" or "cpu".
      name: device name ("NVIDIA A100-SXM4-40GB", "TPU v4", or the CPU model).
      count: devices of that kind visible to this process (CPU: 1, all cores).
      compute_capability: (major, minor) of the first GPU, else None.
      cpu_flags: feature flags of the host CPU (from /proc/cpuinfo; empty elsewhere).
    """

    kind: str
    name: str
    count: int
    compute_capability: tuple[int, int] | None = None
    cpu_flags: frozenset[str] = frozenset()

    @property
    def cpu_has_amx(self) -> bool:
        """Intel AMX tiles with bfloat16: the CPUs where bf16 matmuls beat float32."""
        return "amx_bf16" in self.cpu_flags


def cpu_info(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
    """(model name, feature flags) of the host CPU; ("cpu", {}) when unknown."""
    name, flags = "cpu", frozenset()
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and name == "cpu":
                    name = value.strip()
                elif key == "flags" and not flags:
                    flags = frozenset(value.split())
                if name != "cpu" and flags:
                    break
    except OSError:
        pass
    return name, flags


def tpu_present() -> bool:
    """A Cloud TPU is configured (TPU_NAME / COLAB_TPU_ADDR) or attached (TPU VM)."""
    return bool(os.environ.get("TPU_NAME") or os.environ.get("COLAB_TPU_ADDR")
                or os.path.exists("/dev/accel0") or os.path.exists("/dev/vfio/0"))


def detect() -> Accelerator:
    """The accelerator this process trains on. Does not initialize the eager context."""
    import tensorflow as tf

    cpu_name, cpu_flags = cpu_info()
    if tpu_present():
        name = os.environ.get("TPU_ACCELERATOR_TYPE", "TPU")  # e.g. "v4-8"
        if not name.upper().startswith("TPU"):
            name = f"TPU {name}"
        return Accelerator("tpu", name, 0, None, cpu_flags)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        details = tf.config.experimental.get_device_details(gpus[0])
        return Accelerator("gpu", details.get("device_name", "GPU"), len(gpus),
                           details.get("compute_capability"), cpu_flags)
    return Accelerator("cpu", cpu_name, 1, None, cpu_flags)


# (m, k, n) of the probe's matmuls: squares, plus the large-k shapes where
# TensorFlow's CPU matmul runs fastest (measured on a 2-core AMD EPYC: 2048^3
# ~125 GFLOP/s, 1024x4096x1024 and 2048x8192x256 ~155-170 GFLOP/s). The best
# of them is the peak: the highest matmul rate seen is the conservative denominator.
PROBE_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (1024, 4096, 1024), (2048, 8192, 256))


def matmul_peak_flops(dtype: str = "float32", shapes=PROBE_SHAPES, repeats: int = 5,
                      device: str | None = None) -> float:
    """Best FLOP/s of TensorFlow matmuls (2 m k n FLOPs each) over `shapes` x `repeats`.

    Takes ~3 s on a 2-core CPU. Run it when the machine is otherwise idle:
    it measures what this process can get, so other load lowers it.

    Args:
      dtype: "float32", "bfloat16" or "float16".
      shapes: (m, k, n) of the matmuls tried.
      repeats: timed runs per shape (after one untimed run).
      device: e.g. "/GPU:0"; default: TensorFlow's placement.
    """
    import tensorflow as tf

    best = 0.0
    with tf.device(device) if device else contextlib.nullcontext():
        for m, k, n in shapes:
            # Variables, so that graph optimizations cannot fold the product away.
            a = tf.Variable(tf.cast(tf.random.normal([m, k]), dtype))
            b = tf.Variable(tf.cast(tf.random.normal([k, n]), dtype))
            matmul = tf.function(lambda a=a, b=b: tf.matmul(a, b))
            matmul().numpy()
            for _ in range(repeats):
                start = time.perf_counter()
                matmul().numpy()
                best = max(best, 2 * m * k * n / (time.perf_counter() - start))
    return best


def peak_flops(accelerator: Accelerator, compute_dtype: str) -> tuple[float, str]:
    """Peak FLOP/s of ONE device of `accelerator` in `compute_dtype`, and its source.

    GPUs/TPUs: the published table, else a probe on the first device. CPU: the
    probe (the whole host: all cores together form one device here).

    Returns:
      (flop_per_s, source) with source "table:<key>" or "probe:<dtype> matmul".
    """
    if accelerator.kind in ("gpu", "tpu"):
        import tensorflow as tf

        tf32 = (accelerator.kind == "gpu"
                and tf.config.experimental.tensor_float_32_execution_enabled()
                and (accelerator.compute_capability or (0, 0)) >= (8, 0))
        peak = flops.table_peak_flops(accelerator.name, compute_dtype, tf32=tf32)
        if peak:
            return peak, f"table:{accelerator.name}"
        if accelerator.kind == "tpu":
            raise ValueError(f"no peak FLOP/s known for {accelerator.name!r}")
        return (matmul_peak_flops(compute_dtype, shapes=((8192, 8192, 8192),), device="/GPU:0"),
                f"probe:{compute_dtype} matmul")
    return matmul_peak_flops(compute_dtype), f"probe:{compute_dtype} matmul"

