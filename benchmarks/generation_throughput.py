"""Generation speed: absorbed vs expanded MLA cache, and without the cache; FLOPs per token.

  python benchmarks/generation_throughput.py [--preset cpu_small] [--batch 1]
      [--prompt-len 16] [--new-tokens 112] [--repeats 3] [--context 4096] [--no-uncached]

Builds the preset's model with random weights (speed does not depend on the
weights), compiles `models.deepseek.generate` in a `tf.function` once per mode,
and times greedy decoding of `--new-tokens` tokens after a `--prompt-len` prompt:

  absorbed  prefill once, then one token per step through the MLA latent cache,
            attending in the latent space (W_UK and W_UV absorbed; the default)
  expanded  the same, re-expanding the cached latents through kv_b_proj every step
  uncached  every step re-runs the model over the whole prefix

The modes take turns within each repeat (so a busy machine slows them alike);
each reports its best. Prints one JSON object: new tokens/s of each mode and
their ratios; the analytic forward FLOPs per generated token
(`flops.decode_flops_per_token`), absorbed vs expanded, for the preset at its
cache length (prompt + new tokens) with the FLOP/s that the measured speed
implies, and for the `deepseek_v3` preset at `--context` (analytic only: that
model is never built); and the cache bytes per token of context against an
equivalent multi-head-attention cache, for the preset and for DeepSeek-V3
(bfloat16).
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import tensorflow as tf

from config import get_config
from models.deepseek import DeepSeekCausalLM, flops, generate

MODES = {"absorbed": dict(use_cache=True, absorb=True),
         "expanded": dict(use_cache=True, absorb=False),
         "uncached": dict(use_cache=False)}


def compiled_generation(model, new_tokens: int, mode: str):
    """A tf.function of greedy generation in `mode` (see MODES), traced on first call."""
    return tf.function(lambda ids: generate(model, ids, new_tokens, temperature=0.0,
                                            **MODES[mode])[0])


def best_seconds(fns: dict, prompt, repeats: int) -> dict:
    """Best wall time (s) of each compiled call, the calls taking turns in every repeat."""
    for fn in fns.values():
        fn(prompt).numpy()  # trace + warm up
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for mode, fn in fns.items():
            start = time.perf_counter()
            fn(prompt).numpy()
            best[mode] = min(best[mode], time.perf_counter() - start)
    return best


def flops_report(config, context: int) -> dict:
    """Forward FLOPs per generated token at `context`, absorbed vs expanded."""
    absorbed = flops.decode_flops_per_token(config, context, absorbed=True)
    expanded = flops.decode_flops_per_token(config, context, absorbed=False)
    return {"context": context, "absorbed": absorbed, "expanded": expanded,
            "expanded_over_absorbed": round(expanded / absorbed, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="cpu_small")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=112)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=4096,
                        help="context length of the analytic deepseek_v3 FLOPs")
    parser.add_argument("--no-uncached", action="store_true", help="skip the uncached mode")
    args = parser.parse_args()

    config = get_config(args.preset).model
    cache_len = args.prompt_len + args.new_tokens
    if cache_len > config.max_position_embeddings:
        parser.error(f"prompt-len + new-tokens must be <= {config.max_position_embeddings}")
    keras.utils.set_random_seed(0)
    model = DeepSeekCausalLM(config)
    prompt = tf.random.uniform([args.batch, args.prompt_len], 0, config.vocab_size, tf.int32)
    modes = [m for m in MODES if not (args.no_uncached and m == "uncached")]
    seconds = best_seconds({m: compiled_generation(model, args.new_tokens, m) for m in modes},
                           prompt, args.repeats)
    tokens = args.batch * args.new_tokens
    speed = {m: round(tokens / s, 1) for m, s in seconds.items()}
    preset_flops = flops_report(config, cache_len)
    for m in ("absorbed", "expanded"):
        preset_flops[f"{m}_gflop_per_s"] = round(speed[m] * preset_flops[m] / 1e9, 2)
    v3 = get_config("deepseek_v3").model
    report = {
        "preset": args.preset,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens,
        "tokens_per_second": speed,
        "absorbed_over_expanded": round(seconds["expanded"] / seconds["absorbed"], 2),
        **({"cache_speedup": round(seconds["uncached"] / seconds["absorbed"], 2)}
           if "uncached" in seconds else {}),
        "decode_flops_per_token": {args.preset: preset_flops,
                                   "deepseek_v3": flops_report(v3, args.context)},
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
