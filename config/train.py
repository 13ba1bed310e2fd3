"""The training side of the config: the Trainer (`train`) and the Evaluator's blessing
rule (`eval`)."""

from __future__ import annotations

import dataclasses
import re

from config.checks import check_choice, check_positive

STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
JIT_COMPILE = ("auto", "true", "false")
LORA_TARGETS = ("attention", "mlp")
EXPORT_DTYPES = ("auto", "float32", "bfloat16", "int8")  # savedmodel.precision.WEIGHT_DTYPES


def _check_trainable(value: str) -> None:
    """Raises ValueError unless `value` is `all`, `top:N` (N >= 0) or a valid regular
    expression (the forms of `TrainConfig.trainable`)."""
    if value == "all":
        return
    if value.startswith("top:"):
        n = value[4:]
        if not n.isdigit() or int(n) < 0:
            raise ValueError(f"train.trainable={value!r}: top:N needs a whole number N >= 0")
        return
    try:
        re.compile(value)
    except re.error as e:
        raise ValueError(f"train.trainable={value!r} is neither all, top:N nor a valid "
                         f"regular expression ({e})") from e


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """The Trainer: packing, optimizer, schedule, distribution, precision, checkpoints.

    Attributes:
      seq_len: tokens per packed training sequence (documents are concatenated
        with `[EOS]` between them and cut into windows of seq_len + 1).
      batch_size: the global batch, in sequences per optimizer step, whatever
        the number of replicas and micro-batches; the learning-rate schedule is
        defined in optimizer steps of this global batch.
      grad_accum_steps: micro-batches per optimizer step (gradient
        accumulation): each replica runs batch_size / (grad_accum_steps *
        replicas) sequences at a time; the update equals one step on the whole
        global batch.
      train_steps: optimizer steps.
      learning_rate: peak learning rate of AdamW.
      min_learning_rate: the floor of the cosine decay.
      warmup_steps: linear warmup steps from 0 to the peak.
      weight_decay: decoupled weight decay (AdamW), applied to matrices and
        embeddings only (not to RMSNorm scales or biases).
      beta_1, beta_2: AdamW moments (beta_2 = 0.95 as in DeepSeek-V3 §4.2).
      grad_clip_norm: global-norm gradient clipping (of the global gradient).
      distribution_strategy: `auto` (TPUStrategy when a TPU is present,
        MultiWorkerMirroredStrategy when TF_CONFIG names several tasks,
        MirroredStrategy for several local GPUs, else one device), or one of
        `one_device`, `mirrored`, `multi_worker`, `tpu` to force it.
      precision: Keras dtype policy: `auto` (mixed_bfloat16 on TPUs and GPUs of
        compute capability >= 8.0; mixed_float16 with dynamic loss scaling on
        older GPUs >= 7.0; float32 otherwise, CPUs included: bf16 is slower
        there without AMX, and only ~14% faster with it), or `float32`, `mixed_bfloat16`,
        `mixed_float16`. Router scores, softmax, RMSNorm statistics and the
        loss stay float32 in every policy.
      recompute_activations: recompute each decoder block's activations in
        the backward pass (gradient checkpointing): less memory, ~1/3 more compute.
      checkpoint_every: steps between checkpoints.
      log_every: steps between log lines and TensorBoard points.
      eval_batches: batches of the eval split the Trainer scores at the end.
      shuffle_buffer: documents in the shuffle buffer.
      seed: seed of initialization and data order.
      trainable: which weights train: `all`; `top:N`, the last N decoder blocks
        plus the final norm, the LM head (the embedding when tied) and the MTP
        modules; or a regular expression matched (`re.search`) against weight
        paths such as `layers.3/mlp/experts/up_proj/kernel` (a MoE layer's routed
        experts are stacked kernels, (E, in, out)). The others stay
        bit-identical and get no optimizer slots (nor router-bias updates).
      lora_rank: > 0 trains low-rank adapters of this rank (Keras `enable_lora`)
        on the `lora_targets` projections instead of the weights themselves; the
        exported model carries the merged weights (Hu et al. 2021, LoRA).
      lora_targets: comma-separated: `attention` (q/kv/o projections of MLA),
        `mlp` (dense MLP, routed experts (per-expert adapters on the stacked
        kernels) and shared experts).
      distill_alpha, distill_temperature: with a teacher (`--teacher`), loss =
        alpha CE + (1 - alpha) tau^2 KL(softmax(teacher/tau) || softmax(student/tau))
        (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network", §2).
      jit_compile: compile the training step with XLA: `auto` (on for GPUs and
        TPUs, off on CPUs, where `benchmarks/train_throughput.py` measures it
        slower; see docs/benchmarks/train-throughput.md), `true` or `false`. With XLA
        the MoE layers dispatch with a static capacity (`moe_capacity_factor`).
      moe_capacity_factor: cf of the static-shape MoE dispatch used with XLA: each
        expert takes at most ceil(cf N K / E) of the N K (token, expert) pairs of
        a micro-batch; the rest are dropped (counted: `moe_dropped_fraction`).
        Without XLA the dispatch is dropless.
      max_skipped_steps: a step whose gradients are not finite changes nothing
        and is skipped (counted); after this many consecutive skips training
        stops with FloatingPointError (the last good checkpoint is kept).
      max_restarts: with several workers (`--num-workers`), how many times the
        launcher restarts the group from its last checkpoint after a worker dies,
        hangs or is preempted, within one Trainer run (0: fail at once).
      min_workers: the fewest workers a restart may continue on; a worker that was
        killed or hung is a lost slot, and with min_workers below the group's size
        the restart continues on the slots left (never fewer than min_workers),
        with the same global batch (more micro-batches per replica). 0: the
        group's own size (a lost slot is replaced).
      heartbeat_timeout_s: a worker that has finished no step for this long (5x
        as long before its first step: TensorFlow start-up, the cluster's
        rendezvous, tracing) is hung; the launcher stops the group and restarts it.
      preemption_grace_s: after SIGTERM, how long the launcher waits for the
        workers to save their checkpoint and exit before it kills them.
      prune_keep_experts: > 0 prunes every MoE layer of the trained model to this many
        routed experts, its most-routed on the eval split (router load; Lu et al. 2024,
        arXiv 2402.14800), before the Trainer's eval and export, so the Evaluator
        gates and the Pusher pushes the pruned model (`components/trainer/pruning.py`).
        It changes the exported model, not the trained weights: the checkpoint
        directory ignores it (a run resumes, or trains zero steps, when it is added).
        0: no pruning. Checked against the model with the rules of
        `expert_pruning.select_experts` (`PipelineConfig`).
      export_dtype: the precision of the exported (evaluated, pushed) model's weights:
        `auto` (the trained model's: float32, or bfloat16 for LoRA on a bf16 base, int8
        for LoRA on an int8 base), `float32`, `bfloat16`, or `int8` (the projections
        quantized with per-output-channel scales, `models/formats/quantization.py`;
        embedding, norms and router float32). Applied after training (and pruning),
        before the Trainer's eval, so the Evaluator gates the model that is pushed; the
        checkpoint directory ignores it.
      on_source_exhausted: what a data mixture does when a source runs out: `repeat`
        (every source repeats, reshuffled each epoch, so a small source is up-sampled) or
        `stop` (every source is read once; training ends the first time the sampler picks
        a source with no window left, `components/trainer/mixture.py`).
      dpo_beta: DPO's beta (`data.task="dpo"`; Rafailov et al. 2023, eq. 7): how far the
        policy may move from the reference (the base model) for a given preference.
      grpo_group_size: G, completions sampled per prompt (`data.task="grpo"`;
        DeepSeekMath §4.1); `train.batch_size` counts prompts, so a step scores
        batch_size x G completions.
      grpo_kl_beta: beta, the coefficient of the k3 KL to the reference (DeepSeekMath eq. 3).
      grpo_clip_epsilon: the clip range of the policy ratio (PPO's epsilon).
      grpo_inner_steps: mu, optimizer updates per sampled batch (DeepSeekMath Alg. 1); each
        counts as one step of `train.train_steps`.
      grpo_max_new_tokens: the most tokens sampled per completion; a prompt longer than
        seq_len - grpo_max_new_tokens is not used (counted).
      grpo_temperature: the sampling temperature of the completions.
      grpo_rewards: comma-separated built-in rewards, summed (`components/trainer/rewards.py`:
        exact_match, format).
      reward_module_file: a Python file defining `reward_fn(prompt, completion, answer) ->
        float`, added to the built-ins (as TFX passes `run_fn` in a module file); "" for none.
    """

    seq_len: int = 128
    batch_size: int = 16
    grad_accum_steps: int = 1
    train_steps: int = 1000
    learning_rate: float = 1e-3
    min_learning_rate: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.1
    beta_1: float = 0.9
    beta_2: float = 0.95
    grad_clip_norm: float = 1.0
    distribution_strategy: str = "auto"
    precision: str = "auto"
    recompute_activations: bool = False
    checkpoint_every: int = 250
    log_every: int = 25
    eval_batches: int = 20
    shuffle_buffer: int = 10_000
    seed: int = 1337
    trainable: str = "all"
    lora_rank: int = 0
    lora_targets: str = "attention,mlp"
    distill_alpha: float = 0.5
    distill_temperature: float = 2.0
    jit_compile: str = "auto"
    moe_capacity_factor: float = 1.25
    max_skipped_steps: int = 10
    max_restarts: int = 2
    min_workers: int = 0
    heartbeat_timeout_s: float = 300.0
    preemption_grace_s: float = 120.0
    prune_keep_experts: int = 0
    export_dtype: str = "auto"
    on_source_exhausted: str = "repeat"
    dpo_beta: float = 0.1
    grpo_group_size: int = 8
    grpo_kl_beta: float = 0.04
    grpo_clip_epsilon: float = 0.2
    grpo_inner_steps: int = 1
    grpo_max_new_tokens: int = 16
    grpo_temperature: float = 1.0
    grpo_rewards: str = "exact_match"
    reward_module_file: str = ""

    def __post_init__(self) -> None:
        for name in ("dpo_beta", "grpo_group_size", "grpo_inner_steps", "grpo_max_new_tokens",
                     "grpo_temperature", "grpo_clip_epsilon"):
            check_positive(f"train.{name}", getattr(self, name))
        if self.grpo_group_size < 2:
            raise ValueError(f"train.grpo_group_size={self.grpo_group_size} must be >= 2: "
                             "advantages are relative to the group")
        if self.grpo_kl_beta < 0:
            raise ValueError(f"train.grpo_kl_beta={self.grpo_kl_beta} must be >= 0")
        check_choice("train.jit_compile", self.jit_compile, JIT_COMPILE)
        check_choice("train.export_dtype", self.export_dtype, EXPORT_DTYPES)
        check_choice("train.on_source_exhausted", self.on_source_exhausted, ON_SOURCE_EXHAUSTED)
        check_positive("train.moe_capacity_factor", self.moe_capacity_factor)
        _check_trainable(self.trainable)
        if self.lora_rank < 0:
            raise ValueError(f"train.lora_rank={self.lora_rank} must be >= 0")
        targets = [t.strip() for t in self.lora_targets.split(",") if t.strip()]
        if not targets or set(targets) - set(LORA_TARGETS):
            raise ValueError(f"train.lora_targets={self.lora_targets!r} must be a "
                             f"comma-separated subset of {list(LORA_TARGETS)}")
        if not 0.0 <= self.distill_alpha <= 1.0:
            raise ValueError(f"train.distill_alpha={self.distill_alpha} must be in [0, 1]")
        check_positive("train.distill_temperature", self.distill_temperature)
        for name in ("seq_len", "batch_size", "grad_accum_steps", "train_steps",
                     "checkpoint_every", "log_every", "shuffle_buffer", "max_skipped_steps"):
            check_positive(f"train.{name}", getattr(self, name))
        if self.batch_size % self.grad_accum_steps:
            raise ValueError(
                f"train.batch_size={self.batch_size} must be divisible by "
                f"train.grad_accum_steps={self.grad_accum_steps}"
            )
        if self.warmup_steps < 0:
            raise ValueError(f"train.warmup_steps={self.warmup_steps} must be >= 0")
        if not 0 < self.min_learning_rate <= self.learning_rate:
            raise ValueError(
                f"train.min_learning_rate={self.min_learning_rate} must be in "
                f"(0, learning_rate={self.learning_rate}]"
            )
        check_positive("train.grad_clip_norm", self.grad_clip_norm)
        for name in ("max_restarts", "min_workers", "prune_keep_experts"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name}={getattr(self, name)} must be >= 0")
        check_positive("train.heartbeat_timeout_s", self.heartbeat_timeout_s)
        check_positive("train.preemption_grace_s", self.preemption_grace_s)
        check_choice("train.distribution_strategy", self.distribution_strategy, STRATEGIES)
        check_choice("train.precision", self.precision, PRECISIONS)
        if not isinstance(self.recompute_activations, bool):
            raise ValueError(
                f"train.recompute_activations={self.recompute_activations!r} must be a bool"
            )


