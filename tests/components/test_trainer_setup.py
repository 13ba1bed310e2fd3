"""The Trainer's choices, without training: strategy, precision, peak FLOP/s,
schedule, weight decay, replica sharding of global batches, checkpoint fingerprint."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import checkpoint_location, data, hardware, precision, strategy
from components.trainer.hardware import Accelerator
from components.trainer.schedule import make_learning_rate_schedule, make_optimizer
from config import get_config
from models.deepseek import DeepSeekCausalLM, flops

CPU = Accelerator("cpu", "AMD EPYC", 1, None, frozenset({"avx2", "fma"}))
CPU_AMX = Accelerator("cpu", "Xeon", 1, None, frozenset({"avx512f", "amx_bf16", "amx_tile"}))
A100 = Accelerator("gpu", "NVIDIA A100-SXM4-40GB", 8, (8, 0))
V100 = Accelerator("gpu", "Tesla V100-SXM2-16GB", 1, (7, 0))
P100 = Accelerator("gpu", "Tesla P100", 1, (6, 0))
TPU = Accelerator("tpu", "TPU v4", 0)


@pytest.mark.parametrize("accelerator, policy", [
    (CPU, "float32"), (CPU_AMX, "float32"), (A100, "mixed_bfloat16"),
    (V100, "mixed_float16"), (P100, "float32"), (TPU, "mixed_bfloat16"),
])
def test_auto_precision_per_device(accelerator, policy):
    assert precision.choose_policy("auto", accelerator)[0] == policy


def test_a_bf16_policy_with_xla_on_a_cpu_with_amx_is_refused():
    # TF 2.16's XLA CPU backend fails the step's bf16 dots on AMX CPUs ("unsupported
    # operand type BF16 in op dot"), measured on a Xeon with AMX.
    for policy in ("mixed_bfloat16", "bfloat16"):
        with pytest.raises(ValueError, match=rf"precision {policy} with train.jit_compile="
                                             r"true on this CPU \(Xeon, AMX\).*"
                                             r"train.jit_compile=false"):
            precision.check_xla(policy, CPU_AMX, xla=True)
    precision.check_xla("mixed_bfloat16", CPU_AMX, xla=False)  # bf16 without XLA
    precision.check_xla("mixed_bfloat16", CPU, xla=True)  # no AMX: not refused
    precision.check_xla("mixed_bfloat16", A100, xla=True)
    precision.check_xla("float32", CPU_AMX, xla=True)


def test_precision_override_and_bad_value():
    assert precision.choose_policy("mixed_bfloat16", CPU)[0] == "mixed_bfloat16"
    with pytest.raises(ValueError, match="train.precision='half'"):
        precision.choose_policy("half", CPU)
    with pytest.raises(ValueError, match="train.precision='half'"):
        get_config("tiny", {"train.precision": "half"})


def test_cpu_flags_parsed(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Xeon X\nflags\t\t: fpu avx2 amx_bf16\n")
    name, flags = hardware.cpu_info(str(cpuinfo))
    assert name == "Xeon X" and "amx_bf16" in flags
    assert hardware.cpu_info(str(tmp_path / "missing")) == ("cpu", frozenset())


def test_auto_strategy(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert strategy.resolve_name("auto", CPU) == "one_device"
    assert strategy.resolve_name("auto", A100) == "mirrored"
    assert strategy.resolve_name("auto", V100) == "one_device"
    assert strategy.resolve_name("auto", TPU) == "tpu"
    assert strategy.resolve_name("mirrored", CPU) == "mirrored"
    cluster = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]},
               "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(cluster))
    assert strategy.resolve_name("auto", CPU) == "multi_worker"
    assert strategy.resolve_name("auto", A100) == "multi_worker"
    assert strategy.cluster_size() == 2
    assert strategy.cluster_hosts() == 1  # two workers on loopback share one host
    assert strategy.cluster_hosts({"cluster": {"chief": ["a:1"], "worker": ["b:1", "b:2"]}}) == 2


def test_one_device_strategy_is_the_default():
    s = strategy.make_strategy("one_device")
    assert strategy.describe(s) == "OneDevice" and s.num_replicas_in_sync == 1
    assert strategy.is_chief(s) and strategy.num_workers(s) == 1


def test_peak_flops_table_and_probe():
    assert flops.table_peak_flops("NVIDIA A100-SXM4-40GB", "bfloat16") == 312e12
    assert flops.table_peak_flops("NVIDIA A100-SXM4-40GB", "float32") == 156e12  # TF32
    assert flops.table_peak_flops("NVIDIA A100-SXM4-40GB", "float32", tf32=False) == 19.5e12
    assert flops.table_peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756e12
    assert flops.table_peak_flops("Tesla T4", "bfloat16") is None  # no bf16 on Turing
    assert flops.table_peak_flops("TPU v4", "bfloat16") == 275e12
    assert flops.table_peak_flops("Some New GPU", "bfloat16") is None
    probe = hardware.probe_matmul_peak("float32", shapes=((256, 256, 256),), repeats=2,
                                       warmup_s=0.0).peak_flops
    assert 1e8 < probe < 1e14
    peak, source, _ = hardware.peak_flops(A100, "bfloat16")
    assert (peak, source) == (312e12, "table:NVIDIA A100-SXM4-40GB")


def test_schedule_warmup_then_cosine_on_optimizer_steps():
    tc = get_config("tiny", {"train.train_steps": 110, "train.warmup_steps": 10,
                             "train.learning_rate": 1e-3, "train.min_learning_rate": 1e-4}).train
    lr = make_learning_rate_schedule(tc)
    # warmup: lr(s) = peak * s / warmup; then peak -> min over the remaining 100 steps
    np.testing.assert_allclose(float(lr(0)), 0.0, atol=1e-12)
    np.testing.assert_allclose(float(lr(5)), 5e-4, rtol=1e-6)
    np.testing.assert_allclose(float(lr(10)), 1e-3, rtol=1e-6)
    # halfway through the decay: min + (peak - min) * (1 + cos(pi/2)) / 2 = 5.5e-4
    np.testing.assert_allclose(float(lr(60)), 5.5e-4, rtol=1e-5)
    np.testing.assert_allclose(float(lr(110)), 1e-4, rtol=1e-5)


def test_weight_decay_on_matrices_not_on_norms():
    """With zero gradients AdamW's update is the decay alone: w -= lr * wd * w."""
    config = get_config("tiny", {"train.warmup_steps": 0, "train.weight_decay": 0.5,
                                 "train.learning_rate": 0.1, "train.min_learning_rate": 0.01})
    model = DeepSeekCausalLM(config.model)
    variables = model.trainable_variables
    optimizer = make_optimizer(config.train, variables)
    before = [v.numpy().copy() for v in variables]
    optimizer.apply([tf.zeros_like(v) for v in variables], variables)
    for v, b in zip(variables, before, strict=True):
        after = v.numpy()
        if len(v.shape) < 2:  # RMSNorm scales
            np.testing.assert_array_equal(after, b, err_msg=v.path)
        else:  # kernels, embedding, router weight: w * (1 - 0.1 * 0.5)
            np.testing.assert_allclose(after, b * 0.95, rtol=1e-6, err_msg=v.path)
    assert any("norm" in v.path for v in variables if len(v.shape) < 2)


