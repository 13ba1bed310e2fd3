"""One training job: what `run_fn` runs in its own process for one worker, and
what each worker process runs when there are several (`launcher.py`).

`run(job)` picks the strategy and the precision for the devices it finds,
builds the input pipeline from the transformed training files, trains
(`train_loop.train`) and, on the chief, writes the run's figures to
`job.result_path` (JSON). The float32 copy that is evaluated and exported is
made by the caller (`run_fn`), from the returned model or the final checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainingJob:
    """Everything a training process needs; JSON-serializable for worker processes.

    Attributes:
      pipeline_config: `PipelineConfig.to_json()`.
      train_files: file patterns of the transformed training examples.
      checkpoint_dir: the stable checkpoint directory (`checkpoint_location.py`).
      log_dir: TensorBoard directory (chief).
      result_path: where the chief writes the run's figures (JSON).
      num_workers: worker processes in the cluster (1: no TF_CONFIG needed).
      peak_flops_per_device: peak FLOP/s of one device (CPU: one host) in the
        run's compute dtype, measured by the caller; 0 = measure here.
      peak_flops_source: how it was obtained ("probe:float32 matmul", "table:...").
      peak_probe: the CPU probe's figures (`hardware.PeakProbe.figures()`), or {}.
      intra_op_threads: TensorFlow intra-op threads (0 = TensorFlow's default);
        set by the launcher so that N workers on one CPU share its cores.
      eos_id: the tokenizer's end-of-sequence id, which separates packed documents.
      pad_id: the tokenizer's padding id (SFT rows are padded with it).
      base_model: a directory to warm-start from (`base_model.py`), or "".
      teacher_model: a directory holding a distillation teacher, or "".
      tokenizer_dir: Transform's output directory, whose assets hold the run's tokenizer,
        or a directory holding tokenizer.json (GRPO decodes its sampled completions with
        it), or "".
    """

    pipeline_config: str
    train_files: list[str]
    checkpoint_dir: str
    log_dir: str
    result_path: str
    num_workers: int = 1
    peak_flops_per_device: float = 0.0
    peak_flops_source: str = ""
    peak_probe: dict = dataclasses.field(default_factory=dict)
    intra_op_threads: int = 0
    eos_id: int = 1
    pad_id: int = 2
    base_model: str = ""
    teacher_model: str = ""
    tokenizer_dir: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrainingJob:
        return cls(**json.loads(text))


def is_mixture(config) -> bool:
    """Whether the run samples by weight (`mixture.py`): 2+ sources, or one source
    that stops when it runs out (`train.on_source_exhausted="stop"`). Otherwise the
    stream is exactly `data.make_train_dataset`'s (one source, repeated)."""
    return (len(config.data.source_weights()) > 1
            or config.train.on_source_exhausted == "stop")


def check_mixture(config) -> None:
    """Refuses what the Trainer cannot sample by weight.

    Raises:
      ValueError: `data.task` sft, dpo or grpo with 2+ `data.sources` (or "stop"), one line.
    """
    task = config.data.task
    if task != "pretrain" and is_mixture(config):
        raise ValueError(
            f"data.task={task} with data.sources {sorted(config.data.source_weights())} "
            f"(train.on_source_exhausted={config.train.on_source_exhausted!r}): the Trainer "
            f"samples {task} records from one source only; train on one source, repeated")


def make_dataset_fn(config, train_files: list[str], eos_id: int, pad_id: int):
    """() -> the run's dataset of global batches (see `train_loop.train`).

    Pretraining with 2+ sources (`config.data.source_weights()`), or "stop": the
    weighted mixture of the sources' records of the one train split
    (`mixture.make_mixture_train_dataset`, `train.on_source_exhausted`; batches carry
    "source", the index in sorted-name order). One source: `data.make_train_dataset`,
    unchanged. SFT: `data.make_sft_train_dataset`; DPO: `data.make_dpo_train_dataset`
    (pairs); GRPO: `data.make_grpo_train_dataset` (prompts and answers).

    Raises:
      ValueError: `check_mixture`.
    """
    from components.trainer import data, mixture

    check_mixture(config)
    tc = config.train
    weights = config.data.source_weights()

    def dataset_fn():
        if config.data.task == "sft":
            return data.make_sft_train_dataset(train_files, tc.seq_len, tc.batch_size,
                                               tc.shuffle_buffer, tc.seed, pad_id)
        if config.data.task == "dpo":
            return data.make_dpo_train_dataset(train_files, tc.seq_len, tc.batch_size,
                                               tc.shuffle_buffer, tc.seed, pad_id)
        if config.data.task == "grpo":
            return data.make_grpo_train_dataset(train_files, tc.seq_len, tc.grpo_max_new_tokens,
                                                tc.batch_size, tc.shuffle_buffer, tc.seed, pad_id)
        if is_mixture(config):
            return mixture.make_mixture_train_dataset(
                mixture.split_sources(train_files, weights), weights, tc.seq_len,
                tc.batch_size, tc.shuffle_buffer, tc.seed, eos_id, tc.on_source_exhausted)
        return data.make_train_dataset(train_files, tc.seq_len, tc.batch_size,
                                       tc.shuffle_buffer, tc.seed, eos_id)

    return dataset_fn


def check_sources_have_records(config, train_files: list[str]) -> None:
    """For a mixture: every source has a record in the train split (a source with none
    ends the sampled stream at once).

    Raises:
      ValueError: naming the sources without a record, and the files.
    """
    from components.trainer import mixture

    if config.data.task != "pretrain" or not is_mixture(config):
        return
    sources = mixture.split_sources(train_files, sorted(config.data.source_weights()))
    empty = [name for name, source in sources.items()
             if next(iter(mixture.read_source(source).take(1)), None) is None]
    if empty:
        raise ValueError(f"data sources {empty} have no record in the train split "
                         f"{train_files}: were all their records rejected, or is the name "
                         "wrong?")


def source_figures(config, train_files: list[str], result) -> dict:
    """The run's per-source figures beside `result`'s (source_weights, source_tokens,
    source_token_shares): {"source_epochs": {name: epochs of that source drawn}}
    (`mixture.measure_sources`: one more pass over the train split per source) and,
    when the data ran out (`result.stopped_early`), "stopped_early": "source 'X'
    exhausted at step s" (X: the source drawn furthest into its epoch, the one whose
    last window was drawn). SFT, DPO and GRPO runs: {} (records are not packed into
    windows).

    Raises:
      ValueError: a source has no record in the train split (`mixture.measure_sources`).
    """
    from components.trainer import mixture

    if config.data.task != "pretrain":
        return {}
    names = list(result.source_tokens)
    sources = (mixture.split_sources(train_files, names) if is_mixture(config)
               else {names[0]: train_files})
    epochs = mixture.epochs_drawn(result.source_sequences, mixture.measure_sources(sources),
                                  config.train.seq_len)
    figures = {"source_epochs": epochs}
    if result.stopped_early:
        exhausted = max(epochs, key=epochs.get)
        figures["stopped_early"] = (f"source {exhausted!r} exhausted at step "
                                    f"{result.train_steps}")
        log.warning("train.on_source_exhausted=stop: %s of train.train_steps=%d",
                    figures["stopped_early"], config.train.train_steps)
    return figures


def load_job_tokenizer(directory: str):
    """The `ByteLevelBpe` of `TrainingJob.tokenizer_dir`: a directory holding tokenizer.json
    (e.g. a model's assets), or Transform's output (its tokenizer asset).

    Raises:
      FileNotFoundError: neither.
    """
    import tensorflow as tf

    from tokenization.byte_level_bpe import TOKENIZER_FILE, ByteLevelBpe
    from tokenization.tokenizer import load_tokenizer

    if tf.io.gfile.exists(os.path.join(directory, TOKENIZER_FILE)):
        return ByteLevelBpe.from_file(directory)
    return load_tokenizer(directory)


def plan(job: TrainingJob):
    """(accelerator, strategy name, policy, policy reason) for this process's devices."""
    from components.trainer import hardware, precision, strategy
    from components.trainer.train_loop import resolve_jit_compile
    from config import PipelineConfig

    tc = PipelineConfig.from_json(job.pipeline_config).train
    accelerator = hardware.detect()
    name = strategy.resolve_name(tc.distribution_strategy, accelerator)
    policy, reason = precision.choose_policy(tc.precision, accelerator)
    if job.base_model:
        from savedmodel import base_model

        policy, reason = precision.model_policy(policy, reason,
                                                base_model.weight_dtype(job.base_model), tc)
    precision.check_xla(policy, accelerator, resolve_jit_compile(tc.jit_compile, accelerator))
    return accelerator, name, policy, reason


def run(job: TrainingJob):
    """Trains as this process's part of `job`. Returns the `TrainResult`.

    In a fresh process, call it before any other TensorFlow op (the strategy
    may configure collective ops, and thread settings apply only then).
    """
    import tensorflow as tf

    if job.intra_op_threads:
        tf.config.threading.set_intra_op_parallelism_threads(job.intra_op_threads)
    from components.trainer import hardware, precision, strategy, train_loop
    from config import PipelineConfig

    config = PipelineConfig.from_json(job.pipeline_config)
    accelerator, name, policy, reason = plan(job)
    dist = strategy.make_strategy(name)
    log.info("devices: %s x %d (%s); strategy %s; precision %s (%s)", accelerator.kind,
             max(accelerator.count, 1), accelerator.name, strategy.describe(dist), policy, reason)

    peak, source = job.peak_flops_per_device, job.peak_flops_source
    if peak <= 0:
        peak, source, job.peak_probe = hardware.peak_flops(accelerator,
                                                           precision.compute_dtype(policy))
    # CPUs: one probe covers a whole host, and loopback workers share one host.
    devices = strategy.cluster_hosts() if accelerator.kind == "cpu" else dist.num_replicas_in_sync
    total_peak = peak * devices
    log.info("peak %.1f GFLOP/s per device (%s) x %d = %.1f GFLOP/s for MFU",
             peak / 1e9, source, devices, total_peak / 1e9)

    dataset_fn = make_dataset_fn(config, job.train_files, job.eos_id, job.pad_id)
    tokenizer = None
    if config.data.task == "grpo":
        tokenizer = load_job_tokenizer(job.tokenizer_dir)
    try:
        result = train_loop.train(config, dataset_fn, job.checkpoint_dir, job.log_dir,
                                  strategy=dist, precision=policy, peak_flops=total_peak,
                                  base_model=job.base_model, teacher_model=job.teacher_model,
                                  tokenizer=tokenizer)
    except tf.errors.OutOfRangeError:
        check_sources_have_records(config, job.train_files)  # the likely cause, named
        raise
    if strategy.is_chief(dist):
        figures = {**result.figures(), **source_figures(config, job.train_files, result),
                   "precision_reason": reason,
                   "peak_flops_source": f"{source} x {devices}",
                   "peak_probe": job.peak_probe,
                   "accelerator": f"{accelerator.kind}: {accelerator.name}"}
        tf.io.gfile.makedirs(os.path.dirname(job.result_path) or ".")  # local or gs://
        with tf.io.gfile.GFile(job.result_path, "w") as f:
            json.dump(figures, f, indent=2)
    return result
