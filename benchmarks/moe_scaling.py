"""How a training step's graph and start-up grow with the number of routed experts.

  python benchmarks/moe_scaling.py [--experts 8,64,256] [--dispatch dropless,capacity]
      [--steps 20] [--repo DIR] [--import-checkpoints DIR[,DIR...]]

The model of the stacked-experts issue: 4 blocks (block 0 dense, blocks 1-3 MoE),
hidden 64, expert width 16, top-2 of E routed experts (no groups) plus one shared
expert, no MTP, on random tokens, batch 8 x 63; only E changes. One gradient step
(`compute_loss`, the gradient of every weight, SGD applied) in one `tf.function`,
each (E, dispatch) in a fresh process, one after the other, and one JSON object
printed:

  graph_ops      nodes of the step's graph, the function library included (the
                 gradient and loop bodies are functions of their own)
  trace_s        `get_concrete_function`: tracing the step
  first_call_s   the first call (graph optimization and the first run)
  step_ms        median wall time of the next `--steps` calls
  ratio_vs_<E0>  each figure over the smallest E's, per dispatch

`--import-checkpoints` instead imports each Hugging Face checkpoint with
`hf_interop.hf_import(..., dtype="float32")` (what `deepseek-tfx hf-import --dtype
float32` runs), each in a fresh process: `import_s` is that call's wall time (TensorFlow
already imported), `saved_model_pb_bytes` the size of the SavedModel's graph, and
`variables_bytes` that of its weights (e.g. tests/fixtures/hf_deepseek_v3_256/experts_256
and experts_8: DeepSeek-V3's expert layout at small widths, and the same with 8 experts).

`--repo DIR` imports the model from another checkout (e.g. a worktree of the
commit before a change, to measure it side by side in one run). The code uses only
`DeepSeekCausalLM`, `DeepSeekConfig` and `compute_loss`, which both layouts share.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measure(n_experts: int, dispatch: str, steps: int) -> dict:
    """One (E, dispatch) run in this process; see the module docstring."""
    import numpy as np
    import tensorflow as tf

    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek.config import DeepSeekConfig

    config = DeepSeekConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=4, first_k_dense_replace=1,
        max_position_embeddings=64, num_attention_heads=4, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, intermediate_size=128,
        moe_intermediate_size=16, n_routed_experts=n_experts, num_experts_per_tok=2,
        n_group=1, topk_group=1, n_shared_experts=1, num_nextn_predict_layers=0,
        tie_word_embeddings=True)
    tf.random.set_seed(0)
    model = DeepSeekCausalLM(config)
    model(tf.zeros([1, 4], tf.int32))
    capacity = 1.25 if dispatch == "capacity" else None
    ids = tf.constant(np.random.default_rng(0).integers(3, 512, size=(8, 64)), tf.int32)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(ids[:, :-1], ids[:, 1:],
                                      moe_capacity_factor=capacity)["loss"]  # (8, 63) tokens
        variables = model.trainable_variables
        for v, g in zip(variables, tape.gradient(loss, variables), strict=True):
            if g is not None:
                v.assign_sub(1e-3 * tf.convert_to_tensor(g))
        return loss

    t0 = time.perf_counter()
    concrete = step.get_concrete_function(ids)
    trace = time.perf_counter() - t0
    graph_def = concrete.graph.as_graph_def()
    ops = len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)
    t0 = time.perf_counter()
    step(ids).numpy()
    first = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step(ids).numpy()
        times.append(time.perf_counter() - t0)
    return {"experts": n_experts, "dispatch": dispatch, "graph_ops": ops,
            "trace_s": round(trace, 2), "first_call_s": round(first, 2),
            "step_ms": round(1000 * statistics.median(times), 1)}


def measure_import(checkpoint: str) -> dict:
    """hf_import of `checkpoint` into a temporary directory, timed; see the docstring."""
    import tempfile

    import tensorflow  # noqa: F401  (imported before the clock starts)

    from savedmodel.hf_interop import hf_import

    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        hf_import(checkpoint, os.path.join(out, "model"), dtype="float32")
        elapsed = time.perf_counter() - t0
        model = os.path.join(out, "model")
        variables = os.path.join(model, "variables")
        return {"checkpoint": checkpoint, "import_s": round(elapsed, 2),
                "saved_model_pb_bytes": os.path.getsize(os.path.join(model, "saved_model.pb")),
                "variables_bytes": sum(os.path.getsize(os.path.join(variables, f))
                                       for f in os.listdir(variables))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--experts", default="8,64,256")
    parser.add_argument("--dispatch", default="dropless,capacity")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repo", default=ROOT, help="the checkout whose model is measured")
    parser.add_argument("--import-checkpoints", help="HF checkpoint directories to import")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # "E,dispatch": a child run
    parser.add_argument("--one-import", help=argparse.SUPPRESS)  # a checkpoint: a child run
    args = parser.parse_args(argv)
    if args.one or args.one_import:
        sys.path.insert(0, args.repo)
        if args.one_import:
            print(json.dumps(measure_import(args.one_import)))
            return
        n, dispatch = args.one.split(",")
        print(json.dumps(measure(int(n), dispatch, args.steps)))
        return
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    if args.import_checkpoints:
        runs = []
        for checkpoint in args.import_checkpoints.split(","):
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--one-import",
                 os.path.abspath(checkpoint), "--repo", os.path.abspath(args.repo)],
                check=True, capture_output=True, text=True, env=env, cwd=args.repo)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        for run in runs:
            run["ratio_vs_first"] = {key: round(run[key] / runs[0][key], 2) for key in
                                     ("import_s", "saved_model_pb_bytes", "variables_bytes")}
        print(json.dumps({"repo": os.path.abspath(args.repo), "imports": runs}, indent=1))
        return
    experts = [int(e) for e in args.experts.split(",")]
    runs = []
    for dispatch in args.dispatch.split(","):
        for n in experts:
            out = subprocess.run(
                [sys.executable, os.path.abspath(__file__), "--one", f"{n},{dispatch}",
                 "--steps", str(args.steps), "--repo", os.path.abspath(args.repo)],
                check=True, capture_output=True, text=True, env=env, cwd=args.repo)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    for run in runs:
        base = next(r for r in runs if r["dispatch"] == run["dispatch"]
                    and r["experts"] == experts[0])
        run[f"ratio_vs_{experts[0]}"] = {
            key: round(run[key] / base[key], 2) for key in
            ("graph_ops", "trace_s", "first_call_s", "step_ms")}
    print(json.dumps({"repo": os.path.abspath(args.repo), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
