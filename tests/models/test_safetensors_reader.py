"""safetensors_reader: the format parsed by hand (no torch, no TF backend), dtypes
through ml_dtypes, headers checked against their files."""

import json
import struct

import ml_dtypes
import numpy as np
import pytest
from checkpoint_edits import SHARDED

from models.formats.checkpoint_error import CheckpointError
from models.formats.safetensors_reader import open_checkpoint, read_header, write_safetensors


def _raw(path, header: dict, data: bytes = b""):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_round_trip_of_every_supported_dtype_and_row_reads(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "f32": rng.normal(size=(5, 3)).astype(np.float32),
        "f16": rng.normal(size=(4,)).astype(np.float16),
        "bf16": rng.normal(size=(7, 2)).astype(ml_dtypes.bfloat16),
        "fp8": rng.normal(size=(6, 4)).astype(ml_dtypes.float8_e4m3fn),
        "empty": np.zeros((0, 3), np.float32),
    }
    write_safetensors(str(tmp_path / "model.safetensors"), tensors)
    ckpt = open_checkpoint(str(tmp_path))
    assert {n: i.dtype for n, i in ckpt.tensors.items()} == {
        "f32": "F32", "f16": "F16", "bf16": "BF16", "fp8": "F8_E4M3", "empty": "F32"}
    for name, value in tensors.items():
        got = ckpt.read(name)
        assert got.dtype == value.dtype and got.shape == value.shape
        np.testing.assert_array_equal(got.view(np.uint8), value.view(np.uint8))
    np.testing.assert_array_equal(ckpt.read("bf16", (2, 5)), tensors["bf16"][2:5])


def test_reads_what_the_safetensors_library_wrote():
    """The q_lora fixture was written by transformers' save_pretrained (6 shards + index)."""
    ckpt = open_checkpoint(str(SHARDED))
    assert len(ckpt.files) == 6 and len(ckpt.tensors) > 100
    assert ckpt.read("model.norm.weight").shape == (64,)


@pytest.mark.parametrize("dtype", ["I16", "F64", "F8_E5M2", "BOOL"])
def test_other_dtypes_are_refused_by_name(tmp_path, dtype):
    path = _raw(tmp_path / "x.safetensors", {"t": {"dtype": dtype, "shape": [1],
                                                   "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(CheckpointError, match=f"x.safetensors: tensor t: dtype '{dtype}'"):
        read_header(str(path))


@pytest.mark.parametrize("header,data,match", [
    ({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8,
     r"tensor t: data_offsets \[0, 16\] do not fit"),
    ({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8,
     "hold 8 bytes, but shape"),
    ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}, b"",
     "shape .* not a list of ints"),
    ({"t": {"dtype": "F32", "shape": [1]}}, b"", "needs dtype, shape and data_offsets"),
    ([1, 2], b"", "not a JSON object"),
])
def test_bad_headers_are_named(tmp_path, header, data, match):
    path = _raw(tmp_path / "x.safetensors", header, data)
    with pytest.raises(CheckpointError, match=match):
        read_header(str(path))


def test_header_longer_than_the_file_names_the_file(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(CheckpointError, match=r"model.safetensors: header claims 10+ bytes "
                                              r"but the file holds 10 bytes"):
        read_header(str(path))
    path.write_bytes(b"\1\2")
    with pytest.raises(CheckpointError, match="too short"):
        read_header(str(path))
