"""Untrusted checkpoint directories are checked before anything is allocated (issue 23).

Each case is refused with one line naming the file, key or tensor: in-process
through `load_hf_checkpoint`, and the four cases of the issue's "Why" (an index
path outside the directory, a config far larger than its weights, a FIFO, a
short file) also through `python -m cli hf-import` in a subprocess: exit code
!= 0, one `error: ...` line, no output directory, well within the timeout and
under 2 GB peak RSS (measured by a fresh wrapper process, so that earlier
children of the test process do not count).
"""

import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
from checkpoint_edits import BF16_FREE, FP8, SHARDED, copy_fixture, edit_config, rewrite_tensors

from models.deepseek import hf_checkpoint
from models.formats.checkpoint_error import CheckpointError

ROOT = pathlib.Path(__file__).resolve().parents[2]
O_PROJ = "model.layers.0.self_attn.o_proj.weight"
FP8_O_PROJ = "model.layers.1.self_attn.o_proj.weight"


def _outside_index(tmp):
    """The index names a real, valid shard two levels up (outside the directory)."""
    elsewhere = tmp / "somewhere"
    copy_fixture(BF16_FREE, elsewhere)
    d = tmp / "a" / "ckpt"
    d.mkdir(parents=True)
    shutil.copy(BF16_FREE / "config.json", d)
    names = json.loads((elsewhere / "model.safetensors").read_bytes()[8:].split(b"}}")[0]
                       + b"}}")
    weight_map = {n: "../../somewhere/model.safetensors" for n in names if n != "__metadata__"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d, r"shard '\.\./\.\./somewhere/model.safetensors' is outside the checkpoint directory"


def _etc_passwd(tmp):
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"model.norm.weight": "/etc/passwd"}}))
    return d, "shard '/etc/passwd' is outside the checkpoint directory"


def _linked_folder_outside(tmp):
    """The index names `sub/model.safetensors`, where `sub` links to a folder outside."""
    copy_fixture(BF16_FREE, tmp / "elsewhere")
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    (d / "model.safetensors").unlink()
    os.symlink(tmp / "elsewhere", d / "sub")
    header = json.loads((tmp / "elsewhere" / "model.safetensors").read_bytes()[8:].split(
        b"}}")[0] + b"}}")
    weight_map = {n: "sub/model.safetensors" for n in header if n != "__metadata__"}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d, "shard 'sub/model.safetensors' is outside the checkpoint directory"


def _huge_vocab(tmp):
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    edit_config(d, vocab_size=3_000_000)
    return d, (r"model.safetensors: tensor model.embed_tokens.weight has shape \(256, 64\), "
               r"expected \(3000000, 64\) \(config.json vocab_size=3000000")


def _huge_depth(tmp):
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    edit_config(d, num_hidden_layers=10**6)
    return d, "config.json num_hidden_layers=1000000 is above 1024"


def _more_layers(tmp):
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    edit_config(d, num_hidden_layers=500)
    return d, r"num_hidden_layers=500 .* = 500 layers, but the checkpoint's tensors have 3"


def _fifo(tmp):
    d = tmp / "ckpt"
    d.mkdir()
    shutil.copy(BF16_FREE / "config.json", d)
    os.mkfifo(d / "model.safetensors")
    return d, "model.safetensors: safetensors file is a FIFO, not a regular file"


def _short_file(tmp):
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    path = d / "model.safetensors"
    (n,) = struct.unpack("<Q", path.read_bytes()[:8])
    path.write_bytes(path.read_bytes()[:8 + n + 1000])  # header intact, data cut short
    return d, r"model.safetensors: tensor .*: data_offsets \[\d+, \d+\] do not fit"


def _header_beyond_file(tmp):
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    path = d / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + path.read_bytes()[8:1000])
    return d, r"model.safetensors: header claims 1099511627776 bytes but the file holds 1000"


