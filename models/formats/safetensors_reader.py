"""Reading safetensors checkpoints without torch or the safetensors TF backend.

  open_checkpoint(dir)  -> Checkpoint: every shard's header parsed and checked
  Checkpoint.read(name) -> numpy array (ml_dtypes for bfloat16 / float8), one tensor
  write_safetensors(path, tensors)   a small writer (tests, tools)

The file format (https://github.com/huggingface/safetensors, "Format"): 8 bytes,
a little-endian uint64 N; N bytes of JSON header `{name: {"dtype", "shape",
"data_offsets": [begin, end]}, "__metadata__": {...}}`; then the data buffer,
where a tensor's bytes are `buffer[begin:end]`, row-major, little-endian.

The safetensors library's TensorFlow backend cannot read FP8 (numpy has no
float8 type), so headers are parsed here and tensor bytes are read into numpy
arrays of `ml_dtypes` types: BF16 -> ml_dtypes.bfloat16, F8_E4M3 ->
ml_dtypes.float8_e4m3fn, F16 -> float16, F32 -> float32; and, for DeepSeek-V4's
formats, F8_E8M0 -> uint8 (the raw exponent bytes), I8 -> int8, I64 -> int64. Other
dtypes are refused by name.

Checkpoint directories are untrusted. Before any tensor is read:
  - every shard named by `model.safetensors.index.json` must be a relative name
    whose folder resolves (realpath) inside the checkpoint directory (the file
    may be a symlink, as in the Hugging Face hub cache), exist, and be a regular
    file (`os.stat`, which follows links, before `open`: a FIFO is refused,
    never opened);
  - each header length and each tensor's `data_offsets` must fit in its file,
    and each tensor's byte count must equal its shape times its dtype's size;
  - the index's `weight_map` and the headers must name the same tensors in the
    same files.
A tensor is read by one `pread` of its own bytes: never a whole shard, and no
memory map whose touched pages would stay resident.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import struct

import ml_dtypes
import numpy as np

from models.formats.checkpoint_error import CheckpointError

SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"

# safetensors dtype name -> numpy dtype. F8_E8M0 (float8_e8m0fnu, DeepSeek-V4's scales) is
# read as its raw biased-exponent bytes, uint8 (ml_dtypes 0.3 has no e8m0 type; decode with
# `mxfp4.e8m0_to_float32`); I8 holds DeepSeek-V4-Flash's packed MXFP4 experts (two e2m1
# codes a byte, `mxfp4.py`); I64 its hash-routing tables (`ffn.gate.tid2eid`).
DTYPES = {
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E8M0": np.dtype(np.uint8),
    "I8": np.dtype(np.int8),
    "I64": np.dtype(np.int64),
}
NAMES_OF_DTYPES = {v: k for k, v in DTYPES.items()}  # uint8 is written as F8_E8M0
# The safetensors library refuses headers above 100 MB; so do we.
MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_INDEX_BYTES = 100 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are.

    Attributes:
      name: the tensor's name in the checkpoint.
      path: the shard's absolute path.
      dtype: safetensors dtype name ("BF16", "F8_E4M3", "F16", "F32", "F8_E8M0", "I8",
        "I64").
      shape: the stored shape (PyTorch's [out, in] for linear weights).
      offset: absolute file offset of the first byte.
      nbytes: byte count (= prod(shape) * itemsize).
    """

    name: str
    path: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

    @property
    def np_dtype(self) -> np.dtype:
        return DTYPES[self.dtype]

    @property
    def file(self) -> str:
        return os.path.basename(self.path)