def test_split_for_replicas_row_layout():
    # Global batch of 8 rows (row i holds i), k = 2 micro-batches, R = 2 replicas:
    # micro-batch 0 = rows 0-3, micro-batch 1 = rows 4-7; replica r takes b = 2 rows of each.
    rows = tf.reshape(tf.range(8 * 3), [8, 3]) // 3  # (8, 3): row i is [i, i, i]
    ds = tf.data.Dataset.from_tensors({"input_ids": rows}).repeat(2)
    both = [e["input_ids"][:, :, 0].numpy().tolist() for e in data.split_for_replicas(ds, 2, 2)]
    assert both[:2] == [[[0, 1], [4, 5]], [[2, 3], [6, 7]]]  # replica 0, replica 1
    assert len(both) == 4  # 2 global batches x 2 replicas
    second = [e["input_ids"][:, :, 0].numpy().tolist()
              for e in data.split_for_replicas(ds, 2, 2, first_replica=1, num_local_replicas=1)]
    assert second == [[[2, 3], [6, 7]]] * 2
    one = [e["input_ids"][:, :, 0].numpy().tolist() for e in data.split_for_replicas(ds, 2, 1)]
    assert one[0] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # one replica: the same micro-batches
    with pytest.raises(ValueError, match="divisible"):
        data.split_for_replicas(ds, 3, 1)


