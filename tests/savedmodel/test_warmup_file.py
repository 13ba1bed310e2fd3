"""TF Serving's warm-up file (`assets.extra/tf_serving_warmup_requests`): written by
`save_text_model` (so by the Trainer's `export_serving_model` and a text hf-import) and by
a logits-only hf-import, read by `serving.warmup`.

Subjects: a tiny plain language model and a tiny chat model (`save_text_model` with a
learned byte-level tokenizer; one dense block, context 128, vocab 512), a logits-only
hf-import of the V3 fixture, and hand-made files for what the reader must refuse. The
file is parsed here with TF Serving's own protos, independently of the reader.
`tensorflow_model_server` is not installed on these machines, so TF Serving itself does
not load the file here: the tests check its format and replay every record through the
loaded SavedModel's signatures, as TF Serving does at load.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (
    classification_pb2,
    predict_pb2,
    prediction_log_pb2,
)
from tiny_text_model import save_tiny_text_model

from savedmodel.export import write_warmup_requests
from savedmodel.layout import (
    MAX_WARMUP_RECORDS,
    WARMUP_PROMPTS,
    WARMUP_REQUESTS_ASSET,
    extra_path,
    warmup_requests,
)
from serving.warmup import read_warmup_requests, replay, warmup_requests_for

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "\n\n": 10, "明月": 6, "床前": 3}
CONTEXT, VOCAB = 128, 512
CHAT_AFFIXES = ("User: ", "\n\nAssistant: ")
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "hf_deepseek_v3" / "no_q_lora"


def _save(out: Path, chat: bool) -> Path:
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    return save_tiny_text_model(out, ByteLevelBpe(learn(UNITS, 300).json), context=CONTEXT,
                                max_new_tokens=4, vocab_size=VOCAB,
                                chat_prompt=CHAT_AFFIXES if chat else None)


@pytest.fixture(scope="module", params=["plain", "chat"])
def saved(request, tmp_path_factory):
    """(SavedModel directory, its loaded signatures) of a tiny text model."""
    path = _save(tmp_path_factory.mktemp(request.param) / "saved", request.param == "chat")
    return path, dict(tf.saved_model.load(str(path)).signatures)


def _logs(model_dir) -> list[prediction_log_pb2.PredictionLog]:
    """The file's records as TF Serving parses them (not through serving.warmup)."""
    path = extra_path(str(model_dir), WARMUP_REQUESTS_ASSET)
    return [prediction_log_pb2.PredictionLog.FromString(r)
            for r in tf.data.TFRecordDataset(path).as_numpy_iterator()]


# ----------------------------------------------------------------------------- text models


@pytest.mark.slow  # the module's two models: ~30 s each to trace and save
def test_one_predict_request_per_signature_with_exactly_its_inputs(saved):
    model_dir, signatures = saved
    logs = _logs(model_dir)
    assert 1 <= len(logs) <= MAX_WARMUP_RECORDS
    assert all(log.WhichOneof("log_type") == "predict_log" for log in logs)
    names = [log.predict_log.request.model_spec.signature_name for log in logs]
    assert sorted(names) == sorted(signatures)  # each signature once, no other
    expected = {"serving_default", "generate", "logits", "tokenize", "detokenize"}
    assert set(names) == expected | ({"generate_raw"} if "generate_raw" in signatures else set())
    assert names[0] == "tokenize"  # what the server's validation runs first
    for log in logs:
        request = log.predict_log.request
        specs = signatures[request.model_spec.signature_name].structured_input_signature[1]
        assert set(request.inputs) == set(specs), request.model_spec.signature_name
        for key, proto in request.inputs.items():
            assert proto.dtype == specs[key].dtype.as_datatype_enum, key
            shape = [d.size for d in proto.tensor_shape.dim]
            assert specs[key].shape.is_compatible_with(shape), (key, shape)
            assert all(shape), (key, shape)  # no empty batch or sequence


