"""TF Serving's SavedModel warm-up file, read and replayed.

A SavedModel's `assets.extra/tf_serving_warmup_requests` (`layout.WARMUP_REQUESTS_ASSET`,
written by `savedmodel.export`) is a TFRecord file of serialized
`tensorflow_serving.apis.prediction_log_pb2.PredictionLog`s, each a `predict_log` whose
`request` (a `PredictRequest`) names a signature (`model_spec.signature_name`, empty =
serving_default) and carries its inputs as `TensorProto`s. TF Serving replays it when it
loads the model (https://www.tensorflow.org/tfx/serving/saved_model_warmup: Predict,
Classify, Regress and MultiInference logs, at most 1,000 records); `serve` reads it here
and calls each signature once per record before it reports ready, since a signature's
first call after loading costs seconds (`savedmodel/export.py`, Warm-up). A model
exported before the file existed is warmed with the same requests, built from its loaded
signatures (`warmup_requests_for`).
"""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tensorflow_serving.apis import prediction_log_pb2

from savedmodel.layout import (
    MAX_WARMUP_RECORDS,
    WARMUP_LOGITS_LENGTH,
    WARMUP_REQUESTS_ASSET,
    WarmupRequest,
    extra_path,
    read_model_config,
    warmup_requests,
)

DEFAULT_SIGNATURE = "serving_default"  # TF Serving's, for an empty signature_name


def read_warmup_requests(model_dir: str) -> list[WarmupRequest]:
    """The warm-up requests of a SavedModel, in the file's order.

    Args:
      model_dir: a SavedModel directory (one version, not a serving directory).

    Returns:
      [(signature name, {input name: numpy array})]: arrays in the TensorProto's dtype
      and shape (`tf.make_ndarray`; strings as bytes in object arrays). [] when the
      SavedModel has no warm-up file.

    Raises:
      ValueError: the file is not a TFRecord of PredictionLog predict requests, or has
        more than 1,000 records (TF Serving refuses to load such a model); the message
        names the file and the record (from 0).
    """
    path = extra_path(model_dir, WARMUP_REQUESTS_ASSET)
    if not tf.io.gfile.exists(path):
        return []
    requests = []
    records = iter(tf.data.TFRecordDataset(path).as_numpy_iterator())
    index = 0
    while True:
        try:
            record = next(records)
        except StopIteration:
            break
        except tf.errors.OpError as e:  # DataLossError: a bad length or checksum
            raise ValueError(f"{path}: record {index} is not a readable TFRecord "
                             f"({e.message.splitlines()[0]})") from None
        if index >= MAX_WARMUP_RECORDS:
            raise ValueError(f"{path}: more than {MAX_WARMUP_RECORDS} records; TF Serving "
                             "replays at most that many and refuses to load the model")
        requests.append(_parse(record, path, index))
        index += 1
    return requests


def warmup_requests_for(model_dir: str, signatures: dict) -> tuple[list[WarmupRequest], str]:
    """What to replay before serving a SavedModel: its warm-up file's requests, or, for a
    model without one, the requests the export would have written
    (`layout.warmup_requests`), built from its loaded signatures.

    Args:
      model_dir: the SavedModel directory.
      signatures: its loaded signatures (`dict(tf.saved_model.load(d).signatures)`).

    Returns:
      (requests, where they came from: the file's path, or a phrase saying they were
      built from the signatures).

    Raises:
      ValueError: see `read_warmup_requests` (a corrupt file is not silently skipped).
    """
    requests = read_warmup_requests(model_dir)
    if requests:
        return requests, extra_path(model_dir, WARMUP_REQUESTS_ASSET)
    try:
        config = read_model_config(model_dir)
        context, vocab_size = config.max_position_embeddings, config.vocab_size
    except (FileNotFoundError, ValueError):  # no readable config: ids below 8 and no crop
        context, vocab_size = 1 << 30, WARMUP_LOGITS_LENGTH
    tokenize = None
    if "tokenize" in signatures:
        def tokenize(text: np.ndarray) -> np.ndarray:
            return signatures["tokenize"](text=tf.constant(text))["input_ids"].numpy()
    specs = {name: fn.structured_input_signature[1] for name, fn in signatures.items()}
    built = warmup_requests(specs, context, vocab_size, tokenize)
    return built, f"built from the signatures (no {WARMUP_REQUESTS_ASSET} in {model_dir})"


def _parse(record: bytes, path: str, index: int) -> WarmupRequest:
    """One record: (signature name, inputs). Raises ValueError naming path and index."""
    log = prediction_log_pb2.PredictionLog()
    try:
        log.ParseFromString(record)
    except DecodeError as e:
        raise ValueError(f"{path}: record {index} is not a PredictionLog ({e})") from None
    kind = log.WhichOneof("log_type")
    if kind != "predict_log":
        raise ValueError(f"{path}: record {index} is a {kind or 'empty PredictionLog'}; "
                         "only predict_log requests (signatures) are replayed")
    request = log.predict_log.request
    if not request.inputs:
        raise ValueError(f"{path}: record {index} ({request.model_spec.signature_name!r}) "
                         "has no inputs")
    inputs = {}
    for key, proto in request.inputs.items():
        try:
            inputs[key] = tf.make_ndarray(proto)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{path}: record {index}: input '{key}' is not a readable "
                             f"TensorProto ({e})") from None
    return request.model_spec.signature_name or DEFAULT_SIGNATURE, inputs


def replay(signatures: dict, requests: list[WarmupRequest]) -> dict[str, float]:
    """Calls each request's signature once with its inputs, in order (what TF Serving
    does at load with one request iteration), and returns the seconds each signature
    took, summed over its records.

    Args:
      signatures: a loaded SavedModel's signatures (`dict(tf.saved_model.load(d).signatures)`).
      requests: `read_warmup_requests`'s list.

    Returns:
      {signature name: seconds (wall clock)}, in the order the signatures were first called.

    Raises:
      ValueError: a request names a signature the model lacks, or its inputs are not
        exactly the signature's (naming the record, from 0, and the signature).
      tf.errors.OpError: the model failed on a request (as the signature raised it).
    """
    timings: dict[str, float] = {}
    for index, (name, inputs) in enumerate(requests):
        if name not in signatures:
            raise ValueError(f"warm-up record {index} names signature '{name}'; the model has "
                             f"{sorted(signatures)}")
        specs = signatures[name].structured_input_signature[1]
        if set(inputs) != set(specs):
            raise ValueError(f"warm-up record {index} ({name}) has inputs {sorted(inputs)}; "
                             f"the signature takes {sorted(specs)}")
        tensors = {k: tf.constant(v, dtype=specs[k].dtype) for k, v in inputs.items()}
        start = time.perf_counter()
        signatures[name](**tensors)
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
    return timings
