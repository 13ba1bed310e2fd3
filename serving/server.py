"""`deepseek-tfx serve`: the pushed model over HTTP, on TensorFlow Serving's REST shapes.

  GET  /v1/models/<name>                 model status (as TF Serving's GetModelStatus)
  GET  /v1/models/<name>/metadata        signatures of the SavedModel
  POST /v1/models/<name>:predict         {"instances": [...]} or {"inputs": ...},
                                         optional "signature_name" (default serving_default)

Requests and responses follow TF Serving's REST API, so a client can move to
`tensorflow_model_server --rest_api_port=... --model_base_path=<serving dir>`
unchanged: row format (`instances`: a list of prompts or of objects with the
signature's inputs) answers `{"predictions": [...]}`, columnar format (`inputs`)
answers `{"outputs": ...}`. The newest numbered version under the serving directory
is loaded (as TF Serving's default version policy); a SavedModel directory itself
(e.g. what `hf-import` wrote) is served as version 1. A SavedModel without a
tokenizer (logits only) serves `logits` and `serving_default` (token ids in, logits
out); asking it for text says that it has no tokenizer.

Inputs. A signature input of rank >= 1 has one row per prompt (`prompt`, `input_ids`,
and the sampling inputs of `generate` when the model takes them per prompt); a rank-0
input is one value for the whole call (the sampling inputs of older exports). In row
format each instance fills the per-row inputs with its own values (a scalar input must
then be the same in every instance); in columnar format a single value given for a
per-row input is repeated for every prompt.

Validation, before any model work: a bad request gets a 400 with `{"error": ...}`
naming the field and its allowed range, and the server keeps serving:
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
  rows             at most `serve.max_batch_size` prompts per request.
A model without config.json (nor the pipeline config), or with one that cannot be
read, skips the checks that need the context or the vocabulary (a warning says why);
the model itself then rejects what it cannot run.

Batching (TF Serving's `--enable_batching`, same knob names: `config.
ServeConfig`). There is no lock around the model: each request is validated in its
HTTP thread and queued; `num_batch_threads` batch threads each take the queued
requests of one batching key, up to `max_batch_size` rows, once that many rows wait
or the oldest has waited `batch_timeout_micros`, concatenate their per-row inputs
along axis 0, call the signature once and hand each request its rows of the outputs.
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

Needs only TensorFlow and tensorflow_text (and the standard library's threaded HTTP
server).
"""

from __future__ import annotations

import json
import logging
import re
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
)
from serving.batcher import Batcher, Unavailable

log = logging.getLogger(__name__)

_PREDICT = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict$")
_STATUS = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
                     r"(?P<metadata>/metadata)?$")
MAX_BODY_BYTES = 10 * 1024 * 1024
_TEXT_SIGNATURES = ("generate", "tokenize", "detokenize")
# Sampling inputs: (allowed, what the 400 says).
_SAMPLING_RANGES = {
    "temperature": (lambda v: v >= 0, "must be >= 0 (0 = greedy)"),
    "top_k": (lambda v: v >= 0, "must be >= 0 (0 = no top-k filter)"),
    "top_p": (lambda v: (v > 0) & (v <= 1), "must be in (0, 1] (1 = no nucleus filter)"),
}


class BadRequest(ValueError):
    """A request the model cannot answer; becomes HTTP 400 with the message."""


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


