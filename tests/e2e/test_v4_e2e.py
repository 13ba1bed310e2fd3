"""A DeepSeek-V4-style model through the whole pipeline (issue 41): `deepseek-tfx run
--preset tiny_v4` on Tang and Song poems and a slice of Tiny Shakespeare, pruning its
experts 8 -> 6 (the hash layer keeps a valid `tid2eid`) and exporting int8, is evaluated,
blessed and pushed, and the pushed model continues a Chinese prompt.

The tasks that start from a model (SFT, LoRA, distillation, DPO, GRPO, warm start) and the
distributed and kill -9 runs are tested in the Trainer's own loop on the same model size
(tests/components/test_trainer_v4*.py); `cpu_small_v4`, the main job's V4 size, is
measured by hand (docs/benchmarks/v4-training.md).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
STEPS = 20
PROMPT = "床前明月光，"


@pytest.fixture(scope="module")
def v4_run(tmp_path_factory, shakespeare, chinese_poems):
    data = tmp_path_factory.mktemp("v4-data")
    (data / "poems.txt").write_text("\n\n".join(chinese_poems[:300]), encoding="utf-8")
    (data / "shakespeare.txt").write_text(shakespeare[:60_000], encoding="utf-8")
    out = tmp_path_factory.mktemp("v4-run")
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "run", "--preset", "tiny_v4", "--data", str(data),
         "--output", str(out), "--train-steps", str(STEPS),
         "--set", "train.prune_keep_experts=6", "--set", "train.export_dtype=int8"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-5000:]
    return {"out": out, "console": proc.stdout}


def _pushed(out: pathlib.Path) -> pathlib.Path:
    (version,) = sorted((out / "serving").iterdir())
    return version


def test_the_v4_run_is_blessed_and_pushed_pruned_and_int8(v4_run):
    console = v4_run["console"]
    assert "blessed: True" in console and "pushed model:" in console, console[-3000:]
    assert "experts pruned: 8 -> 6" in console and "exported int8" in console
    pushed = _pushed(v4_run["out"])
    config = json.loads((pushed / "assets.extra" / "deepseek_tfx_config.json").read_text())
    assert config["model"]["model_type"] == "deepseek_v4"
    assert config["model"]["n_routed_experts"] == 6
    hf = json.loads((pushed / "assets.extra" / "config.json").read_text())
    assert hf["model_type"] == "deepseek_v4"
    assert json.loads((pushed / "assets.extra" / "precision.json").read_text())[
        "weight_dtype"] == "int8"


def test_the_trainer_built_the_hash_table_and_trained_the_indexer(v4_run):
    (summary,) = (v4_run["out"] / "pipeline_root" / "Trainer").glob(
        "model/*/training_summary.json")
    figures = json.loads(summary.read_text())
    assert figures["tid2eid"]["tokens_counted"] > 0
    assert figures["tid2eid"]["max_load_over_mean"] < 1.1
    history = figures["history"]  # the logged steps (train.log_every)
    assert history[-1]["step"] == STEPS and all(h["indexer_loss"] > 0 for h in history)
    assert history[-1]["lm_loss"] < history[0]["lm_loss"]
    assert figures["pruned_experts_kept"] and figures["n_routed_experts_before"] == 8


def test_the_pushed_v4_model_continues_a_chinese_prompt(v4_run):
    """Greedy continuation through the pushed SavedModel's `generate` signature (int8,
    pruned, V4 caches); the prompt's bytes come back unchanged in front of it."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the tokenizer's ops)

    loaded = tf.saved_model.load(str(_pushed(v4_run["out"])))
    out = loaded.signatures["generate"](
        prompt=tf.constant([PROMPT]), max_new_tokens=tf.constant([8]),
        temperature=tf.constant([0.0]), top_k=tf.constant([0]), top_p=tf.constant([1.0]),
        seed=tf.constant([0]))
    text = [t.decode("utf-8") for t in np.asarray(out["text"]).reshape(-1)][0]
    completion = [t.decode("utf-8") for t in np.asarray(out["completion"]).reshape(-1)][0]
    assert text == PROMPT + completion and completion