def _regular_file_size(path: str, what: str) -> int:
    """The size of `path` after checking, without opening it, that it is a regular file.

    Raises:
      FileNotFoundError: nothing there.
      CheckpointError: a FIFO, device, socket or directory.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: {what} not found") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(
            st.st_mode) else "a device or socket")
        raise CheckpointError(f"{path}: {what} is {kind}, not a regular file")
    return st.st_size


def _open_regular(path: str):
    """Opens a file already checked to be regular; O_NONBLOCK so that a FIFO swapped
    in since the check cannot block, and the opened descriptor is checked again."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise CheckpointError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def read_header(path: str) -> tuple[dict[str, TensorInfo], dict]:
    """Parses and checks one safetensors file's header; reads no tensor data.

    Returns:
      ({tensor name: TensorInfo}, the header's `__metadata__` or {}).

    Raises:
      FileNotFoundError: no such file.
      CheckpointError: not a regular file; a header length beyond the file or above
        100 MB; a header that is not a JSON object of tensor entries; an unsupported
        dtype; a bad shape; data_offsets that do not fit in the file or do not match
        shape x dtype size (each names the file, and the tensor where there is one).
    """
    name = os.path.basename(path)
    size = _regular_file_size(path, "safetensors file")
    if size < 8:
        raise CheckpointError(f"{path}: {size} bytes, too short for a safetensors file")
    with _open_regular(path) as f:
        (n,) = struct.unpack("<Q", f.read(8))
        if n > size - 8:
            raise CheckpointError(
                f"{path}: header claims {n} bytes but the file holds {size} bytes "
                "(truncated or not a safetensors file)")
        if n > MAX_HEADER_BYTES:
            raise CheckpointError(f"{path}: header of {n} bytes is above {MAX_HEADER_BYTES}")
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start, data_size = 8 + n, size - 8 - n
    tensors = {}
    for tname, entry in header.items():
        where = f"{name}: tensor {tname}"
        if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
            raise CheckpointError(f"{where}: entry needs dtype, shape and data_offsets")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in DTYPES:
            raise CheckpointError(
                f"{where}: dtype {dtype!r} is not supported (only {sorted(DTYPES)})")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise CheckpointError(f"{where}: shape {shape!r} is not a list of ints >= 0")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(
                isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise CheckpointError(f"{where}: data_offsets {offsets!r} is not [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= data_size:
            raise CheckpointError(
                f"{where}: data_offsets [{begin}, {end}] do not fit in the file's "
                f"{data_size} data bytes ({path} is {size} bytes)")
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        if end - begin != nbytes:
            raise CheckpointError(
                f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but shape "
                f"{tuple(shape)} of {dtype} needs {nbytes}")
        tensors[tname] = TensorInfo(tname, path, dtype, tuple(shape), data_start + begin, nbytes)
    return tensors, metadata


def _inside(directory_real: str, path: str) -> bool:
    """Whether the folder holding `path` resolves (realpath) inside the checkpoint
    directory. The file itself may be a symlink, as in the Hugging Face hub cache,
    whose `snapshots/<rev>/` files link to `../../blobs/<sha>`: the directory's
    owner made it; a name that climbs out (`../x`, a linked folder) is refused."""
    real = os.path.realpath(os.path.dirname(path))
    return os.path.commonpath([directory_real, real]) == directory_real


class Checkpoint:
    """The checked headers of a safetensors checkpoint directory; reads tensors lazily.

    Attributes:
      directory: the checkpoint directory.
      files: the shards' absolute paths, sorted.
      tensors: {name: TensorInfo} over all shards.
      metadata: {file name: its header's __metadata__}.
    """

    def __init__(self, directory: str, files: list[str], tensors: dict[str, TensorInfo],
                 metadata: dict[str, dict]):
        self.directory = directory
        self.files = files
        self.tensors = tensors
        self.metadata = metadata

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        """The TensorInfo of `name`. Raises CheckpointError (naming it) when absent."""
        try:
            return self.tensors[name]
        except KeyError:
            raise CheckpointError(f"{self.directory}: no tensor {name}") from None

    def read(self, name: str, rows: tuple[int, int] | None = None) -> np.ndarray:
        """One tensor (or rows [r0, r1) of its first axis) as stored, a fresh array.

        Returns:
          A numpy array of the stored dtype (ml_dtypes.bfloat16 / float8_e4m3fn for
          BF16 / F8_E4M3, uint8 exponent bytes for F8_E8M0) and the stored shape (first
          axis r1 - r0 with `rows`).

        Raises:
          CheckpointError: no such tensor, or the file is shorter than its header
            said (changed since it was opened).
        """
        info = self.info(name)
        shape, offset, nbytes = info.shape, info.offset, info.nbytes
        if rows is not None:
            r0, r1 = rows
            if not shape or not 0 <= r0 <= r1 <= shape[0]:
                raise ValueError(f"{name}: rows {rows} outside shape {shape}")
            row_bytes = (nbytes // shape[0]) if shape[0] else 0
            shape = (r1 - r0, *shape[1:])
            offset, nbytes = offset + r0 * row_bytes, (r1 - r0) * row_bytes
        out = np.empty(shape, info.np_dtype)
        buf = memoryview(out.reshape(-1).view(np.uint8))
        with _open_regular(info.path) as f:
            f.seek(offset)
            got = f.readinto(buf)
        if got != nbytes:
            raise CheckpointError(
                f"{info.path}: tensor {name} ends past the end of the file "
                f"(read {got} of {nbytes} bytes)")
        return out


def open_checkpoint(checkpoint_dir: str) -> Checkpoint:
    """Finds, checks and parses the safetensors files of `checkpoint_dir`.

    With `model.safetensors.index.json`, the shards are the ones its `weight_map`
    names, and the headers must hold exactly the tensors the index places in them.
    Without one, `model.safetensors`, else every `*.safetensors` of the directory.

    Raises:
      FileNotFoundError: no safetensors file, or a shard named by the index is absent
        (names it and the index).
      CheckpointError: a shard path outside the directory or not a regular file; a bad
        index or header (see `read_header`); a tensor in two shards; index and headers
        that disagree (each names the file and tensor).
    """
    directory = os.path.abspath(checkpoint_dir)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{checkpoint_dir}: not a directory")
    real_dir = os.path.realpath(directory)
    index_path = os.path.join(directory, SAFE_WEIGHTS_INDEX_NAME)
    weight_map = None
    if os.path.lexists(index_path):
        weight_map, files = _indexed_shards(directory, real_dir, index_path)
    else:
        single = os.path.join(directory, SAFE_WEIGHTS_NAME)
        if os.path.lexists(single):
            files = [single]
        else:
            files = sorted(os.path.join(directory, f) for f in os.listdir(directory)
                           if f.endswith(".safetensors"))
        if not files:
            raise FileNotFoundError(f"{checkpoint_dir}: no *.safetensors files")
    for path in files:  # every file checked before any header is read
        _regular_file_size(path, "safetensors file")

    tensors: dict[str, TensorInfo] = {}
    metadata = {}
    for path in files:
        found, metadata[os.path.basename(path)] = read_header(path)
        for name, info in found.items():
            if name in tensors:
                raise CheckpointError(
                    f"tensor {name} is in both {tensors[name].file} and {info.file}")
            tensors[name] = info
    if weight_map is not None:
        _check_index_matches_headers(weight_map, tensors)
    return Checkpoint(directory, files, tensors, metadata)


def _indexed_shards(directory: str, real_dir: str, index_path: str
                    ) -> tuple[dict[str, str], list[str]]:
    """(weight_map, shard paths in name order) of the index `index_path` of the checkpoint
    `directory` (`real_dir`: its real path), every shard checked to be inside it.

    Raises:
      FileNotFoundError: a shard named by the index is absent (names it and the index).
      CheckpointError: the index is not a regular file, above MAX_INDEX_BYTES, not JSON,
        or has no "weight_map" of names to file names; a shard path outside the directory.
    """
    size = _regular_file_size(index_path, "the safetensors index")
    if size > MAX_INDEX_BYTES:
        raise CheckpointError(f"{index_path}: {size} bytes, above {MAX_INDEX_BYTES}")
    with _open_regular(index_path) as f:
        try:
            index = json.loads(f.read())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{index_path}: not valid JSON ({e})") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise CheckpointError(
            f"{index_path}: needs a \"weight_map\" object of tensor name -> file name")
    files = []
    for shard in sorted(set(weight_map.values())):
        path = os.path.join(directory, shard)
        if os.path.isabs(shard) or not _inside(real_dir, path):
            raise CheckpointError(
                f"{index_path}: shard {shard!r} is outside the checkpoint directory "
                f"{directory} (its folder resolves to "
                f"{os.path.realpath(os.path.dirname(path))})")
        if not os.path.lexists(path):
            raise FileNotFoundError(
                f"{path}: shard named in {SAFE_WEIGHTS_INDEX_NAME} not found")
        files.append(path)
    return weight_map, files


def _check_index_matches_headers(weight_map: dict[str, str],
                                 tensors: dict[str, TensorInfo]) -> None:
    """Checks that the index's `weight_map` places every tensor of the headers
    (`tensors`) in the shard that holds it, and no other.

    Raises:
      CheckpointError: a tensor of the index in no header or in another shard than the
        index says, or one of the headers not in the index (each names the file and
        tensor).
    """
    for name, shard in sorted(weight_map.items()):
        if name not in tensors:
            raise CheckpointError(
                f"{SAFE_WEIGHTS_INDEX_NAME} places tensor {name} in {shard}, whose "
                "header does not have it")
        if tensors[name].file != os.path.basename(shard):
            raise CheckpointError(
                f"{SAFE_WEIGHTS_INDEX_NAME} places tensor {name} in {shard}, but it is in "
                f"{tensors[name].file}")
    extra = sorted(set(tensors) - set(weight_map))
    if extra:
        raise CheckpointError(
            f"{tensors[extra[0]].file}: tensor {extra[0]} is not in "
            f"{SAFE_WEIGHTS_INDEX_NAME} ({len(extra)} such tensors)")


def write_safetensors(path: str, tensors: dict[str, np.ndarray],
                      metadata: dict[str, str] | None = None) -> None:
    """Writes numpy arrays (float32, float16, ml_dtypes bfloat16 / float8_e4m3fn) as one
    safetensors file, tensors in name order (a small writer for tests and tools).

    Raises:
      ValueError: an array of another dtype (named).
    """
    write_safetensors_streaming(
        path, [(name, tensors[name].shape, tensors[name].dtype, lambda a=tensors[name]: a)
               for name in sorted(tensors)], metadata)


def write_safetensors_streaming(path: str, entries: list, metadata: dict[str, str] | None = None
                                ) -> None:
    """Writes one safetensors file, making each tensor only when its bytes are written: the
    header comes from the shapes and dtypes alone, so the memory beyond the caller's is one
    tensor (`save_hf_checkpoint` writes a whole model this way).

    Args:
      path: the file to write.
      entries: [(name, shape, numpy dtype, make)], in file order; `make()` returns the
        array (that shape and dtype; float32, float16, ml_dtypes bfloat16 or
        float8_e4m3fn; uint8 is written as F8_E8M0 exponent bytes, int8 as I8, int64
        as I64).
      metadata: the header's `__metadata__` (default {"format": "pt"}, as transformers).

    Raises:
      ValueError: a dtype that cannot be written, or an array whose shape or dtype is
        not what its entry said (named).
    """
    header: dict = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, shape, dtype, _ in entries:
        dtype = np.dtype(dtype)
        if dtype not in NAMES_OF_DTYPES:
            raise ValueError(f"{name}: dtype {dtype} cannot be written")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": NAMES_OF_DTYPES[dtype], "shape": [int(d) for d in shape],
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data buffer aligned to 8 bytes, as the library does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for name, shape, dtype, make in entries:
            a = np.ascontiguousarray(make())
            if tuple(a.shape) != tuple(shape) or a.dtype != np.dtype(dtype):
                raise ValueError(f"{name}: made {a.dtype} {tuple(a.shape)}, the header says "
                                 f"{np.dtype(dtype)} {tuple(shape)}")
            f.write(memoryview(a.reshape(-1).view(np.uint8)))
            del a