class ModelServer:
    """The loaded SavedModel, request validation and batching, independent of HTTP.

    Args:
      serving_dir: a serving directory (its newest numbered version is loaded) or a
        SavedModel directory (version 1).
      model_name: the <name> of /v1/models/<name>.
      serve: batching knobs; `ServeConfig()` when None.

    Raises:
      FileNotFoundError: see `layout.latest_version`.
    """

    def __init__(self, serving_dir: str, model_name: str = "deepseek",
                 serve: ServeConfig | None = None):
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
        self.batcher = Batcher(self._call, self.serve)

    def close(self) -> None:
        """Stops the batch threads (queued requests get Unavailable)."""
        self.batcher.close()

    def stats(self) -> dict:
        """The batcher's counts: requests, calls, rows, max_rows, retried_batches, refused."""
        return self.batcher.stats()

    def status(self) -> dict:
        return {"model_version_status": [{
            "version": str(self.version), "state": "AVAILABLE",
            "status": {"error_code": "OK", "error_message": ""}}]}

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

    def predict(self, body: dict) -> dict:
        """Answers a TF Serving REST predict request body; blocks until its batch ran.

        Raises:
          BadRequest: the request is malformed or out of range (validated before it is
            queued), or the model rejected its inputs (InvalidArgumentError).
          Unavailable: the batch queue is full.
          Exception: anything else the model raised (HTTP 500).
        """
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        name = body.get("signature_name", "serving_default")
        if not isinstance(name, str) or name not in self.signatures:
            why = "" if self.has_tokenizer or name not in _TEXT_SIGNATURES else (
                " (it has no tokenizer: logits only, token ids in)")
            raise BadRequest(f"unknown signature_name '{name}'; the model has "
                             f"{sorted(self.signatures)}{why}")
        specs = self.signatures[name].structured_input_signature[1]
        if ("instances" in body) == ("inputs" in body):
            raise BadRequest('give exactly one of "instances" (row format) or "inputs" '
                             "(columnar format)")
        if "instances" in body:
            columns = self._rows_to_columns(body["instances"], specs)
        else:
            columns = body["inputs"]
            if not isinstance(columns, dict):
                if len(specs) != 1:
                    raise BadRequest(f'"inputs" must be an object with keys {sorted(specs)}')
                columns = {next(iter(specs)): columns}
        try:
            inputs, rows = self._to_arrays(columns, specs)
        except BadRequest as e:
            if self.has_tokenizer or not _has_text(columns):
                raise
            raise BadRequest(f"{e} (the model has no tokenizer: it takes token ids, "
                             "not text)") from e
        outputs = self.run(name, inputs, rows)
        if "input_ids" in outputs and "lengths" in outputs:  # tokenize: the batch's padding off
            longest = int(outputs["lengths"].max()) if outputs["lengths"].size else 0
            outputs = {**outputs, "input_ids": outputs["input_ids"][:, :longest]}
        outputs = {k: _to_json(v) for k, v in outputs.items()}
        if "instances" in body:
            n = len(body["instances"])
            batched = {k: v for k, v in outputs.items() if isinstance(v, list) and len(v) == n}
            if len(batched) == 1:
                return {"predictions": next(iter(batched.values()))}
            return {"predictions": [{k: v[i] for k, v in batched.items()} for i in range(n)]}
        return {"outputs": outputs}

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
        self._validate(name, inputs, rows)
        return self.batcher.submit(self._batch_key(name, inputs), inputs, rows).result()

    # -- parsing ------------------------------------------------------------------
    @staticmethod
    def _rows_to_columns(instances, specs) -> dict:
        if not isinstance(instances, list) or not instances:
            raise BadRequest('"instances" must be a non-empty list')
        batched = [k for k, s in specs.items() if s.shape.rank and s.shape.rank >= 1]
        if all(not isinstance(x, dict) for x in instances):
            if len(batched) != 1:
                raise BadRequest(f"instances must be objects with keys {sorted(specs)}")
            return {batched[0]: instances}
        if not all(isinstance(x, dict) for x in instances):
            raise BadRequest("instances must be all objects or all values")
        columns: dict = {}
        for key, spec in specs.items():
            values = [x.get(key) for x in instances]
            if spec.shape.rank == 0:  # a scalar input: the same for the whole batch
                given = {json.dumps(v) for v in values if v is not None}
                if len(given) > 1:
                    raise BadRequest(f"'{key}' is a scalar input: it must be the same "
                                     "in every instance")
                if given:
                    columns[key] = json.loads(given.pop())
            else:
                if any(v is None for v in values):
                    raise BadRequest(f"every instance needs '{key}'")
                columns[key] = values
        return columns

    @staticmethod
    def _to_arrays(columns: dict, specs) -> tuple[dict[str, np.ndarray], int]:
        """(numpy inputs of the signature's dtypes and shapes, rows). A single value for
        a per-row (rank-1) input is repeated for every row."""
        unknown = sorted(set(columns) - set(specs))
        if unknown:
            raise BadRequest(f"unknown inputs {unknown}; the signature takes {sorted(specs)}")
        missing = sorted(set(specs) - set(columns))
        if missing:
            raise BadRequest(f"missing inputs {missing}")
        arrays = {}
        for key, spec in specs.items():
            try:
                arrays[key] = tf.constant(columns[key], dtype=spec.dtype).numpy()
            except (TypeError, ValueError) as e:
                raise BadRequest(f"input '{key}' must be {spec.dtype.name} "
                                 f"{spec.shape.as_list()}: {e}") from e
        row_counts = {k: a.shape[0] for k, a in arrays.items() if specs[k].shape.rank and a.ndim}
        if len(set(row_counts.values())) > 1:
            raise BadRequest(f"the inputs have different numbers of rows: {row_counts}")
        rows = next(iter(row_counts.values()), 0)
        for key, spec in specs.items():
            if spec.shape.rank == 1 and arrays[key].ndim == 0 and row_counts:
                arrays[key] = np.full([rows], arrays[key])  # one value for every prompt
            if not spec.shape.is_compatible_with(arrays[key].shape):
                raise BadRequest(f"input '{key}' has shape {list(arrays[key].shape)}, "
                                 f"expected {spec.shape.as_list()}")
        return arrays, rows

    # -- validation ---------------------------------------------------------------
    def _validate(self, name: str, inputs: dict[str, np.ndarray], rows: int) -> None:
        """Raises BadRequest naming the field and its allowed range (see the module doc)."""
        limit = self.serve.max_batch_size
        if rows > limit:
            raise BadRequest(f"a request may have at most max_batch_size={limit} rows "
                             f"(prompts); this one has {rows}: split it (or start serve with "
                             "a larger --max-batch-size)")
        for field, (allowed, what) in _SAMPLING_RANGES.items():
            if field in inputs:
                values = inputs[field]
                bad = np.flatnonzero(~allowed(values.reshape(-1)))
                if bad.size:
                    at = f" (prompt {bad[0]})" if values.ndim and rows > 1 else ""
                    raise BadRequest(f"{field}={values.reshape(-1)[bad[0]]} {what}{at}")
        ids = inputs.get("input_ids")
        if ids is not None and self.vocab_size and ids.size:
            bad = np.argwhere((ids < 0) | (ids >= self.vocab_size))
            if bad.size:
                where = ", ".join(str(i) for i in bad[0])
                raise BadRequest(f"input_ids must be in [0, {self.vocab_size}) (vocab_size); "
                                 f"input_ids[{where}] = {ids[tuple(bad[0])]}")
        if "prompt" in inputs and rows and self.context and "tokenize" in self.signatures:
            self._check_room(name, inputs, rows)

    def _check_room(self, name: str, inputs: dict[str, np.ndarray], rows: int) -> None:
        """max_new_tokens in [1, context - prompt tokens], for every prompt."""
        if "max_new_tokens" in inputs:
            new = np.broadcast_to(inputs["max_new_tokens"], [rows])
        elif name == "serving_default" and self.default_max_new_tokens:
            new = np.full([rows], self.default_max_new_tokens)
        else:
            return
        templated = self.chat_prompt is not None and name != "generate_raw"
        prompts = list(inputs["prompt"])
        if templated:
            prefix, suffix = (s.encode("utf-8") for s in self.chat_prompt)
            prompts = [prefix + p + suffix for p in prompts]
        lengths = self.signatures["tokenize"](text=tf.constant(prompts))["lengths"].numpy()
        used = lengths + (0 if templated else 1)  # a plain prompt starts with [EOS]
        seen = "in the chat template" if templated else "with the [EOS] separator first"
        for i in range(rows):
            room, at = self.context - int(used[i]), f" (prompt {i})" if rows > 1 else ""
            if 1 <= new[i] <= room:
                continue
            if "max_new_tokens" not in inputs:
                raise BadRequest(
                    f"prompt is {used[i]} tokens ({seen}){at}; {name} generates "
                    f"max_new_tokens={new[i]} (the model's generation defaults), so the prompt "
                    f"may have at most {self.context - int(new[i])} tokens of the "
                    f"{self.context}-token context (max_position_embeddings); the generate "
                    "signature takes a smaller max_new_tokens")
            if room < 1:
                raise BadRequest(
                    f"prompt is {used[i]} tokens ({seen}){at}; with max_new_tokens={new[i]} "
                    f"it may have at most {self.context - max(int(new[i]), 1)} tokens of the "
                    f"{self.context}-token context (max_position_embeddings)")
            raise BadRequest(
                f"max_new_tokens={new[i]} must be in [1, {room}]{at}: the prompt is {used[i]} "
                f"tokens ({seen}) of the {self.context}-token context "
                "(max_position_embeddings)")

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


