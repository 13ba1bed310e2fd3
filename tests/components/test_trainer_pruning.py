"""Expert pruning in the Trainer (`train.prune_keep_experts`, components/trainer/pruning.py):
refused at config time by `select_experts`' rules; ignored by the checkpoint directory;
in `run_fn`, the router load is measured on the eval split (Tang and Song poems), the
pruned model is evaluated and exported with its own config, and its figures are recorded.

Subject: the `tiny` preset (8 routed experts in 4 groups, top-2 of 2 groups, one MoE
decoder block and one MTP block) trained a few steps on poems with a tokenizer learned on
them, then `run_fn` with prune_keep_experts = 4 on the same checkpoint directory: it
resumes at the last step (trains nothing), prunes and exports.
"""

from __future__ import annotations

import collections
import json
import re
import types

import numpy as np
import pytest

from components.trainer import checkpoint_location
from config import get_config

STEPS = 6
KEEP = 4  # half the tiny model's 8 routed experts: one per group of 2


@pytest.mark.parametrize("overrides, message", [
    ({"train.prune_keep_experts": 6}, "train.prune_keep_experts=6 must be a multiple of "
                                      "n_group=4 for topk_method='noaux_tc'"),
    ({"train.prune_keep_experts": 1}, "train.prune_keep_experts=1 must be in "
                                      "[num_experts_per_tok=2, n_routed_experts=8]"),
    ({"train.prune_keep_experts": 9}, "train.prune_keep_experts=9 must be in "
                                      "[num_experts_per_tok=2, n_routed_experts=8]"),
    ({"train.prune_keep_experts": 4, "model.topk_group": 1},
     "train.prune_keep_experts=4 leaves topk_group * keep / n_group = 1 experts"),
    ({"train.prune_keep_experts": -1}, "train.prune_keep_experts=-1 must be >= 0"),
    ({"train.prune_keep_experts": 4, "model.first_k_dense_replace": 2,
      "model.num_nextn_predict_layers": 0},
     "train.prune_keep_experts=4: the model has no MoE layer to prune"),
])
def test_a_keep_the_pruning_would_refuse_is_refused_by_the_config(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)) as e:
        get_config("tiny", overrides)
    assert "\n" not in str(e.value)


def test_valid_keeps_pass_and_a_greedy_router_needs_no_multiple_of_n_group():
    assert get_config("tiny", {"train.prune_keep_experts": 4}).train.prune_keep_experts == 4
    assert get_config("tiny", {"train.prune_keep_experts": "8"}).train.prune_keep_experts == 8
    greedy = {"model.topk_method": "greedy", "model.scoring_func": "softmax",
              "model.seq_aux": False, "train.prune_keep_experts": 3}
    assert get_config("tiny", greedy).train.prune_keep_experts == 3
    # Only the first dense block: the MTP block is still MoE.
    only_mtp = {"model.first_k_dense_replace": 2, "train.prune_keep_experts": 4}
    assert get_config("tiny", only_mtp).model.num_moe_layers == 1


def test_the_checkpoint_directory_ignores_the_pruning(train_file):
    plain = get_config("tiny")
    pruned = get_config("tiny", {"train.prune_keep_experts": KEEP})
    other = get_config("tiny", {"train.seed": 7})
    fingerprint = checkpoint_location.fingerprint
    assert fingerprint(pruned, [train_file]) == fingerprint(plain, [train_file])
    assert fingerprint(other, [train_file]) != fingerprint(plain, [train_file])


def test_the_run_summary_says_how_many_experts_were_kept(monkeypatch, capsys):
    from reporting import run_summary

    model = {"train_steps": 2, "pruned_experts_kept": 4, "n_routed_experts_before": 8,
             "pruning_tokens": 1024}
    runs = [run_summary.ComponentRun("Trainer", "COMPLETE", 1.0, {"Model": model})]
    monkeypatch.setattr(run_summary, "latest_run", lambda path: runs)
    run_summary.print_summary("unused.sqlite", 1.0)
    assert ("experts pruned: 8 -> 4 per MoE layer (router load on 1024 eval tokens)"
            in capsys.readouterr().out)
    del model["pruned_experts_kept"]
    run_summary.print_summary("unused.sqlite", 1.0)
    assert "experts pruned" not in capsys.readouterr().out


