"""`deepseek-tfx serve`: the pushed model over HTTP, on TensorFlow Serving's REST shapes.

  GET  /v1/models/<name>                 model status (as TF Serving's GetModelStatus)
  GET  /v1/models/<name>/metadata        signatures of the SavedModel
  POST /v1/models/<name>:predict         {"instances": [...]} or {"inputs": ...},
                                         optional "signature_name" (default serving_default)

Requests and responses follow TF Serving's REST API, so a client can move to
`tensorflow_model_server --rest_api_port=... --model_base_path=<serving dir>`
unchanged: row format (`instances`: a list of prompts or of objects with the
signature's inputs) answers `{"predictions": [...]}`, columnar format (`inputs`)
answers `{"outputs": ...}`. Bad requests get a 4xx with `{"error": "..."}`
naming what is wrong; the server keeps serving. The newest numbered version
under the serving directory is loaded (as TF Serving's default version policy); a
SavedModel directory itself (e.g. what `hf-import` wrote) is served as version 1.
A SavedModel without a tokenizer (logits only) serves `logits` and `serving_default`
(token ids in, logits out); asking it for text says that it has no tokenizer.

Needs only TensorFlow and tensorflow_text (and the standard library's HTTP server,
threaded; model calls are serialized by TensorFlow itself).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the regex ops of the tokenizer)

log = logging.getLogger(__name__)

_PREDICT = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict$")
_STATUS = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
                     r"(?P<metadata>/metadata)?$")
MAX_BODY_BYTES = 10 * 1024 * 1024
_TEXT_SIGNATURES = ("generate", "tokenize", "detokenize")


class BadRequest(ValueError):
    """A request the model cannot answer; becomes HTTP 400 with the message."""


def newest_version(serving_dir: str) -> tuple[str, int]:
    """(path, version) of the highest numbered SavedModel under `serving_dir`.

    A directory that is itself a SavedModel is version 1.

    Raises:
      FileNotFoundError: no saved_model.pb in it and no numbered version with one.
    """
    if os.path.isfile(os.path.join(serving_dir, "saved_model.pb")):
        return serving_dir, 1
    versions = [int(d) for d in os.listdir(serving_dir) if d.isdigit()
                and os.path.isfile(os.path.join(serving_dir, d, "saved_model.pb"))]
    if not versions:
        raise FileNotFoundError(f"{serving_dir}: no saved_model.pb and no numbered SavedModel "
                                "versions")
    version = max(versions)
    return os.path.join(serving_dir, str(version)), version


class ModelServer:
    """The loaded SavedModel and the request logic, independent of HTTP."""

    def __init__(self, serving_dir: str, model_name: str = "deepseek"):
        self.path, self.version = newest_version(serving_dir)
        self.name = model_name
        self.model = tf.saved_model.load(self.path)
        self.signatures = dict(self.model.signatures)
        self.has_tokenizer = os.path.isfile(os.path.join(self.path, "assets", "tokenizer.json"))
        self._lock = threading.Lock()

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
        """Runs a TF Serving REST predict request body; raises BadRequest."""
        if not isinstance(body, dict):
            raise BadRequest("the request body must be a JSON object")
        name = body.get("signature_name", "serving_default")
        if name not in self.signatures:
            why = "" if self.has_tokenizer or name not in _TEXT_SIGNATURES else (
                " (it has no tokenizer: logits only, token ids in)")
            raise BadRequest(f"unknown signature_name '{name}'; the model has "
                             f"{sorted(self.signatures)}{why}")
        fn = self.signatures[name]
        specs = fn.structured_input_signature[1]
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
            tensors = self._to_tensors(columns, specs)
        except BadRequest as e:
            if self.has_tokenizer or not _has_text(columns):
                raise
            raise BadRequest(f"{e} (the model has no tokenizer: it takes token ids, "
                             "not text)") from e
        with self._lock:
            try:
                outputs = fn(**tensors)
            except (tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
                raise BadRequest(f"the model rejected the inputs: {str(e).splitlines()[0]}") from e
        outputs = {k: _to_json(v.numpy()) for k, v in outputs.items()}
        if "instances" in body:
            n = len(body["instances"])
            batched = {k: v for k, v in outputs.items() if isinstance(v, list) and len(v) == n}
            if len(batched) == 1:
                return {"predictions": next(iter(batched.values()))}
            return {"predictions": [{k: v[i] for k, v in batched.items()} for i in range(n)]}
        return {"outputs": outputs}

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
    def _to_tensors(columns: dict, specs) -> dict:
        unknown = sorted(set(columns) - set(specs))
        if unknown:
            raise BadRequest(f"unknown inputs {unknown}; the signature takes {sorted(specs)}")
        missing = sorted(set(specs) - set(columns))
        if missing:
            raise BadRequest(f"missing inputs {missing}")
        tensors = {}
        for key, spec in specs.items():
            try:
                tensor = tf.constant(columns[key], dtype=spec.dtype)
            except (TypeError, ValueError) as e:
                raise BadRequest(f"input '{key}' must be {spec.dtype.name} "
                                 f"{spec.shape.as_list()}: {e}") from e
            if not spec.shape.is_compatible_with(tensor.shape):
                raise BadRequest(f"input '{key}' has shape {tensor.shape.as_list()}, "
                                 f"expected {spec.shape.as_list()}")
            tensors[key] = tensor
        return tensors


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
            except Exception as e:  # noqa: BLE001 (a server keeps serving)
                log.exception("predict failed")
                self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {e}"})

        def log_message(self, fmt, *args):
            log.info("%s " + fmt, self.address_string(), *args)

    return Handler


def make_http_server(serving_dir: str, host: str = "127.0.0.1", port: int = 8501,
                     model_name: str = "deepseek") -> ThreadingHTTPServer:
    """Loads the newest version and returns a ready (not yet serving) HTTP server."""
    model_server = ModelServer(serving_dir, model_name)
    httpd = ThreadingHTTPServer((host, port), make_handler(model_server))
    httpd.daemon_threads = True
    httpd.model_server = model_server
    return httpd
