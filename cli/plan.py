"""`deepseek-tfx plan`: what fits, from arithmetic only (`models/deepseek/memory_plan.py`).

  deepseek-tfx plan [--tables]
      the design table: 7B on 1 x A100 80 GB, 65B on 8 x A100, 175B on 64 x A100
      (and the fewest that fit), DeepSeek-V2-Lite, DeepSeek-V3 671B; full and LoRA
  deepseek-tfx plan --preset deepseek_v4_flash | deepseek_v4_pro  [same options]
      the V4 planner (`models/deepseek_v4/memory_plan.py`), plus total / activated
      parameters against DeepSeek's published sizes, weight bytes per dtype and the V4
      caches (sliding window, CSA / HCA compressed entries, indexer keys, compressor state)
  deepseek-tfx plan --preset NAME | --config CONFIG_JSON  [--mode full|lora|frozen|inference]
      [--weights-dtype bfloat16|float32] [--compute-dtype bfloat16|float32]
      [--optimizer adamw|sgd|adafactor] [--lora-rank R] [--lora-targets attention,mlp]
      [--trainable-blocks N] [--batch B] [--seq-len T] [--grad-accum-steps K]
      [--recompute none|full] [--devices N] [--memory-gb GiB]
      [--sharding none|optimizer|full] [--gpu A100|H100|...] [--peak-tflops F] [--mfu M]

Imports no TensorFlow: it answers in about a second.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from common.json_file import read_json
from models import families
from models.deepseek import flops, memory_plan
from models.deepseek.deepseek_presets import DEEPSEEK_PRESETS, deepseek_preset
from models.deepseek.hf_config import CONFIG_NAME, config_from_hf
from models.deepseek_v4 import memory_plan as v4_plan
from models.deepseek_v4.config import DeepSeekV4Config
from models.deepseek_v4.presets import DEEPSEEK_V4_PRESETS, PUBLISHED_SIZES, deepseek_v4_preset
from models.planning import plan_input

# Models of the planner itself, beside models/deepseek/deepseek_presets.py.
PLAN_MODELS = tuple(memory_plan.DESIGN_CONFIGS)


def _config(args: argparse.Namespace):
    """The DeepSeekConfig (or DeepSeekV4Config) of --preset or --config (a config.json or
    its directory)."""
    if args.config:
        path = args.config
        if os.path.isdir(path):
            path = os.path.join(path, CONFIG_NAME)
        try:
            return config_from_hf(read_json(path, "a HF config.json"))
        except (FileNotFoundError, ValueError) as e:
            raise SystemExit(f"error: {e}" if path in str(e) else f"error: {path}: {e}") from e
    name = args.preset
    if name in memory_plan.DESIGN_CONFIGS:
        return memory_plan.DESIGN_CONFIGS[name]
    if name in DEEPSEEK_V4_PRESETS:
        return deepseek_v4_preset(name)
    try:
        return deepseek_preset(name)
    except ValueError:
        raise SystemExit(f"error: --preset {name!r}: choose one of "
                         f"{sorted(DEEPSEEK_PRESETS) + sorted(DEEPSEEK_V4_PRESETS)}"
                         f" or {list(PLAN_MODELS)}") from None


def _peak(args: argparse.Namespace) -> tuple[float, str]:
    if args.peak_tflops:
        return args.peak_tflops * 1e12, f"{args.peak_tflops:g} TFLOP/s (--peak-tflops)"
    peak = flops.table_peak_flops(args.gpu, args.compute_dtype)
    if peak is None:
        raise SystemExit(f"error: --gpu {args.gpu!r}: no published {args.compute_dtype} peak; "
                         f"choose one of {list(flops.PEAK_FLOPS_TABLE)} or give --peak-tflops")
    tf32 = args.compute_dtype == "float32" and peak != flops.table_peak_flops(
        args.gpu, "float32", tf32=False)
    return peak, f"{peak / 1e12:g} TFLOP/s ({args.gpu} {'TF32' if tf32 else args.compute_dtype})"


def _plan_json(pl) -> dict:
    """One plan for machines: bytes per device, what fits, times and parameter counts."""
    fields = ("weights", "master_weights", "gradients", "optimizer_states", "activations",
              "kv_cache", "total", "fits", "min_devices", "tokens_per_step", "step_time_s",
              "token_time_s")
    case = {k: v for k, v in dataclasses.asdict(pl.case).items() if k != "config"}
    return {"case": case, "counts": dataclasses.asdict(pl.counts),
            **{k: getattr(pl, k) for k in fields}}


def cmd_plan(args: argparse.Namespace) -> int:
    """Prints the design table, or one case's plan."""
    if args.tables or not (args.preset or args.config):
        plans = [memory_plan.plan(case) for _, case in memory_plan.design_cases()]
        print(DESIGN_INTRO)
        print(memory_plan.format_table(plans))
        print(ASSUMPTIONS)
        return 0
    config = _config(args)
    peak, peak_text = _peak(args)
    checkpoint = args.config if args.config and os.path.isdir(args.config) else \
        os.path.dirname(os.path.abspath(args.config or "."))
    name = args.preset or os.path.basename(os.path.abspath(checkpoint))
    try:
        case = plan_input.PlanInput(
            config, name=name, mode=args.mode, weights_dtype=args.weights_dtype,
            compute_dtype=args.compute_dtype, optimizer=args.optimizer,
            lora_rank=args.lora_rank, lora_targets=args.lora_targets,
            trainable_blocks=args.trainable_blocks, batch_per_device=args.batch,
            seq_len=args.seq_len, grad_accum_steps=args.grad_accum_steps,
            recompute=args.recompute, devices=args.devices, memory_gib=args.memory_gb,
            sharding=args.sharding, peak_flops=peak, mfu=args.mfu)
        pl = families.family_of(config).module("memory_plan").plan(case)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    if args.json:
        print(json.dumps(_plan_json(pl), indent=2))
        return 0
    print(memory_plan.format_table([pl]))
    if args.seq_len > config.max_position_embeddings:
        print(f"note: --seq-len {args.seq_len} exceeds the model's max_position_embeddings "
              f"{config.max_position_embeddings}")
    counts = pl.counts
    print(f"\n{name}: {counts.total:,} parameters, {counts.trained:,} trained"
          + (f" ({counts.adapters:,} LoRA adapter parameters)" if counts.adapters else ""))
    print(f"per device (GiB): weights {pl.weights / plan_input.GIB:.2f}, master weights "
          f"{pl.master_weights / plan_input.GIB:.2f}, gradients "
          f"{pl.gradients / plan_input.GIB:.2f}, optimizer states "
          f"{pl.optimizer_states / plan_input.GIB:.2f}, activations "
          f"{pl.activations / plan_input.GIB:.2f}, KV cache {pl.kv_cache / plan_input.GIB:.2f}"
          f"; total {pl.total / plan_input.GIB:.2f} of {args.memory_gb:g}")
    fewest = ("no number of devices (nothing is divided with --sharding none)"
              if pl.min_devices is None and args.sharding == "none" else
              "no number of devices" if pl.min_devices is None else f"{pl.min_devices}")
    print(f"{'fits' if pl.fits else 'does NOT fit'} on {args.devices} x {args.memory_gb:g} GiB; "
          f"fewest devices of {args.memory_gb:g} GiB that fit: {fewest}")
    what = "decoding step" if args.mode == "inference" else "optimizer step"
    print(f"time at {args.mfu:.0%} MFU of {peak_text}: {pl.step_time_s:.4g} s per {what} "
          f"({pl.tokens_per_step:,} tokens), {pl.token_time_s:.3g} s per token")
    if families.family_of(config) is families.DEEPSEEK_V4:  # its caches and published sizes
        print(_v4_report(name, config, args.seq_len, args.compute_dtype))
    return 0


