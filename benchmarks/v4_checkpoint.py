"""Write a synthetic DeepSeek-V4 checkpoint in the released layout, shard by shard.

  python benchmarks/v4_checkpoint.py OUT_DIR [--size tiny|small|1gb] [--format flash|base|bf16]
      [--max-shard-bytes N] [--seed S]

What it writes
--------------
`config.json` (transformers 5.24 `DeepseekV4Config` fields: `layer_types`,
`mlp_layer_types`, `compress_rates`, `rope_parameters` {"main", "compress"}, `hc_*`,
`o_groups`, `index_*`, ...; plus the release's `quantization_config` and top-level
`expert_dtype`), `model-0000K-of-0000N.safetensors` and `model.safetensors.index.json`,
with DeepSeek's release tensor names and dtypes. The layout is that of the published
DeepSeek-V4-Flash headers (46 shards, 69,187 tensors; a public dump of its
`model.safetensors.index.json` + headers), scaled down by the config:

  embed.weight, head.weight [vocab, hidden] BF16; norm.weight [hidden] BF16;
  hc_head_fn [hc, hc*hidden], hc_head_base [hc], hc_head_scale [1] F32;
  layers.N.{attn_norm, ffn_norm}.weight BF16; layers.N.hc_{attn,ffn}_{fn,base,scale} F32
    ([hc*(hc+2), hc*hidden], [hc*(hc+2)], [3]);
  layers.N.attn.{wq_a, wq_b, wkv, wo_a, wo_b}.weight FP8 + .scale; attn.{q_norm,
    kv_norm}.weight BF16; attn.attn_sink [heads] F32;
  compressed layers: attn.compressor.{wkv, wgate}.weight BF16 [w, hidden] (w = 2*head_dim
    for CSA, head_dim for HCA), attn.compressor.ape [rate, w] F32, attn.compressor.norm.weight
    [head_dim] BF16;
  CSA layers: attn.indexer.wq_b.weight FP8 + .scale, attn.indexer.weights_proj.weight BF16,
    attn.indexer.compressor.{wkv, wgate, ape, norm} (width 2*index_head_dim);
  layers.N.ffn.gate.weight [E, hidden] BF16; hash layers ffn.gate.tid2eid [vocab, top_k]
    I64, the others ffn.gate.bias [E] F32;
  layers.N.ffn.shared_experts.w{1,2,3}.weight FP8 + .scale;
  layers.N.ffn.experts.E.w{1,2,3}.weight: --format flash MXFP4 (I8 [out, in/2] + F8_E8M0
    .scale [out, in/32]); base FP8 + F32 .scale; bf16 BF16;
  mtp.D.*: e_proj, h_proj FP8; enorm, hnorm, norm BF16; hc_head_*; and one decoder layer
    (sliding attention, a top-k router with bias).

FP8 weights have per-128x128-block scales, F8_E8M0 for --format flash (V4-Flash,
`scale_fmt` "ue8m0") and F32 for --format base (V4-Flash-Base); --format bf16 has no
quantization_config. Note that transformers 5.24 `save_pretrained` writes some of these
under other names (`attn.norm.weight` for the release's `attn.kv_norm.weight`,
`model.embed_tokens.weight`, `model.hc_head.hc_fn`, `model.norm.weight`): its
`conversion_mapping.py` "deepseek_v4" maps both spellings to the same parameter.

Values: matrices normal(0, initializer_range) (then quantized by `fp8.quantize` /
`mxfp4.quantize`, the functions the tests check), norms and hc scales ones, sinks,
`ape`, hc bases and router biases zeros, `tid2eid` rows of top_k distinct experts.
Each tensor draws from its own generator (seed, crc32(name)), so any tensor can be
recomputed alone (`tensor_values`).

Memory: one tensor at a time (`write_safetensors_streaming`): the largest is the
embedding, held in BF16 and drawn in row blocks (0.26 GB at vocab 129,280 x hidden 1024),
so the writer's peak is well under the checkpoint's size.

Sizes (`--size`; bytes printed by the script):
  tiny: hidden 64, 4 layers (sliding, CSA, HCA, CSA), 4 experts; a few hundred kB.
  small: hidden 256, 4 layers, 8 experts of width 128, vocab 8192.
  1gb: vocab 129,280 (DeepSeek's), hidden 1024, 8 layers (sliding x2, CSA, HCA, CSA, HCA,
    CSA, sliding; 3 hash-routed) + 1 MTP layer, 16 heads of head_dim 128, 64 routed
    experts of width 512, top-6: 1.087 GB as V4-Flash (FP8 + MXFP4; 0.53 GB of it the
    BF16 embedding and head, 0.49 GB the experts), 1.51 GB as V4-Flash-Base, 2.46 GB as
    BF16.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import zlib

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from models.formats import fp8, mxfp4  # noqa: E402
from models.formats.safetensors_reader import (  # noqa: E402
    SAFE_WEIGHTS_INDEX_NAME,
    write_safetensors_streaming,
)

FORMATS = ("flash", "base", "bf16")
SLIDING, CSA, HCA = ("sliding_attention", "compressed_sparse_attention",
                     "heavily_compressed_attention")
BF16 = np.dtype(ml_dtypes.bfloat16)
DEFAULT_MAX_SHARD_BYTES = 400_000_000  # 3 shards at --size 1gb (the release: 46 of ~3.2 GB)

_COMMON = dict(
    num_key_value_heads=1, n_shared_experts=1, scoring_func="sqrtsoftplus",
    norm_topk_prob=True, routed_scaling_factor=1.5, rope_theta=10000.0,
    compress_rope_theta=160000.0, compress_rates={CSA: 4, HCA: 128}, hc_mult=4,
    hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, rms_norm_eps=1e-6,
    initializer_range=0.02, tie_word_embeddings=False, attention_dropout=0.0,
    num_nextn_predict_layers=1, hidden_act="silu", bos_token_id=0, eos_token_id=1,
)
SIZES = {
    "tiny": dict(
        vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, head_dim=32, qk_rope_head_dim=8, q_lora_rank=48,
        n_routed_experts=4, num_experts_per_tok=2, o_groups=2, o_lora_rank=16,
        index_n_heads=4, index_head_dim=16, index_topk=4, sliding_window=8,
        layer_types=[SLIDING, CSA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        max_position_embeddings=512),
    "small": dict(
        vocab_size=8192, hidden_size=256, moe_intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, head_dim=128, qk_rope_head_dim=64, q_lora_rank=128,
        n_routed_experts=8, num_experts_per_tok=2, o_groups=2, o_lora_rank=128,
        index_n_heads=4, index_head_dim=64, index_topk=16, sliding_window=64,
        layer_types=[SLIDING, CSA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
        max_position_embeddings=4096),
    "1gb": dict(
        vocab_size=129280, hidden_size=1024, moe_intermediate_size=512, num_hidden_layers=8,
        num_attention_heads=16, head_dim=128, qk_rope_head_dim=64, q_lora_rank=384,
        n_routed_experts=64, num_experts_per_tok=6, o_groups=4, o_lora_rank=256,
        index_n_heads=8, index_head_dim=64, index_topk=64, sliding_window=128,
        layer_types=[SLIDING, SLIDING, CSA, HCA, CSA, HCA, CSA, SLIDING],
        mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 5, max_position_embeddings=4096),
}


def hf_config(size: str = "tiny", fmt: str = "flash", **overrides) -> dict:
    """config.json of a synthetic V4 checkpoint: transformers 5.24 DeepseekV4Config fields
    (as its `save_pretrained` writes them) and the release's quantization keys.

    Raises:
      ValueError: an unknown size or format.
    """
    if size not in SIZES or fmt not in FORMATS:
        raise ValueError(f"size {size!r} / format {fmt!r}: choose from {list(SIZES)} / "
                         f"{list(FORMATS)}")
    c = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
         **_COMMON, **SIZES[size], **overrides}
    c["partial_rotary_factor"] = c["qk_rope_head_dim"] / c["head_dim"]
    rope = {"rope_type": "default", "partial_rotary_factor": c["partial_rotary_factor"]}
    c["rope_parameters"] = {"main": {**rope, "rope_theta": c["rope_theta"]},
                            "compress": {**rope, "rope_theta": c["compress_rope_theta"]}}
    c["torch_dtype"] = "bfloat16"
    if fmt != "bf16":  # DeepSeek-V4-Flash's release keys (config.json, 2026)
        c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3",
                                    "quant_method": "fp8", "weight_block_size": [128, 128]}
        if fmt == "flash":
            c["quantization_config"]["scale_fmt"] = "ue8m0"
            c["expert_dtype"] = "fp4"
    return c


@dataclasses.dataclass(frozen=True)
class Spec:
    """One model tensor: release name, logical shape, and role ("linear": FP8 when
    quantized, "expert": MXFP4 / FP8, "bf16_linear": never quantized, "norm": BF16 ones,
    "f32_zeros" / "f32_ones" / "f32_normal": float32, "tid2eid": int64)."""

    name: str
    shape: tuple[int, ...]
    role: str


def _layer_specs(c: dict, p: str, attn_type: str, hash_moe: bool) -> list[Spec]:
    h, hc, heads, hd = c["hidden_size"], c["hc_mult"], c["num_attention_heads"], c["head_dim"]
    q, og, ol = c["q_lora_rank"], c["o_groups"], c["o_lora_rank"]
    e, f, k = c["n_routed_experts"], c["moe_intermediate_size"], c["num_experts_per_tok"]
    mix = hc * (hc + 2)  # pre (hc) + post (hc) + comb (hc*hc), transformers HyperConnection
    s = [Spec(p + "attn_norm.weight", (h,), "norm"), Spec(p + "ffn_norm.weight", (h,), "norm")]
    for site in ("attn", "ffn"):
        s += [Spec(f"{p}hc_{site}_fn", (mix, hc * h), "f32_normal"),
              Spec(f"{p}hc_{site}_base", (mix,), "f32_zeros"),
              Spec(f"{p}hc_{site}_scale", (3,), "f32_ones")]
    a = p + "attn."
    s += [Spec(a + "attn_sink", (heads,), "f32_zeros"),
          Spec(a + "q_norm.weight", (q,), "norm"), Spec(a + "kv_norm.weight", (hd,), "norm"),
          Spec(a + "wq_a.weight", (q, h), "linear"),
          Spec(a + "wq_b.weight", (heads * hd, q), "linear"),
          Spec(a + "wkv.weight", (hd, h), "linear"),
          Spec(a + "wo_a.weight", (og * ol, heads * hd // og), "linear"),
          Spec(a + "wo_b.weight", (h, og * ol), "linear")]
    if attn_type != SLIDING:
        rate = c["compress_rates"][attn_type]
        w = 2 * hd if attn_type == CSA else hd  # CSA: two overlapping series (Ca, Cb)
        cp = a + "compressor."
        s += [Spec(cp + "wkv.weight", (w, h), "bf16_linear"),
              Spec(cp + "wgate.weight", (w, h), "bf16_linear"),
              Spec(cp + "ape", (rate, w), "f32_zeros"),
              Spec(cp + "norm.weight", (hd,), "norm")]
    if attn_type == CSA:
        ih, idim, rate = c["index_n_heads"], c["index_head_dim"], c["compress_rates"][CSA]
        ip = a + "indexer."
        s += [Spec(ip + "wq_b.weight", (ih * idim, q), "linear"),
              Spec(ip + "weights_proj.weight", (ih, h), "bf16_linear"),
              Spec(ip + "compressor.wkv.weight", (2 * idim, h), "bf16_linear"),
              Spec(ip + "compressor.wgate.weight", (2 * idim, h), "bf16_linear"),
              Spec(ip + "compressor.ape", (rate, 2 * idim), "f32_zeros"),
              Spec(ip + "compressor.norm.weight", (idim,), "norm")]
    g = p + "ffn."
    s.append(Spec(g + "gate.weight", (e, h), "bf16_linear"))
    s.append(Spec(g + "gate.tid2eid", (c["vocab_size"], k), "tid2eid") if hash_moe
             else Spec(g + "gate.bias", (e,), "f32_zeros"))
    for wn, shape in (("w1", (f, h)), ("w2", (h, f)), ("w3", (f, h))):
        s.append(Spec(f"{g}shared_experts.{wn}.weight", shape, "linear"))
    for x in range(e):
        for wn, shape in (("w1", (f, h)), ("w2", (h, f)), ("w3", (f, h))):
            s.append(Spec(f"{g}experts.{x}.{wn}.weight", shape, "expert"))
    return s


def tensor_specs(c: dict) -> list[Spec]:
    """Every tensor of the release layout for config `c`, in file order (embed, layers,
    norm, hc_head, head, MTP), with logical (unpacked) shapes."""
    h, hc, v = c["hidden_size"], c["hc_mult"], c["vocab_size"]
    head = [Spec("hc_head_fn", (hc, hc * h), "f32_normal"), Spec("hc_head_base", (hc,),
            "f32_zeros"), Spec("hc_head_scale", (1,), "f32_ones")]
    s = [Spec("embed.weight", (v, h), "bf16_linear")]
    for i in range(c["num_hidden_layers"]):
        s += _layer_specs(c, f"layers.{i}.", c["layer_types"][i],
                          c["mlp_layer_types"][i] == "hash_moe")
    s += [Spec("norm.weight", (h,), "norm"), *head, Spec("head.weight", (v, h), "bf16_linear")]
    for d in range(c["num_nextn_predict_layers"]):
        p = f"mtp.{d}."
        s += [Spec(p + "e_proj.weight", (h, h), "linear"),
              Spec(p + "h_proj.weight", (h, h), "linear"),
              Spec(p + "enorm.weight", (h,), "norm"), Spec(p + "hnorm.weight", (h,), "norm"),
              Spec(p + "norm.weight", (h,), "norm"),
              *[Spec(p + x.name, x.shape, x.role) for x in head]]
        s += _layer_specs(c, p, SLIDING, hash_moe=False)
    return s


def stored_entries(spec: Spec, fmt: str) -> list[tuple[str, tuple[int, ...], np.dtype]]:
    """[(name, stored shape, numpy dtype)] of one spec in `fmt`: the weight, then its scale."""
    name, shape = spec.name, spec.shape
    quantized = fmt != "bf16" and spec.role in ("linear", "expert")
    if not quantized:
        dtype = {"norm": BF16, "bf16_linear": BF16, "linear": BF16, "expert": BF16,
                 "tid2eid": np.dtype(np.int64)}.get(spec.role, np.dtype(np.float32))
        return [(name, shape, dtype)]
    stem = name[:-len(".weight")]
    if spec.role == "expert" and fmt == "flash":
        return [(name, mxfp4.packed_shape(shape), np.dtype(np.int8)),
                (stem + ".scale", mxfp4.scale_shape(shape), np.dtype(np.uint8))]
    scale_dtype = np.dtype(np.uint8) if fmt == "flash" else np.dtype(np.float32)
    return [(name, shape, np.dtype(ml_dtypes.float8_e4m3fn)),
            (stem + ".scale", fp8.Fp8Quantization().scale_shape(shape), scale_dtype)]


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def tensor_values(spec: Spec, c: dict, seed: int, dtype=np.float32) -> np.ndarray:
    """The unquantized values of one tensor (`dtype` for floats, int64 for tid2eid),
    drawn a block of rows at a time."""
    rng = _rng(seed, spec.name)
    if spec.role == "tid2eid":  # top_k distinct experts a token: offset + j * (E // k) mod E
        e, k = c["n_routed_experts"], spec.shape[1]
        offset = rng.integers(0, e, size=(spec.shape[0], 1))
        return (offset + np.arange(k) * max(1, e // k)) % e
    if spec.role in ("norm", "f32_ones"):
        return np.ones(spec.shape, dtype)
    if spec.role == "f32_zeros":
        return np.zeros(spec.shape, dtype)
    out = np.empty(spec.shape, dtype)
    std = np.float32(c["initializer_range"])
    rows = max(1, (8 << 20) // max(1, int(np.prod(spec.shape[1:])) * 4))
    for r0 in range(0, spec.shape[0], rows):
        r1 = min(r0 + rows, spec.shape[0])
        out[r0:r1] = rng.standard_normal((r1 - r0, *spec.shape[1:]), np.float32) * std
    return out


def _makers(spec: Spec, c: dict, fmt: str, seed: int) -> list:
    """One `make()` per stored entry; the weight's quantization leaves the scale for the
    scale's maker (written right after it)."""
    entries = stored_entries(spec, fmt)
    if len(entries) == 1:
        dtype = entries[0][2]
        if spec.role == "tid2eid":
            return [lambda: tensor_values(spec, c, seed)]
        return [lambda: tensor_values(spec, c, seed, dtype)]
    pending = {}

    def weight():
        w = tensor_values(spec, c, seed)
        if spec.role == "expert" and fmt == "flash":
            q, s = mxfp4.quantize(w)
        else:
            q, s = fp8.quantize(w, e8m0=fmt == "flash")
        pending["scale"] = s
        return q

    return [weight, lambda: pending.pop("scale")]


