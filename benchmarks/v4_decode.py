"""DeepSeek-V4 cached decoding: time per generated token after a short and a long prompt.

  python benchmarks/v4_decode.py [--prompt-lengths 256 4096] [--new-tokens 32]
      [--warmup 4] [--repeats 3] [--prefill-chunk 512] [--batch 1]

Builds a small `DeepSeekV4CausalLM` with random weights (speed does not depend on the
weights) that has every layer type (sliding window 128, CSA at rate 4 with a lightning
indexer keeping index_topk 512, HCA at rate 128), prefills each prompt through
`call_with_cache` (in chunks of `--prefill-chunk`), then times a compiled (tf.function)
one-token decode step on the cache: `--warmup` untimed steps, then `--new-tokens` greedy
steps, best of `--repeats` (the cache is reset to the prefilled one each repeat).

With the cache a step projects one token and attends over the sliding window plus the
compressed entries (O(W + S/m) per layer, not O(S)), so the time per token should grow
little with the prompt; the acceptance is the longest prompt within 2x of the shortest.
Prints one JSON object: ms per token at each prompt length and the ratio of the longest
to the shortest.
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import numpy as np
import tensorflow as tf

from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config


def bench_config(max_positions: int) -> DeepSeekV4Config:
    """A small V4 with one layer of each type per group (sliding, CSA, HCA) x 2."""
    return DeepSeekV4Config(
        vocab_size=4096, hidden_size=256, moe_intermediate_size=256, num_hidden_layers=6,
        num_attention_heads=4, head_dim=128, q_lora_rank=128, qk_rope_head_dim=32,
        n_routed_experts=8, num_experts_per_tok=2,
        layer_types=(SLIDING, CSA, HCA, SLIDING, CSA, HCA), compress_rates={CSA: 4, HCA: 128},
        mlp_layer_types=("hash_moe", "moe", "moe", "moe", "moe", "moe"), hc_mult=4,
        sliding_window=128, o_groups=2, o_lora_rank=64, index_n_heads=4, index_head_dim=64,
        index_topk=512, max_position_embeddings=max_positions)


def decode_seconds_per_token(model, prompt_len: int, new_tokens: int, warmup: int,
                             repeats: int, prefill_chunk: int, batch: int) -> float:
    """Best mean wall time (s) of one compiled decode step after a prompt_len prompt."""
    rng = np.random.default_rng(prompt_len)
    vocab = model.config.vocab_size
    prompt = rng.integers(0, vocab, (batch, prompt_len)).astype(np.int32)
    capacity = prompt_len + warmup + new_tokens
    cache = model.init_cache(batch, capacity)
    cache_spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), cache)
    prefill = tf.function(model.call_with_cache, input_signature=[
        tf.TensorSpec([batch, None], tf.int32), cache_spec, tf.TensorSpec([], tf.int32)])
    for start in range(0, prompt_len, prefill_chunk):
        chunk = prompt[:, start:start + prefill_chunk]
        logits, cache = prefill(tf.constant(chunk), cache, tf.constant(start, tf.int32))

    @tf.function(input_signature=[tf.TensorSpec([batch], tf.int32), cache_spec,
                                  tf.TensorSpec([], tf.int32)])
    def step(token, cache, index):
        logits, cache = model.call_with_cache(token[:, None], cache, index)  # (B, 1, V)
        return tf.argmax(logits[:, -1], axis=-1, output_type=tf.int32), cache

    first = tf.argmax(logits[:, -1], axis=-1, output_type=tf.int32)  # (B,)
    prefilled = cache
    best = float("inf")
    for _ in range(repeats):
        token, cache, index = first, prefilled, prompt_len
        for _ in range(warmup):
            token, cache = step(token, cache, tf.constant(index, tf.int32))
            index += 1
        token.numpy()
        start = time.perf_counter()
        for _ in range(new_tokens):
            token, cache = step(token, cache, tf.constant(index, tf.int32))
            index += 1
        token.numpy()
        best = min(best, (time.perf_counter() - start) / new_tokens)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt-lengths", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args(argv)
    longest = max(args.prompt_lengths) + args.warmup + args.new_tokens
    keras.utils.set_random_seed(0)
    model = DeepSeekV4CausalLM(bench_config(max(longest, 4096 + 64)))
    ms = {}
    for length in args.prompt_lengths:
        seconds = decode_seconds_per_token(model, length, args.new_tokens, args.warmup,
                                           args.repeats, args.prefill_chunk, args.batch)
        ms[length] = round(seconds * 1000, 2)
    short, long = min(args.prompt_lengths), max(args.prompt_lengths)
    print(json.dumps({
        "config": "hidden 256, 6 layers (sliding/CSA/HCA x 2), window 128, CSA 4, HCA 128, "
                  "index_topk 512, 8 experts top-2, hc_mult 4",
        "batch": args.batch, "new_tokens": args.new_tokens,
        "ms_per_token": {str(k): v for k, v in ms.items()},
        f"ratio_{long}_to_{short}": round(ms[long] / ms[short], 3),
    }, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