@pytest.mark.slow  # the module's two models: ~30 s each to trace and save
def test_reader_gives_the_records_with_chinese_byte_for_byte(saved):
    model_dir, _ = saved
    requests = read_warmup_requests(str(model_dir))
    assert [name for name, _ in requests] == [
        log.predict_log.request.model_spec.signature_name for log in _logs(model_dir)]
    by_name = dict(requests)
    prompts = [p.encode("utf-8") for p in WARMUP_PROMPTS]
    assert "床前明月光，疑是地上霜。".encode() in prompts
    assert list(by_name["tokenize"]["text"]) == prompts
    assert list(by_name["generate"]["prompt"]) == prompts
    assert by_name["generate"]["max_new_tokens"].dtype == np.int32
    assert by_name["generate"]["temperature"].dtype == np.float32
    assert by_name["logits"]["input_ids"].dtype == np.int32


@pytest.mark.slow  # the module's two models: ~30 s each to trace and save
def test_every_record_replays_through_the_loaded_signatures(saved):
    model_dir, signatures = saved
    requests = read_warmup_requests(str(model_dir))
    timings = replay(signatures, requests)
    assert list(timings) == [name for name, _ in requests]
    assert all(seconds > 0 for seconds in timings.values())
    # The recorded ids are the prompts' own: detokenize gives the text back, Chinese too.
    by_name = dict(requests)
    text = signatures["detokenize"](input_ids=tf.constant(by_name["detokenize"]["input_ids"]))
    assert list(text["text"].numpy()) == [p.encode("utf-8") for p in WARMUP_PROMPTS]
    out = signatures["generate"](**{k: tf.constant(v) for k, v in by_name["generate"].items()})
    assert out["num_generated"].numpy().max() <= 2


@pytest.mark.slow  # the module's two models: ~30 s each to trace and save
def test_replay_refuses_a_record_the_model_cannot_take(saved):
    _, signatures = saved
    with pytest.raises(ValueError, match=r"record 1 names signature 'classify'"):
        replay(signatures, [("detokenize", {"input_ids": np.ones([1, 2], np.int32)}),
                            ("classify", {"x": np.ones([1], np.float32)})])
    with pytest.raises(ValueError, match=r"record 0 \(tokenize\) has inputs \['prompt'\]; "
                                         r"the signature takes \['text'\]"):
        replay(signatures, [("tokenize", {"prompt": np.array([b"x"], object)})])


@pytest.mark.slow  # the module's two models: ~30 s each to trace and save
def test_a_model_without_the_file_gets_the_same_requests_from_its_signatures(saved, tmp_path):
    model_dir, signatures = saved
    written, source = warmup_requests_for(str(model_dir), signatures)
    assert source == extra_path(str(model_dir), WARMUP_REQUESTS_ASSET)
    old = tmp_path / "exported_before_the_file"
    shutil.copytree(model_dir, old)
    (old / "assets.extra" / WARMUP_REQUESTS_ASSET).unlink()
    built, source = warmup_requests_for(str(old), signatures)
    assert source.startswith("built from the signatures")
    assert [name for name, _ in built] == [name for name, _ in written]
    for (name, a), (_, b) in zip(built, written, strict=True):
        assert sorted(a) == sorted(b), name
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].tolist() == b[key].tolist(), (name, key)


# ----------------------------------------------------------------------------- the builder


def test_builder_fills_scalar_inputs_and_skips_signatures_it_cannot_fill():
    # An older export's generate took one value of each sampling input per call.
    scalar = {k: tf.TensorSpec([], d, name=k) for k, d in (
        ("max_new_tokens", tf.int32), ("temperature", tf.float32), ("top_k", tf.int32),
        ("top_p", tf.float32), ("seed", tf.int32))}
    signatures = {"classify": {"x": tf.TensorSpec([None], tf.float32, name="x")},
                  "logits": {"input_ids": tf.TensorSpec([None, None], tf.int32)},
                  "generate": {"prompt": tf.TensorSpec([None], tf.string), **scalar}}
    requests = warmup_requests(signatures, max_context=4, vocab_size=3)
    assert [name for name, _ in requests] == ["generate", "logits"]
    generate, logits = requests[0][1], requests[1][1]
    assert generate["max_new_tokens"].shape == () and generate["max_new_tokens"] == 2
    assert generate["temperature"] == 0.0 and generate["temperature"].dtype == np.float32
    assert generate["prompt"].tolist() == [p.encode("utf-8") for p in WARMUP_PROMPTS]
    assert logits["input_ids"].tolist() == [[0, 1, 2, 0]]  # min(8, context) ids mod vocab


