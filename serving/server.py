"""The pushed model behind `deepseek-tfx serve`, on TensorFlow Serving's REST shapes,
independent of HTTP (`serving/http_app.py` puts it on uvicorn + FastAPI).

  GET  /v1/models/<name>[/versions/N]            model status (TF Serving's
                                                 GetModelStatus): state LOADING while
                                                 warming up, then AVAILABLE
  GET  /v1/models/<name>[/versions/N]/metadata   signatures of the SavedModel
  POST /v1/models/<name>[/versions/N]:predict    {"instances": [...]} or {"inputs": ...},
                                                 optional "signature_name" (default
                                                 serving_default)

Requests and responses follow TF Serving's REST API, so a client can move to
`tensorflow_model_server --rest_api_port=... --model_base_path=<serving dir>`
unchanged: row format (`instances`: a list of prompts or of objects with the
signature's inputs) answers `{"predictions": [...]}`, columnar format (`inputs`)
answers `{"outputs": ...}`. The newest numbered version under the serving directory
is loaded (as TF Serving's default version policy); a SavedModel directory itself
(e.g. what `hf-import` wrote) is served as version 1. A SavedModel without a
tokenizer (logits only) serves `logits` and `serving_default` (token ids in, logits
out); asking it for text says that it has no tokenizer.

Warm-up. `warm_up()` runs every signature through the batcher at the batch sizes it
will see (1, 2, 4, ... up to max_batch_size rows), after replaying the SavedModel's
warm-up requests (`assets.extra/tf_serving_warmup_requests`, when
`serving.warmup.read_warmup_requests` can read them); until it is done the state is
LOADING and `predict`/`run` raise Unavailable (503: retry), as TF Serving does not
serve a model before its warm-up ends.

Inputs. A signature input of rank >= 1 has one row per prompt (`prompt`, `input_ids`,
and the sampling inputs of `generate` when the model takes them per prompt); a rank-0
input is one value for the whole call (the sampling inputs of older exports). In row
format each instance fills the per-row inputs with its own values (a scalar input must
then be the same in every instance); in columnar format a single value given for a
per-row input is repeated for every prompt.

Validation, before any model work: a bad request gets a 400 with `{"error": ...}`
naming the field and its allowed range, and the server keeps serving. First the JSON
itself, before any tensor is built (`serving/request_limits.py`): unknown keys,
nesting deeper than an input's rank, ragged lists, integers outside their dtype
(int32), non-finite floats, booleans where numbers belong. Then:
  max_new_tokens   in [1, context - prompt tokens], the context being
                   `max_position_embeddings` (the model's config,
                   `layout.read_model_config`) and the prompt
                   counted by the `tokenize` signature as the model sees it (plain
                   LMs: one [EOS] separator first; chat models: inside the chat
                   template's prefix and suffix, assets.extra/chat_prompt.json, except
                   for `generate_raw`); for `serving_default`, the generation default
                   (generation_config.json) bounds the prompt instead;
  temperature >= 0, top_k >= 0, 0 < top_p <= 1;
  input_ids        in [0, vocab_size) (`logits`, `detokenize`, a logits-only
                   `serving_default`);
  rows             at most `serve.max_batch_size` prompts per request;
  logits           (any signature that returns [rows, positions, vocab] floats:
                   `logits`, a logits-only `serving_default`) positions <= context
                   (max_position_embeddings), and the reply at most
                   `serve.max_response_bytes` (default 64 MiB), sized as
                   rows x positions x vocab_size x 20 bytes (a float32 in JSON):
                   ask for fewer rows or positions, or generate text instead.
A model without config.json (nor the pipeline config), or with one that cannot be
read, skips the checks that need the context or the vocabulary (a warning says why);
the model itself then rejects what it cannot run.

Batching (TF Serving's `--enable_batching`, same knob names: `config.
ServeConfig`). There is no lock around the model: each request is validated in its
caller's thread (the HTTP app's worker thread) and queued; `num_batch_threads` batch
threads each take the queued requests of one batching key, up to `max_batch_size`
rows, once that many rows wait or the oldest has waited `batch_timeout_micros`,
concatenate their per-row inputs along axis 0, call the signature once and hand each request its rows of the outputs.
The batching key is the signature, the values of its scalar inputs, the shape of
its inputs past the row axis (e.g. the length of `input_ids`, so no padding changes a
request's logits) and, for per-row `max_new_tokens`, its power-of-two bucket
(1, 2-3, 4-7, 8-15, ...): a batched `generate` runs until its longest row is done,
so a request for 8 tokens is never held up by one for 200, at most by one for 15.
Keys are served oldest request first, so no key starves another, and a long
`generate` batch occupies one batch thread while the others go on. When a batched
call fails, each of its requests is run again alone, so only the request at fault
gets the error (400 when the model rejects its inputs, 500 otherwise). More than
`max_enqueued_batches * max_batch_size` queued rows: 503 at once, as TF Serving's
full batch queue.

Needs only TensorFlow, tensorflow_text, numpy and pydantic.
"""

