"""Every training task on a DeepSeek-V4-style model (`tiny_v4`), in the Trainer's own loop
(`train_loop.train`) on Tang and Song poems (UTF-8 bytes as token ids 3..258, so the text
is exactly what the model sees): pretraining from scratch (hash tables built from the
token counts and frozen, mHC trained in float32, bias updates on the score-routed layers
only, the lightning indexer moved by its own KL, MTP on V4 blocks), SFT with LoRA on the
V4 projections (grouped output projection and experts included), frozen layers,
distillation V3 -> V4 and V4 -> V3, warm start from a V4 Hugging Face checkpoint, expert
pruning with valid `tid2eid`, int8 export, DPO and GRPO steps, and the XLA step's static
shapes. Kill -9 resume and two workers: tests/components/test_trainer_v4_distributed.py.
"""

from __future__ import annotations

import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from components.trainer import model_io, train_loop, trainable
from config import get_config
from models import checkpoints
from models.deepseek_v4 import hash_routing

# Each test traces a V4 training step (a few seconds to tens of seconds on 2 cores).
pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[2]
V4_FIXTURE = ROOT / "tests" / "fixtures" / "hf_deepseek_v4" / "tiny"
BYTE_OFFSET = 3  # byte b is token b + 3 (ids 0..2 are the added tokens), as the BPE's bytes


def v4(preset: str = "tiny_v4", **overrides):
    settings = {"train.train_steps": 4, "train.log_every": 1, "train.checkpoint_every": 100,
                "train.warmup_steps": 1}
    settings.update(overrides)
    return get_config(preset, settings)


def poem_ids(poems: list[str]) -> np.ndarray:
    """The poems' UTF-8 bytes as token ids (`BYTE_OFFSET`), one poem after another."""
    data = "\n".join(poems).encode("utf-8")
    return np.frombuffer(data, np.uint8).astype(np.int32) + BYTE_OFFSET


def poem_batches(config, poems: list[str], prompt_tokens: int = 0):
    """A dataset_fn of global batches cut from the poems in order (repeating): input ids
    and next-token labels; the first `prompt_tokens` labels of each row are not targets
    (an SFT prompt)."""
    tc = config.train
    ids = poem_ids(poems)
    rows = len(ids) // (tc.seq_len + 1)
    windows = ids[:rows * (tc.seq_len + 1)].reshape(rows, tc.seq_len + 1)
    batches = rows // tc.batch_size
    windows = windows[:batches * tc.batch_size].reshape(batches, tc.batch_size, -1)
    labels = windows[:, :, 1:].copy()
    labels[:, :, :prompt_tokens] = -100

    def dataset_fn():
        return tf.data.Dataset.from_tensor_slices(
            {"input_ids": windows[:, :, :-1], "labels": labels}).repeat()

    return dataset_fn


def weights(model) -> dict[str, np.ndarray]:
    return {trainable.weight_path(v): v.numpy() for v in model.weights}


def initial_weights(config) -> dict[str, np.ndarray]:
    keras.utils.set_random_seed(config.train.seed)
    return weights(model_io.build_model(config))


def train(config, dataset_fn, tmp_path, **kwargs):
    return train_loop.train(config, dataset_fn, str(tmp_path / "ckpt"), None, **kwargs)


# ---------------------------------------------------------------------------- pretraining


