"""GRPO across workers and through a kill -9 (issue 29): the sampled completions, rewards
and updates of 2 loopback workers are those of one worker, and a worker killed mid-run
restarts from the last checkpoint and ends at the same step with the same figures.

The sampling seeds are a function of the run's seed, the rollout index (batches consumed,
checkpointed) and the global row (`grpo.rollout_seeds`), so a restarted or split run
draws the very completions of the uninterrupted one-worker run. The reward here is a
user's `reward_fn` from a module file (the completion's bytes), so the untrained tiny
model's completions score differently within a group and every step has a policy
gradient.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import threading

import numpy as np
import pytest
from fault_injection import inject

from components.trainer import data, launcher, model_io
from components.trainer import job as job_lib
from config import get_config
from config.sections import GenerationConfig
from corpus import addition
from savedmodel.export import save_text_model
from tokenization.tokenizer import learn

pytestmark = pytest.mark.slow  # worker processes (TensorFlow import, a loopback cluster)

STEPS = 12
REWARD = '''
def reward_fn(prompt, completion, answer):
    """The completion's UTF-8 bytes: an untrained model's completions differ in it (ids
    past the tokenizer's vocabulary decode to no bytes)."""
    return len(completion.encode("utf-8")) / 4.0
'''


@pytest.fixture(scope="module")
def grpo_files(tmp_path_factory):
    """(train file, base model dir, tokenizer dir, reward module) for the runs."""
    import keras
    import tokenizers

    d = tmp_path_factory.mktemp("grpo")
    problems = addition.problems("train")[:256]
    # Byte tokens only (no pair is that frequent): digits are single tokens.
    tok = learn({p + a: 1 for p, a in problems}, 300, min_frequency=10**9)
    tok.write(str(d / "tokenizer"))
    hf = tokenizers.Tokenizer.from_str(tok.to_json_string())

    def enc(s):
        return hf.encode(s, add_special_tokens=False).ids

    train_file = str(d / "train.tfrecord.gz")
    data.write_sft_examples(train_file, [(enc(p) + enc(a) + [tok.eos_id], len(enc(p)), len(a))
                                         for p, a in problems])
    config = base_config(str(d / "reward.py"))
    keras.utils.set_random_seed(0)
    model = model_io.build_model(config)
    save_text_model(model, tok, GenerationConfig(), str(d / "base"))
    (d / "reward.py").write_text(REWARD, encoding="utf-8")
    return train_file, str(d / "base"), str(d / "tokenizer"), str(d / "reward.py")


def base_config(reward_file: str, **train):
    return get_config("tiny", {
        "data.task": "grpo", "train.train_steps": STEPS, "train.log_every": 1,
        "train.checkpoint_every": 4, "train.warmup_steps": 1, "train.seq_len": 16,
        "train.batch_size": 4, "train.grpo_group_size": 4, "train.grpo_max_new_tokens": 4,
        "train.learning_rate": 1e-3, "train.grpo_rewards": "",
        "train.reward_module_file": reward_file,
        **{f"train.{k}": v for k, v in train.items()}})


def run_grpo(num_workers: int, files, workdir, faults=()) -> dict:
    """GRPO for STEPS steps on `num_workers` loopback workers, with `faults` (worker,
    signal, after step) sent as the heartbeats pass the step; the result JSON plus
    "restarts"."""
    train_file, base, tokenizer_dir, reward = files
    job = job_lib.TrainingJob(
        pipeline_config=base_config(reward).to_json(), train_files=[train_file],
        checkpoint_dir=str(workdir / "ckpt"), log_dir=str(workdir / "logs"),
        result_path=str(workdir / "result.json"), peak_flops_per_device=1e11,
        peak_flops_source="fixed for the test", base_model=base, tokenizer_dir=tokenizer_dir)
    sent: list[float] = []
    injector = threading.Thread(target=inject, args=(workdir / "logs", faults, sent),
                                daemon=True)
    injector.start()
    restarts = launcher.run_workers(job, num_workers, job_dir=str(workdir / "logs"),
                                    timeout_s=900)
    injector.join(timeout=1)
    assert len(sent) == len(faults), f"only {len(sent)} of the faults {faults} were sent"
    with open(job.result_path) as f:
        return {**json.load(f), "restarts": [dataclasses.asdict(r) for r in restarts]}


def _by_step(run: dict, key: str) -> dict[int, float]:
    return {h["step"]: h["figures"][key] for h in run["history"]}


def test_grpo_on_two_workers_killed_midway_ends_as_one_worker(grpo_files, tmp_path):
    one = run_grpo(1, grpo_files, tmp_path / "one")
    two = run_grpo(2, grpo_files, tmp_path / "two", faults=((1, signal.SIGKILL, 6),))
    (lost,) = two["restarts"]
    assert lost["cause"] == "lost" and lost["resumed_from_step"] == 4, lost
    assert "killed by SIGKILL" in lost["reason"]
    assert one["train_steps"] == two["train_steps"] == STEPS
    assert two["num_workers"] == 2 and two["global_batch_size"] == one["global_batch_size"]
    # The resumed run's windows (steps 5..12) against the uninterrupted one-worker run's.
    rewards_1, rewards_2 = _by_step(one, "reward_mean"), _by_step(two, "reward_mean")
    steps = sorted(rewards_2)
    assert steps[0] == 5 and steps[-1] == STEPS, steps
    np.testing.assert_allclose([rewards_2[s] for s in steps], [rewards_1[s] for s in steps],
                               atol=1e-6)
    assert len({round(v, 6) for v in rewards_1.values()}) > 1  # completions differ by step
    assert min(_by_step(one, "reward_std").values()) > 0  # every step has a gradient
    np.testing.assert_allclose([h["loss"] for h in two["history"]],
                               [h["loss"] for h in one["history"] if h["step"] in rewards_2],
                               rtol=1e-4, atol=1e-6)