def _absent_shard(tmp):
    d = copy_fixture(SHARDED, tmp / "ckpt")
    (d / "model-00002-of-00006.safetensors").unlink()
    return d, "model-00002-of-00006.safetensors: shard named in model.safetensors.index.json"


def _index_disagrees(tmp):
    d = copy_fixture(SHARDED, tmp / "ckpt")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00006.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d, "places tensor model.norm.weight in model-00001-of-00006.safetensors, but it is in"


def _wrong_shape(tmp):
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    rewrite_tensors(d, lambda t: {**t, O_PROJ: np.zeros((3, 5), np.float32)})
    return d, rf"model.safetensors: tensor {O_PROJ} has shape \(3, 5\), expected \(64, 64\)"


def _weight_in_an_integer_dtype(tmp):
    # The reader knows I8 (V4's MXFP4 pairs): a V2/V3 weight in it is refused, not cast.
    d = copy_fixture(BF16_FREE, tmp / "ckpt")
    rewrite_tensors(d, lambda t: {**t, O_PROJ: np.ones(t[O_PROJ].shape, np.int8)})
    return d, rf"model.safetensors: tensor {O_PROJ} has dtype I8, expected one of"


def _missing_scale(tmp):
    d = copy_fixture(FP8, tmp / "ckpt")
    rewrite_tensors(d, lambda t: {k: v for k, v in t.items() if k != FP8_O_PROJ + "_scale_inv"})
    return d, f"FP8 tensor {FP8_O_PROJ} has no scale {FP8_O_PROJ}_scale_inv"


def _scale_wrong_dtype(tmp):
    d = copy_fixture(FP8, tmp / "ckpt")
    s = FP8_O_PROJ + "_scale_inv"
    rewrite_tensors(d, lambda t: {**t, s: t[s].astype(np.float16)})
    return d, f"tensor {s} has dtype F16, expected F32"


def _scale_wrong_shape(tmp):
    d = copy_fixture(FP8, tmp / "ckpt")
    s = FP8_O_PROJ + "_scale_inv"
    rewrite_tensors(d, lambda t: {**t, s: np.ones((1, 1), np.float32)})
    return d, rf"tensor {s} has shape \(1, 1\), expected \(2, 1\)"


def _fp8_without_quantization_config(tmp):
    d = copy_fixture(FP8, tmp / "ckpt")
    edit_config(d, drop=("quantization_config",))
    return d, "is float8_e4m3fn, but config.json has no quantization_config"


def _unknown_quant_method(tmp):
    d = copy_fixture(FP8, tmp / "ckpt")
    q = edit_config(d)["quantization_config"]
    edit_config(d, quantization_config={**q, "quant_method": "gptq"})
    return d, "quantization_config quant_method='gptq' is not supported"


def _unknown_scale_fmt(tmp):
    d = copy_fixture(FP8, tmp / "ckpt")
    q = edit_config(d)["quantization_config"]
    edit_config(d, quantization_config={**q, "scale_fmt": "ue4m3"})
    return d, "quantization_config scale_fmt='ue4m3' is not supported"


