"""`PipelineConfig`, the whole configuration of one run, and its serving sections
(`generation`, `serve`).

The input sections (`data`, `tokenizer`, `validation`) are in `config/data.py`, the
training sections (`train`, `eval`) in `config/train.py`, the model (`model`) is
`models.deepseek.config.DeepSeekConfig` (V2/V3/V3.2-style) or
`models.deepseek_v4.config.DeepSeekV4Config` (V4-style); the dict form of a V4 model section
says so by `"model_type": "deepseek_v4"` (`MODEL_TYPE_KEY`), a V2/V3 one by its absence.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from config import serialization
from config.data import DataConfig, TokenizerConfig, ValidationConfig
from config.train import EvalConfig, TrainConfig
from models.deepseek.config import DeepSeekConfig
from models.deepseek_v4.config import CSA, DeepSeekV4Config

PIPELINE_NAME = "deepseek-tfx"
MODEL_TYPE_KEY = "model_type"
V4_MODEL_TYPE = "deepseek_v4"


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """Defaults of the pushed model's text generation, as `hf-export` writes them to
    generation_config.json (`savedmodel/hf_generation.py`).

    Attributes:
      max_new_tokens: tokens generated at most; also `serving_default`'s when a request
        gives none (`serving/server.py`).
      temperature: sampling temperature; 0 is greedy (`do_sample: false`).
      top_k: sample among the k most probable tokens (with temperature > 0).
      top_p: nucleus sampling: the smallest set of tokens whose probability reaches p
        (with temperature > 0).
    """

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
        `benchmarks/serve_load.py`, docs/benchmarks/serving-load.md).
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
      decode_slots: requests the serving engine decodes at once (continuous batching,
        `serving/engine.py`): the OpenAI routes' generation. 0 turns the engine off
        (they then go through the batcher, replaying a finished reply when streamed).
      max_waiting_requests: requests waiting for a decode slot; more get a 503.
      decode_steps_per_call: decoding steps per call of the engine's decode function
        (`serving/engine.py`): fewer calls, each ~2 ms of fixed cost on a CPU; a request
        that arrives meanwhile waits up to that many steps for its prefill.
      slot_positions: positions (prompt + max_tokens) a decode slot holds; 0 = the
        model's context (max_position_embeddings). Each running request's cache takes
        this many positions (docs/guides/serving.md gives bytes per slot).
    """

    max_batch_size: int = 32
    batch_timeout_micros: int = 20_000
    max_enqueued_batches: int = 16
    num_batch_threads: int = 2
    max_body_bytes: int = 10 * 1024 * 1024
    max_response_bytes: int = 64 * 1024 * 1024
    timeout_keep_alive: int = 5
    timeout_request_body: int = 30
    decode_slots: int = 32
    max_waiting_requests: int = 256
    slot_positions: int = 0
    decode_steps_per_call: int = 4

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "max_enqueued_batches", "num_batch_threads",
                     "max_body_bytes", "max_response_bytes", "timeout_keep_alive",
                     "timeout_request_body", "max_waiting_requests", "decode_steps_per_call"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"serve.{name}={value} must be an integer >= 1")
        for name in ("batch_timeout_micros", "decode_slots", "slot_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"serve.{name}={value} must be an integer >= 0")


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
        valid number of experts to keep (`check_keep_experts` of the model's config), or a
        V4 model's `index_topk` exceeds
        the compressed entries a `train.seq_len` sequence has in a CSA layer.
    """

    preset: str
    model: DeepSeekConfig | DeepSeekV4Config
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
        if isinstance(self.model, DeepSeekV4Config):
            self._check_v4_model()
        if self.train.prune_keep_experts:
            self._check_pruning()

    def _check_v4_model(self) -> None:
        """The checks of a V4 model that need the training section: the indexer's top-k
        must be a choice among the compressed entries a training sequence has (the
        static top-k of the XLA step)."""
        m, seq_len = self.model, self.train.seq_len
        if CSA in m.layer_types:
            rate = m.compress_rates[CSA]
            entries = seq_len // rate
            if m.index_topk > entries:
                raise ValueError(
                    f"model.index_topk={m.index_topk} exceeds the {entries} compressed entries "
                    f"a train.seq_len={seq_len} sequence has in a CSA layer (model.compress_rates"
                    f"[{CSA!r}]={rate}); lower it or lengthen the sequences")

    def _check_pruning(self) -> None:
        """Refuses `train.prune_keep_experts` that `expert_pruning` would refuse after
        training, before anything runs."""
        keep, m = self.train.prune_keep_experts, self.model
        if not isinstance(m, DeepSeekV4Config) and not m.num_moe_layers:  # V4: all are MoE
            raise ValueError(
                f"train.prune_keep_experts={keep}: the model has no MoE layer to prune "
                f"(first_k_dense_replace={m.first_k_dense_replace} = num_hidden_layers="
                f"{m.num_hidden_layers}, num_nextn_predict_layers=0)")
        m.check_keep_experts(keep, name="train.prune_keep_experts")

    def to_dict(self) -> dict[str, Any]:
        """`{"preset": name, section: {field: value}}`, JSON-serializable
        (`serialization.to_dict`); a V4 model section starts with its `model_type`."""
        d = serialization.to_dict(self)
        if isinstance(self.model, DeepSeekV4Config):
            d["model"] = {MODEL_TYPE_KEY: V4_MODEL_TYPE, **d["model"]}
        return d

    def to_json(self) -> str:
        """`to_dict()` as JSON text with sorted keys."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PipelineConfig:
        """The config of a `to_dict()`, values parsed into their declared types.

        Raises:
          ValueError: an unknown section or key, or a bad value (named by SECTION.FIELD),
            or an unknown `model.model_type`.
        """
        return serialization.from_dict(cls, d, model_section(d.get("model")))

    def is_v4(self) -> bool:
        """True when the model is V4-style (`DeepSeekV4Config`)."""
        return isinstance(self.model, DeepSeekV4Config)

    @classmethod
    def from_json(cls, s: str) -> PipelineConfig:
        """The config of a `to_json()` text (see `from_dict`)."""
        return cls.from_dict(json.loads(s))


def model_section(values: Any) -> dict[str, type]:
    """`{"model": its config class}` for a model section's dict form: `DeepSeekV4Config` when
    its `model_type` is "deepseek_v4", else `DeepSeekConfig` (`{}` for a missing section).

    Raises:
      ValueError: another `model_type`.
    """
    if not isinstance(values, dict):
        return {"model": DeepSeekConfig} if values is not None else {}
    model_type = values.get(MODEL_TYPE_KEY)
    if model_type not in (None, V4_MODEL_TYPE):
        raise ValueError(f"model.{MODEL_TYPE_KEY}={model_type!r} is not known; a V4 model "
                         f"section says {V4_MODEL_TYPE!r}, a V2/V3 one nothing")
    return {"model": DeepSeekV4Config if model_type == V4_MODEL_TYPE else DeepSeekConfig}
