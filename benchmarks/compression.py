"""Smaller models to serve, side by side: float32, bf16, int8, int8 + LoRA, experts pruned.

  python benchmarks/compression.py [--run runs/tinyshakespeare-cpu_small]
      [--lora-steps 100] [--max-new-tokens 32] [--json OUT]

From the main job's run directory (`deepseek-tfx run`: the pushed model in
`<run>/serving/<version>`, Transform's outputs in `<run>/pipeline_root/Transform`),
one run builds every variant of the pushed model as a SavedModel with the pushed
model's signatures (`savedmodel.export.export_serving_model`), in a temporary
directory:

  float32          the pushed model itself
  bfloat16         its weights cast to bf16 (`train.export_dtype=bfloat16`)
  int8             projections int8 with per-output-channel scales (`--dtype int8`,
                   `models/formats/quantization.py`; embedding, norms, router float32)
  int8 + LoRA      the int8 model as the base of `--lora-steps` steps of rank-8 LoRA
                   on the run's train split (QLoRA-style: the base stays int8), the
                   adapters merged into re-quantized int8 kernels
  pruned 50% / 75% the routed experts kept by router load on the eval split
                   (`expert_pruning`), when the config's group rule allows the keep

and measures, for each:

  weights MB       the SavedModel's `variables/` bytes (the whole directory besides)
  serving RSS MB   the peak RSS of a fresh process that loads the SavedModel with
                   `tensorflow` + `tensorflow_text` only and runs its `generate`
                   signature (what TF Serving holds), measured in that child process
                   (with TensorFlow's own allocator, as `deepseek-tfx serve` runs)
  tok/s b=1, b=16  greedy tokens generated per second through `generate`, one prompt
                   and 16 prompts a call (`--max-new-tokens` each; after one warm-up
                   call), in that same child process
  bits/byte        held-out bits per byte on the run's eval split, scored exactly as
                   the pipeline's LmEvaluator scores it (`evaluate_saved_model`)

Every variant is measured in the same run on the same machine, one at a time.
Prints a Markdown table (and JSON with `--json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

PROMPTS = ["ROMEO:", "JULIET:\nO", "First Citizen:\n", "KING RICHARD III:\nNow is the",
           "To be, or not", "MENENIUS:\nWhy, masters,", "The", "HAMLET:\n",
           "KING LEAR:\nBlow, winds,", "Now is the winter", "O Romeo, Romeo!", "MACBETH:\n",
           "Friends, Romans,", "What light", "PROSPERO:\n", "All the world"]


# ----------------------------------------------------------------------------- the child


def serve_child(model_dir: str, max_new_tokens: int) -> dict:
    """Loads `model_dir` as TF Serving would (tensorflow + tensorflow_text only), runs
    greedy `generate` at batch 1 and 16; returns tokens/s and the process's peak RSS."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the tokenizer's ops)

    generate = tf.saved_model.load(model_dir).signatures["generate"]

    def call(prompts):
        n = len(prompts)
        out = generate(prompt=tf.constant(prompts),
                       max_new_tokens=tf.fill([n], max_new_tokens),
                       temperature=tf.zeros([n]), top_k=tf.zeros([n], tf.int32),
                       top_p=tf.ones([n]), seed=tf.zeros([n], tf.int32))
        return int(tf.reduce_sum(out["num_generated"]))

    figures = {}
    for batch, calls in ((1, 8), (16, 4)):
        prompts = PROMPTS[:batch]
        call(prompts)  # warm-up: the first call of a signature traces nothing, but allocates
        start, tokens = time.perf_counter(), 0
        for i in range(calls):
            tokens += call(PROMPTS[i % len(PROMPTS):][:batch] if batch == 1 else prompts)
        figures[f"tokens_per_s_b{batch}"] = tokens / (time.perf_counter() - start)
    figures["serving_peak_rss_mb"] = peak_rss_mb()
    return figures