from __future__ import annotations

import logging
import re
import threading
import time

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the regex ops of the tokenizer)

from config import ServeConfig
from savedmodel.layout import (
    MODEL_CONFIG_NAME,
    PIPELINE_CONFIG_ASSET,
    has_tokenizer,
    latest_version,
    read_chat_prompt,
    read_hf_generation_config,
    read_model_config,
    read_pipeline_config,
    read_tokenizer,
)
from serving.batcher import Batcher, Unavailable
from serving.engine import Engine, Request, Sampling
from serving.request_limits import (
    BadRequest,
    PredictRequest,
    columns_to_arrays,
    rows_to_columns,
)
from serving.server_checks import RequestChecks
from serving.warmup import read_warmup_requests

log = logging.getLogger(__name__)

__all__ = ["BadRequest", "ModelServer", "Unavailable"]

_TEXT_SIGNATURES = ("generate", "tokenize", "detokenize")


# ----------------------------------------------------------------------------- the model


def _default_max_new_tokens(model_dir: str) -> int | None:
    """`serving_default`'s max_new_tokens: generation_config.json's, else the pipeline
    config's; None when neither file says (or one cannot be read)."""
    try:
        hf = read_hf_generation_config(model_dir) or {}
        if hf.get("max_new_tokens"):
            return hf["max_new_tokens"]
        pipeline = read_pipeline_config(model_dir)
    except ValueError as e:
        log.warning("%s: serving_default's max_new_tokens is not known (%s)", model_dir, e)
        return None
    return pipeline.generation.max_new_tokens if pipeline is not None else None


