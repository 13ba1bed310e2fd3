"""The XLA-compiled training step (`train.jit_compile`, `components/trainer/train_step.py`).

- With a capacity that covers every expert's load (cf = E / K: C = N), nothing is
  dropped, and the compiled step follows the eager one step for step.
- `cpu_small` shapes compile and train a step; `gpu_base` shapes (2 layers) lower to HLO
  (compile-only: tf2xla accepts every op of the whole step at those static shapes),
  in a child process (its ~4 GB of weights and slots are returned when it ends).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from components.trainer import data, train_loop
from config import get_config

# Slow: each test compiles a training step with XLA.
pytestmark = pytest.mark.slow

ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def config_for(preset="tiny", **train):
    overrides = {"train.log_every": 1, "train.checkpoint_every": 10**6,
                 **{f"train.{k}": v for k, v in train.items()}}
    return get_config(preset, overrides)


def run(config, train_file, tmp_path, name):
    tc = config.train

    def dataset_fn():
        return data.make_train_dataset(train_file, tc.seq_len, tc.batch_size, tc.shuffle_buffer,
                                       tc.seed)

    return train_loop.train(config, dataset_fn, str(tmp_path / name), None)


def test_xla_step_equals_the_eager_step_when_nothing_is_dropped(train_file, tmp_path):
    """Two micro-batches (the accumulation loop inside the compiled step; the e2e test
    runs one)."""
    # tiny: E = 8 routed experts, K = 2 per token; cf = E / K = 4 gives
    # capacity = ceil(4 * N * 2 / 8) = N: an expert can take every token, none is dropped.
    kwargs = dict(train_steps=8, warmup_steps=2, grad_accum_steps=2)
    eager = run(config_for(jit_compile="false", **kwargs), train_file, tmp_path, "eager")
    xla = run(config_for(jit_compile="true", moe_capacity_factor=4.0, **kwargs), train_file,
              tmp_path, "xla")
    assert xla.jit_compile and not eager.jit_compile
    assert xla.moe_dropped_fraction == 0.0
    a = np.array([h["loss"] for h in eager.history])
    b = np.array([h["loss"] for h in xla.history])
    # XLA fuses and reorders float32 sums; over 8 AdamW steps the losses stay within 1e-4
    # (relative) of each other: the same computation, not merely a similar one.
    np.testing.assert_allclose(b, a, rtol=1e-4)
    for v, w in zip(eager.model.weights, xla.model.weights, strict=True):
        np.testing.assert_allclose(w.numpy(), v.numpy(), rtol=1e-3, atol=1e-5, err_msg=v.path)


def test_cpu_small_step_compiles_and_trains():
    config = config_for("cpu_small", jit_compile="true", train_steps=2)
    tc = config.train
    vocab = config.model.vocab_size

    def dataset_fn():
        return data.random_token_batches(tc.batch_size, tc.seq_len, vocab)

    with tempfile.TemporaryDirectory() as d:
        result = train_loop.train(config, dataset_fn, d, None)
    assert result.jit_compile and result.steps_run == 2
    # Random tokens over 8,192 ids: the loss starts near ln(8192) = 9.01.
    assert abs(result.history[0]["loss"] - np.log(vocab)) < 0.5
    assert 0.0 <= result.moe_dropped_fraction < 0.5


GPU_BASE_SCRIPT = textwrap.dedent("""
    import json
    import tensorflow as tf
    from components.trainer import train_loop
    from components.trainer.train_step import make_train_step
    from config import get_config

    # gpu_base's widths, batch, context and experts; 2 of its 12 layers (one dense, one MoE:
    # every op of the step; the other layers repeat them) to keep this under a minute.
    config = get_config("gpu_base", {"train.jit_compile": "true", "model.num_hidden_layers": 2,
                                     "model.first_k_dense_replace": 1})
    tc = config.train
    strategy = tf.distribute.get_strategy()
    state = train_loop.setup(config, strategy, "mixed_bfloat16", warm_start=False)
    step = make_train_step(state.model, state.optimizer, state.selection.variables, strategy,
                           micro_batches=1, grad_clip_norm=tc.grad_clip_norm,
                           moe_mask=state.selection.moe_mask, step_counter=state.step,
                           jit_compile=True, moe_capacity_factor=tc.moe_capacity_factor)
    ids = tf.zeros([1, tc.batch_size, tc.seq_len], tf.int32)  # (k, b, T) per replica
    hlo = step.xla_step.experimental_get_compiler_ir({"input_ids": ids, "labels": ids})(
        stage="hlo")
    print("RESULT " + json.dumps({"hlo_chars": len(hlo), "batch": tc.batch_size,
                                  "seq_len": tc.seq_len,
                                  "sort": "sort(" in hlo, "custom_call": hlo.count("custom-call")}))
""")


def test_gpu_base_step_lowers_to_xla_hlo():
    """Compile-only: the whole gpu_base step (32 x 1024 tokens, 16 experts, mixed
    bfloat16; 2 layers, one dense and one MoE, + MTP) is accepted by tf2xla with static
    shapes; no GPU is needed to check it."""
    result = subprocess.run([sys.executable, "-c", GPU_BASE_SCRIPT], capture_output=True,
                            text=True, timeout=1200, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-4000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out["batch"] == 32 and out["seq_len"] == 1024
    assert out["hlo_chars"] > 100_000 and out["sort"]  # the capacity dispatch sorts pairs