def peak_rss_mb() -> float:
    """This process's peak RSS since its `exec`, MB: /proc's VmHWM (getrusage's ru_maxrss
    also counts the parent's pages a forked child held before it exec'ed)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


# ----------------------------------------------------------------------------- the parent


def _latest(pattern: str) -> str:
    paths = sorted(glob.glob(pattern), key=lambda p: int(os.path.basename(p)))
    if not paths:
        raise SystemExit(f"error: nothing matches {pattern}: run `deepseek-tfx run` first")
    return paths[-1]


def _dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(path) for f in files)


def _lora_model(int8_dir: str, config, train_files: str, steps: int, work: str):
    """The int8 model at `int8_dir` fine-tuned with rank-8 LoRA for `steps` steps on
    `train_files`; returned merged and re-quantized (`model_io.copy_for_export`)."""
    from components.trainer import data, model_io, train_loop
    from tokenization.tokenizer import EOS_ID

    train = dataclasses.replace(config.train, lora_rank=8, lora_targets="attention,mlp",
                                train_steps=steps, warmup_steps=min(10, steps),
                                learning_rate=1e-3, min_learning_rate=1e-4,
                                checkpoint_every=steps, log_every=max(1, steps // 4),
                                export_dtype="auto")
    config = dataclasses.replace(config, train=train)
    tc = config.train

    def dataset_fn():
        return data.make_train_dataset(train_files, tc.seq_len, tc.batch_size,
                                       tc.shuffle_buffer, tc.seed + 1, EOS_ID)

    result = train_loop.train(config, dataset_fn, os.path.join(work, "lora_ckpt"), None,
                              precision="float32", base_model=int8_dir)
    print(f"  int8 + LoRA: {steps} steps, final train loss {result.final_loss:.4f}, "
          f"{result.trainable_params} trainable parameters", flush=True)
    return model_io.copy_for_export(config, result.model)


def greedy_matches(model, saved_dir: str, graph: str, config, max_new_tokens: int = 32) -> str:
    """How many of PROMPTS get the same greedy completion from the exported `generate`
    signature as from the in-memory Keras `model` through the same code
    (`savedmodel.export.ServingModule`), e.g. "16/16 prompts"."""
    import tensorflow as tf

    from savedmodel.export import ServingModule
    from tokenization.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(graph)
    n = len(PROMPTS)
    knobs = dict(max_new_tokens=tf.fill([n], max_new_tokens), temperature=tf.zeros([n]),
                 top_k=tf.zeros([n], tf.int32), top_p=tf.ones([n]), seed=tf.zeros([n], tf.int32))
    with tempfile.TemporaryDirectory() as assets:
        tokenizer.write(assets)
        module = ServingModule(model, tokenizer, config.generation, assets)
        keras_out = module.generate(tf.constant(PROMPTS), *knobs.values())["completion"]
    saved = tf.saved_model.load(saved_dir).signatures["generate"]
    saved_out = saved(prompt=tf.constant(PROMPTS), **knobs)["completion"]
    same = int(tf.reduce_sum(tf.cast(tf.equal(keras_out, saved_out), tf.int32)))
    return f"{same}/{n} prompts"


def build_variants(run: str, work: str, lora_steps: int) -> tuple[list[dict], object, tuple]:
    """Exports every variant into `work`; returns [{"name", "dir", "note"}], the
    pipeline config and the eval split's (docs, bytes)."""
    import numpy as np

    from cli.prune import token_windows
    from components.lm_evaluator.executor import read_eval_documents
    from components.trainer import model_io
    from models.deepseek.expert_pruning import prune_experts
    from models.formats import quantization
    from models.layers.expert_load import expert_load
    from savedmodel.export import export_serving_model
    from savedmodel.hf_interop import load_model_from_savedmodel
    from savedmodel.layout import latest_version, read_pipeline_config
    from tokenization.tokenizer import EOS_ID

    pushed, _ = latest_version(os.path.join(run, "serving"))
    config = read_pipeline_config(pushed)
    root = os.path.join(run, "pipeline_root", "Transform")
    examples = _latest(os.path.join(root, "transformed_examples", "*"))
    graph = _latest(os.path.join(root, "transform_graph", "*"))
    docs, num_bytes = read_eval_documents(types.SimpleNamespace(uri=examples), "eval")
    variants = [{"name": "float32", "dir": pushed, "note": "the pushed model"}]

    def export(name, model, note, cfg=config):
        out = os.path.join(work, name.replace(" ", "_").replace("%", "pct").replace("+", "plus"))
        export_serving_model(model, graph, cfg, out)
        variants.append({"name": name, "dir": out, "note": note})
        print(f"  exported {name}: {out}", flush=True)
        return out

    bf16 = dataclasses.replace(config, train=dataclasses.replace(config.train,
                                                                 export_dtype="bfloat16"))
    export("bfloat16", model_io.to_export_dtype(bf16, load_model_from_savedmodel(pushed)),
           "weights cast to bf16", bf16)
    model = load_model_from_savedmodel(pushed)
    quantization.quantize_int8(model)
    int8_dir = export("int8", model, "Keras int8 projections, per-channel scales")
    same = greedy_matches(model, int8_dir, graph, config)
    variants[-1]["note"] += f"; greedy `generate` = the quantized Keras model on {same}"
    print(f"  int8: greedy generate of the SavedModel = the Keras model's on {same}",
          flush=True)
    model = _lora_model(int8_dir, config, os.path.join(examples, "Split-train", "*"), lora_steps,
                        work)
    export("int8 + LoRA", model, f"{lora_steps} steps of rank-8 LoRA on the int8 base, "
           "re-quantized")

    float_model = load_model_from_savedmodel(pushed)
    # The router load on the eval split, in the Trainer's windows (`[EOS] d1 [EOS] d2 ...`).
    batches = token_windows(docs, EOS_ID, config.train.seq_len, 65536)
    load = expert_load(float_model, batches)  # (M, E)
    experts = config.model.n_routed_experts
    for share in (0.5, 0.75):
        keep = int(round(experts * share))
        try:
            pruned = prune_experts(float_model, keep, load)
        except ValueError as e:
            variants.append({"name": f"pruned {share:.0%}", "dir": None,
                             "note": f"keep {keep} of {experts}: refused: {e}"})
            print(f"  pruned {share:.0%}: refused: {e}", flush=True)
            continue
        tokens = int(np.sum(load[0])) // config.model.num_experts_per_tok
        export(f"pruned {share:.0%}", pruned,
               f"{keep} of {experts} routed experts, by router load on {tokens} eval tokens")
    return variants, config, (docs, num_bytes)