def test_checkpoint_fingerprint(tmp_path):
    f = tmp_path / "train-00000.gz"
    data.write_examples(str(f), [[5, 6, 7], [8, 9]])
    base = get_config("tiny")
    fp = checkpoint_location.fingerprint(base, [str(tmp_path / "*.gz")])
    assert len(fp) == 16
    # How the run is executed does not matter ...
    same = get_config("tiny", {"train.log_every": 1, "train.checkpoint_every": 3,
                               "train.grad_accum_steps": 2, "train.distribution_strategy": "mirrored"})
    assert checkpoint_location.fingerprint(same, [str(f)]) == fp
    # ... what is trained on, and how, does.
    assert checkpoint_location.fingerprint(get_config("tiny", {"train.train_steps": 31}), [str(f)]) != fp
    data.write_examples(str(f), [[5, 6, 7], [8, 10]])
    assert checkpoint_location.fingerprint(base, [str(f)]) != fp
    model_run = tmp_path / "root" / "Trainer" / "model_run" / "7"
    path = checkpoint_location.stable_checkpoint_dir(str(model_run), base, [str(f)])
    assert path == str(tmp_path / "root" / "Trainer" / "checkpoints" /
                       checkpoint_location.fingerprint(base, [str(f)]))
    checkpoint_location.link_from_model_run(str(model_run), path)
    assert (model_run / "checkpoints.txt").read_text() == path + "\n"
    # No link into the checkpoints: TFX's rmtree of a failed execution's outputs would
    # follow it and delete them.
    assert not (model_run / "checkpoints").exists()


def test_config_validation_of_train_fields():
    with pytest.raises(ValueError, match="must be divisible by train.grad_accum_steps=3"):
        get_config("tiny", {"train.grad_accum_steps": 3})
    with pytest.raises(ValueError, match="train.distribution_strategy='ps'"):
        get_config("tiny", {"train.distribution_strategy": "ps"})
    with pytest.raises(ValueError, match="train.recompute_activations"):
        get_config("tiny", {"train.recompute_activations": "yes"})


@pytest.mark.slow
def test_fused_adamw_matches_keras_adamw():
    """The fused update (ResourceApplyAdam + decoupled decay) == keras.optimizers.AdamW."""
    import keras

    from components.trainer.schedule import no_decay_variables

    config = get_config("tiny", {"train.warmup_steps": 2})
    tc = config.train
    keras.utils.set_random_seed(0)
    fused_model = DeepSeekCausalLM(config.model)
    keras.utils.set_random_seed(0)
    keras_model = DeepSeekCausalLM(config.model)
    fused = make_optimizer(tc, fused_model.trainable_variables)
    reference = keras.optimizers.AdamW(
        learning_rate=make_learning_rate_schedule(tc), weight_decay=tc.weight_decay,
        beta_1=tc.beta_1, beta_2=tc.beta_2, epsilon=1e-8)
    reference.exclude_from_weight_decay(var_list=no_decay_variables(keras_model.trainable_variables))
    reference.build(keras_model.trainable_variables)
    apply_fused = tf.function(lambda g: fused.apply(g, fused_model.trainable_variables))
    apply_keras = tf.function(lambda g: reference.apply(g, keras_model.trainable_variables))
    for step in range(4):
        grads = [tf.random.stateless_normal(v.shape, [step, i])
                 for i, v in enumerate(fused_model.trainable_variables)]
        apply_fused(grads)
        apply_keras(grads)
    for a, b in zip(fused_model.get_weights(), keras_model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