ON_SOURCE_EXHAUSTED = ("repeat", "stop")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """The Evaluator's blessing rule.

    A model is blessed when its bits per byte on the eval split is at most
    `max_bits_per_byte`, each benchmark task score named in `min_scores` is at least
    its threshold, and, when a previously blessed model exists, its bits per byte (on
    the same eval data) is at most that model's times `1 + baseline_tolerance` and each
    task's primary score (acc, or exact_match for generation tasks, and every metric
    named in `min_scores`) is not lower than that model's by more than `task_tolerance`
    and two standard errors of the difference.

    Attributes:
      max_bits_per_byte: absolute threshold (bits per UTF-8 byte).
      baseline_tolerance: relative slack against the last blessed model.
      max_eval_tokens: cap on eval tokens scored (0 = all).
      batch_size: sequences per eval batch (also rows per task-scoring batch).
      tasks: benchmark task files (`evaluation/tasks.py` JSONL format), scored as
        lm-evaluation-harness scores them (`evaluation/task_scoring.py`); a JSON list or
        a comma-separated string. The CLI makes them absolute paths.
      min_scores: {"TASK": minimum acc (exact_match for a generation task), or
        "TASK/METRIC": minimum METRIC (acc, acc_norm, acc_bytes, exact_match)}, each in
        [0, 1]; TASK is the task file's `task` name.
      task_tolerance: the least drop of a task score below the last blessed model's that
        fails the blessing (a fraction: 0.02 = 2 accuracy points); a drop within two
        standard errors of the difference (sampling noise) never fails
        (`components/lm_evaluator/blessing.py`).
      max_bits_per_byte_by_source: {"SOURCE": threshold} for the named sources of a
        mixture (`data.sources`, "replay", or "default"): the model's bits per byte on
        that source's own eval examples must be at most the threshold, on top of
        `max_bits_per_byte` on the whole eval split.
      min_reward_accuracy: DPO (`data.task="dpo"`): the least held-out reward accuracy (the
        share of eval pairs whose chosen response gets the larger implicit reward
        beta log(pi/pi_ref)) for the blessing; the chosen responses' bits per byte are held
        to `max_bits_per_byte`.
      min_pass_at_1: GRPO (`data.task="grpo"`): the least held-out pass@1 (greedy decoding,
        the `exact_match` reward) for the blessing.
    """

    max_bits_per_byte: float = 3.0
    baseline_tolerance: float = 0.01
    max_eval_tokens: int = 0
    batch_size: int = 16
    tasks: tuple[str, ...] = ()
    min_scores: dict[str, float] = dataclasses.field(default_factory=dict)
    task_tolerance: float = 0.02
    max_bits_per_byte_by_source: dict[str, float] = dataclasses.field(default_factory=dict)
    min_reward_accuracy: float = 0.5
    min_pass_at_1: float = 0.0

    def __post_init__(self) -> None:
        check_positive("eval.max_bits_per_byte", self.max_bits_per_byte)
        for name in ("min_reward_accuracy", "min_pass_at_1"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"eval.{name}={getattr(self, name)} must be in [0, 1]")
        if self.baseline_tolerance < 0:
            raise ValueError(f"eval.baseline_tolerance={self.baseline_tolerance} must be >= 0")
        check_positive("eval.batch_size", self.batch_size)
        object.__setattr__(self, "tasks", _task_paths(self.tasks))
        object.__setattr__(self, "min_scores", _min_scores(self.min_scores))
        if not 0 <= self.task_tolerance <= 1:
            raise ValueError(f"eval.task_tolerance={self.task_tolerance} must be in [0, 1]")
        object.__setattr__(self, "max_bits_per_byte_by_source",
                           _source_thresholds(self.max_bits_per_byte_by_source))


