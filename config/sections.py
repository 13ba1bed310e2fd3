"""`PipelineConfig`, the whole configuration of one run, and its serving sections
(`generation`, `serve`).

The input sections (`data`, `tokenizer`, `validation`) are in `config/data.py`, the
training sections (`train`, `eval`) in `config/train.py`, the model (`model`) is
`models.deepseek.config.DeepSeekConfig`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from config import serialization
from config.data import DataConfig, TokenizerConfig, ValidationConfig
from config.train import EvalConfig, TrainConfig
from models.deepseek.config import DeepSeekConfig

PIPELINE_NAME = "deepseek-tfx"


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
      max_body_bytes: the largest request body, bytes, whatever its framing
        (Content-Length or chunked, counted while it streams in): more is a 413.
      max_response_bytes: the largest reply a request may ask for, bytes; a `logits`
        request is sized before it runs (rows x positions x vocab_size x 20 bytes, a
        float32 in JSON) and refused with a 400 above this.
      timeout_keep_alive: seconds an idle connection (no complete request headers)
        stays open (uvicorn's `timeout_keep_alive`); headers begun but not finished by
        then get a 408.
      timeout_request_body: seconds a request's body may take to arrive once its
        headers have; later is a 408 and the connection is closed.
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 20_000
    max_enqueued_batches: int = 16
    num_batch_threads: int = 2
    max_body_bytes: int = 10 * 1024 * 1024
    max_response_bytes: int = 64 * 1024 * 1024
    timeout_keep_alive: int = 5
    timeout_request_body: int = 30

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads",
                     "max_body_bytes", "max_response_bytes", "timeout_keep_alive",
                     "timeout_request_body"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"serve.{name}={value} must be an integer >= 1")
        if not isinstance(self.batch_timeout_micros, int) or self.batch_timeout_micros < 0:
            raise ValueError(
                f"serve.batch_timeout_micros={self.batch_timeout_micros} must be an integer >= 0")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Everything one pipeline run needs. Build it with `get_config(...)`.

    Attributes:
      preset: the name of the preset it was built from (`config/presets.py`).
      model, data, tokenizer, train, eval, validation, generation, serve: the sections.

    Raises:
      ValueError: on construction, when the model's vocabulary differs from a learned
        tokenizer's, `train.seq_len` exceeds `model.max_position_embeddings`, or
        `train.prune_keep_experts` is set for a model without MoE layers or is not a
        valid number of experts to keep (`DeepSeekConfig.check_keep_experts`).
    """

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
        if self.train.prune_keep_experts:
            self._check_pruning()

    def _check_pruning(self) -> None:
        """Refuses `train.prune_keep_experts` that `expert_pruning` would refuse after
        training, before anything runs."""
        keep, m = self.train.prune_keep_experts, self.model
        if not m.num_moe_layers:
            raise ValueError(
                f"train.prune_keep_experts={keep}: the model has no MoE layer to prune "
                f"(first_k_dense_replace={m.first_k_dense_replace} = num_hidden_layers="
                f"{m.num_hidden_layers}, num_nextn_predict_layers=0)")
        m.check_keep_experts(keep, name="train.prune_keep_experts")

    def to_dict(self) -> dict[str, Any]:
        """`{"preset": name, section: {field: value}}`, JSON-serializable
        (`serialization.to_dict`)."""
        return serialization.to_dict(self)

    def to_json(self) -> str:
        """`to_dict()` as JSON text with sorted keys."""
        return serialization.to_json(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineConfig:
        """The config of a `to_dict()`, values parsed into their declared types.

        Raises:
          ValueError: an unknown section or key, or a bad value (named by SECTION.FIELD).
        """
        return serialization.from_dict(cls, d)

    @classmethod
    def from_json(cls, s: str) -> PipelineConfig:
        """The config of a `to_json()` text (see `from_dict`)."""
        return serialization.from_json(cls, s)