# ----------------------------------------------------------------------------- logits-only


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_logits_only_import_carries_logits_requests(tmp_path):
    from savedmodel.hf_interop import hf_import

    imported = hf_import(str(FIXTURE), str(tmp_path / "saved"), use_tokenizer=False)
    requests = read_warmup_requests(imported.path)
    assert [name for name, _ in requests] == ["serving_default", "logits"]
    signatures = dict(tf.saved_model.load(imported.path).signatures)
    assert list(replay(signatures, requests)) == ["serving_default", "logits"]


# ----------------------------------------------------------------------------- the reader


def _write(path: Path, records: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def _predict_log(name: str) -> bytes:
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = name
    request.inputs["text"].CopyFrom(tf.make_tensor_proto(np.array([b"x"], object)))
    return prediction_log_pb2.PredictionLog(
        predict_log=prediction_log_pb2.PredictLog(request=request)).SerializeToString()


def test_no_file_is_no_requests(tmp_path):
    assert read_warmup_requests(str(tmp_path)) == []


def test_empty_signature_name_is_serving_default(tmp_path):
    _write(tmp_path / "assets.extra" / WARMUP_REQUESTS_ASSET, [_predict_log("")])
    [(name, inputs)] = read_warmup_requests(str(tmp_path))
    assert name == "serving_default"
    assert inputs["text"].tolist() == [b"x"]


def test_a_truncated_file_is_refused_naming_the_record(tmp_path):
    path = tmp_path / "assets.extra" / WARMUP_REQUESTS_ASSET
    _write(path, [_predict_log("tokenize")] * 3)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 5])  # the third record loses its end
    with pytest.raises(ValueError, match=rf"{WARMUP_REQUESTS_ASSET}: record 2 is not a "
                                         "readable TFRecord"):
        read_warmup_requests(str(tmp_path))


def test_a_corrupt_record_is_refused_by_its_checksum(tmp_path):
    path = tmp_path / "assets.extra" / WARMUP_REQUESTS_ASSET
    _write(path, [_predict_log("tokenize")] * 2)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 + 20] ^= 0xFF  # a byte of the second record's data
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"record 1 is not a readable TFRecord"):
        read_warmup_requests(str(tmp_path))


def test_a_record_that_is_not_a_prediction_log_is_refused(tmp_path):
    _write(tmp_path / "assets.extra" / WARMUP_REQUESTS_ASSET,
           [_predict_log("tokenize"), b"\xff\xff\xff not a protobuf"])
    with pytest.raises(ValueError, match=r"record 1 is not a PredictionLog"):
        read_warmup_requests(str(tmp_path))


def test_other_log_types_are_refused_by_name(tmp_path):
    classify = prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(
        request=classification_pb2.ClassificationRequest()))
    _write(tmp_path / "assets.extra" / WARMUP_REQUESTS_ASSET,
           [_predict_log("tokenize"), classify.SerializeToString()])
    with pytest.raises(ValueError, match=r"record 1 is a classify_log; only predict_log"):
        read_warmup_requests(str(tmp_path))


def test_more_records_than_tf_serving_loads_are_refused(tmp_path):
    _write(tmp_path / "assets.extra" / WARMUP_REQUESTS_ASSET,
           [_predict_log("tokenize")] * (MAX_WARMUP_RECORDS + 1))
    with pytest.raises(ValueError, match=r"more than 1000 records"):
        read_warmup_requests(str(tmp_path))


def test_the_writer_refuses_what_tf_serving_would_not_load(tmp_path):
    request = ("tokenize", {"text": np.array([b"x"], object)})
    with pytest.raises(ValueError, match=r"1001 requests; TF Serving replays 1 to 1000"):
        write_warmup_requests(str(tmp_path), [request] * (MAX_WARMUP_RECORDS + 1))
    with pytest.raises(ValueError, match=r"0 requests"):
        write_warmup_requests(str(tmp_path), [])
    path = write_warmup_requests(str(tmp_path), [request] * MAX_WARMUP_RECORDS)
    assert path == extra_path(str(tmp_path), WARMUP_REQUESTS_ASSET)
    assert len(read_warmup_requests(str(tmp_path))) == MAX_WARMUP_RECORDS
