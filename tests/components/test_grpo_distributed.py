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

import signal

import numpy as np
import pytest
from fault_injection import run_cluster_job

from components.trainer import data, model_io
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
    signal, after step) sent as the heartbeats pass the step (`run_cluster_job`); the
    result JSON plus "restarts"."""
    train_file, base, tokenizer_dir, reward = files
    return run_cluster_job(base_config(reward), num_workers, train_file, workdir, faults,
                           base_model=base, tokenizer_dir=tokenizer_dir)


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
    # The whole run's windows against the uninterrupted one-worker run's: steps 1..4 came
    # back with the checkpoint the restarted group resumed from, 5..12 are its own.
    rewards_1, rewards_2 = _by_step(one, "reward_mean"), _by_step(two, "reward_mean")
    steps = [h["step"] for h in two["history"]]
    assert steps == list(range(1, STEPS + 1)), steps
    np.testing.assert_allclose([rewards_2[s] for s in steps], [rewards_1[s] for s in steps],
                               atol=1e-6)
    assert len({round(v, 6) for v in rewards_1.values()}) > 1  # completions differ by step
    assert min(_by_step(one, "reward_std").values()) > 0  # every step has a gradient
    np.testing.assert_allclose([h["loss"] for h in two["history"]],
                               [h["loss"] for h in one["history"] if h["step"] in rewards_2],
                               rtol=1e-4, atol=1e-6)