def test_pretraining_from_scratch_trains_what_v4_trains_and_freezes_the_hash_tables(
        chinese_poems, tmp_path):
    config = v4(**{"train.train_steps": 12, "model.num_nextn_predict_layers": 1})
    dataset_fn = poem_batches(config, chinese_poems[:400])
    before = initial_weights(config)
    result = train(config, dataset_fn, tmp_path)
    after, model = weights(result.model), result.model
    history = result.history
    assert history[-1]["lm_loss"] < history[0]["lm_loss"] - 0.5, [h["lm_loss"] for h in history]
    assert all(h["mtp_loss"] > 0 and h["indexer_loss"] > 0 for h in history)  # MTP, indexer

    # tid2eid: the balanced table of the first batches' token counts, left as built.
    counts = hash_routing.count_tokens(
        (b["input_ids"].numpy() for b in dataset_fn().take(64)), config.model.vocab_size)
    routers = hash_routing.hash_routers(model)
    assert len(routers) == 1 and result.tid2eid["tokens_counted"] == counts.sum()
    expected = hash_routing.balanced_tid2eid(counts, 8, 2, config.train.seed)
    np.testing.assert_array_equal(routers[0].tid2eid.numpy(), expected)
    assert not any(v is routers[0].tid2eid for v in model.trainable_variables)

    # mHC trains in float32; every hyper-connection weight moved.
    hc = [p for p in after if "_hc/" in p or p.startswith("hc_head/")]
    assert hc and all(after[p].dtype == np.float32 for p in hc)
    assert all(not np.array_equal(after[p], before[p]) for p in hc), hc

    # Aux-loss-free bias: none on the hash layer, updated on the score-routed ones.
    for moe in model.moe_layers:
        if moe.gate.tid2eid is not None:
            assert moe.gate.e_score_correction_bias is None
        else:
            assert np.abs(moe.gate.e_score_correction_bias.numpy()).max() > 0

    # The lightning indexer moved (its only signal is its KL: top-k has no gradient).
    indexer = [p for p in after if "/indexer/" in p and p.endswith("kernel")]
    assert indexer and all(not np.array_equal(after[p], before[p]) for p in indexer)


def test_the_xla_step_has_static_shapes_for_windows_and_top_k():
    """The tiny_v4 step lowers to XLA HLO whole (compressor windows and the indexer's top-k
    of static size; MoE with static capacity); lowering, not compiling, keeps it cheap."""
    from components.trainer import train_step
    from components.trainer.schedule import make_optimizer

    config = v4(**{"train.jit_compile": "true"})
    model = model_io.build_model(config)
    selection = trainable.prepare(model, config.train)
    optimizer = make_optimizer(config.train, selection.variables)
    step = train_step.make_train_step(
        model, optimizer, selection.variables, tf.distribute.get_strategy(), micro_batches=1,
        grad_clip_norm=1.0, jit_compile=True, moe_capacity_factor=1.25)
    tc = config.train
    ids = tf.zeros([1, tc.batch_size, tc.seq_len], tf.int32)
    hlo = step.xla_step.experimental_get_compiler_ir({"input_ids": ids, "labels": ids})(
        stage="hlo")
    assert "TopK" in hlo or "sort(" in hlo  # the indexer's top-k (and the capacity sort)
    assert "?" not in hlo.split("ENTRY", 1)[1].split("\n", 1)[0]  # no dynamic dimension


# ---------------------------------------------------------------------------- fine-tuning


def test_sft_with_lora_adapts_the_grouped_output_projection_and_the_experts_only(
        chinese_poems, tmp_path):
    config = v4(**{"train.lora_rank": 4, "train.lora_targets": "attention,mlp",
                   "train.learning_rate": 1e-2})
    dataset_fn = poem_batches(config, chinese_poems[:200], prompt_tokens=8)
    before = initial_weights(config)
    result = train(config, dataset_fn, tmp_path)
    model = result.model
    adapted = {type(layer).__name__ + ":" + layer.name
               for layer in trainable.lora_layers(model, "attention,mlp") if layer.lora_enabled}
    assert "ExpertProjection:o_a_proj" in adapted  # the grouped output projection
    assert {"ExpertProjection:gate_proj", "ExpertProjection:down_proj"} <= adapted  # experts
    after = weights(model)
    lora = [p for p in after if p.endswith(("lora_kernel_a", "lora_kernel_b"))]
    assert any(np.abs(after[p]).max() > 0 for p in lora if p.endswith("lora_kernel_b"))
    for path, value in before.items():  # the base model is bit for bit as it started
        if not path.endswith("tid2eid"):  # (built from the token counts before step 1)
            np.testing.assert_array_equal(after[path], value, err_msg=path)
    merged = model_io.copy_for_export(config, model)  # W + A B in plain kernels
    ids = tf.constant(poem_ids(chinese_poems[:2])[None, :config.train.seq_len])
    np.testing.assert_allclose(merged(ids).numpy(), model(ids).numpy(), atol=2e-5)