def _has_text(value) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, dict):
        return any(_has_text(v) for v in value.values())
    return isinstance(value, list) and any(_has_text(v) for v in value)


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


# ----------------------------------------------------------------------------- HTTP


def make_handler(server: ModelServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _model_matches(self, match) -> bool:
            if match.group("name") != server.name:
                self._send(HTTPStatus.NOT_FOUND,
                           {"error": f"Servable not found for request: '{match.group('name')}'"
                                     f" (this server serves '{server.name}')"})
                return False
            version = match.group("version")
            if version is not None and int(version) != server.version:
                self._send(HTTPStatus.NOT_FOUND,
                           {"error": f"version {version} is not loaded (loaded: {server.version})"})
                return False
            return True

        def do_GET(self):  # noqa: N802 (http.server API)
            match = _STATUS.match(self.path)
            if not match:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such resource: {self.path}"})
                return
            if self._model_matches(match):
                self._send(HTTPStatus.OK,
                           server.metadata() if match.group("metadata") else server.status())

        def do_POST(self):  # noqa: N802
            match = _PREDICT.match(self.path)
            if not match:
                self._send(HTTPStatus.NOT_FOUND, {"error": f"no such resource: {self.path}"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           {"error": f"request body over {MAX_BODY_BYTES} bytes"})
                self.close_connection = True
                return
            raw = self.rfile.read(length)
            if not self._model_matches(match):
                return
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                self._send(HTTPStatus.BAD_REQUEST, {"error": f"the body is not JSON: {e}"})
                return
            try:
                self._send(HTTPStatus.OK, server.predict(body))
            except BadRequest as e:
                self._send(HTTPStatus.BAD_REQUEST, {"error": str(e)})
            except Unavailable as e:
                self._send(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(e)})
            except Exception as e:  # noqa: BLE001 (a server keeps serving)
                log.exception("predict failed")
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {e}"})

        def log_message(self, fmt, *args):
            log.info("%s " + fmt, self.address_string(), *args)

    return Handler


class _HTTPServer(ThreadingHTTPServer):
    """A thread per connection; a listen backlog for many clients at once (socketserver's
    default of 5 refuses connections when 32 clients connect together)."""

    daemon_threads = True
    request_queue_size = 256


def make_http_server(serving_dir: str, host: str = "127.0.0.1", port: int = 8501,
                     model_name: str = "deepseek",
                     serve: ServeConfig | None = None) -> ThreadingHTTPServer:
    """Loads the newest version and returns a ready (not yet serving) HTTP server.

    `httpd.model_server` is the `ModelServer`; call its `close()` after
    `httpd.server_close()` to stop the batch threads.

    Raises:
      FileNotFoundError: see `layout.latest_version`.
    """
    model_server = ModelServer(serving_dir, model_name, serve)
    httpd = _HTTPServer((host, port), make_handler(model_server))
    httpd.model_server = model_server
    return httpd
