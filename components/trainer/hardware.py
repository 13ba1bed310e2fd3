"""What the Trainer runs on, and its peak FLOP/s (the denominator of MFU).

`detect()` reports the accelerator kind (TPU, GPU or CPU), its name and count
without creating TensorFlow's eager context (so it can run before
MultiWorkerMirroredStrategy configures collective ops), plus the CPU's
feature flags (AMX: where bfloat16 matmuls beat float32 on a CPU).

Peak FLOP/s: GPUs and TPUs from the published table next to the model
(`models.deepseek.flops.PEAK_FLOPS_TABLE`); CPUs, and accelerators missing
from the table, by a matmul probe (`probe_matmul_peak`): TensorFlow's own
matmul on a few matrix shapes (`PROBE_SHAPES`) in the compute dtype, each
warmed up, then timed several times; the best shape's median rate. The probe is
what MFU on a CPU is measured against: what the BLAS actually reaches here,
not a data-sheet number. The Trainer probes before training, and
`training_summary.json` records the probe's figures (`peak_probe`). A CPU's probe is kept
for PROBE_CACHE_HOURS in a per-user cache (`cached_cpu_probe`), keyed by the CPU model, the
cores and threads this process may use, the TensorFlow version and the dtype: runs on the
same machine then share one MFU denominator, and a run starts 3-5 s sooner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import math
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
# ~125 GFLOP/s, 1024x4096x1024 and 2048x8192x256 ~155-170 GFLOP/s).
PROBE_SHAPES = ((1024, 1024, 1024), (2048, 2048, 2048), (1024, 4096, 1024), (2048, 8192, 256))
PROBE_WARMUP_S = 1.0  # once, before the first shape: thread pools up, clocks settled
PROBE_SHAPE_WARMUP_RUNS = 2  # untimed runs of every shape before its timed ones (caches)
PROBE_REPEATS = 9  # timed runs per shape; the shape's figure is their median


@dataclasses.dataclass(frozen=True)
class PeakProbe:
    """A matmul probe's result: the peak FLOP/s MFU is measured against, and how it was got.

    Attributes:
      peak_flops: FLOP/s, the best over `shapes` of each shape's median rate.
      dtype: the matmuls' dtype ("float32", "bfloat16", "float16").
      shapes: {"MxKxN": [median, min, max] GFLOP/s over the timed runs}.
      warmup_s: seconds the first shape ran untimed (each shape then ran
        `PROBE_SHAPE_WARMUP_RUNS` untimed runs of its own).
      repeats: timed runs per shape.
      wall_s: seconds the probe took.
    """

    peak_flops: float
    dtype: str
    shapes: dict
    warmup_s: float
    repeats: int
    wall_s: float

    @property
    def source(self) -> str:
        return f"probe:{self.dtype} matmul"

    def figures(self) -> dict:
        """JSON-able figures (`training_summary.json`'s `peak_probe`)."""
        return {"peak_gflops": round(self.peak_flops / 1e9, 2), "dtype": self.dtype,
                "shapes_gflops_median_min_max": self.shapes, "warmup_s": self.warmup_s,
                "repeats": self.repeats, "wall_s": round(self.wall_s, 2),
                "rule": "best over shapes of the median of timed runs after warm-up"}


def probe_matmul_peak(dtype: str = "float32", shapes=PROBE_SHAPES, repeats: int = PROBE_REPEATS,
                      warmup_s: float = PROBE_WARMUP_S, device: str | None = None) -> PeakProbe:
    """Peak FLOP/s of TensorFlow matmuls (2 m k n FLOPs each), made to repeat run to run.

    First, untimed runs of the first shape for `warmup_s` seconds (thread pools
    started, clocks settled: once, they stay so). Then for each (m, k, n) of
    `shapes`: PROBE_SHAPE_WARMUP_RUNS untimed runs (its operands in cache), then
    `repeats` timed runs; the shape's rate is their median (one slow or lucky run
    does not move it). The peak is the best shape's median. Both the Trainer
    (`run_fn`, once per run, before training) and `benchmarks/train_throughput.py`
    call this, so their MFUs share a denominator. It measures what this process can
    get: run it when the machine is otherwise idle. About 3.3 s on a 2-core CPU (a
    warm-up per shape took 6.1 s for the same peak: `benchmarks/peak_probe.py`).

    Args:
      dtype: "float32", "bfloat16" or "float16".
      shapes: (m, k, n) of the matmuls tried.
      repeats: timed runs per shape (>= 1).
      warmup_s: untimed seconds before the first shape's timed runs.
      device: e.g. "/GPU:0"; default: TensorFlow's placement.

    Returns:
      A `PeakProbe`.

    Raises:
      ValueError: repeats < 1.
    """
    import statistics

    import tensorflow as tf

    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    begin = time.perf_counter()
    per_shape, best = {}, 0.0
    with tf.device(device) if device else contextlib.nullcontext():
        for i, (m, k, n) in enumerate(shapes):
            # Variables, so that graph optimizations cannot fold the product away.
            a = tf.Variable(tf.cast(tf.random.normal([m, k]), dtype))
            b = tf.Variable(tf.cast(tf.random.normal([k, n]), dtype))
            matmul = tf.function(lambda a=a, b=b: tf.matmul(a, b))
            warm_end = time.perf_counter() + (warmup_s if i == 0 else 0.0)  # once
            for _ in range(PROBE_SHAPE_WARMUP_RUNS):
                matmul().numpy()
            while time.perf_counter() < warm_end:
                matmul().numpy()
            rates = []
            for _ in range(repeats):
                start = time.perf_counter()
                matmul().numpy()
                rates.append(2 * m * k * n / (time.perf_counter() - start))
            median = statistics.median(rates)
            per_shape[f"{m}x{k}x{n}"] = [round(r / 1e9, 1) for r in (median, min(rates), max(rates))]
            best = max(best, median)
    return PeakProbe(best, dtype, per_shape, warmup_s, repeats, time.perf_counter() - begin)


def peak_flops(accelerator: Accelerator, compute_dtype: str) -> tuple[float, str, dict]:
    """Peak FLOP/s of ONE device of `accelerator` in `compute_dtype`, its source, and the
    probe's figures.

    GPUs/TPUs: the published table, else a probe on the first device. CPU: the
    probe (the whole host: all cores together form one device here), through the
    per-user cache (`cached_cpu_probe`).

    Returns:
      (flop_per_s, source, probe) with source "table:<key>" or "probe:<dtype> matmul",
      and probe the `PeakProbe.figures()` of a probe ({} for a table value).
    """
    if accelerator.kind in ("gpu", "tpu"):
        import tensorflow as tf

        tf32 = (accelerator.kind == "gpu"
                and tf.config.experimental.tensor_float_32_execution_enabled()
                and (accelerator.compute_capability or (0, 0)) >= (8, 0))
        peak = flops.table_peak_flops(accelerator.name, compute_dtype, tf32=tf32)
        if peak:
            return peak, f"table:{accelerator.name}", {}
        if accelerator.kind == "tpu":
            raise ValueError(f"no peak FLOP/s known for {accelerator.name!r}")
        probe = probe_matmul_peak(compute_dtype, shapes=((8192, 8192, 8192),), device="/GPU:0")
        return probe.peak_flops, probe.source, probe.figures()
    figures = cached_cpu_probe(accelerator, compute_dtype)
    return figures["peak_flops"], f"probe:{compute_dtype} matmul", figures


PROBE_CACHE_DIR_ENV = "DEEPSEEK_TFX_CACHE_DIR"  # default: $XDG_CACHE_HOME or ~/.cache, /deepseek-tfx
PEAK_PROBE_ENV = "DEEPSEEK_TFX_PEAK_PROBE"  # "fresh": probe again, whatever the cache holds
PROBE_CACHE_HOURS = 24.0  # a cached probe older than this is measured again

log = logging.getLogger(__name__)


def probe_cache_path() -> str:
    """The JSON file of cached CPU probes: `$DEEPSEEK_TFX_CACHE_DIR/peak_probe.json`, by
    default under `$XDG_CACHE_HOME` (or `~/.cache`) `/deepseek-tfx/`."""
    base = os.environ.get(PROBE_CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "deepseek-tfx")
    return os.path.join(base, "peak_probe.json")


def probe_key(accelerator: Accelerator, dtype: str) -> str:
    """What a CPU probe's figure depends on: the CPU model, the cores this process may run
    on, TensorFlow's intra-op threads (0: its default), its version, and the dtype."""
    import tensorflow as tf

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = tf.config.threading.get_intra_op_parallelism_threads()
    return f"{accelerator.name}|cores={cores}|intra_op_threads={threads}|tf={tf.__version__}|{dtype}"


def _usable(entry, dtype: str, now: float) -> bool:
    try:
        return (entry["dtype"] == dtype and math.isfinite(entry["peak_flops"])
                and entry["peak_flops"] > 0
                and 0 <= now - entry["measured_at_unix"] < PROBE_CACHE_HOURS * 3600)
    except (KeyError, TypeError):
        return False


def cached_cpu_probe(accelerator: Accelerator, dtype: str, probe=None) -> dict:
    """The CPU probe's figures (`PeakProbe.figures()` plus `peak_flops` in FLOP/s,
    `measured_at`, `key` and `cached`), from the cache when it holds a usable entry for
    `probe_key(accelerator, dtype)` younger than PROBE_CACHE_HOURS, else from a new probe
    (`probe`, default `probe_matmul_peak(dtype)`), which is then written to the cache.

    Args:
      accelerator: the CPU (`detect()`).
      dtype: the matmuls' dtype, as `probe_matmul_peak`'s.
      probe: a callable dtype -> `PeakProbe` (tests pass a fake).

    `DEEPSEEK_TFX_PEAK_PROBE=fresh` probes again whatever the cache holds. An unreadable or
    malformed cache file is measured over; one that cannot be written is logged and left
    (the run goes on with its probe). Writes are atomic (a temporary file, then rename), so
    concurrent runs on one machine never read half a file.
    """
    path, key, now = probe_cache_path(), probe_key(accelerator, dtype), time.time()
    try:
        with open(path, encoding="utf-8") as f:
            cache = json.load(f)
        cache = cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        cache = {}
    entry = cache.get(key)
    if os.environ.get(PEAK_PROBE_ENV, "") != "fresh" and _usable(entry, dtype, now):
        return {**entry, "cached": True}
    result = (probe or probe_matmul_peak)(dtype)
    entry = {**result.figures(), "peak_flops": result.peak_flops, "key": key,
             "measured_at_unix": now, "cache": path,
             "measured_at": datetime.datetime.fromtimestamp(now, datetime.timezone.utc)
             .isoformat(timespec="seconds")}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({**cache, key: entry}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("peak probe not cached (%s): %s", path, e)
    return {**entry, "cached": False}