def _v4_report(name: str, config: DeepSeekV4Config, seq_len: int, compute_dtype: str) -> str:
    """Parameters in DeepSeek's convention (against the published sizes when `name` is a
    preset), weight bytes per dtype and the V4 caches of one sequence of `seq_len` tokens."""
    s = v4_plan.parameter_summary(config)

    def vs(n: int, published: float | None) -> str:
        return "" if published is None else (
            f"; published {published / 1e9:,.0f}B, {100 * (n / published - 1):+.2f}%")

    total_pub, active_pub = PUBLISHED_SIZES.get(name, (None, None))
    w = v4_plan.weight_bytes(config)
    released = v4_plan.weight_bytes(config, include_mtp=True)["released"]
    b = plan_input.DTYPE_BYTES[compute_dtype]
    kv = v4_plan.kv_cache_items(config, seq_len, b)
    mib = 2**20
    return "\n".join([
        f"\n{name} in DeepSeek's convention (MTP excluded; activated = all but the unchosen "
        "routed experts and the embedding):",
        f"  total {s.total:,} ({s.total / 1e9:,.2f}B{vs(s.total, total_pub)})",
        f"  activated per token {s.activated:,} ({s.activated / 1e9:,.2f}B"
        f"{vs(s.activated, active_pub)}); with the embedding {s.activated_with_embedding:,}",
        f"  routed experts {s.routed_experts / 1e9:,.2f}B; MTP modules (released, not built) "
        f"{s.mtp:,} ({s.mtp_activated:,} activated); tid2eid buffers {s.tid2eid:,} int64",
        f"  weights (no MTP): float32 {w['float32'] / plan_input.GIB:,.1f} GiB, bfloat16 "
        f"{w['bfloat16'] / plan_input.GIB:,.1f} GiB; released checkpoint (FP4 experts, FP8, "
        f"bf16, with MTP and scales, estimated) {released / plan_input.GIB:,.1f} GiB",
        f"  KV cache of one sequence at {seq_len:,} tokens ({compute_dtype} entries, float32 "
        f"compressor state): {sum(kv.values()) / mib:,.2f} MiB = "
        + " + ".join(f"{k} {v / mib:,.2f}" for k, v in kv.items()),
        f"  KV growth per token of context: {v4_plan.kv_cache_bytes_per_token(config, b):,.0f} "
        f"bytes (CSA entries 1 per {config.compress_rates['compressed_sparse_attention']} "
        f"tokens + indexer keys, HCA entries 1 per "
        f"{config.compress_rates['heavily_compressed_attention']}); the sliding window "
        f"({config.sliding_window} entries per block) and the compressor state are bounded",
    ])


