"""`deepseek-tfx hf-import` and `hf-export`: Hugging Face DeepSeek-V3 checkpoints
(config.json, safetensors, tokenizer.json) to a SavedModel and back
(`savedmodel/hf_interop.py`)."""

from __future__ import annotations

import argparse
import os

from cli import quiet_commands
from cli.model_dir import resolve_model_dir
from common import memory
from savedmodel.precision import AUTO, HF_DTYPES, WEIGHT_DTYPES


def cmd_hf_import(args: argparse.Namespace) -> int:
    """Writes the SavedModel; prints its signatures, tokenizer and sampling defaults."""
    memory.use_system_allocator()  # before TensorFlow loads: see common/memory.py
    from savedmodel.hf_interop import hf_import

    try:
        imported = hf_import(args.checkpoint_dir, args.out_dir,
                             use_tokenizer=not args.no_tokenizer, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:  # CheckpointError, UnsupportedTokenizerError
        raise SystemExit(f"error: {e}") from e
    print(f"SavedModel with signatures {', '.join(imported.signatures)}: "
          f"{os.path.abspath(imported.path)}")
    print(f"  weights: {imported.weight_dtype}")
    if imported.tokenizer is None:
        why = "--no-tokenizer" if args.no_tokenizer else f"no tokenizer.json in {args.checkpoint_dir}"
        print(f"  logits only ({why}): generate, evaluate and text requests to serve need a "
              "tokenizer")
    else:
        g = imported.generation
        sampling = ("greedy" if g.temperature == 0 else
                    f"temperature {g.temperature}, top_k {g.top_k}, top_p {g.top_p}")
        print(f"  tokenizer: {imported.tokenizer}")
        print(f"  serving_default: {sampling}, max_new_tokens {g.max_new_tokens} "
              f"(from {imported.generation_source})")
    return 0


def cmd_hf_export(args: argparse.Namespace) -> int:
    """Writes the HF checkpoint; prints its shards and files."""
    memory.use_system_allocator()
    from savedmodel.hf_interop import hf_export

    model_dir = resolve_model_dir(args.model_dir)
    try:
        files = hf_export(model_dir, args.out_dir, max_shard_bytes=args.max_shard_size,
                          config_form=args.config_form, dtype=args.dtype)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"error: {e}") from e
    shards = [f for f in files if f.endswith(".safetensors")]
    names = sorted({os.path.basename(f) for f in files} - {os.path.basename(f) for f in shards})
    print(f"HF checkpoint ({len(shards)} safetensors file(s), {', '.join(['config.json'] + names)})"
          f": {os.path.abspath(args.out_dir)}")
    if "tokenizer.json" not in names:
        print(f"  no tokenizer: {model_dir} carries none (logits only)")
    return 0


def add_parsers(sub) -> None:
    """Registers `hf-import` and `hf-export` on `sub`, the top-level parser's
    `add_subparsers()`."""
    hf_in = sub.add_parser("hf-import", help="HF DeepSeek-V3 checkpoint -> SavedModel (text "
                           "signatures with tokenizer.json, else logits only)")
    hf_in.add_argument("checkpoint_dir", help="config.json + *.safetensors (sharded or not), "
                       "optionally tokenizer.json, tokenizer_config.json, generation_config.json")
    hf_in.add_argument("out_dir", help="where the SavedModel is written")
    hf_in.add_argument("--no-tokenizer", action="store_true",
                       help="import the weights only (logits), ignoring tokenizer.json")
    hf_in.add_argument("--dtype", choices=(AUTO, *WEIGHT_DTYPES), default=AUTO,
                       help="the SavedModel's weights: auto = the checkpoint's own precision "
                       "(bf16 and FP8 checkpoints -> bfloat16, float32 -> float32); int8 = "
                       "int8 projections with per-channel scales (embedding, norms and "
                       "router float32)")
    quiet_commands.add_arguments(hf_in, "hf-import")
    hf_in.set_defaults(fn=cmd_hf_import)

    hf_out = sub.add_parser("hf-export", help="SavedModel -> HF DeepSeek-V3 checkpoint")
    hf_out.add_argument("model_dir", help="a SavedModel from hf-import or the pipeline "
                        "(a serving dir: the newest version)")
    hf_out.add_argument("out_dir", help="where config.json and *.safetensors are written (and "
                        "tokenizer.json, tokenizer_config.json, generation_config.json when "
                        "the SavedModel carries a tokenizer)")
    hf_out.add_argument("--max-shard-size", type=int, default=5 * 1024**3,
                        help="bytes per safetensors shard (default 5 GiB)")
    hf_out.add_argument("--config-form", choices=("4.x", "5.x"), default="5.x",
                        help="config.json as transformers 4.x (rope_scaling) or 5.x "
                        "(rope_parameters) writes it")
    hf_out.add_argument("--dtype", choices=(AUTO, *HF_DTYPES), default=AUTO,
                        help="the safetensors' dtype: auto = the SavedModel's own precision "
                        "(a bf16 import exports the tensors it was imported from; an int8 "
                        "model exports its dequantized kernels in float32)")
    quiet_commands.add_arguments(hf_out, "hf-export")
    hf_out.set_defaults(fn=cmd_hf_export)