def test_frozen_layers_and_distillation_from_a_v3_teacher(chinese_poems, tmp_path):
    """A V4 student learns from a V3-style teacher (same vocabulary); `top:1` trains only
    the last block, the final norm and the head: everything else is bit-identical."""
    teacher_config = get_config("tiny")
    teacher = model_io.build_model(teacher_config)
    checkpoints.save_hf_checkpoint(teacher, str(tmp_path / "teacher"))
    config = v4(**{"train.trainable": "top:1"})
    before = initial_weights(config)
    result = train(config, poem_batches(config, chinese_poems[:200]), tmp_path,
                   teacher_model=str(tmp_path / "teacher"))
    assert all(h["distill_loss"] > 0 for h in result.history)
    after = weights(result.model)
    last = f"layers.{config.model.num_hidden_layers - 1}/"
    for path, value in before.items():
        moved = not np.array_equal(after[path], value)
        if path.endswith("tid2eid"):  # built from the token counts before the first step
            continue
        if not path.startswith((last, "norm/", "embed_tokens/", "hc_head/")):
            assert not moved, path
    assert any(not np.array_equal(after[p], before[p]) for p in before if p.startswith(last))


def test_distillation_from_a_v4_teacher_into_a_v3_student(chinese_poems, tmp_path):
    teacher = model_io.build_model(v4())
    hash_routing.assign_tid2eid(teacher, hash_routing.balanced_tid2eid(np.ones(512), 8, 2))
    checkpoints.save_hf_checkpoint(teacher, str(tmp_path / "teacher"))
    config = get_config("tiny", {"train.train_steps": 3, "train.log_every": 1,
                                 "train.checkpoint_every": 100, "train.warmup_steps": 1})
    result = train(config, poem_batches(config, chinese_poems[:200]), tmp_path,
                   teacher_model=str(tmp_path / "teacher"))
    assert all(h["distill_loss"] > 0 for h in result.history)
    assert type(result.model).__name__ == "DeepSeekCausalLM"


def test_warm_start_from_a_v4_checkpoint_starts_at_its_weights(chinese_poems, tmp_path):
    """`--base-model` of a V4 import: the first step's loss is the base model's own."""
    from savedmodel import base_model

    base = base_model.read_model_config(str(V4_FIXTURE))
    config = v4(**{"train.train_steps": 1})
    config = type(config).from_dict({**config.to_dict(), "model": {
        "model_type": "deepseek_v4", **base.to_dict()}})
    dataset_fn = poem_batches(config, chinese_poems[:100])
    result = train(config, dataset_fn, tmp_path, base_model=str(V4_FIXTURE))
    assert result.tid2eid == {}  # the base model's tables are kept
    loaded = base_model.load_model(str(V4_FIXTURE), dtype="float32")  # stored bf16
    batch = next(iter(dataset_fn()))
    expected = loaded.compute_loss(batch["input_ids"], batch["labels"])["lm_loss"]
    assert result.history[0]["lm_loss"] == pytest.approx(float(expected), abs=1e-5)
    for gate, base_gate in zip(result.model.moe_layers, loaded.moe_layers, strict=True):
        if gate.gate.tid2eid is not None:
            np.testing.assert_array_equal(gate.gate.tid2eid.numpy(),
                                          base_gate.gate.tid2eid.numpy())


# ---------------------------------------------------------------------------- compression


def test_expert_pruning_keeps_valid_hash_tables_and_the_int8_export_generates(
        chinese_poems, tmp_path):
    from components.trainer import pruning
    from models.deepseek import generation

    config = v4(**{"train.prune_keep_experts": 4, "train.export_dtype": "int8"})
    dataset_fn = poem_batches(config, chinese_poems[:200])
    result = train(config, dataset_fn, tmp_path)
    plain = model_io.copy_for_export(config, result.model)
    pruned, record = pruning.prune_trained_model(plain, dataset_fn().take(4), config)
    assert pruned.config.n_routed_experts == 4 and record.n_routed_experts == 8
    for moe in pruned.moe_layers:
        table = moe.gate.tid2eid
        if table is not None:
            rows = table.numpy()
            assert rows.min() >= 0 and rows.max() < 4
            assert (rows[:, 0] != rows[:, 1]).all()  # k = 2 distinct experts per token
    pruned_config = type(config).from_dict({**config.to_dict(), "model": {
        "model_type": "deepseek_v4", **pruned.config.to_dict()}, "train": {
            **config.train.__dict__, "prune_keep_experts": 0}})
    exported = model_io.to_export_dtype(pruned_config, pruned)
    from models.formats.quantization import is_quantized_model

    assert is_quantized_model(exported)
    prompt = tf.constant(poem_ids(["床前明月光"])[None, :])
    tokens, lengths = generation.generate(exported, prompt, max_new_tokens=4, temperature=0.0)
    assert tokens.shape == (1, prompt.shape[1] + 4)