TASK_METRICS = ("acc", "acc_norm", "acc_bytes", "exact_match")


def _task_paths(value) -> tuple[str, ...]:
    """`eval.tasks` as a tuple of non-empty, distinct paths (from a list, a tuple or a
    comma-separated string)."""
    if isinstance(value, str):
        value = [p.strip() for p in value.split(",")] if value.strip() else []
    if not isinstance(value, (list, tuple)) or not all(isinstance(p, str) for p in value):
        raise ValueError(f"eval.tasks={value!r}: expected a list of task file paths")
    if any(not p for p in value):
        raise ValueError(f"eval.tasks={list(value)!r}: an empty path")
    if len(set(value)) < len(value):
        raise ValueError(f"eval.tasks={list(value)!r}: a task file is listed twice")
    return tuple(value)


def _source_thresholds(value) -> dict[str, float]:
    """`eval.max_bits_per_byte_by_source` checked: source names -> finite numbers > 0."""
    from config.sources import check_source_name

    key = "eval.max_bits_per_byte_by_source"
    if not isinstance(value, dict):
        raise ValueError(f"{key}={value!r}: expected a JSON object {{\"SOURCE\": bits}}")
    out = {}
    for name, bits in value.items():
        check_source_name(f"{key} key", name)
        if isinstance(bits, bool) or not isinstance(bits, (int, float)) or not (
                0 < bits < float("inf")):
            raise ValueError(f"{key}[{name!r}]={bits!r}: expected a finite number > 0")
        out[name] = float(bits)
    return out


def _min_scores(value) -> dict[str, float]:
    """`eval.min_scores` checked: keys TASK or TASK/METRIC, values numbers in [0, 1]."""
    if not isinstance(value, dict):
        raise ValueError(f"eval.min_scores={value!r}: expected a JSON object "
                         '{"TASK": score, "TASK/METRIC": score}')
    out = {}
    for key, score in value.items():
        task, _, metric = key.partition("/")
        if not task or (metric and metric not in TASK_METRICS) or key.count("/") > 1:
            raise ValueError(f"eval.min_scores key {key!r}: expected TASK or TASK/METRIC with "
                             f"METRIC one of {', '.join(TASK_METRICS)}")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
            raise ValueError(f"eval.min_scores[{key!r}]={score!r}: expected a number in [0, 1]")
        out[key] = float(score)
    return out
