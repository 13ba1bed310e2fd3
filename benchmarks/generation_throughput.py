"""Generation speed with and without the latent KV cache, and the cache's size.

  python benchmarks/generation_throughput.py [--preset cpu_small] [--batch 1]
      [--prompt-len 16] [--new-tokens 112] [--repeats 3]

Builds the preset's model with random weights (speed does not depend on the
weights), compiles `models.deepseek.generate` in a `tf.function` once per mode,
and times greedy decoding of `--new-tokens` tokens after a `--prompt-len` prompt:

  cached    prefill once, then one token per step through the MLA latent cache
  uncached  every step re-runs the model over the whole prefix

Prints one JSON object: new tokens/s of each mode (best of --repeats), the
speed-up, and the cache bytes per token of context against an equivalent
multi-head-attention cache (full per-head keys and values), for the preset and
for the released DeepSeek-V3 (bfloat16).
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import tensorflow as tf

from models.deepseek import DeepSeekCausalLM, flops, generate
from models.deepseek.config import deepseek_v3_config
from pipeline.configs import get_config


def time_generation(model, prompt, new_tokens: int, use_cache: bool, repeats: int) -> float:
    """Best wall time (s) of one compiled greedy generation call."""
    fn = tf.function(lambda ids: generate(model, ids, new_tokens, temperature=0.0,
                                          use_cache=use_cache)[0])
    fn(prompt).numpy()  # trace + warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn(prompt).numpy()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="cpu_small")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    config = get_config(args.preset).model
    if args.prompt_len + args.new_tokens > config.max_position_embeddings:
        parser.error(f"prompt-len + new-tokens must be <= {config.max_position_embeddings}")
    keras.utils.set_random_seed(0)
    model = DeepSeekCausalLM(config)
    prompt = tf.random.uniform([args.batch, args.prompt_len], 0, config.vocab_size, tf.int32)
    seconds = {mode: time_generation(model, prompt, args.new_tokens, mode == "cached",
                                     args.repeats)
               for mode in ("cached", "uncached")}
    tokens = args.batch * args.new_tokens
    v3 = deepseek_v3_config()
    report = {
        "preset": args.preset,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "cached_tokens_per_second": round(tokens / seconds["cached"], 1),
        "uncached_tokens_per_second": round(tokens / seconds["uncached"], 1),
        "cache_speedup": round(seconds["uncached"] / seconds["cached"], 2),
        "cache_bytes_per_token": {
            args.preset + " float32": {
                "mla_latent": flops.kv_cache_bytes_per_token(config, 4, "mla"),
                "equivalent_mha": flops.kv_cache_bytes_per_token(config, 4, "mha"),
            },
            "deepseek_v3 bfloat16": {
                "mla_latent": flops.kv_cache_bytes_per_token(v3, 2, "mla"),
                "equivalent_mha": flops.kv_cache_bytes_per_token(v3, 2, "mha"),
            },
        },
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
