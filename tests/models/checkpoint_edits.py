"""Copies of checkpoint fixtures with edits, for the FP8 and hostile-checkpoint tests
(numpy + ml_dtypes only; `safetensors_reader.write_safetensors` writes the shards)."""

from __future__ import annotations

import json
import pathlib
import shutil
from collections.abc import Callable

import numpy as np

from models.formats.safetensors_reader import (
    SAFE_WEIGHTS_INDEX_NAME,
    open_checkpoint,
    write_safetensors,
)

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
FP8 = FIXTURES / "hf_deepseek_v3_fp8"
BF16_FREE = FIXTURES / "hf_deepseek_v3" / "no_q_lora"  # float32, one model.safetensors
SHARDED = FIXTURES / "hf_deepseek_v3" / "q_lora"  # float32, 6 shards + index, MTP


def copy_fixture(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
    """config.json, index and safetensors of `src` copied into `dst` (made)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "config.json" or f.name.endswith((".safetensors", ".index.json")):
            shutil.copy(f, dst / f.name)
    return dst


def edit_config(d: pathlib.Path, **changes) -> dict:
    """Sets config.json keys (and removes those named in `drop`)."""
    cfg = json.loads((d / "config.json").read_text())
    drop = changes.pop("drop", ())
    cfg.update(changes)
    for k in drop:
        cfg.pop(k, None)
    (d / "config.json").write_text(json.dumps(cfg))
    return cfg


def rewrite_tensors(d: pathlib.Path,
                    edit: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
                    shard_of: Callable[[str, str | None], str] | None = None) -> None:
    """Reads every tensor, applies `edit` to the {name: array} dict, and writes the
    shards back in the same files (a new tensor goes where `shard_of(name, old file)`
    says, by default the first shard), with the index rebuilt when there is one."""
    ckpt = open_checkpoint(str(d))
    where = {n: i.file for n, i in ckpt.tensors.items()}
    tensors = edit({n: ckpt.read(n) for n in ckpt.tensors})
    files = sorted({i.file for i in ckpt.tensors.values()})
    shards: dict[str, dict] = {f: {} for f in files}
    for name, value in tensors.items():
        f = where.get(name) if shard_of is None else shard_of(name, where.get(name))
        shards[f or files[0]][name] = value
    for f, shard in shards.items():
        write_safetensors(str(d / f), shard)
    index = d / SAFE_WEIGHTS_INDEX_NAME
    if index.exists():
        weight_map = {n: f for f, shard in shards.items() for n in shard}
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def dequantized(d: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of an FP8 checkpoint, FP8 weights dequantized to float32, scales
    dropped, everything float32."""
    from models.formats import fp8
    from models.formats.fp8 import Fp8Quantization

    cfg = json.loads((d / "config.json").read_text())
    q = cfg["quantization_config"]
    quant = Fp8Quantization(tuple(q["weight_block_size"]), q.get("scale_fmt"))
    ckpt = open_checkpoint(str(d))
    out = {}
    for name, info in ckpt.tensors.items():
        if name.endswith("_scale_inv"):
            continue
        value = ckpt.read(name)
        if info.dtype == "F8_E4M3":
            value = fp8.dequantize(value, ckpt.read(name + "_scale_inv"), quant, name)
        out[name] = value.astype(np.float32)
    return out