# ----------------------------------------------------------------------------- run_fn


def _poem_data(poems: list[str], root):
    """(tokenizer learned on the poems, transform output dir, train file, eval file)."""
    import tokenizers

    from components.trainer import data
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    train, held_out = poems[:-40], poems[-40:]
    counts = collections.Counter(line for p in train for line in p.split("\n") if line)
    tokenizer = ByteLevelBpe(learn(counts, 512).json)
    assets = root / "transform" / "transform_fn" / "assets"
    tokenizer.write(str(root / "tok"))
    assets.mkdir(parents=True)
    (assets / "tokenizer_poems.json").write_text((root / "tok" / "tokenizer.json").read_text())
    (assets / "tokenizer_config_poems.json").write_text(
        (root / "tok" / "tokenizer_config.json").read_text())
    hf = tokenizers.Tokenizer.from_str(tokenizer.to_json_string())
    files = {}
    for split, docs in (("train", train[:400]), ("eval", held_out)):
        files[split] = str(root / f"{split}-00000-of-00001.gz")
        data.write_examples(files[split], [hf.encode(d, add_special_tokens=False).ids
                                           for d in docs])
    return tokenizer, str(root / "transform"), files["train"], files["eval"]


@pytest.fixture(scope="module")
def pruned_run(chinese_poems, tmp_path_factory):
    """A tiny run trained STEPS steps, then run_fn with prune_keep_experts=KEEP resuming it:
    (config, unpruned trained model, tokenizer, eval file, serving dir, run_fn's model_run
    dir)."""
    from components.trainer import job as job_lib
    from components.trainer import run_fn

    root = tmp_path_factory.mktemp("pruned_run")
    tokenizer, transform, train, eval_file = _poem_data(chinese_poems, root)
    overrides = {"train.train_steps": STEPS, "train.warmup_steps": 1,
                 "train.checkpoint_every": STEPS, "train.log_every": 2}
    config = get_config("tiny", overrides)
    checkpoints = str(root / "checkpoints")
    job = job_lib.TrainingJob(  # the earlier run, without pruning
        pipeline_config=config.to_json(), train_files=[train],
        checkpoint_dir=checkpoint_location.stable_checkpoint_dir("unused", config, [train],
                                                           checkpoints),
        log_dir=str(root / "first"), result_path=str(root / "first" / "result.json"),
        peak_flops_per_device=1e11, peak_flops_source="fixed for the test",
        eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    trained = job_lib.run(job).model

    def fixed_peak(job):
        job.peak_flops_per_device, job.peak_flops_source = 1e11, "fixed for the test"

    pruned_config = get_config("tiny", {**overrides, "train.prune_keep_experts": KEEP})
    serving = root / "model" / "Format-Serving"
    fn_args = types.SimpleNamespace(
        custom_config={"pipeline_config": pruned_config.to_json(),
                       "checkpoint_root": checkpoints},
        train_steps=STEPS, transform_output=transform, base_model=None,
        train_files=[train], eval_files=[eval_file], model_run_dir=str(root / "model_run"),
        serving_model_dir=str(serving))
    with pytest.MonkeyPatch.context() as m:
        m.setattr(run_fn, "measure_cpu_peak", fixed_peak)
        run_fn.run_fn(fn_args)
    return config, trained, tokenizer, eval_file, serving, root / "model"


@pytest.mark.slow
def test_run_fn_prunes_by_the_eval_load_and_exports_the_pruned_model(pruned_run):
    import tensorflow as tf

    from components.trainer import data, train_loop
    from models.deepseek.expert_pruning import prune_experts, select_experts
    from models.layers.expert_load import expert_load
    from savedmodel.hf_interop import load_model_from_savedmodel
    from savedmodel.layout import (
        EXPERT_PRUNING_ASSET,
        MODEL_CONFIG_NAME,
        extra_path,
        read_model_config,
        read_pipeline_config,
    )

    config, trained, tokenizer, eval_file, serving, model_dir = pruned_run
    tc = config.train
    summary = json.loads((model_dir / "training_summary.json").read_text())
    # The resumed run trained nothing: pruning is not in the checkpoint directory's key.
    assert (summary["resumed_from_step"], summary["steps_run"]) == (STEPS, 0)

    # The load was measured on the eval split's first eval_batches batches, as evaluated:
    # 4 batches x 8 windows x 32 tokens = 1,024 tokens (the held-out poems are longer).
    eval_ds = data.make_eval_dataset([eval_file], tc.seq_len, tc.batch_size, tokenizer.eos_id)
    batches = [b["input_ids"] for b in eval_ds.take(tc.eval_batches)]
    assert len(batches) == tc.eval_batches == 4
    record = json.loads(open(extra_path(str(serving), EXPERT_PRUNING_ASSET)).read())
    load = np.array([layer["load"] for layer in record["layers"]])  # (2, 8)
    np.testing.assert_array_equal(load, expert_load(trained, batches))
    assert load.sum(axis=1)[0] == 1024 * 2  # the decoder block: tokens x top-2
    kept = select_experts(config.model, KEEP, load)
    assert [layer["kept"] for layer in record["layers"]] == [k.tolist() for k in kept]
    assert (record["keep"], record["n_routed_experts"], record["tokens"]) == (KEEP, 8, 1024)
    assert {"pruned_experts_kept": KEEP, "n_routed_experts_before": 8,
            "pruning_tokens": 1024}.items() <= summary.items()

    # Every reader of the SavedModel sees the pruned architecture.
    assert read_model_config(str(serving)).n_routed_experts == KEEP
    assert read_pipeline_config(str(serving)).model.n_routed_experts == KEEP
    hf_config = json.loads(open(extra_path(str(serving), MODEL_CONFIG_NAME)).read())
    assert hf_config["n_routed_experts"] == KEEP

    reference = prune_experts(trained, KEEP, load)  # the pruned Keras model
    assert summary["parameters"] == reference.count_params() < trained.count_params()
    loss, _ = train_loop.evaluate(reference, eval_ds, tc.eval_batches)
    assert summary["trainer_eval_loss"] == pytest.approx(loss, rel=1e-6)
    loss_before, _ = train_loop.evaluate(trained, eval_ds, tc.eval_batches)
    assert summary["trainer_eval_loss_before_pruning"] == pytest.approx(loss_before, rel=1e-6)
    assert record["eval_loss_before"] == summary["trainer_eval_loss_before_pruning"]

    ids = batches[0][:2]  # (2, 32) poem tokens
    expected = reference(ids, training=False).numpy()
    served = tf.saved_model.load(str(serving)).signatures["logits"](input_ids=ids)["logits"]
    # The same weights and ops in a traced graph, which may sum in another order: sums of
    # up to 128 terms (intermediate_size) chained through two blocks and the head, about
    # sqrt(128) ~ 11 ulps each with random-sign rounding; 64 allowed (measured: 2).
    from numerics import assert_float32_close

    assert_float32_close(served.numpy(), expected, ulps=64)
    reloaded = load_model_from_savedmodel(str(serving))
    assert reloaded.config.n_routed_experts == KEEP
    np.testing.assert_array_equal(reloaded(ids, training=False).numpy(), expected)


@pytest.mark.slow  # imports tfx
def test_the_model_artifact_records_the_pruning():
    from components.trainer.executor import record_summary

    class Artifact:
        def __init__(self):
            self.properties = {}

        def set_int_custom_property(self, key, value):
            self.properties[key] = value

        set_float_custom_property = set_string_custom_property = set_int_custom_property
        set_bool_custom_property = set_int_custom_property

    artifact = Artifact()
    figures = {"pruned_experts_kept": 4, "n_routed_experts_before": 8, "pruning_tokens": 1024,
               "trainer_eval_loss_before_pruning": 5.5}
    record_summary(artifact, figures)
    assert artifact.properties == figures


@pytest.mark.parametrize("overrides", [
    {}, {"model.first_k_dense_replace": 2}, {"model.num_nextn_predict_layers": 0},
    {"model.first_k_dense_replace": 0, "model.num_nextn_predict_layers": 2}])
def test_the_config_counts_the_moe_layers_the_model_builds(overrides):
    from models.deepseek.causal_lm import DeepSeekCausalLM

    model = get_config("tiny", overrides).model
    assert model.num_moe_layers == DeepSeekCausalLM(model).num_moe_layers
