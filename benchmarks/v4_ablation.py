"""What each V4 piece buys on Tiny Shakespeare: V3 against V4 and three V4 ablations, equal size.

  python benchmarks/v4_ablation.py [--steps 200] [--variants v3,v4,v4_no_mhc,v4_full_attn,
      v4_learned_routing] [--corpus ../shared/corpora/tinyshakespeare.txt] [--json out.json]
      [--peak-gflops G] [--quick]

Variants (all trained the same way, one after the other, each in its own process on the
machine's 2 cores):

  v3                  `deepseek_preset("cpu_small")` (models/deepseek): hidden 256, 4 layers,
                      MLA, 8 experts top-2 + 1 shared, the first layer dense, tied, no MTP.
  v4                  `deepseek_v4_preset("cpu_small_v4")` (models/deepseek_v4): hidden 256,
                      4 layers (sliding, CSA, HCA, CSA; window 32, CSA rate 4 with the indexer
                      keeping 8 entries, HCA rate 32), hc_mult 4, layer 0 hash-routed, tied.
  v4_no_mhc           v4 with hc_mult = 1 (one residual stream: no hyper-connections).
  v4_full_attn        v4 with full causal attention: every layer sliding-window with
                      sliding_window = seq_len (no compressor, no indexer).
  v4_learned_routing  v4 with learned (score) routing in every layer (no hash layer).

Each V4 variant's `moe_intermediate_size` is set (a multiple of 8) so that its total
parameters (`models/deepseek_v4/memory_plan.parameter_summary`) are closest to v3's
(`models/deepseek/flops.total_params`); variants off by more than 5% are refused. The
printed counts are those of the built models.

Data: the corpus's first 90% (by characters) trains a byte-level BPE (Hugging Face
`tokenizers` BpeTrainer, vocab = the V3 preset's vocab_size, byte alphabet, 3 special
tokens) and is the training stream; its last 10% is the held-out tail. Every variant sees
the same batches: `--steps` x batch windows of seq_len + 1 tokens at random offsets (one
seed). Training: the cpu_small train settings (`config/presets.py`: seq_len 128, batch 16,
peak lr 2e-3 to 2e-4, warmup min(50, steps / 4), AdamW with weight decay 0.1 and
beta_2 0.95, global-norm clip 1.0) through the project's optimizer and schedule
(`components/trainer/schedule.make_optimizer`, a keras.optimizers.AdamW); one
`tf.function` step calls `model.compute_loss(x, y)`, clips and applies the gradients, and
updates the routers' biases (`model.update_router_biases(out["expert_load"])`). The V4
variants' hash layers get the Trainer's balanced `tid2eid` of the training tokens' counts
(`models/deepseek_v4/hash_routing.py`).

Reported per variant:
  params              total parameters of the built model (tid2eid tables excluded)
  bits_per_byte       held-out: sum of token NLL in bits / UTF-8 bytes of the scored
                      tokens, over consecutive seq_len windows (each token scored once,
                      given up to seq_len - 1 tokens before it in its window)
  tokens_per_second   batch x seq_len / the median step time (the first 3 steps, which
                      trace, left out)
  mfu                 tokens_per_second x flops_per_token / peak, flops_per_token from
                      models/deepseek/flops.py (v3) or models/deepseek_v4/flops.py (V4,
                      "attended" keys), peak the Trainer's float32 matmul probe
                      (`components/trainer/hardware.peak_flops`) unless --peak-gflops
  mfu_computed        the same with the attention this implementation executes
                      (`counted="computed"`, by `attn_implementation`: V4's sparse path, the
                      default, scores 2 x sliding_window window keys per query plus its CSA
                      picks or every HCA entry; "dense" scores all T tokens and entries)
Prints a Markdown table and one JSON object (also written to `--json`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PROJECT_ROOT)
DEFAULT_CORPUS = os.path.join(os.path.dirname(PROJECT_ROOT), "shared", "corpora",
                              "tinyshakespeare.txt")
VARIANTS = ("v3", "v4", "v4_no_mhc", "v4_full_attn", "v4_learned_routing")
SPECIAL_TOKENS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>")
SKIP_STEPS = 3


# ----------------------------------------------------------------------------- configs


def v3_config(quick: bool):
    from models.deepseek.deepseek_presets import deepseek_preset

    return deepseek_preset("tiny" if quick else "cpu_small").replace(num_nextn_predict_layers=0)


def train_settings(quick: bool, steps: int) -> dict:
    """seq_len, batch, lr, min_lr, warmup, weight decay, betas, clip: cpu_small's train
    section (`config.get_config`), tiny's for --quick."""
    from config import get_config

    t = get_config("tiny" if quick else "cpu_small").train
    return dict(seq_len=t.seq_len, batch_size=t.batch_size, learning_rate=t.learning_rate,
                min_learning_rate=t.min_learning_rate,
                warmup_steps=min(t.warmup_steps, max(steps // 4, 1)), train_steps=steps,
                weight_decay=t.weight_decay, beta_1=t.beta_1, beta_2=t.beta_2,
                grad_clip_norm=t.grad_clip_norm)


def _v4_base(quick: bool, seq_len: int):
    from models.deepseek_v4.presets import deepseek_v4_preset

    c = deepseek_v4_preset("tiny_v4" if quick else "cpu_small_v4")
    return c.replace(vocab_size=v3_config(quick).vocab_size,
                     max_position_embeddings=max(seq_len, c.max_position_embeddings),
                     num_nextn_predict_layers=0)


def v4_config(variant: str, quick: bool, seq_len: int):
    """The V4 variant's config, its moe_intermediate_size matched to v3's total parameters.

    Raises:
      ValueError: unknown variant, or no width within 5% of v3's parameters (not checked
        with `quick`: the tiny V4's other weights already exceed the tiny V3's total).
    """
    from models.deepseek import flops as v3_flops
    from models.deepseek_v4 import memory_plan
    from models.deepseek_v4.config import SLIDING

    c = _v4_base(quick, seq_len)
    n = c.num_hidden_layers
    if variant == "v4_no_mhc":
        c = c.replace(hc_mult=1)
    elif variant == "v4_full_attn":
        c = c.replace(layer_types=(SLIDING,) * n, sliding_window=seq_len)
    elif variant == "v4_learned_routing":
        c = c.replace(mlp_layer_types=("moe",) * n)
    elif variant != "v4":
        raise ValueError(f"variant={variant!r} must be one of {VARIANTS}")
    target = v3_flops.total_params(v3_config(quick))
    best = min(range(8, 4 * c.hidden_size + 1, 8), key=lambda f: abs(
        memory_plan.parameter_summary(c.replace(moe_intermediate_size=f)).total - target))
    c = c.replace(moe_intermediate_size=best)
    total = memory_plan.parameter_summary(c).total
    if abs(total / target - 1) > 0.05 and not quick:  # the tiny models cannot match
        raise ValueError(f"{variant}: {total:,} parameters, not within 5% of v3's {target:,}")
    return c


def flops_per_token(variant: str, config, seq_len: int, counted: str = "attended") -> int:
    """Training FLOPs per token; V4 counts the attended keys or, with counted="computed",
    the dense masked attention this implementation runs (V3's formula is already dense)."""
    if variant == "v3":
        from models.deepseek import flops
        return flops.flops_per_token(config, seq_len)
    from models.deepseek_v4 import flops
    return flops.flops_per_token(config, seq_len, counted=counted)


# ----------------------------------------------------------------------------- data


def prepare_data(corpus: str, vocab_size: int, out_dir: str, max_eval_tokens: int) -> dict:
    """Trains the byte-level BPE on the first 90% and writes train / held-out token ids
    (.npy) and each held-out token's UTF-8 byte count; returns the data facts."""
    import numpy as np
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    with open(corpus, encoding="utf-8") as f:
        text = f.read()
    cut = len(text) * 9 // 10
    train_text, heldout_text = text[:cut], text[cut:]
    start = time.perf_counter()
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2,
                                  special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    lines = train_text.splitlines(keepends=True)
    tok.train_from_iterator(("".join(lines[i:i + 64]) for i in range(0, len(lines), 64)),
                            trainer)
    train_ids = np.asarray(tok.encode(train_text).ids, np.int32)
    heldout_ids = np.asarray(tok.encode(heldout_text).ids, np.int32)
    if max_eval_tokens:
        heldout_ids = heldout_ids[:max_eval_tokens + 1]
    # Byte-level BPE: each character of a token's string is one byte.
    token_bytes = np.asarray([len(tok.id_to_token(i)) for i in range(tok.get_vocab_size())],
                             np.int32)
    assert tok.decode(heldout_ids[:200].tolist()) == heldout_text[:len(
        tok.decode(heldout_ids[:200].tolist()))], "byte-level BPE must round-trip"
    np.save(os.path.join(out_dir, "train.npy"), train_ids)
    np.save(os.path.join(out_dir, "heldout.npy"), heldout_ids)
    np.save(os.path.join(out_dir, "token_bytes.npy"), token_bytes)
    return {"corpus": corpus, "train_chars": len(train_text), "heldout_chars": len(heldout_text),
            "vocab_size": tok.get_vocab_size(), "train_tokens": int(train_ids.size),
            "heldout_tokens_evaluated": int(heldout_ids.size - 1),
            "heldout_bytes_per_token": round(len(heldout_text.encode("utf-8"))
                                             / len(tok.encode(heldout_text).ids), 3),
            "tokenizer_s": round(time.perf_counter() - start, 1)}


# ----------------------------------------------------------------------------- one run


def run_variant(variant: str, data_dir: str, steps: int, quick: bool, peak: float,
                seed: int) -> dict:
    """Trains and evaluates one variant in this process (module docstring)."""
    import keras
    import numpy as np
    import tensorflow as tf

    from components.trainer import schedule
    from config.train import TrainConfig

    tf.config.threading.set_intra_op_parallelism_threads(2)
    settings = train_settings(quick, steps)
    T, B = settings["seq_len"], settings["batch_size"]
    keras.utils.set_random_seed(seed)
    if variant == "v3":
        from models.deepseek.causal_lm import DeepSeekCausalLM
        config = v3_config(quick)
        model = DeepSeekCausalLM(config)
    else:
        from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM
        config = v4_config(variant, quick, T)
        model = DeepSeekV4CausalLM(config)
    train_ids = np.load(os.path.join(data_dir, "train.npy"))
    if variant != "v3":  # the hash layers' tables, as the Trainer builds them from scratch
        from models.deepseek_v4 import hash_routing

        counts = hash_routing.count_tokens([train_ids], config.vocab_size)  # (V,)
        tables = [hash_routing.balanced_tid2eid(counts, config.n_routed_experts,
                                                config.num_experts_per_tok, seed + i)
                  for i in range(len(hash_routing.hash_routers(model)))]
        if tables:
            hash_routing.assign_tid2eid(model, np.stack(tables))
    params = sum(int(np.prod(v.shape)) for v in model.weights if "tid2eid" not in v.path)
    variables = model.trainable_variables
    train_config = TrainConfig(**{k: v for k, v in settings.items()})
    optimizer = schedule.make_optimizer(train_config, variables)
    clip = settings["grad_clip_norm"]
    has_bias_update = hasattr(model, "update_router_biases")

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            out = model.compute_loss(x, y, training=True)
        grads = tape.gradient(out["loss"], variables)
        pairs = [(g, v) for g, v in zip(grads, variables, strict=True) if g is not None]
        clipped, norm = tf.clip_by_global_norm([g for g, _ in pairs], clip)
        optimizer.apply_gradients(zip(clipped, [v for _, v in pairs], strict=True))
        if has_bias_update:
            model.update_router_biases(out["expert_load"])
        return out["lm_loss"], norm

    rng = np.random.default_rng(seed)  # the same batches for every variant
    times, losses = [], []
    for _ in range(steps):
        offsets = rng.integers(0, train_ids.size - T - 1, B)
        window = np.stack([train_ids[o:o + T + 1] for o in offsets])  # (B, T + 1)
        x, y = tf.constant(window[:, :-1]), tf.constant(window[:, 1:])
        start = time.perf_counter()
        loss, _ = step(x, y)
        losses.append(float(loss.numpy()))
        times.append(time.perf_counter() - start)

    heldout = np.load(os.path.join(data_dir, "heldout.npy"))
    token_bytes = np.load(os.path.join(data_dir, "token_bytes.npy"))

    @tf.function
    def nll_sum(x, y):
        logits = model(x, training=False)  # (B, T, V) float32
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    n_windows = (heldout.size - 1) // T
    windows = np.stack([heldout[i * T:i * T + T + 1] for i in range(n_windows)])  # (N, T + 1)
    nats = 0.0
    for i in range(0, n_windows, B):
        chunk = windows[i:i + B]
        nats += float(nll_sum(tf.constant(chunk[:, :-1]), tf.constant(chunk[:, 1:])).numpy())
    scored_bytes = int(token_bytes[windows[:, 1:]].sum())
    step_time = statistics.median(times[SKIP_STEPS:] if len(times) > SKIP_STEPS else times)
    tps = B * T / step_time
    fpt = flops_per_token(variant, config, T)
    fpt_computed = flops_per_token(variant, config, T, "computed")
    return {
        "variant": variant, "params": params,
        "moe_intermediate_size": config.moe_intermediate_size,
        "bits_per_byte": round(nats / np.log(2) / scored_bytes, 4),
        "heldout_tokens": int(n_windows * T), "heldout_bytes": scored_bytes,
        "final_train_loss": round(float(np.mean(losses[-10:])), 4),
        "tokens_per_second": round(tps, 1), "step_time_s": round(step_time, 4),
        "train_time_s": round(sum(times), 1), "flops_per_token": fpt,
        "mfu": round(tps * fpt / peak, 4) if peak else None,
        "flops_per_token_computed": fpt_computed,
        "mfu_computed": round(tps * fpt_computed / peak, 4) if peak else None,
    }


# ----------------------------------------------------------------------------- main


def measure_peak() -> tuple[float, str]:
    from components.trainer import hardware

    peak, source, _ = hardware.peak_flops(hardware.detect(), "float32")
    return peak, source


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--eval-tokens", type=int, default=0,
                    help="score only the first N held-out tokens (0: all of them)")
    ap.add_argument("--peak-gflops", type=float, default=0.0,
                    help="peak FLOP/s for MFU (default: the Trainer's float32 matmul probe)")
    ap.add_argument("--json", default="")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: tiny models (the tiny presets), 8 steps, 2,048 held-out "
                         "tokens")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--peak", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.quick:
        args.steps = min(args.steps, 8)
        args.eval_tokens = args.eval_tokens or 2048
    if args.one:
        print("RESULT " + json.dumps(run_variant(args.one, args.data_dir, args.steps,
                                                  args.quick, args.peak, args.seed)))
        return 0

    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"--variants: {v!r} is not one of {VARIANTS}")
    settings = train_settings(args.quick, args.steps)
    for v in variants:  # refuse a size mismatch before any training
        if v != "v3":
            v4_config(v, args.quick, settings["seq_len"])
    if args.peak_gflops:
        peak, peak_source = args.peak_gflops * 1e9, "--peak-gflops"
    else:
        peak, peak_source = measure_peak()
    runs = []
    with tempfile.TemporaryDirectory() as data_dir:
        data = prepare_data(args.corpus, v3_config(args.quick).vocab_size, data_dir,
                            args.eval_tokens)
        print(f"data: {data}", flush=True)
        for v in variants:
            cmd = [sys.executable, os.path.abspath(__file__), "--one", v, "--data-dir", data_dir,
                   "--steps", str(args.steps), "--seed", str(args.seed), "--peak", str(peak)]
            cmd += ["--quick"] if args.quick else []
            start = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT,
                                 env={**os.environ, "PYTHONPATH": PROJECT_ROOT})
            if out.returncode != 0 or "RESULT " not in out.stdout:
                sys.exit(f"{v}: run failed:\n{out.stderr[-3000:]}")
            run = json.loads(out.stdout.split("RESULT ", 1)[1])
            run["wall_s"] = round(time.perf_counter() - start, 1)
            runs.append(run)
            print(f"{v}: {run}", flush=True)
    base = next((r["params"] for r in runs if r["variant"] == "v3"), None)
    print(f"\n{args.steps} steps x {settings['batch_size']} x {settings['seq_len']} tokens; "
          f"peak {peak / 1e9:.1f} GFLOP/s ({peak_source})\n")
    print("| variant | params | vs v3 | held-out bits/byte | tokens/s | MFU | MFU (computed) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        vs = f"{100 * (r['params'] / base - 1):+.1f}%" if base else "-"
        mfu, mfu_c = ("-" if r[k] is None else f"{100 * r[k]:.1f}%"
                      for k in ("mfu", "mfu_computed"))
        print(f"| {r['variant']} | {r['params']:,} | {vs} | {r['bits_per_byte']:.4f} | "
              f"{r['tokens_per_second']:,.0f} | {mfu} | {mfu_c} |")
    result = {"steps": args.steps, "train": settings, "data": data,
              "peak_flops": peak, "peak_source": peak_source, "runs": runs}
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