class ModelServer(RequestChecks):
    """The loaded SavedModel, request validation and batching, independent of HTTP.

    Args:
      serving_dir: a serving directory (its newest numbered version is loaded) or a
        SavedModel directory (version 1).
      model_name: the <name> of /v1/models/<name>.
      serve: batching knobs and limits; `ServeConfig()` when None.
      warm: run `warm_up()` before returning (state AVAILABLE); False leaves the
        state LOADING (requests get Unavailable) until the caller runs `warm_up()`.

    Raises:
      FileNotFoundError: see `layout.latest_version`.
    """

    def __init__(self, serving_dir: str, model_name: str = "deepseek",
                 serve: ServeConfig | None = None, warm: bool = True):
        self.path, self.version = latest_version(serving_dir)
        self.name = model_name
        self.serve = serve or ServeConfig()
        self.model = tf.saved_model.load(self.path)
        self.signatures = dict(self.model.signatures)
        self.has_tokenizer = has_tokenizer(self.path)
        # What validation needs, from assets.extra/ (None: not checked before the model).
        self.context = self.vocab_size = None
        try:
            model = read_model_config(self.path)
            self.context, self.vocab_size = model.max_position_embeddings, model.vocab_size
        except FileNotFoundError:
            log.warning("%s has no assets.extra/%s (nor %s): max_new_tokens and token ids are "
                        "not checked before the model runs", self.path, MODEL_CONFIG_NAME,
                        PIPELINE_CONFIG_ASSET)
        except ValueError as e:  # a config file that cannot be read: say why
            log.warning("%s: max_new_tokens and token ids are not checked before the model "
                        "runs: %s", self.path, e)
        self.default_max_new_tokens = _default_max_new_tokens(self.path)
        self.chat_prompt = read_chat_prompt(self.path)
        # signature -> vocab dim of its [rows, positions, vocab] float output (logits)
        self.logits_signatures = {
            name: next(v.shape[-1] for v in fn.structured_outputs.values()
                       if v.shape.rank == 3 and v.dtype.is_floating)
            for name, fn in self.signatures.items()
            if any(v.shape.rank == 3 and v.dtype.is_floating
                   for v in fn.structured_outputs.values())}
        self.state = "LOADING"  # TF Serving's ModelVersionStatus.State
        self._warm_up_stats: dict = {}
        self._ready = threading.Event()
        self.batcher = Batcher(self._call, self.serve)
        self.engine = self._start_engine()
        if warm:
            self.warm_up()

    def _start_engine(self) -> Engine | None:
        """The serving engine (`serving/engine.py`) when the SavedModel has its functions,
        a tokenizer and a known context, and `serve.decode_slots` > 0; else None."""
        if not (self.serve.decode_slots and self.has_tokenizer and self.context
                and Engine.has_engine(self.model)):
            return None
        tokenizer = read_tokenizer(self.path)
        return Engine(self.model, tokenizer.surfaces(), tokenizer.eos_id,
                      min(self.serve.slot_positions or self.context, self.context),
                      slots=self.serve.decode_slots,
                      max_waiting=self.serve.max_waiting_requests,
                      vocab_size=self.vocab_size,
                      steps_per_call=self.serve.decode_steps_per_call)

    def close(self) -> None:
        """Stops the batch threads and the engine (queued requests get Unavailable, or
        end as cancelled)."""
        self.batcher.close()
        if self.engine is not None:
            self.engine.close()

    def stats(self) -> dict:
        """The batcher's counts since warm-up ended: requests, calls, rows,
        retried_batches, refused; and max_rows, the largest batch (warm-up included)."""
        now, warm = self.batcher.stats(), self._warm_up_stats
        return {k: v if k == "max_rows" else v - warm.get(k, 0) for k, v in now.items()}

    @property
    def ready(self) -> bool:
        """True once `warm_up()` has run (state AVAILABLE)."""
        return self._ready.is_set()

    def status(self) -> dict:
        """TF Serving's GetModelStatus reply: state LOADING until warmed up, then AVAILABLE."""
        return {"model_version_status": [{
            "version": str(self.version), "state": self.state,
            "status": {"error_code": "OK", "error_message": ""}}]}

    def warm_up(self, signatures: bool = True) -> dict:
        """Runs every signature through the batcher before traffic (TF Serving's
        SavedModel warm-up), then the engine's two functions; then the state is AVAILABLE.

        First the model's own warm-up requests (`serving.warmup.read_warmup_requests`,
        when the file is there), then each signature at
        1, 2, 4, ... up to max_batch_size rows with synthesized inputs (greedy, one new
        token, 8 token ids), so the first real batches of any size find their kernels
        ready. A warm-up request that fails is logged and skipped.

        Args:
          signatures: False warms the engine only (the OpenAI routes' generation); the
            signatures (the TF Serving routes) are then made ready by their first
            request. Their first calls are most of a warm-up: 27 of a tiny V4 chat
            model's ~40 s here (2-core Xeon; the engine's, 6 s). A server without an
            engine (`decode_slots` 0, no tokenizer, or a SavedModel without the engine's
            functions) warms its signatures either way: they are its only way to serve.

        Returns:
          {"requests": calls made, "failed": of which failed, "seconds": wall time,
          "signatures": whether the signatures were warmed}.
        """
        start, calls, failed = time.perf_counter(), 0, 0
        warm_signatures = signatures or self.engine is None
        for name, inputs, rows in self._warmup_requests() if warm_signatures else ():
            calls += 1
            try:
                self._validate(name, inputs, rows)
                self.batcher.submit(self._batch_key(name, inputs), inputs, rows).result()
            except Exception as e:  # noqa: BLE001 (warm-up is best effort)
                failed += 1
                log.warning("warm-up: %s at %d rows failed: %s", name, rows,
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
        if self.engine is not None:  # both engine functions, greedy and sampled
            for temperature in (0.0, 1.0):
                calls += 1
                ended = self.engine.run(Request([0, 1], 2, Sampling(temperature),
                                                lambda event: None))
                failed += ended.reason == "error"
        self._warm_up_stats = self.batcher.stats()
        self.state = "AVAILABLE"
        self._ready.set()
        return {"requests": calls, "failed": failed,
                "seconds": round(time.perf_counter() - start, 2),
                "signatures": warm_signatures}

    def _warmup_requests(self):
        """(signature, inputs, rows): the model's warm-up file, then synthesized ones."""
        try:
            for name, inputs in read_warmup_requests(self.path):
                if name in self.signatures:
                    rows = next((int(v.shape[0]) for v in inputs.values() if v.ndim), 1)
                    yield name, inputs, rows
        except (OSError, ValueError) as e:
            log.warning("warm-up: %s/assets.extra's warm-up requests unreadable: %s",
                        self.path, e)
        sizes, n = [], 1
        while n < self.serve.max_batch_size:
            sizes.append(n)
            n *= 2
        sizes.append(self.serve.max_batch_size)
        for name in sorted(self.signatures):
            specs = self.signatures[name].structured_input_signature[1]
            # serving_default generates its default max_new_tokens: one row is enough
            unbounded = "prompt" in specs and "max_new_tokens" not in specs
            for rows in sizes[:1] if unbounded else sizes:
                inputs = self._synthetic_inputs(name, rows)
                if inputs is not None:
                    yield name, inputs, rows

    def _synthetic_inputs(self, name: str, rows: int) -> dict[str, np.ndarray] | None:
        """Inputs for `rows` prompts: text "预热" ("warm-up"), 8 token ids, greedy sampling of
        one new token; None for a signature with inputs of other kinds."""
        values = {"max_new_tokens": 1, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
        inputs = {}
        for key, spec in self.signatures[name].structured_input_signature[1].items():
            shape = [rows] if spec.shape.rank == 1 else []
            if spec.dtype == tf.string and spec.shape.rank in (0, 1):
                inputs[key] = np.full(shape, "预热".encode(), dtype=object)
            elif key == "input_ids" and spec.shape.rank == 2:
                high = min(self.vocab_size or 2, 256)
                inputs[key] = (np.arange(rows * 8).reshape(rows, 8) % high).astype(
                    spec.dtype.as_numpy_dtype)
            elif key in values and spec.shape.rank in (0, 1):
                inputs[key] = np.full(shape, values[key], dtype=spec.dtype.as_numpy_dtype)
            else:
                return None
        return inputs

    def metadata(self) -> dict:
        sigs = {}
        for name, fn in self.signatures.items():
            inputs = fn.structured_input_signature[1]
            sigs[name] = {
                "inputs": {k: {"dtype": v.dtype.name, "shape": v.shape.as_list()}
                           for k, v in inputs.items()},
                "outputs": {k: {"dtype": v.dtype.name, "shape": v.shape.as_list()}
                            for k, v in fn.structured_outputs.items()},
            }
        return {"model_spec": {"name": self.name, "version": str(self.version)},
                "metadata": {"signature_def": sigs}}

    def predict(self, body, usage: dict | None = None) -> dict:
        """Answers a TF Serving REST predict request body (parsed JSON); blocks until
        its batch ran.

        Args:
          body: the parsed JSON body.
          usage: if given, filled with what the request cost, in OpenAI's names:
            `prompt_tokens` (the prompts' tokens as the model sees them when
            validation counted them, the token ids given to `logits`/`detokenize`,
            else 0) and `completion_tokens` (the sum of `num_generated`, else 0).

        Raises:
          BadRequest: the request is malformed or out of range (validated before it is
            queued, `serving/request_limits.py`), or the model rejected its inputs
            (InvalidArgumentError).
          Unavailable: the batch queue is full, or the model is still warming up.
          Exception: anything else the model raised (HTTP 500).
        """
        self._check_ready()
        try:
            return self._predict(body, usage if usage is not None else {})
        except RecursionError as e:  # JSON nested nearly as deep as the parser goes
            raise BadRequest("the request is nested too deep") from e

    def _predict(self, body, usage: dict) -> dict:
        request = PredictRequest.from_json(body)
        name = request.signature_name
        if name not in self.signatures:
            why = "" if self.has_tokenizer or name not in _TEXT_SIGNATURES else (
                " (it has no tokenizer: logits only, token ids in)")
            raise BadRequest(f"unknown signature_name '{name}'; the model has "
                             f"{sorted(self.signatures)}{why}")
        specs = self.signatures[name].structured_input_signature[1]
        if request.instances is not None:
            columns = rows_to_columns(request.instances, specs)
        else:
            columns = request.inputs
            if not isinstance(columns, dict):
                if len(specs) != 1:
                    raise BadRequest(f'"inputs" must be an object with keys {sorted(specs)}')
                columns = {next(iter(specs)): columns}
        try:
            inputs, rows = columns_to_arrays(columns, specs, self.serve.max_batch_size)
        except BadRequest as e:
            if self.has_tokenizer or not _has_text(columns):
                raise
            raise BadRequest(f"{e} (the model has no tokenizer: it takes token ids, "
                             "not text)") from e
        self._check_ready()
        prompt_tokens = self._validate(name, inputs, rows)
        outputs = self.batcher.submit(self._batch_key(name, inputs), inputs, rows).result()
        usage["prompt_tokens"] = prompt_tokens
        generated = outputs.get("num_generated")
        usage["completion_tokens"] = int(generated.sum()) if generated is not None else 0
        if "input_ids" in outputs and "lengths" in outputs:  # tokenize: the batch's padding off
            longest = int(outputs["lengths"].max()) if outputs["lengths"].size else 0
            outputs = {**outputs, "input_ids": outputs["input_ids"][:, :longest]}
        outputs = {k: _to_json(v) for k, v in outputs.items()}
        if request.instances is not None:
            n = len(request.instances)
            batched = {k: v for k, v in outputs.items() if isinstance(v, list) and len(v) == n}
            if len(batched) == 1:
                return {"predictions": next(iter(batched.values()))}
            return {"predictions": [{k: v[i] for k, v in batched.items()} for i in range(n)]}
        return {"outputs": outputs}

    def _check_ready(self) -> None:
        if not self._ready.is_set():
            raise Unavailable(f"model '{self.name}' is LOADING (warming up); retry in a "
                              f"moment (GET /v1/models/{self.name} says AVAILABLE when ready)")

    def run(self, name: str, inputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Validates and runs one call of signature `name` through the batcher; blocks
        until its batch ran. What `predict` does after parsing JSON, for callers that
        hold numpy arrays already (other front doors than TF Serving's REST API).

        Args:
          name: a signature of the model (`self.signatures`).
          inputs: every input of the signature, as numpy arrays of its dtypes and
            shapes (per-row inputs [rows, ...]; strings as bytes).
          rows: the number of prompts (rows) of the call.

        Returns:
          The signature's outputs as numpy arrays, this call's rows only.

        Raises:
          BadRequest, Unavailable, Exception: as `predict`.
        """
        self._check_ready()
        self._validate(name, inputs, rows)
        return self.batcher.submit(self._batch_key(name, inputs), inputs, rows).result()

    # -- batching -----------------------------------------------------------------
    @staticmethod
    def _batch_key(name: str, inputs: dict[str, np.ndarray]) -> tuple:
        """(signature, scalar inputs, shapes past the row axis, max_new_tokens bucket)."""
        scalars = tuple(sorted((k, v.item()) for k, v in inputs.items() if v.ndim == 0))
        shapes = tuple(sorted((k, v.shape[1:]) for k, v in inputs.items() if v.ndim >= 2))
        new = inputs.get("max_new_tokens")
        bucket = int(new.max()).bit_length() if new is not None and new.ndim and new.size else 0
        return name, scalars, shapes, bucket

    def _call(self, name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One signature call (a batch thread's). Raises BadRequest when the model
        rejects the inputs; anything else the model raised as is."""
        specs = self.signatures[name].structured_input_signature[1]
        tensors = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()}
        try:
            outputs = self.signatures[name](**tensors)
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            raise BadRequest(f"the model rejected the inputs: {_error_summary(e)}") from e
        return {k: v.numpy() for k, v in outputs.items()}


def _error_summary(error: Exception) -> str:
    """The informative line of a TensorFlow error (not 'Graph execution error:')."""
    text = getattr(error, "message", None) or str(error)
    for line in text.splitlines():
        line = re.sub(r"\s*\[Op:[^\]]*\]$", "", line.strip())
        if line and not line.startswith(("Graph execution error", "Detected at node", "<stack",
                                         "[[")):
            return line
    return text.splitlines()[0] if text else type(error).__name__


def _has_text(value, depth: int = 4) -> bool:
    """Whether `value` holds a string within `depth` levels (bounded: any JSON)."""
    if isinstance(value, str):
        return True
    if depth == 0:
        return False
    if isinstance(value, dict):
        return any(_has_text(v, depth - 1) for v in value.values())
    return isinstance(value, list) and any(_has_text(v, depth - 1) for v in value)


def _to_json(value):
    if isinstance(value, np.ndarray):
        if value.dtype.kind in ("S", "O"):
            return [_to_json(v) for v in value.tolist()] if value.ndim else _to_json(value.item())
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, list):
        return [_to_json(v) for v in value]
    return value
