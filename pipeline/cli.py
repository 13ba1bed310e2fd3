"""`deepseek-tfx`: the command line. It parses arguments and calls the pipeline;
the logic lives in the modules it calls.

  deepseek-tfx run       [--data PATH] [--preset NAME] [--output DIR] [--train-steps N]
                         [--set SECTION.FIELD=VALUE ...] [--no-cache]
  deepseek-tfx generate  --model DIR --prompt TEXT [--max-new-tokens N] [--temperature T]
                         [--top-k K] [--top-p P] [--seed S]
  deepseek-tfx evaluate  --model DIR --data PATH
  deepseek-tfx hf-import CHECKPOINT_DIR OUT_DIR
  deepseek-tfx hf-export MODEL_DIR OUT_DIR [--max-shard-size BYTES] [--config-form 4.x|5.x]
                         [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import urllib.request
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS_NAME = "tinyshakespeare.txt"
DEFAULT_CORPUS_URL = (
    "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
)


# ----------------------------------------------------------------------------- data paths


def default_corpus() -> Path:
    """Tiny Shakespeare: `../shared/corpora/` beside the project when present,
    else `data/tinyshakespeare.txt`, fetched from its public source on first use."""
    for candidate in (
        PROJECT_ROOT.parent / "shared" / "corpora" / DEFAULT_CORPUS_NAME,
        Path.cwd().parent / "shared" / "corpora" / DEFAULT_CORPUS_NAME,
    ):
        if candidate.is_file():
            return candidate
    local = PROJECT_ROOT / "data" / DEFAULT_CORPUS_NAME
    if not local.is_file():
        print(f"fetching Tiny Shakespeare from {DEFAULT_CORPUS_URL} -> {local}", file=sys.stderr)
        tmp = local.with_suffix(".part")
        try:
            urllib.request.urlretrieve(DEFAULT_CORPUS_URL, tmp)
        except OSError as e:
            raise SystemExit(
                f"error: cannot fetch the default corpus ({e}); pass --data PATH to a text file"
            ) from e
        tmp.rename(local)
    return local


def split_data_path(data: str) -> tuple[str, str]:
    """PATH -> (input_base, pattern) for ExampleGen: a file, a directory or a glob."""
    path = os.path.abspath(data)
    if os.path.isdir(path):
        return path, "*"
    if any(ch in os.path.basename(path) for ch in "*?["):
        return os.path.dirname(path), os.path.basename(path)
    if not os.path.isfile(path):
        raise SystemExit(f"error: --data {data}: no such file or directory")
    return os.path.dirname(path), os.path.basename(path)


def parse_overrides(items: list[str]) -> dict:
    overrides = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --set {item!r}: expected SECTION.FIELD=VALUE")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        overrides[key.strip()] = value
    return overrides


# ----------------------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    from pipeline.configs import get_config

    overrides = parse_overrides(args.set or [])
    if args.train_steps is not None:
        overrides["train.train_steps"] = args.train_steps
    try:
        config = get_config(args.preset, overrides)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from e
    data = args.data or str(default_corpus())
    input_base, pattern = split_data_path(data)
    name = f"{Path(pattern).stem if pattern != '*' else Path(input_base).name}-{config.preset}"
    output_dir = args.output or os.path.join("runs", name)

    print(f"deepseek-tfx: preset {config.preset}, data {os.path.join(input_base, pattern)}")
    print(f"              outputs under {os.path.abspath(output_dir)}")
    start = time.perf_counter()
    from pipeline.local_runner import run_local

    paths = run_local(config, input_base, pattern, output_dir, enable_cache=not args.no_cache)
    wall = time.perf_counter() - start
    return print_summary(paths, wall)


def print_summary(paths: dict, wall_s: float) -> int:
    from pipeline.run_summary import latest_run

    runs = latest_run(paths["metadata_path"])
    print()
    print(f"{'component':<32} {'status':<10} {'seconds':>8}")
    for r in runs:
        print(f"{r.component:<32} {r.state.lower():<10} {r.duration_s:>8.1f}")
    print(f"{'total wall time':<43} {wall_s:>8.1f}")
    by_name = {r.component: r for r in runs}
    cleaner = by_name.get("TextCleaner")
    if cleaner:
        props = cleaner.outputs.get("Examples", {})
        drops = {k[len('dropped_'):]: v for k, v in props.items() if k.startswith("dropped_")}
        print(f"\nrecords: read {props.get('records_read')}, kept {props.get('records_kept')}, "
              f"dropped {props.get('records_dropped')} {drops or ''}")
    evaluator = by_name.get("LmEvaluator")
    if evaluator:
        ev = evaluator.outputs.get("ModelEvaluation", {})
        bl = evaluator.outputs.get("ModelBlessing", {})
        print(f"eval: bits_per_byte {ev.get('bits_per_byte', float('nan')):.4f}, "
              f"perplexity {ev.get('perplexity', float('nan')):.2f}, "
              f"tokens {ev.get('eval_tokens')}, bytes {ev.get('eval_bytes')}")
        print(f"blessed: {bool(bl.get('blessed'))} ({bl.get('blessing_message', '')})")
    pusher = by_name.get("Pusher")
    pushed = pusher.outputs.get("PushedModel", {}) if pusher else {}
    if pushed.get("pushed"):
        print(f"pushed model: {pushed.get('pushed_destination')}")
    else:
        print("pushed model: none (not blessed)")
    print(f"ML Metadata: {paths['metadata_path']}")
    failed = [r.component for r in runs if r.state not in ("COMPLETE", "CACHED")]
    return 1 if failed else 0


def resolve_model_dir(model: str) -> str:
    """A SavedModel directory, or a serving directory whose newest version is used."""
    if os.path.isfile(os.path.join(model, "saved_model.pb")):
        return model
    versions = [d for d in os.listdir(model) if d.isdigit()] if os.path.isdir(model) else []
    if not versions:
        raise SystemExit(f"error: --model {model}: no SavedModel and no numbered versions in it")
    return os.path.join(model, max(versions, key=int))


def cmd_generate(args: argparse.Namespace) -> int:
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    loaded = tf.saved_model.load(resolve_model_dir(args.model))
    out = loaded.signatures["generate"](
        prompt=tf.constant([args.prompt]),
        max_new_tokens=tf.constant(args.max_new_tokens, tf.int32),
        temperature=tf.constant(args.temperature, tf.float32),
        top_k=tf.constant(args.top_k, tf.int32),
        top_p=tf.constant(args.top_p, tf.float32),
        seed=tf.constant(args.seed, tf.int32),
    )
    sys.stdout.write(out["text"][0].numpy().decode("utf-8") + "\n")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from serving.evaluate import evaluate_text_files

    model_dir = resolve_model_dir(args.model)
    input_base, pattern = split_data_path(args.data)
    metrics = evaluate_text_files(model_dir, os.path.join(input_base, pattern))
    print(json.dumps(metrics, indent=2))
    return 0


def cmd_hf_import(args: argparse.Namespace) -> int:
    from models.deepseek.hf_checkpoint import CheckpointError
    from serving.hf_interop import hf_import

    try:
        out = hf_import(args.checkpoint_dir, args.out_dir)
    except (FileNotFoundError, CheckpointError) as e:
        raise SystemExit(f"error: {e}") from e
    print(f"SavedModel with signatures logits, serving_default: {os.path.abspath(out)}")
    return 0


def cmd_hf_export(args: argparse.Namespace) -> int:
    from serving.hf_interop import hf_export

    model_dir = resolve_model_dir(args.model_dir)
    try:
        files = hf_export(model_dir, args.out_dir, max_shard_bytes=args.max_shard_size,
                          config_form=args.config_form, dtype=args.dtype)
    except FileNotFoundError as e:
        raise SystemExit(f"error: {e}") from e
    print(f"HF checkpoint ({len(files)} safetensors file(s)): {os.path.abspath(args.out_dir)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deepseek-tfx", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the whole TFX pipeline locally (LocalDagRunner)")
    run.add_argument("--data", help="text/JSONL file, directory or glob (default: Tiny Shakespeare)")
    run.add_argument("--preset", default="cpu_small", help="tiny | cpu_small | gpu_base")
    run.add_argument("--output", help="output directory (default: runs/<corpus>-<preset>)")
    run.add_argument("--train-steps", type=int, help="override train.train_steps")
    run.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                     help="override any config field, e.g. --set model.hidden_size=128")
    run.add_argument("--no-cache", action="store_true", help="re-run every component")
    run.set_defaults(fn=cmd_run)

    gen = sub.add_parser("generate", help="generate text with a pushed model")
    gen.add_argument("--model", required=True, help="serving dir (newest version) or SavedModel")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    gen.add_argument("--top-k", type=int, default=50, help="0 = off")
    gen.add_argument("--top-p", type=float, default=0.95, help="1.0 = off")
    gen.add_argument("--seed", type=int, default=0)
    gen.set_defaults(fn=cmd_generate)

    ev = sub.add_parser("evaluate", help="bits per byte and perplexity of a pushed model on text")
    ev.add_argument("--model", required=True, help="serving dir (newest version) or SavedModel")
    ev.add_argument("--data", required=True, help="text/JSONL file, directory or glob")
    ev.set_defaults(fn=cmd_evaluate)

    hf_in = sub.add_parser("hf-import", help="HF DeepSeek-V3 checkpoint -> SavedModel (logits)")
    hf_in.add_argument("checkpoint_dir", help="config.json + *.safetensors (sharded or not)")
    hf_in.add_argument("out_dir", help="where the SavedModel is written")
    hf_in.set_defaults(fn=cmd_hf_import)

    hf_out = sub.add_parser("hf-export", help="SavedModel -> HF DeepSeek-V3 checkpoint")
    hf_out.add_argument("model_dir", help="a SavedModel from hf-import or the pipeline "
                        "(a serving dir: the newest version)")
    hf_out.add_argument("out_dir", help="where config.json and *.safetensors are written")
    hf_out.add_argument("--max-shard-size", type=int, default=5 * 1024**3,
                        help="bytes per safetensors shard (default 5 GiB)")
    hf_out.add_argument("--config-form", choices=("4.x", "5.x"), default="5.x",
                        help="config.json as transformers 4.x (rope_scaling) or 5.x "
                        "(rope_parameters) writes it")
    hf_out.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    hf_out.set_defaults(fn=cmd_hf_export)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "apache_beam", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