def plan_shards(specs: list[Spec], fmt: str, max_shard_bytes: int) -> list[list[Spec]]:
    """Specs grouped into shards of at most `max_shard_bytes` (a weight and its scale in
    the same shard; one larger tensor gets a shard of its own)."""
    shards, current, size = [], [], 0
    for spec in specs:
        n = sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize
                for _, shape, dt in stored_entries(spec, fmt))
        if current and size + n > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(spec)
        size += n
    if current:
        shards.append(current)
    return shards


def checkpoint_bytes(c: dict, fmt: str) -> int:
    """Bytes of tensor data the checkpoint of config `c` holds in `fmt`."""
    return sum(int(np.prod(shape, dtype=np.int64)) * dt.itemsize
               for spec in tensor_specs(c) for _, shape, dt in stored_entries(spec, fmt))


def write_checkpoint(out_dir: str, size: str = "tiny", fmt: str = "flash", seed: int = 0,
                     max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, log=None,
                     **overrides) -> dict:
    """Writes config.json, the shards and the index of a synthetic V4 checkpoint.

    Returns:
      {"config": config.json dict, "bytes": tensor bytes, "shards": count, "tensors": count}.
    """
    c = hf_config(size, fmt, **overrides)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    shards = plan_shards(tensor_specs(c), fmt, max_shard_bytes)
    weight_map, total = {}, 0
    for i, group in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        entries = []
        for spec in group:
            for (name, shape, dtype), make in zip(stored_entries(spec, fmt),
                                                  _makers(spec, c, fmt, seed), strict=True):
                entries.append((name, shape, dtype, make))
                weight_map[name] = fname
                total += int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        t = time.monotonic()
        write_safetensors_streaming(os.path.join(out_dir, fname), entries)
        if log:
            log(f"{fname}: {len(entries)} tensors, {time.monotonic() - t:.1f} s")
    with open(os.path.join(out_dir, SAFE_WEIGHTS_INDEX_NAME), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    return {"config": c, "bytes": total, "shards": len(shards), "tensors": len(weight_map)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=sorted(SIZES), default="1gb")
    ap.add_argument("--format", choices=FORMATS, default="flash")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES)
    ap.add_argument("--dry-run", action="store_true", help="print the sizes, write nothing")
    args = ap.parse_args(argv)
    c = hf_config(args.size, args.format)
    for fmt in FORMATS:
        print(f"{args.size} as {fmt}: {checkpoint_bytes(hf_config(args.size, fmt), fmt) / 1e9:.3f}"
              f" GB of tensors")
    if args.dry_run:
        return 0
    t = time.monotonic()
    got = write_checkpoint(args.out_dir, args.size, args.format, args.seed,
                           args.max_shard_bytes, log=print)
    print(f"{args.out_dir}: {got['tensors']} tensors, {got['bytes'] / 1e9:.3f} GB in "
          f"{got['shards']} shards, {time.monotonic() - t:.0f} s (vocab {c['vocab_size']}, "
          f"hidden {c['hidden_size']}, {c['num_hidden_layers']} layers, "
          f"{c['n_routed_experts']} experts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