DESIGN_INTRO = (
    "What fits (GiB per device; 80 GB GPUs hold 80 GiB). Batch 1 x 4,096 tokens per device,\n"
    "full activation recomputation, bf16 compute, AdamW; full = bf16 weights + float32 master\n"
    "weights, gradients in bf16; LoRA = rank 16 on attention and MLP (experts included), bf16\n"
    "base, float32 adapters and states. DP = plain data parallel (everything replicated, as the\n"
    "Trainer runs); ZeRO3 = weights, gradients and states divided over the devices. inference =\n"
    "bf16 weights + MLA KV cache of 4,096 tokens. 'min dev' = the fewest 80 GiB devices that\n"
    "fit with that sharding. Times at 40% MFU of A100 312 / H100 989 bf16 TFLOP/s.\n")

ASSUMPTIONS = (
    "\nNot counted: the runtime (CUDA context, framework), allocator fragmentation, the layer\n"
    "ZeRO-3 gathers at a time, one layer's transient copies; no tensor, pipeline or expert\n"
    "parallelism (activations are not divided). LoRA and frozen runs are charged the FLOPs\n"
    "of full training (an upper bound). Method: models/deepseek/memory_plan.py.")


def add_parsers(sub) -> None:
    """Registers `plan` on `sub`, the top-level parser's `add_subparsers()`."""
    p = sub.add_parser("plan", help="memory per device and time per step: what fits "
                       "(no arguments: the design table)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--preset", help=f"a model preset: {', '.join(sorted(DEEPSEEK_PRESETS))}, "
                      f"{', '.join(sorted(DEEPSEEK_V4_PRESETS))}, {', '.join(PLAN_MODELS)}")
    what.add_argument("--config", help="a HF config.json (or its checkpoint directory)")
    what.add_argument("--tables", action="store_true", help="print the design table")
    p.add_argument("--json", action="store_true",
                   help="one case's plan as JSON (bytes per device) instead of the table")
    p.add_argument("--mode", choices=plan_input.MODES, default="full",
                   help="full fine-tuning, LoRA, frozen (top N blocks train), or inference "
                   "(weights + KV cache: also what an imported checkpoint needs)")
    p.add_argument("--weights-dtype", choices=tuple(plan_input.DTYPE_BYTES), default="bfloat16",
                   help="stored weights (full training adds float32 master weights to bf16)")
    p.add_argument("--compute-dtype", choices=tuple(plan_input.DTYPE_BYTES),
                   default="bfloat16", help="activations and the peak FLOP/s used")
    p.add_argument("--optimizer", choices=plan_input.OPTIMIZERS, default="adamw")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-targets", default="attention,mlp")
    p.add_argument("--trainable-blocks", type=int, default=None,
                   help="N of train.trainable=top:N (mode frozen; limits LoRA too)")
    p.add_argument("--batch", type=int, default=1, help="sequences per device per micro-batch")
    p.add_argument("--seq-len", type=int, default=4096,
                   help="tokens per sequence (inference: the context in the KV cache)")
    p.add_argument("--grad-accum-steps", type=int, default=1)
    p.add_argument("--recompute", choices=plan_input.RECOMPUTE, default="none")
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--memory-gb", type=float, default=80.0,
                   help="memory per device in GiB (an 80 GB A100 has 80 GiB)")
    p.add_argument("--sharding", choices=plan_input.SHARDINGS, default="none",
                   help="none: plain data parallel; optimizer: ZeRO-2; full: ZeRO-3/FSDP")
    p.add_argument("--gpu", default="A100", help="the device whose published peak is used "
                   f"({', '.join(flops.PEAK_FLOPS_TABLE)})")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="peak TFLOP/s per device (instead of --gpu)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilization")
    p.set_defaults(fn=cmd_plan)