def measure(variants: list[dict], config, eval_data, max_new_tokens: int) -> list[dict]:
    """Adds bytes, bits/byte (this process) and serving figures (a child each)."""
    from common import memory
    from components.lm_evaluator.executor import evaluate_saved_model
    from config import DEFAULT_SOURCE

    docs, num_bytes = eval_data
    rows = []
    for v in variants:
        row = {"name": v["name"], "note": v["note"]}
        if v["dir"] is None:
            rows.append(row)
            continue
        row["weights_bytes"] = _dir_bytes(os.path.join(v["dir"], "variables"))
        row["savedmodel_bytes"] = _dir_bytes(v["dir"])
        metrics, _ = evaluate_saved_model(v["dir"], {DEFAULT_SOURCE: (docs, num_bytes)}, config)
        row["bits_per_byte"] = metrics["bits_per_byte"]
        # The child's environment is the server's: TensorFlow's own allocator (`serve` does
        # not switch to malloc as this process does for its exports).
        env = {k: v for k, v in os.environ.items() if k != memory.SYSTEM_ALLOCATOR_ENV}
        child = subprocess.run(
            [sys.executable, __file__, "--serve-child", v["dir"],
             "--max-new-tokens", str(max_new_tokens)],
            capture_output=True, text=True, check=True, cwd=PROJECT_ROOT, env=env)
        row.update(json.loads(child.stdout.strip().splitlines()[-1]))
        print(f"  measured {v['name']}: {json.dumps(row)}", flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    base = next(r for r in rows if r["name"] == "float32")
    lines = ["| model | weights MB | SavedModel MB | serving peak RSS MB | tok/s b=1 | "
             "tok/s b=16 | held-out bits/byte |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        if "weights_bytes" not in r:
            lines.append(f"| {r['name']} | {r['note']} | | | | | |")
            continue
        ratio = base["weights_bytes"] / r["weights_bytes"]
        change = 100 * (r["bits_per_byte"] / base["bits_per_byte"] - 1)
        lines.append(
            f"| {r['name']} | {r['weights_bytes'] / 1e6:.1f} ({ratio:.2f}x smaller) | "
            f"{r['savedmodel_bytes'] / 1e6:.1f} | {r['serving_peak_rss_mb']:.0f} | "
            f"{r['tokens_per_s_b1']:.1f} | {r['tokens_per_s_b16']:.1f} | "
            f"{r['bits_per_byte']:.4f} ({change:+.2f}%) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", default=str(PROJECT_ROOT / "runs" / "tinyshakespeare-cpu_small"),
                        help="the main job's output directory (deepseek-tfx run --output)")
    parser.add_argument("--lora-steps", type=int, default=100)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", help="also write the rows as JSON here")
    parser.add_argument("--serve-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_child:
        print(json.dumps(serve_child(args.serve_child, args.max_new_tokens)))
        return
    from common import memory

    memory.use_system_allocator()
    with tempfile.TemporaryDirectory() as work:
        print(f"variants of {args.run}:", flush=True)
        variants, config, eval_data = build_variants(args.run, work, args.lora_steps)
        rows = measure(variants, config, eval_data, args.max_new_tokens)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
