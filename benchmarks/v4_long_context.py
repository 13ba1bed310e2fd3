"""Long context: V3 (MLA), V3.2 (MLA + DSA) and V4 (SWA/CSA/HCA) prefill, decode, KV bytes, a step.

  python benchmarks/v4_long_context.py [--lengths 1024 16384 65536 131072]
      [--train-lengths 1024 4096 16384 32768] [--decode-lengths 1024 65536 131072]
      [--families v3 v32 v4] [--chunk 1024] [--repeats 3] [--memory-gb 16]
      [--max-dense-length 65536] [--max-length v32=16384 ...]
      [--decode-cache prefill|random] [--recompute]
      [--json out.json] [--quick]

Three models of the same width, random weights (speed does not depend on them), float32, batch 1:

  v3   `deepseek_preset("cpu_small")` (models/deepseek): hidden 256, 4 layers, 4 heads, MLA
       with kv_lora_rank 64, qk 32 + 16 (rope), v 32, 8 routed experts top-2 + 1 shared
       (first layer dense), vocab 8192, no MTP.
  v32  v3 with DeepSeek Sparse Attention (DeepSeek-V3.2): q_lora_rank 128 (the indexer reads
       the query latent), a lightning indexer of 4 x 32 keeping V3.2's released
       index_topk 2,048 tokens per query.
  v4   `deepseek_v4_preset("cpu_small_v4")` (models/deepseek_v4) with the released
       long-context settings: hidden 256, 4 layers (sliding, CSA, HCA, CSA), 4 heads x
       head_dim 64, one shared KV head, sliding_window 128, CSA rate 4 with the lightning
       indexer (4 x 32, index_topk 512), HCA rate 128, hc_mult 4, 8 experts top-2 (layer 0
       hash-routed), no MTP.
Each model runs with its config's `attn_implementation` (sparse for V3.2 and V4 by
default); `--set-impl dense` measures the masked reference instead.

Every measurement runs in a child process of its own (the same script with `--cell`), so
its peak RSS (`ru_maxrss`) is its own. For each length T:
  prefill   `call_with_cache` of T random tokens into a fresh `init_cache(1, T + 64)`, in
            chunks of `--chunk` tokens (0 = the whole prompt in one call), compiled
            (tf.function, input width unknown: one trace serves every chunk); one untimed
            warm-up chunk compiles it, then the median of `--repeats` timed prefills;
  KV bytes  per token: the bytes of `init_cache(1, T)`'s buffers / T (V3 and V3.2: the
            latent cache, L x (kv_lora_rank + qk_rope_head_dim [+ index_head_dim]) numbers
            per token; V4: its buffers, `memory_plan.allocated_cache_items`), and for V4
            also a deployment's bounded cache (`memory_plan.kv_cache_bytes`, float32) / T;
  decode    at `--decode-lengths`: after one (untimed) prefill of T tokens (or, with
            `--decode-cache random`, the cache's buffers filled with random numbers), 64
            single-token `call_with_cache` steps (compiled); the median ms per token; and,
            in the same process, the same at 1,024 tokens, the steps of the two caches
            alternating in rounds of 8, for the ratio T : 1,024 (the "x 1K" column: two
            processes' medians drift up to 25% apart, one process's ratio does not);
  train     at `--train-lengths`: one compiled forward + backward (`compute_loss` and
            `tape.gradient` over the trainable variables, no optimizer), median as above;
            with `--recompute`, each decoder block's activations are recomputed in the
            backward pass (`recompute_blocks`, the trainer's `train.recompute_activations`).
Then the exponent b of time ~ a T^b (least squares on log-log over the measured lengths).

A dense-attention model (v3, or any `--set-impl dense`) is skipped past
`--max-dense-length` tokens or when its score matrices would not fit `--memory-gb` (an
estimate: 4 float32 copies, per layer kept for backward in training), with the reason
printed; so are a family's prefill and training cells past its `--max-length FAMILY=T`
(e.g. V3.2's gathered prefill, which moves T x index_topk latents, past 16K; its decode
cells still run), and a child that fails (the reason is its
last error line). Prints tables and
one JSON object (also written to `--json`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PROJECT_ROOT)

GIB = 2**30


FAMILIES = ("v3", "v32", "v4")
DECODE_STEPS = 64  # a median of 64 steps: 16 left +-20% between runs
DECODE_REFERENCE = 1024  # each decode cell also times this length, interleaved (the ratio)


def configs(quick: bool, max_len: int, impl: str = "") -> dict:
    """{family: config} of the same width (module docstring)."""
    from models.deepseek.deepseek_presets import deepseek_preset
    from models.deepseek_v4.config import CSA, HCA
    from models.deepseek_v4.presets import deepseek_v4_preset

    if quick:  # tiny widths for a smoke run
        v3 = deepseek_preset("tiny").replace(max_position_embeddings=max_len,
                                             num_nextn_predict_layers=0)
        v32 = v3.replace(q_lora_rank=32, index_topk=32, index_n_heads=2, index_head_dim=16)
        v4 = deepseek_v4_preset("tiny_v4").replace(
            max_position_embeddings=max_len, sliding_window=16,
            compress_rates={CSA: 4, HCA: 16}, index_topk=8, num_nextn_predict_layers=0)
    else:
        v3 = deepseek_preset("cpu_small").replace(max_position_embeddings=max_len)
        v32 = v3.replace(q_lora_rank=128, index_topk=2048, index_n_heads=4, index_head_dim=32)
        v4 = deepseek_v4_preset("cpu_small_v4").replace(
            max_position_embeddings=max_len, sliding_window=128,
            compress_rates={CSA: 4, HCA: 128}, index_topk=512, num_nextn_predict_layers=0)
    out = {"v3": v3, "v32": v32, "v4": v4}
    if impl:
        for family in ("v32", "v4"):
            if "attn_implementation" in {f for f in out[family].to_dict()}:
                out[family] = out[family].replace(attn_implementation=impl)
    return out


def is_dense(family: str, config) -> bool:
    return family == "v3" or getattr(config, "attn_implementation", "dense") == "dense"


def attention_bytes(family: str, config, queries: int, capacity: int, train: bool,
                    recompute: bool = False) -> int:
    """Estimated peak bytes of the score matrices of one call (module docstring): float32
    (H, queries, keys) x 4 copies; in training every layer's are kept for backward (one
    layer's at a time with `recompute`, block activations recomputed). The
    sparse paths count the keys each query scores (and V3.2's indexer, every key)."""
    from models.deepseek_v4.config import CSA, HCA

    heads = config.num_attention_heads
    if family in ("v3", "v32") and is_dense(family, config):
        keys = [capacity] * config.num_hidden_layers
    elif family == "v32":  # the indexer scores every key; MLA attends the top-k
        keys = [config.index_topk + config.index_n_heads * capacity // heads
                ] * config.num_hidden_layers
    elif is_dense(family, config):
        window = capacity if train else config.sliding_window - 1 + queries
        keys = [window + (capacity // config.compress_rates[t] + 1 if t in (CSA, HCA) else 0)
                for t in config.layer_types]
    else:  # the indexer scores its entries a block of queries at a time, kept for nothing
        window = 2 * config.sliding_window if train else config.sliding_window - 1 + queries
        keys = [window + {CSA: config.index_topk,
                          HCA: capacity // config.compress_rates[HCA] + 1}.get(t, 0)
                for t in config.layer_types]
    per_layer = [4 * 4 * heads * queries * k for k in keys]
    return sum(per_layer) if train and not recompute else max(per_layer)


def cache_bytes(cache) -> int:
    import tensorflow as tf
    return sum(int(t.shape.num_elements()) * t.dtype.size for t in tf.nest.flatten(cache))


def timed(fn, repeats: int, warm_up: bool = True) -> list[float]:
    """One untimed warm-up call (unless not `warm_up`), then `repeats` timed calls
    (seconds)."""
    if warm_up:
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def measure_prefill(model, length: int, chunk: int, repeats: int) -> dict:
    """Prefill ms (median of `repeats`) and KV bytes per token."""
    import numpy as np
    import tensorflow as tf

    vocab = model.config.vocab_size
    tokens = tf.constant(np.random.default_rng(length).integers(0, vocab, (1, length)),
                         tf.int32)
    step = _compiled_step(model, length)
    size = chunk or length

    def prefill():
        cache = model.init_cache(1, length)
        for start in range(0, length, size):
            logits, cache = step(tokens[:, start:start + size], cache,
                                 tf.constant(start, tf.int32))
        logits.numpy()

    # The warm-up compiles the step: one chunk, not a whole (long) prefill.
    step(tokens[:, :size], model.init_cache(1, length), tf.constant(0, tf.int32))
    times = timed(prefill, repeats, warm_up=False)
    return {"ms": round(1000 * statistics.median(times), 2),
            "kv_bytes_per_token": cache_bytes(model.init_cache(1, length)) / length}


def _compiled_step(model, capacity: int):
    """`call_with_cache` compiled for caches of `capacity` positions, (1, T) tokens of any
    T, the cache written in place, as `generate` and chat write it."""
    import tensorflow as tf

    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                 model.init_cache(1, capacity))
    return tf.function(functools.partial(model.call_with_cache, in_place=True),
                       input_signature=[tf.TensorSpec([1, None], tf.int32), spec,
                                        tf.TensorSpec([], tf.int32)])


def measure_decode(model, length: int, chunk: int, random_cache: bool) -> dict:
    """ms per decoded token after T = `length` tokens, and after DECODE_REFERENCE tokens in
    the same process: DECODE_STEPS single-token steps at each, in rounds of 8 that
    alternate between the two caches, so the ratio carries no drift between processes
    (measured up to 25% between two runs of one cell). Each cache starts from a prefill
    of its T random tokens (untimed, chunks of `chunk`), or with `random_cache` from its
    buffers filled with random numbers (decode's cost does not depend on the values)."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(length)
    runs = []
    for n in dict.fromkeys([length, DECODE_REFERENCE]):  # the cell's length first
        capacity = n + DECODE_STEPS + 1
        step = _compiled_step(model, capacity)
        tokens = tf.constant(rng.integers(0, model.config.vocab_size, (1, n)), tf.int32)
        if random_cache:
            cache = tf.nest.map_structure(
                lambda t: tf.constant(rng.standard_normal(t.shape.as_list()), t.dtype),
                model.init_cache(1, capacity))
        else:
            cache = model.init_cache(1, capacity)
            for start in range(0, n, chunk or n):
                _, cache = step(tokens[:, start:start + (chunk or n)], cache,
                                tf.constant(start, tf.int32))
        # The first step compiles the (1, 1) shape, untimed.
        _, cache = step(tokens[:, -1:], cache, tf.constant(n, tf.int32))
        runs.append({"n": n, "step": step, "cache": cache, "at": n + 1, "times": []})
    token = tf.constant([[1]], tf.int32)
    for _ in range(DECODE_STEPS // 8):
        for run in runs:
            for _ in range(8):
                start = time.perf_counter()
                logits, run["cache"] = run["step"](token, run["cache"],
                                                   tf.constant(run["at"], tf.int32))
                logits.numpy()
                run["times"].append(time.perf_counter() - start)
                run["at"] += 1
    ms = [1000 * statistics.median(run["times"]) for run in runs]
    return {"decode_ms_per_token": round(ms[0], 3),
            f"decode_ms_per_token_at_{DECODE_REFERENCE}": round(ms[-1], 3),
            "decode_ratio": round(ms[0] / ms[-1], 3)}


def measure_train(model, length: int, repeats: int, recompute: bool = False) -> dict:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(length)
    ids = rng.integers(0, model.config.vocab_size, (1, length + 1))
    x, y = tf.constant(ids[:, :-1], tf.int32), tf.constant(ids[:, 1:], tf.int32)

    @tf.function
    def grad_step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x, y, training=True, recompute_blocks=recompute)["loss"]
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


def build_model(family: str, config):
    import keras
    import numpy as np

    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek_v4 import hash_routing
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM

    keras.utils.set_random_seed(0)
    if family != "v4":
        return DeepSeekCausalLM(config)
    model = DeepSeekV4CausalLM(config)
    # The hash layers route by a balanced table (uniform counts), not the zeros the
    # constructor leaves, which would send every token to expert 0.
    hash_routing.assign_tid2eid(model, hash_routing.balanced_tid2eid(
        np.ones(config.vocab_size), config.n_routed_experts, config.num_experts_per_tok))
    return model


def run_cell(args) -> dict:
    """`--cell family:kind:length` in this process: one measurement and its peak RSS."""
    family, kind, length = args.cell.split(":")
    length = int(length)
    config = configs(args.quick, args.max_len, args.set_impl)[family]
    model = build_model(family, config)
    if kind == "train":
        got = measure_train(model, length, args.repeats, args.recompute)
    elif kind == "decode":
        got = measure_decode(model, length, args.chunk, args.decode_cache == "random")
    else:
        got = measure_prefill(model, length, args.chunk, args.repeats)
    got["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6, 3)
    return got


def run(args) -> dict:
    from models.deepseek_v4 import memory_plan

    cfgs = configs(args.quick, args.max_len, args.set_impl)
    limit = args.memory_gb * GIB
    result = {"configs": {f: cfgs[f].to_dict() for f in args.families}, "chunk": args.chunk,
              "repeats": args.repeats, "recompute": args.recompute,
              "prefill": [], "decode": [], "train": [],
              "skipped": []}

    def cell(kind, family, length):
        config = cfgs[family]
        queries = length if kind == "train" else min(args.chunk or length, length)
        estimate = attention_bytes(family, config, queries, length, kind == "train",
                                   args.recompute)
        reason = None
        if is_dense(family, config) and length > args.max_dense_length:
            reason = f"dense attention past --max-dense-length {args.max_dense_length}"
        elif kind != "decode" and length > args.max_length.get(family, length):
            reason = f"past --max-length {family}={args.max_length[family]}"
        elif estimate > limit:
            reason = (f"~{estimate / GIB:.1f} GiB of attention scores > --memory-gb "
                      f"{args.memory_gb}")
        if reason is None:
            command = [sys.executable, os.path.abspath(__file__), "--cell",
                       f"{family}:{kind}:{length}", "--chunk", str(args.chunk), "--repeats",
                       str(args.repeats), "--max-len", str(args.max_len)]
            command += ["--quick"] if args.quick else []
            command += ["--set-impl", args.set_impl] if args.set_impl else []
            command += ["--decode-cache", args.decode_cache]
            command += ["--recompute"] if args.recompute else []
            done = subprocess.run(command, capture_output=True, text=True)
            lines = done.stdout.strip().splitlines()
            if done.returncode == 0 and lines:
                got = json.loads(lines[-1])
                print(f"{kind} {family} T={length}: {got}", flush=True)
                return got
            errors = [x for x in done.stderr.splitlines() if "Error" in x] or [
                f"exit {done.returncode}"]
            reason = f"failed: {errors[-1][:300]}"
        reason = f"{kind} {family} T={length}: skipped, {reason}"
        print(reason, flush=True)
        result["skipped"].append(reason)
        return None

    for kind, lengths in (("prefill", args.lengths), ("decode", args.decode_lengths),
                          ("train", args.train_lengths)):
        for length in lengths:
            row = {"length": length}
            for family in args.families:
                got = cell(kind, family, length) or {}
                row[f"{family}_ms"] = got.get("decode_ms_per_token" if kind == "decode"
                                              else "ms")
                row[f"{family}_peak_rss_gb"] = got.get("peak_rss_gb")
                if kind == "decode":
                    row[f"{family}_ratio"] = got.get("decode_ratio")
                if kind == "prefill":
                    row[f"{family}_kv_bytes_per_token"] = got.get("kv_bytes_per_token")
            if kind == "prefill" and "v4" in args.families:
                row["v4_deployment_kv_bytes_per_token"] = round(
                    memory_plan.kv_cache_bytes(cfgs["v4"], length, 4) / length, 2)
            result[kind].append(row)
    for kind in ("prefill", "decode", "train"):
        result[f"{kind}_exponent"] = {
            f: exponent({r["length"]: r[f"{f}_ms"] for r in result[kind]})
            for f in args.families}
    return result


def print_tables(result: dict, families) -> None:
    def fmt(x, spec=",.1f"):
        return "skipped" if x is None else format(x, spec)

    names = {"v3": "V3", "v32": "V3.2", "v4": "V4"}
    for kind, unit in (("prefill", "prefill ms"), ("decode", "decode ms/token"),
                       ("train", "train step ms")):
        extra = ""
        if kind == "prefill":
            extra = "".join(f" {names[f]} KV B/token |" for f in families)
            extra += " V4 KV B/token (bounded) |" if "v4" in families else ""
        head = "".join(f" {names[f]} {unit} | {names[f]} GB |" for f in families)
        if kind == "decode":
            extra = "".join(f" {names[f]} x 1K (same process) |" for f in families)
        print(f"\n| length |{head}{extra}")
        print("|---:|" + "---:|" * (2 * len(families) + extra.count("|")))
        for r in result[kind]:
            cells = "".join(f" {fmt(r[f'{f}_ms'], ',.2f' if kind == 'decode' else ',.0f')} |"
                            f" {fmt(r[f'{f}_peak_rss_gb'], '.2f')} |" for f in families)
            if kind == "decode":
                cells += "".join(f" {fmt(r[f'{f}_ratio'], '.2f')} |" for f in families)
            if kind == "prefill":
                cells += "".join(f" {fmt(r[f'{f}_kv_bytes_per_token'], ',.0f')} |"
                                 for f in families)
                if "v4" in families:
                    cells += f" {fmt(r['v4_deployment_kv_bytes_per_token'], ',.1f')} |"
            print(f"| {r['length']:,} |{cells}")
        e = result[f"{kind}_exponent"]
        print(f"{kind} time ~ T^b: " + ", ".join(f"{names[f]} b = {e[f]}" for f in families))


def _family_length(ap, text: str) -> tuple[str, int]:
    """("v32", 16384) from "v32=16384"; an argparse error naming the bad value."""
    family, _, length = text.partition("=")
    if family not in FAMILIES or not length.isdigit():
        ap.error(f"--max-length {text!r}: expected FAMILY=T with FAMILY one of "
                 f"{', '.join(FAMILIES)} and T a number of tokens")
    return family, int(length)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", type=int, nargs="*", default=[1024, 4096, 16384, 65536, 131072])
    ap.add_argument("--decode-lengths", type=int, nargs="*", default=[1024, 65536, 131072])
    ap.add_argument("--train-lengths", type=int, nargs="*",
                    default=[1024, 4096, 16384, 32768])
    ap.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    ap.add_argument("--chunk", type=int, default=1024,
                    help="prefill chunk in tokens (0: the whole prompt in one call)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs (median) after 1 warm-up")
    ap.add_argument("--memory-gb", type=float, default=16.0,
                    help="skip runs whose estimated attention scores exceed this")
    ap.add_argument("--max-dense-length", type=int, default=65536,
                    help="skip dense-attention models past this many tokens")
    ap.add_argument("--max-length", nargs="*", default=[], metavar="FAMILY=T",
                    help="skip FAMILY's prefill and training cells past T tokens")
    ap.add_argument("--set-impl", choices=["sparse", "dense"], default="",
                    help="attn_implementation of V3.2 and V4 (default: their configs')")
    ap.add_argument("--json", default="", help="also write the JSON result here")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: tiny models, lengths 64/256, train 64/128, 1 repeat")
    ap.add_argument("--decode-cache", choices=["prefill", "random"], default="prefill",
                    help="what decode steps start from: a real (untimed) prefill of T tokens, "
                         "or the same buffers filled with random numbers (decode's cost does "
                         "not depend on the values; skips a long prefill)")
    ap.add_argument("--recompute", action="store_true",
                    help="train steps recompute each block's activations in backward")
    ap.add_argument("--cell", default="", help=argparse.SUPPRESS)  # family:kind:length
    ap.add_argument("--max-len", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.max_length = dict(_family_length(ap, x) for x in args.max_length)
    if args.quick and not args.cell:
        args.lengths, args.decode_lengths = [64, 256], [64, 256]
        args.train_lengths, args.repeats = [64, 128], 1
        args.chunk = min(args.chunk, 64) if args.chunk else 0
    args.max_len = args.max_len or max(args.lengths + args.train_lengths + args.decode_lengths
                                       ) + 2 * DECODE_STEPS
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.cell:
        print(json.dumps(run_cell(args)))
        return 0
    result = run(args)
    print_tables(result, args.families)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
