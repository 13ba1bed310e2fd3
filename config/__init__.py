"""The one typed configuration of deepseek-tfx, and its named presets.

Everything a run needs flows from one `PipelineConfig`: the CLI builds it from a
preset plus overrides, `create_pipeline(...)` hands it to every component as JSON
(`custom_config` / execution properties), and the trained model records it. No
component reads environment variables or globals for its settings.

Presets:
  tiny       tests: a 2-layer model that trains in seconds on a slice of text.
  cpu_small  the default main job: Tiny Shakespeare on a 2-core CPU in minutes.
  gpu_base   a ~100M-parameter model for one GPU.
  deepseek_v3  the released 671B DeepSeek-V3 architecture (arithmetic only).

This module imports neither TFX nor TensorFlow, so the CLI can validate a config
(and print errors) before paying for those imports.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from typing import Any

from models.deepseek.config import DeepSeekConfig, deepseek_v3_config

PIPELINE_NAME = "deepseek-tfx"

DOCUMENT_BOUNDARIES = ("blank_line", "line", "file", "jsonl")
NORMALIZATION_FORMS = ("NFC", "NFKC", "none")
# The names of `tokenization.pre_tokenizer.PRE_TOKENIZERS` (this module stays light).
PRE_TOKENIZER_NAMES = ("deepseek_v3",)
INVALID_UTF8_POLICIES = ("replace", "reject")
TASKS = ("pretrain", "sft")
LORA_TARGETS = ("attention", "mlp")


def _check_positive(name: str, value: float) -> None:
    if value <= 0:
        raise ValueError(f"{name}={value} must be > 0")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}='{value}' must be one of {list(choices)}")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """How raw text becomes documents, and how documents are cleaned.

    Attributes:
      document_boundary: where one document ends: `blank_line` (paragraphs),
        `line`, `file` (one document per file) or `jsonl` (one per JSON record).
        Files ending in `.jsonl`/`.jsonl.gz` are always read as JSONL.
      jsonl_text_field: the JSON field holding the text of a JSONL record.
      train_buckets, eval_buckets: hash buckets of the deterministic train/eval
        split (ExampleGen `SplitConfig`, partitioned on the text, so duplicates
        fall into the same split). 9:1 is a 90/10 split.
      normalization: Unicode normalization form (`NFC`, `NFKC` or `none`).
      min_chars, max_chars: documents outside [min_chars, max_chars] Unicode
        characters after cleaning are dropped (counted as `too_short`/`too_long`).
      deduplicate: drop exact duplicates (after normalization), keeping one.
      max_reject_fraction: the run stops before training if more than this
        fraction of the records read is dropped.
      csv_text_column, parquet_text_column: the column holding the text of
        `*.csv` / `*.parquet` files.
      invalid_utf8: bytes that are not UTF-8: `replace` (by U+FFFD, counted as
        a repair) or `reject` (the record is dropped as `invalid_utf8`).
      near_dedup: drop near-duplicates (MinHash LSH over word n-grams), keeping
        the first (train before eval, then file and record order).
      near_dedup_threshold: estimated Jaccard similarity at or above which two
        documents are near-duplicates.
      near_dedup_num_perm, near_dedup_ngram: MinHash permutations; words per shingle.
      quality_filter: apply the Gopher quality rules (off by default: dialogue
        paragraphs such as Tiny Shakespeare's are far below their 50-word floor).
      min_words, max_words, min_mean_word_length, max_mean_word_length,
        max_symbol_word_ratio, max_duplicate_line_fraction, min_alpha_word_fraction:
        the Gopher thresholds (Rae et al. 2021, appendix A.1.1).
      redact_pii: replace e-mail addresses, IP addresses and phone numbers by
        `<EMAIL>`, `<IP_ADDRESS>`, `<PHONE_NUMBER>` (counted per kind).
      task: `pretrain` (documents of text, packed; every token is a target) or
        `sft` (supervised fine-tuning: prompt/response records; the loss covers
        response tokens only). `deepseek-tfx run --task sft`.
      prompt_field, response_field: the fields of an SFT record holding the prompt
        and the response (JSONL keys, CSV/Parquet columns).
      messages_field: the field of an SFT record holding a chat, a list of
        `{"role", "content"}` (Hugging Face chat form); used when a record has it.
      chat_template: a Jinja chat template (transformers' form) for SFT prompts;
        empty: the tokenizer's `chat_template` when it has one, else the default.
    """

    document_boundary: str = "blank_line"
    jsonl_text_field: str = "text"
    train_buckets: int = 9
    eval_buckets: int = 1
    normalization: str = "NFC"
    min_chars: int = 1
    max_chars: int = 1_000_000
    deduplicate: bool = True
    max_reject_fraction: float = 0.5
    csv_text_column: str = "text"
    parquet_text_column: str = "text"
    invalid_utf8: str = "replace"
    near_dedup: bool = True
    near_dedup_threshold: float = 0.8
    near_dedup_num_perm: int = 128
    near_dedup_ngram: int = 5
    quality_filter: bool = False
    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_duplicate_line_fraction: float = 0.3
    min_alpha_word_fraction: float = 0.8
    redact_pii: bool = False
    task: str = "pretrain"
    prompt_field: str = "context"
    response_field: str = "response"
    messages_field: str = "messages"
    chat_template: str = ""

    def __post_init__(self) -> None:
        _check_choice("data.task", self.task, TASKS)
        _check_choice("data.document_boundary", self.document_boundary, DOCUMENT_BOUNDARIES)
        _check_choice("data.normalization", self.normalization, NORMALIZATION_FORMS)
        _check_positive("data.train_buckets", self.train_buckets)
        _check_positive("data.eval_buckets", self.eval_buckets)
        _check_positive("data.min_chars", self.min_chars)
        if self.max_chars < self.min_chars:
            raise ValueError(
                f"data.max_chars={self.max_chars} must be >= data.min_chars={self.min_chars}"
            )
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise ValueError(
                f"data.max_reject_fraction={self.max_reject_fraction} must be in [0, 1]"
            )
        _check_choice("data.invalid_utf8", self.invalid_utf8, INVALID_UTF8_POLICIES)
        if not 0.0 < self.near_dedup_threshold <= 1.0:
            raise ValueError(
                f"data.near_dedup_threshold={self.near_dedup_threshold} must be in (0, 1]")
        for name in ("near_dedup_num_perm", "near_dedup_ngram", "min_words",
                     "min_mean_word_length"):
            _check_positive(f"data.{name}", getattr(self, name))
        if self.max_words < self.min_words:
            raise ValueError(f"data.max_words={self.max_words} must be >= data.min_words")
        if self.max_mean_word_length < self.min_mean_word_length:
            raise ValueError("data.max_mean_word_length must be >= data.min_mean_word_length")
        for name in ("max_symbol_word_ratio", "max_duplicate_line_fraction",
                     "min_alpha_word_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"data.{name}={getattr(self, name)} must be in [0, 1]")


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """The tokenizer: a byte-level BPE (Hugging Face tokenizer.json, DeepSeek-V3 family).

    Learned by Transform from the training split with `tokenizers`' BpeTrainer, or
    given as a file; see `tokenization/tokenizer.py`.

    Attributes:
      vocab_size: the size to learn (added tokens, 256 byte tokens, merges). The
        model's `vocab_size` must equal it. Ignored with `path`, where the model's
        `vocab_size` must cover the given tokenizer instead.
      path: a tokenizer.json, or a directory holding one (and tokenizer_config.json),
        used as it is; empty to learn one.
      pre_tokenizer: the pre-tokenizer to learn with (`pre_tokenizer.PRE_TOKENIZERS`).
      min_frequency: the least count of a pair that the learner merges.
    """

    vocab_size: int = 8192
    path: str = ""
    pre_tokenizer: str = "deepseek_v3"
    min_frequency: int = 2

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"tokenizer.vocab_size={self.vocab_size} must be >= 300")
        if self.pre_tokenizer not in PRE_TOKENIZER_NAMES:
            raise ValueError(f"tokenizer.pre_tokenizer={self.pre_tokenizer!r} must be one of "
                             f"{list(PRE_TOKENIZER_NAMES)}")
        _check_positive("tokenizer.min_frequency", self.min_frequency)


def _check_trainable(value: str) -> None:
    import re

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


STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker", "tpu")
PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")
JIT_COMPILE = ("auto", "true", "false")


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
      precision: Keras dtype policy: `auto` (mixed_bfloat16 on TPUs, GPUs of
        compute capability >= 8.0 and CPUs with AMX; mixed_float16 with dynamic
        loss scaling on older GPUs >= 7.0; float32 otherwise, e.g. on CPUs
        without AMX, where bf16 is slower), or `float32`, `mixed_bfloat16`,
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
        paths such as `layers.3/mlp/experts.0/up_proj/kernel`. The others stay
        bit-identical and get no optimizer slots (nor router-bias updates).
      lora_rank: > 0 trains low-rank adapters of this rank (Keras `enable_lora`)
        on the `lora_targets` projections instead of the weights themselves; the
        exported model carries the merged weights (Hu et al. 2021, LoRA).
      lora_targets: comma-separated: `attention` (q/kv/o projections of MLA),
        `mlp` (dense MLP, experts and shared experts).
      distill_alpha, distill_temperature: with a teacher (`--teacher`), loss =
        alpha CE + (1 - alpha) tau^2 KL(softmax(teacher/tau) || softmax(student/tau))
        (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network", §2).
      jit_compile: compile the training step with XLA: `auto` (on for GPUs and
        TPUs, off on CPUs, where `benchmarks/train_throughput.py` measures it
        slower; see the README), `true` or `false`. With XLA the MoE layers
        dispatch with a static capacity (`moe_capacity_factor`).
      moe_capacity_factor: cf of the static-shape MoE dispatch used with XLA: each
        expert takes at most ceil(cf N K / E) of the N K (token, expert) pairs of
        a micro-batch; the rest are dropped (counted: `moe_dropped_fraction`).
        Without XLA the dispatch is dropless.
      max_skipped_steps: a step whose gradients are not finite changes nothing
        and is skipped (counted); after this many consecutive skips training
        stops with FloatingPointError (the last good checkpoint is kept).
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

    def __post_init__(self) -> None:
        _check_choice("train.jit_compile", self.jit_compile, JIT_COMPILE)
        _check_positive("train.moe_capacity_factor", self.moe_capacity_factor)
        _check_trainable(self.trainable)
        if self.lora_rank < 0:
            raise ValueError(f"train.lora_rank={self.lora_rank} must be >= 0")
        targets = [t.strip() for t in self.lora_targets.split(",") if t.strip()]
        if not targets or set(targets) - set(LORA_TARGETS):
            raise ValueError(f"train.lora_targets={self.lora_targets!r} must be a "
                             f"comma-separated subset of {list(LORA_TARGETS)}")
        if not 0.0 <= self.distill_alpha <= 1.0:
            raise ValueError(f"train.distill_alpha={self.distill_alpha} must be in [0, 1]")
        _check_positive("train.distill_temperature", self.distill_temperature)
        for name in ("seq_len", "batch_size", "grad_accum_steps", "train_steps",
                     "checkpoint_every", "log_every", "shuffle_buffer", "max_skipped_steps"):
            _check_positive(f"train.{name}", getattr(self, name))
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
        _check_positive("train.grad_clip_norm", self.grad_clip_norm)
        _check_choice("train.distribution_strategy", self.distribution_strategy, STRATEGIES)
        _check_choice("train.precision", self.precision, PRECISIONS)
        if not isinstance(self.recompute_activations, bool):
            raise ValueError(
                f"train.recompute_activations={self.recompute_activations!r} must be a bool"
            )


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """The Evaluator's blessing rule.

    A model is blessed when its bits per byte on the eval split is at most
    `max_bits_per_byte`, and, when a previously blessed model exists, at most
    that model's bits per byte (on the same eval data) times
    `1 + baseline_tolerance`.

    Attributes:
      max_bits_per_byte: absolute threshold (bits per UTF-8 byte).
      baseline_tolerance: relative slack against the last blessed model.
      max_eval_tokens: cap on eval tokens scored (0 = all).
      batch_size: sequences per eval batch.
    """

    max_bits_per_byte: float = 3.0
    baseline_tolerance: float = 0.01
    max_eval_tokens: int = 0
    batch_size: int = 16

    def __post_init__(self) -> None:
        _check_positive("eval.max_bits_per_byte", self.max_bits_per_byte)
        if self.baseline_tolerance < 0:
            raise ValueError(f"eval.baseline_tolerance={self.baseline_tolerance} must be >= 0")
        _check_positive("eval.batch_size", self.batch_size)


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
    """Drift between runs (DriftValidator).

    The text profile of this run's cleaned data (document length in characters
    and words, and the distribution of lower-cased word tokens) is compared with
    the profile of the run that produced the latest blessed model, by TFDV's
    Jensen-Shannon divergence drift comparator (in [0, 1]). A divergence above
    its threshold (`drift_threshold`, `token_drift_threshold`) in any split of
    at least `drift_min_documents` documents is an anomaly that stops the run before Transform and training, unless the run accepts drift
    (`deepseek-tfx run --accept-drift`).

    Attributes:
      check_drift: compare with the latest blessed run at all.
      drift_threshold: the largest Jensen-Shannon divergence of the length
        distributions (characters, words) that is not drift. The two halves of
        Tiny Shakespeare differ by 0.02-0.03; doubling every document gives 0.19.
      token_drift_threshold: the same for the token distribution, which is
        noisier on small samples (the halves of Tiny Shakespeare: 0.07; Python
        source against Shakespeare: 0.65).
      drift_min_documents: a split with fewer documents (in this run or the
        baseline) is measured and reported but cannot stop the run: the
        divergence of small samples is mostly sampling noise (two 40-document
        samples of the same text differ by ~0.25 on tokens).
    """

    check_drift: bool = True
    drift_threshold: float = 0.15
    token_drift_threshold: float = 0.3
    drift_min_documents: int = 200

    def __post_init__(self) -> None:
        for name in ("drift_threshold", "token_drift_threshold"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"validation.{name}={value} must be in (0, 1]")
        if self.drift_min_documents < 0:
            raise ValueError(
                f"validation.drift_min_documents={self.drift_min_documents} must be >= 0")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Defaults of the pushed model's text-generation signature."""

    max_new_tokens: int = 64
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 0.95


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """Request batching of `deepseek-tfx serve`, named as TF Serving's batching config
    (`--enable_batching --batching_parameters_file`).

    Concurrent requests for the same signature (and the same scalar inputs, input
    shapes and max_new_tokens bucket: `serving/server.py`) are run as one model call.

    Attributes:
      max_batch_size: the most rows (prompts) in one model call; also the most rows
        one request may have (more is a 400).
      batch_timeout_micros: how long (microseconds) the oldest queued request waits
        for batch-mates before a partial batch runs. 20 ms: at 8 concurrent clients it
        gathers all 8 (4.0x the requests/s of the unbatched server, against 2.7x at
        5 ms), for ~10 ms more median latency with a single client (measured,
        `benchmarks/serve_load.py`, README).
      max_enqueued_batches: queued rows beyond max_enqueued_batches * max_batch_size
        are refused at once (HTTP 503) instead of waiting.
      num_batch_threads: batches run at the same time (each one model call).
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 20_000
    max_enqueued_batches: int = 16
    num_batch_threads: int = 2

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"serve.{name}={value} must be an integer >= 1")
        if not isinstance(self.batch_timeout_micros, int) or self.batch_timeout_micros < 0:
            raise ValueError(
                f"serve.batch_timeout_micros={self.batch_timeout_micros} must be an integer >= 0")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything one pipeline run needs. Build it with `get_config(...)`."""

    preset: str
    model: DeepSeekConfig
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    validation: ValidationConfig = dataclasses.field(default_factory=ValidationConfig)
    generation: GenerationConfig = dataclasses.field(default_factory=GenerationConfig)
    serve: ServeConfig = dataclasses.field(default_factory=ServeConfig)

    def __post_init__(self) -> None:
        if not self.tokenizer.path and self.model.vocab_size != self.tokenizer.vocab_size:
            raise ValueError(
                f"model.vocab_size={self.model.vocab_size} must equal "
                f"tokenizer.vocab_size={self.tokenizer.vocab_size}"
            )
        if self.train.seq_len > self.model.max_position_embeddings:
            raise ValueError(
                f"train.seq_len={self.train.seq_len} exceeds "
                f"model.max_position_embeddings={self.model.max_position_embeddings}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "preset": self.preset,
            "model": self.model.to_dict(),
            "data": dataclasses.asdict(self.data),
            "tokenizer": dataclasses.asdict(self.tokenizer),
            "train": dataclasses.asdict(self.train),
            "eval": dataclasses.asdict(self.eval),
            "validation": dataclasses.asdict(self.validation),
            "generation": dataclasses.asdict(self.generation),
            "serve": dataclasses.asdict(self.serve),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineConfig:
        sections = {
            "data": DataConfig,
            "tokenizer": TokenizerConfig,
            "train": TrainConfig,
            "eval": EvalConfig,
            "validation": ValidationConfig,
            "generation": GenerationConfig,
            "serve": ServeConfig,
        }
        unknown = set(d) - set(sections) - {"preset", "model"}
        if unknown:
            raise ValueError(f"unknown config sections: {sorted(unknown)}")
        model = d["model"]
        if isinstance(model, dict):
            known = {f.name for f in dataclasses.fields(DeepSeekConfig)}
            model = {**model, **typed_section("model", DeepSeekConfig,
                                              {k: v for k, v in model.items() if k in known})}
        kwargs: dict[str, Any] = {"preset": d["preset"], "model": DeepSeekConfig.from_dict(model)}
        for name, section_cls in sections.items():
            if name in d:
                kwargs[name] = _section_from_dict(name, section_cls, d[name])
        return cls(**kwargs)

    @classmethod
    def from_json(cls, s: str) -> PipelineConfig:
        return cls.from_dict(json.loads(s))


def _section_from_dict(name: str, section_cls: type, values: dict[str, Any]) -> Any:
    fields = {f.name for f in dataclasses.fields(section_cls)}
    unknown = set(values) - fields
    if unknown:
        raise ValueError(f"unknown keys in config section '{name}': {sorted(unknown)}")
    return section_cls(**typed_section(name, section_cls, values))


def typed_section(name: str, section_cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` with each one converted to its field's declared type (`coerce`)."""
    hints = typing.get_type_hints(section_cls)
    return {k: coerce(f"{name}.{k}", v, hints[k]) if k in hints else v
            for k, v in values.items()}


def coerce(key: str, value: Any, hint: Any) -> Any:
    """`value` (from --set, parsed as JSON where it parses, or from a config file) as the
    declared type `hint` of the field `key`.

    int: an int, an integral float, or a string of one; float: a finite number or a
    string of one; bool: true/false (any case), 1/0; str: a string, or the JSON text of
    a number or bool given for it (`--set x=123`); `X | None`: None/"none"/"null" or
    an X; dict: a JSON object.

    Raises:
      ValueError: naming the key, the value and the type expected.
    """
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = [t for t in typing.get_args(hint) if t is not type(None)]
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")):
            if len(options) < len(typing.get_args(hint)):
                return None
        errors = []
        for option in options:
            try:
                return coerce(key, value, option)
            except ValueError as e:
                errors.append(str(e))
        names = " or ".join(_TYPE_NAMES.get(t, getattr(t, "__name__", str(t))) for t in options)
        raise ValueError(f"{key}={value!r}: expected {names} or none")
    expected = _TYPE_NAMES.get(hint)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return value.strip().lower() in ("true", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip().replace("_", ""))
            except ValueError:
                pass
    elif hint is float:
        number = value
        if isinstance(value, str):
            try:
                number = float(value.strip())
            except ValueError:
                number = None
        if (isinstance(number, (int, float)) and not isinstance(number, bool)
                and math.isfinite(number)):
            return float(number)
    elif hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (bool, int, float)):
            return json.dumps(value)  # --set data.field=123 meant the text "123"
    elif hint is dict or typing.get_origin(hint) is dict:
        if isinstance(value, dict):
            return value
    else:
        return value  # a type without a rule here: the section validates it
    raise ValueError(f"{key}={value!r}: expected {expected}")


_TYPE_NAMES = {int: "an integer", float: "a finite number (e.g. 3e-4)",
               bool: "true or false", str: "a string", dict: "a JSON object"}


# --------------------------------------------------------------------------- presets


def _tiny() -> PipelineConfig:
    vocab = 512
    return PipelineConfig(
        preset="tiny",
        model=DeepSeekConfig(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            moe_intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            q_lora_rank=32,
            kv_lora_rank=32,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            max_position_embeddings=64,
            tie_word_embeddings=True,
            num_nextn_predict_layers=1,
        ),
        tokenizer=TokenizerConfig(vocab_size=vocab),
        train=TrainConfig(
            seq_len=32,
            batch_size=8,
            train_steps=30,
            learning_rate=3e-3,
            min_learning_rate=3e-4,
            warmup_steps=5,
            checkpoint_every=10,
            log_every=5,
            eval_batches=4,
            shuffle_buffer=1000,
        ),
        eval=EvalConfig(max_bits_per_byte=8.0, batch_size=8),
        generation=GenerationConfig(max_new_tokens=16),
    )


def _cpu_small() -> PipelineConfig:
    vocab = 8192
    return PipelineConfig(
        preset="cpu_small",
        model=DeepSeekConfig(
            vocab_size=vocab,
            hidden_size=256,
            intermediate_size=768,
            moe_intermediate_size=256,
            num_hidden_layers=4,
            num_attention_heads=4,
            q_lora_rank=None,
            kv_lora_rank=64,
            qk_nope_head_dim=32,
            qk_rope_head_dim=16,
            v_head_dim=32,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            max_position_embeddings=256,
            tie_word_embeddings=True,
            num_nextn_predict_layers=0,
        ),
        tokenizer=TokenizerConfig(vocab_size=vocab),
        train=TrainConfig(
            # 450 steps x 2,048 tokens (~3 epochs of the ~310K training tokens of Tiny
            # Shakespeare's first 90%)
            # keep the whole main job under 15 minutes on a 2-core CPU (~2,200 tokens/s).
            seq_len=128,
            batch_size=16,
            train_steps=450,
            learning_rate=2e-3,
            min_learning_rate=2e-4,
            warmup_steps=50,
            checkpoint_every=150,
            log_every=50,
            eval_batches=40,
        ),
        eval=EvalConfig(max_bits_per_byte=3.0, batch_size=16),
    )


def _gpu_base() -> PipelineConfig:
    vocab = 32768
    return PipelineConfig(
        preset="gpu_base",
        model=DeepSeekConfig(
            vocab_size=vocab,
            hidden_size=768,
            intermediate_size=2048,
            moe_intermediate_size=512,
            num_hidden_layers=12,
            num_attention_heads=12,
            q_lora_rank=384,
            kv_lora_rank=256,
            qk_nope_head_dim=64,
            qk_rope_head_dim=32,
            v_head_dim=64,
            n_routed_experts=16,
            n_shared_experts=1,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            first_k_dense_replace=1,
            max_position_embeddings=1024,
            tie_word_embeddings=False,
            num_nextn_predict_layers=1,
        ),
        tokenizer=TokenizerConfig(vocab_size=vocab),
        train=TrainConfig(
            seq_len=1024,
            batch_size=32,
            train_steps=20_000,
            learning_rate=6e-4,
            min_learning_rate=6e-5,
            warmup_steps=1000,
            checkpoint_every=1000,
            log_every=100,
            eval_batches=100,
        ),
        eval=EvalConfig(max_bits_per_byte=2.0, batch_size=16),
    )


def _deepseek_v3() -> PipelineConfig:
    """The released 671B architecture with the paper's pre-training settings
    (§4.2: 4K sequences, peak lr 2.2e-4, 2000 warmup steps): for FLOP and memory
    arithmetic (`models/deepseek/flops.py`), not for training on these machines."""
    model = deepseek_v3_config()
    return PipelineConfig(
        preset="deepseek_v3",
        model=model,
        tokenizer=TokenizerConfig(vocab_size=model.vocab_size),
        train=TrainConfig(
            seq_len=4096,
            batch_size=1920,
            train_steps=100_000,
            learning_rate=2.2e-4,
            min_learning_rate=2.2e-5,
            warmup_steps=2000,
            checkpoint_every=1000,
            log_every=100,
            eval_batches=100,
        ),
        eval=EvalConfig(max_bits_per_byte=1.0, batch_size=8),
    )


PRESETS = {"tiny": _tiny, "cpu_small": _cpu_small, "gpu_base": _gpu_base,
           "deepseek_v3": _deepseek_v3}
DEFAULT_PRESET = "cpu_small"


def get_config(preset: str = DEFAULT_PRESET, overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Returns a preset, with dotted-key overrides applied and validated.

    Args:
      preset: one of `PRESETS`.
      overrides: e.g. `{"train.train_steps": 200, "model.hidden_size": 128}`.

    Raises:
      ValueError: unknown preset, unknown key, or a value the config rejects
        (the message names the key and the value).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; choose one of {sorted(PRESETS)}")
    config = PRESETS[preset]()
    if not overrides:
        return config
    d = config.to_dict()
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if section not in d or not isinstance(d[section], dict) or not field:
            raise ValueError(f"unknown config key '{key}' (expected SECTION.FIELD)")
        if field not in d[section]:
            raise ValueError(f"unknown config key '{key}'")
        d[section][field] = value
    # Keep the tokenizer and model vocabularies in step when only one is overridden.
    if "tokenizer.vocab_size" in overrides and "model.vocab_size" not in overrides:
        d["model"]["vocab_size"] = overrides["tokenizer.vocab_size"]
    return PipelineConfig.from_dict(d)
