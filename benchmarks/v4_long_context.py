"""Long context: V3-style (MLA) against V4-style (SWA/CSA/HCA) prefill time, KV bytes and a step.

  python benchmarks/v4_long_context.py [--lengths 1024 4096 16384] [--train-lengths 1024 4096]
      [--chunk 1024] [--repeats 3] [--memory-gb 16] [--json out.json] [--quick]

Two models of the same width, random weights (speed does not depend on them), float32, batch 1:

  V3  `deepseek_preset("cpu_small")` (models/deepseek): hidden 256, 4 layers, 4 heads, MLA
      with kv_lora_rank 64, qk 32 + 16 (rope), v 32, 8 routed experts top-2 + 1 shared
      (first layer dense), vocab 8192, no MTP.
  V4  `deepseek_v4_preset("cpu_small_v4")` (models/deepseek_v4) with the released long-context
      settings: hidden 256, 4 layers (sliding, CSA, HCA, CSA), 4 heads x head_dim 64, one
      shared KV head, sliding_window 128, CSA rate 4 with the lightning indexer (4 x 32,
      index_topk 512), HCA rate 128, hc_mult 4, 8 experts top-2 (layer 0 hash-routed), no MTP.

For each length T:
  prefill   `call_with_cache` of T random tokens into a fresh `init_cache(1, T)`, in chunks of
            `--chunk` tokens (0 = the whole prompt in one call), compiled (tf.function); one
            untimed warm-up, then the median of `--repeats` timed runs;
  KV bytes  per token: the bytes of `init_cache(1, T)`'s buffers / T (V3: the latent cache,
            L x (kv_lora_rank + qk_rope_head_dim) numbers per token; V4: the position-indexed
            buffers, `memory_plan.allocated_cache_items`), and for V4 also a deployment's
            bounded cache (`memory_plan.kv_cache_bytes`, float32 entries and state) / T;
  train     at `--train-lengths`: one compiled forward + backward (`compute_loss` and
            `tape.gradient` over the trainable variables, no optimizer), median as above.
Then the exponent b of time ~ a T^b (least squares on log-log over the measured lengths).

A run whose largest attention tensors would not fit `--memory-gb` (an estimate: 4 float32
copies of the score matrix, per layer kept for backward in training) is skipped with the
reason printed, as is one that raises ResourceExhaustedError. Prints a table and one JSON
object (also written to `--json`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PROJECT_ROOT)

GIB = 2**30


def configs(quick: bool, max_len: int):
    """(V3 DeepSeekConfig, V4 DeepSeekV4Config) of the same width (module docstring)."""
    from models.deepseek.deepseek_presets import deepseek_preset
    from models.deepseek_v4.config import CSA, HCA
    from models.deepseek_v4.presets import deepseek_v4_preset

    if quick:  # tiny widths for a smoke run
        v3 = deepseek_preset("tiny").replace(max_position_embeddings=max_len,
                                             num_nextn_predict_layers=0)
        v4 = deepseek_v4_preset("tiny_v4").replace(
            max_position_embeddings=max_len, sliding_window=16,
            compress_rates={CSA: 4, HCA: 16}, index_topk=8, num_nextn_predict_layers=0)
        return v3, v4
    v3 = deepseek_preset("cpu_small").replace(max_position_embeddings=max_len)
    v4 = deepseek_v4_preset("cpu_small_v4").replace(
        max_position_embeddings=max_len, sliding_window=128, compress_rates={CSA: 4, HCA: 128},
        index_topk=512, num_nextn_predict_layers=0)
    return v3, v4


def attention_bytes(family: str, config, queries: int, capacity: int, train: bool) -> int:
    """Estimated peak bytes of the score matrices of one call (module docstring): float32
    (H, queries, keys) x 4 copies; in training every layer's are kept for backward."""
    from models.deepseek_v4.config import CSA, HCA

    heads = config.num_attention_heads
    if family == "v3":
        keys = [capacity] * config.num_hidden_layers
    else:
        window = capacity if train else config.sliding_window - 1 + queries
        keys = [window + (capacity // config.compress_rates[t] + 1 if t in (CSA, HCA) else 0)
                for t in config.layer_types]
    per_layer = [4 * 4 * heads * queries * k for k in keys]
    return sum(per_layer) if train else max(per_layer)


def cache_bytes(cache) -> int:
    import tensorflow as tf
    return sum(int(t.shape.num_elements()) * t.dtype.size for t in tf.nest.flatten(cache))


def timed(fn, repeats: int) -> list[float]:
    """One untimed warm-up call, then `repeats` timed calls (seconds)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure_prefill(model, length: int, chunk: int, repeats: int) -> dict:
    import numpy as np
    import tensorflow as tf

    vocab = model.config.vocab_size
    tokens = tf.constant(np.random.default_rng(length).integers(0, vocab, (1, length)),
                         tf.int32)
    cache0 = model.init_cache(1, length)
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), cache0)
    step = tf.function(model.call_with_cache, input_signature=[
        tf.TensorSpec([1, None], tf.int32), spec, tf.TensorSpec([], tf.int32)])
    size = chunk or length

    def prefill():
        cache = model.init_cache(1, length)
        for start in range(0, length, size):
            logits, cache = step(tokens[:, start:start + size], cache,
                                 tf.constant(start, tf.int32))
        logits.numpy()

    times = timed(prefill, repeats)
    return {"ms": round(1000 * statistics.median(times), 2),
            "kv_bytes_per_token": cache_bytes(cache0) / length}


def measure_train(model, length: int, repeats: int) -> dict:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(length)
    ids = rng.integers(0, model.config.vocab_size, (1, length + 1))
    x, y = tf.constant(ids[:, :-1], tf.int32), tf.constant(ids[:, 1:], tf.int32)

    @tf.function
    def grad_step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x, y, training=True)["loss"]
        grads = tape.gradient(loss, model.trainable_variables)
        return loss, tf.linalg.global_norm([g for g in grads if g is not None])

    times = timed(lambda: [t.numpy() for t in grad_step(x, y)], repeats)
    return {"ms": round(1000 * statistics.median(times), 2)}


def exponent(points: dict) -> float | None:
    """Least-squares slope of log(ms) against log(T) over {T: ms}; None with < 2 points."""
    pts = [(math.log(t), math.log(ms)) for t, ms in points.items() if ms]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    num = sum((a - mx) * (b - my) for a, b in pts)
    den = sum((a - mx) ** 2 for a, _ in pts)
    return round(num / den, 3)


def run(args) -> dict:
    import keras
    import numpy as np
    import tensorflow as tf

    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek_v4 import hash_routing, memory_plan
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM

    max_len = max(args.lengths + args.train_lengths)
    v3_config, v4_config = configs(args.quick, max_len)
    keras.utils.set_random_seed(0)
    models = {"v3": DeepSeekCausalLM(v3_config), "v4": DeepSeekV4CausalLM(v4_config)}
    # The hash layers route by a balanced table (uniform counts), not the zeros the
    # constructor leaves, which would send every token to expert 0.
    hash_routing.assign_tid2eid(models["v4"], hash_routing.balanced_tid2eid(
        np.ones(v4_config.vocab_size), v4_config.n_routed_experts,
        v4_config.num_experts_per_tok))
    cfgs = {"v3": v3_config, "v4": v4_config}
    limit = args.memory_gb * GIB
    result = {"configs": {"v3": v3_config.to_dict(), "v4": v4_config.to_dict()},
              "chunk": args.chunk, "repeats": args.repeats, "prefill": [], "train": [],
              "skipped": []}

    def guarded(kind, family, length, estimate, fn):
        if estimate > limit:
            reason = (f"{kind} {family} T={length}: skipped, ~{estimate / GIB:.1f} GiB of "
                      f"attention scores > --memory-gb {args.memory_gb}")
            print(reason, flush=True)
            result["skipped"].append(reason)
            return None
        try:
            return fn()
        except tf.errors.ResourceExhaustedError as e:
            reason = f"{kind} {family} T={length}: out of memory ({str(e).splitlines()[0]})"
            print(reason, flush=True)
            result["skipped"].append(reason)
            return None

    for length in args.lengths:
        row = {"length": length}
        for family, model in models.items():
            queries = min(args.chunk or length, length)
            got = guarded("prefill", family, length,
                          attention_bytes(family, cfgs[family], queries, length, False),
                          lambda m=model, t=length: measure_prefill(m, t, args.chunk, args.repeats))
            row[f"{family}_ms"] = got and got["ms"]
            row[f"{family}_kv_bytes_per_token"] = got and got["kv_bytes_per_token"]
            print(f"prefill {family} T={length}: {got}", flush=True)
        row["v4_deployment_kv_bytes_per_token"] = round(
            memory_plan.kv_cache_bytes(v4_config, length, 4) / length, 2)
        result["prefill"].append(row)
    for length in args.train_lengths:
        row = {"length": length}
        for family, model in models.items():
            got = guarded("train", family, length,
                          attention_bytes(family, cfgs[family], length, length, True),
                          lambda m=model, t=length: measure_train(m, t, args.repeats))
            row[f"{family}_ms"] = got and got["ms"]
            print(f"train {family} T={length}: {got}", flush=True)
        result["train"].append(row)
    for kind in ("prefill", "train"):
        result[f"{kind}_exponent"] = {
            f: exponent({r["length"]: r[f"{f}_ms"] for r in result[kind]}) for f in models}
    return result


def print_tables(result: dict) -> None:
    def fmt(x, spec=",.1f"):
        return "skipped" if x is None else format(x, spec)

    print("\n| length | V3 prefill ms | V4 prefill ms | V3 KV bytes/token | "
          "V4 KV bytes/token (init_cache) | V4 KV bytes/token (deployment) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in result["prefill"]:
        print(f"| {r['length']:,} | {fmt(r['v3_ms'])} | {fmt(r['v4_ms'])} | "
              f"{fmt(r['v3_kv_bytes_per_token'], ',.0f')} | "
              f"{fmt(r['v4_kv_bytes_per_token'], ',.0f')} | "
              f"{fmt(r['v4_deployment_kv_bytes_per_token'], ',.1f')} |")
    e = result["prefill_exponent"]
    print(f"prefill time ~ T^b: V3 b = {e['v3']}, V4 b = {e['v4']}"
          f" (chunk {result['chunk'] or 'whole prompt'})")
    print("\n| length | V3 train step ms | V4 train step ms |")
    print("|---:|---:|---:|")
    for r in result["train"]:
        print(f"| {r['length']:,} | {fmt(r['v3_ms'])} | {fmt(r['v4_ms'])} |")
    e = result["train_exponent"]
    print(f"train step time ~ T^b: V3 b = {e['v3']}, V4 b = {e['v4']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    ap.add_argument("--train-lengths", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--chunk", type=int, default=1024,
                    help="prefill chunk in tokens (0: the whole prompt in one call)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (median) after 1 warm-up")
    ap.add_argument("--memory-gb", type=float, default=16.0,
                    help="skip runs whose estimated attention scores exceed this")
    ap.add_argument("--json", default="", help="also write the JSON result here")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: tiny models, lengths 64/128/256, train 64/128, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.lengths, args.train_lengths, args.repeats = [64, 128, 256], [64, 128], 1
        args.chunk = min(args.chunk, 64) if args.chunk else 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    result = run(args)
    print_tables(result)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