# ---------------------------------------------------------------------------- DPO, GRPO


def test_the_dpo_step_on_a_v4_policy_is_log_2_against_itself():
    from components.trainer import preference_objectives, train_step
    from components.trainer.data import IGNORE_LABEL
    from components.trainer.schedule import make_optimizer

    config = v4(**{"data.task": "dpo"})
    keras.utils.set_random_seed(0)
    model = model_io.build_model(config)
    reference = model_io.build_model(config)
    reference.set_weights(model.get_weights())
    rng = np.random.default_rng(0)
    t = config.train.seq_len
    ids = rng.integers(3, config.model.vocab_size, (1, 4, 2, t)).astype(np.int32)
    labels = np.full_like(ids, IGNORE_LABEL)
    labels[:, :, :, 8:14] = ids[:, :, :, 9:15]
    selection = trainable.without_mtp(model, trainable.prepare(model, config.train))
    variables = trainable.without_indexers(model, selection).variables
    step = train_step.make_train_step(
        model, make_optimizer(config.train, variables), variables,
        tf.distribute.get_strategy(), micro_batches=1, grad_clip_norm=1.0,
        objective=preference_objectives.DPOObjective(model, reference, beta=0.1))
    out = step.step_on({"input_ids": tf.constant(ids), "labels": tf.constant(labels)})
    terms = dict(zip(train_step.LOSS_TERMS, out["terms"].numpy(), strict=True))
    assert terms["lm_loss"] == pytest.approx(np.log(2.0), abs=1e-6)
    assert not bool(out["skipped"])


def test_a_grpo_step_samples_from_a_v4_policy_with_its_caches():
    from components.trainer import grpo, preference_objectives, train_step
    from components.trainer.schedule import make_optimizer

    class Bytes:  # token id b + 3 is byte b (`poem_ids`); 0..2 are the added tokens
        eos_id, pad_id = 1, 2

        def surfaces(self, skip_special=True):
            return [b"", b"", b""] + [bytes([b]) for b in range(256)] + [b""] * 253

    config = v4(**{"data.task": "grpo", "train.batch_size": 2, "train.grpo_group_size": 3,
                   "train.grpo_max_new_tokens": 3, "train.grpo_inner_steps": 1})
    keras.utils.set_random_seed(0)
    model = model_io.build_model(config)
    reference = model_io.build_model(config)
    reference.set_weights(model.get_weights())
    selection = trainable.without_mtp(model, trainable.prepare(model, config.train))
    variables = trainable.without_indexers(model, selection).variables
    update = train_step.make_train_step(
        model, make_optimizer(config.train, variables), variables,
        tf.distribute.get_strategy(), micro_batches=1, grad_clip_norm=1.0,
        objective=preference_objectives.GRPOObjective(model, reference, 3, 0.2, 0.04))
    seen = []

    def reward(prompts, completions, answers):  # varied rewards: a non-zero advantage
        seen.extend(completions)
        return [float(len(c.encode("utf-8", "replace"))) + i for i, c in enumerate(completions)]

    step = grpo.GRPOStep(model, tf.distribute.get_strategy(), update, Bytes(), reward,
                         config, micro_batches=1, eos_id=1, pad_id=2, consumed=0)
    prompts = np.full((1, 2, config.train.seq_len), 2, np.int32)
    prompt = poem_ids(["床前明月光，"])
    prompts[0, :, :len(prompt)] = prompt
    batch = {"prompt_ids": tf.constant(prompts),
             "prompt_length": tf.constant([[len(prompt)] * 2], tf.int32),
             "answer_ids": tf.constant(np.full((1, 2, config.train.seq_len), 4, np.int32)),
             "answer_length": tf.constant([[1, 1]], tf.int32)}
    out = step(iter([batch]))
    assert len(seen) == 6  # 2 prompts x G = 3 completions, sampled with V4's caches
    assert np.isfinite(out["terms"].numpy()).all() and not bool(out["skipped"])
    assert float(out["grad_norm"]) > 0  # the rewards differ: a non-zero policy gradient