CASES = {f.__name__[1:]: f for f in (
    _outside_index, _etc_passwd, _linked_folder_outside, _huge_vocab, _huge_depth, _more_layers,
    _fifo, _short_file, _header_beyond_file, _absent_shard, _index_disagrees, _wrong_shape,
    _weight_in_an_integer_dtype, _missing_scale, _scale_wrong_dtype, _scale_wrong_shape, _fp8_without_quantization_config,
    _unknown_quant_method, _unknown_scale_fmt)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_directory_is_refused_before_the_model_is_built(tmp_path, case, monkeypatch):
    from models.deepseek import causal_lm

    d, match = CASES[case](tmp_path)
    built = []
    monkeypatch.setattr(causal_lm.DeepSeekCausalLM, "__init__",
                        lambda *a, **k: built.append(1) or pytest.fail("model built"))
    start = time.monotonic()
    error = FileNotFoundError if case == "absent_shard" else CheckpointError
    with pytest.raises(error, match=match) as info:
        hf_checkpoint.load_hf_checkpoint(str(d))
    assert "\n" not in str(info.value)
    assert time.monotonic() - start < 5 and not built


# ----------------------------------------------------------------------------- the CLI

# A fresh wrapper process runs the CLI and reports its children's peak RSS.
_WRAPPER = (
    "import json, resource, subprocess, sys, time\n"
    "t = time.monotonic()\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=110)\n"
    "print(json.dumps({'rc': p.returncode, 'stderr': p.stderr, 'seconds': time.monotonic() - t,"
    " 'maxrss_kb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n"
)
CLI_CASES = {  # the "Why" of issue 23, and the key or file each error must name
    "outside_index": "../../somewhere/model.safetensors",
    "huge_vocab": "vocab_size=3000000",
    "huge_depth": "num_hidden_layers=1000000",
    "fifo": "model.safetensors",
    "header_beyond_file": "model.safetensors",
}


@pytest.mark.slow
def test_hostile_directories_through_the_cli(tmp_path):
    """`python -m cli hf-import` on each case, in parallel (~15 s each, mostly imports)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}

    def start(case):
        (tmp_path / case).mkdir()
        d, _ = CASES[case](tmp_path / case)
        out = tmp_path / case / "out"
        return case, out, subprocess.Popen(
            [sys.executable, "-c", _WRAPPER, sys.executable, "-m", "cli", "hf-import", str(d),
             str(out)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)

    cases = list(CLI_CASES)
    running = [start(c) for c in cases[:2]]  # two at a time: the machine has two cores
    queued = cases[2:]
    results = {}
    while running:
        case, out, proc = running.pop(0)
        stdout, _ = proc.communicate(timeout=120)
        results[case] = out, json.loads(stdout)
        if queued:
            running.append(start(queued.pop(0)))
    summary = {c: (round(r["seconds"], 1), r["maxrss_kb"] // 1024) for c, (_, r) in results.items()}
    print("seconds, peak RSS MiB:", summary)
    for case, (out, result) in results.items():
        errors = [line for line in result["stderr"].splitlines() if line.startswith("error:")]
        assert result["rc"] != 0, (case, result)
        assert len(errors) == 1 and CLI_CASES[case] in errors[0], (case, result["stderr"][-2000:])
        assert not out.exists(), case
        assert result["seconds"] < 100, (case, result["seconds"])
        assert result["maxrss_kb"] < 2 * 1024 * 1024, (case, result["maxrss_kb"])


def test_a_linked_shard_file_loads_as_in_the_hub_cache(tmp_path):
    """snapshots/<rev>/model.safetensors -> ../../blobs/<sha>: the file may be a link."""
    blobs = copy_fixture(BF16_FREE, tmp_path / "blobs")
    d = tmp_path / "snapshots" / "rev"
    d.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        os.symlink(os.path.join("..", "..", "blobs", f), d / f)
    model = hf_checkpoint.load_hf_checkpoint(str(d))
    logits = model(np.load(BF16_FREE / "input_ids.npy")).numpy()
    assert np.abs(logits - np.load(BF16_FREE / "expected_logits.npy")).max() <= 1e-4
    assert blobs.is_dir()


@pytest.mark.parametrize("changes", [{}, {"q_lora_rank": None, "tie_word_embeddings": True,
                                          "n_shared_experts": 0}])
def test_expected_shapes_are_those_of_the_built_model(tiny_config, changes):
    """`expected_hf_shapes` (config only) = the model's variables in HF layout."""
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek.hf_names import expected_hf_shapes, hf_weight_map

    config = tiny_config.replace(**changes)
    built = {name: tuple(v.shape[::-1]) if transpose else tuple(v.shape)
             for name, (v, transpose) in hf_weight_map(DeepSeekCausalLM(config)).items()}
    assert expected_hf_shapes(config) == built
