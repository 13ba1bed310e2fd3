"""The LmEvaluator for preference training (issue 29): held-out DPO figures against a
numpy computation on tiny Keras models, GRPO pass@1 and mean reward with a fake
generate_fn on Chinese prompts, and the dpo/grpo blessing rules, without TFX. The
executor itself runs in the pipeline runs of tests/e2e/test_preference_e2e.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from components.lm_evaluator.blessing import decide_blessing
from components.lm_evaluator.preference_scoring import (
    evaluate_dpo,
    evaluate_grpo,
    grpo_eval_records,
    response_rows,
)
from components.trainer.preference import IGNORE_LABEL
from components.trainer.rewards import Reward
from config import get_config

VOCAB, SEQ_LEN, BETA = 40, 12, 0.1
# (chosen ids, rejected ids, prompt_length): ids = prompt ++ response ++ [EOS = 2]
PAIRS = [([5, 6, 7, 8, 9, 2], [5, 6, 7, 11, 2], 3),
         ([13, 14, 15, 2], [13, 16, 17, 18, 19, 2], 1),
         ([20, 21, 22, 23, 2], [20, 21, 24, 2], 2)]


@pytest.fixture(scope="module")
def tiny_models():
    """Two tiny DeepSeekCausalLMs (seeds 0 and 1): one dense block, vocabulary 40."""
    import keras
    import tensorflow as tf

    from models.deepseek.causal_lm import DeepSeekCausalLM

    config = dataclasses.replace(get_config("tiny").model, vocab_size=VOCAB,
                                 max_position_embeddings=SEQ_LEN, num_hidden_layers=1,
                                 num_nextn_predict_layers=0)
    models = []
    for seed in (0, 1):
        keras.utils.set_random_seed(seed)
        model = DeepSeekCausalLM(config)
        model(tf.zeros([1, 4], tf.int32))
        models.append(model)
    return models


def _logits_fn(model):
    return lambda x: model(x, training=False)


def _numpy_logp(model, ids, prompt_length):
    """log pi(response ++ [EOS] | prompt) of one unpadded row, in numpy (float64)."""
    import tensorflow as tf

    logits = model(tf.constant([ids[:-1]], tf.int32), training=False).numpy()[0]  # (n, V)
    logits = logits.astype(np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))  # log_softmax, (n, V)
    return sum(logp[t - 1, ids[t]] for t in range(max(prompt_length, 1), len(ids)))


def test_response_rows_target_the_response_and_the_eos_as_sft_scoring_does():
    inputs, labels = response_rows([([5, 6, 7, 8, 2], 2)], rows=2, seq_len=6, pad_id=0)
    # row 0 reads 5 6 7 8 and predicts, after the 2-token prompt, 7 8 and the EOS.
    assert inputs.tolist() == [[5, 6, 7, 8, 0, 0], [0] * 6]
    x = IGNORE_LABEL
    assert labels.tolist() == [[x, 7, 8, 2, x, x], [x] * 6]


def test_evaluate_dpo_equals_a_numpy_computation(tiny_models):
    policy, reference = tiny_models
    got = evaluate_dpo(_logits_fn(policy), _logits_fn(reference), PAIRS, BETA, batch_size=2,
                       seq_len=SEQ_LEN, pad_id=0)
    chosen = np.array([BETA * (_numpy_logp(policy, c, p) - _numpy_logp(reference, c, p))
                       for c, _, p in PAIRS])
    rejected = np.array([BETA * (_numpy_logp(policy, r, p) - _numpy_logp(reference, r, p))
                         for _, r, p in PAIRS])
    margin = chosen - rejected
    assert got["pairs"] == 3 and got["skipped_too_long"] == 0
    assert got["chosen_reward"] == pytest.approx(chosen.mean(), abs=1e-5)
    assert got["rejected_reward"] == pytest.approx(rejected.mean(), abs=1e-5)
    assert got["reward_margin"] == pytest.approx(margin.mean(), abs=1e-5)
    assert got["reward_margin_stderr"] == pytest.approx(margin.std(ddof=1) / math.sqrt(3),
                                                        abs=1e-5)
    hits = (margin > 0).astype(np.float64)
    assert got["reward_accuracy"] == pytest.approx(hits.mean())
    assert got["reward_accuracy_stderr"] == pytest.approx(
        math.sqrt(hits.var(ddof=1) / 3) if hits.var() else 0.0)
    assert got["policy_chosen_logp"] == pytest.approx(
        np.mean([_numpy_logp(policy, c, p) for c, _, p in PAIRS]), abs=1e-4)


def test_a_reference_equal_to_the_policy_gives_margin_0_and_accuracy_0(tiny_models):
    policy = _logits_fn(tiny_models[0])
    got = evaluate_dpo(policy, policy, PAIRS, BETA, batch_size=2, seq_len=SEQ_LEN, pad_id=0)
    # every reward is beta * 0: ties, and a tie is not a win (TRL's strict >)
    assert got["reward_margin"] == 0.0 and got["chosen_reward"] == 0.0
    assert got["reward_accuracy"] == 0.0 and got["reward_accuracy_stderr"] == 0.0


def test_evaluate_dpo_skips_long_pairs_and_traces_one_batch_shape(tiny_models):
    traced = []

    def logits_fn(x):
        traced.append(tuple(x.shape))  # runs once per trace of the tf.function
        return tiny_models[0](x, training=False)

    too_long = ([5, 6] + [7] * SEQ_LEN + [2], [5, 6, 8, 2], 2)  # chosen: 15 ids > 13
    got = evaluate_dpo(logits_fn, _logits_fn(tiny_models[1]), PAIRS + [too_long], BETA,
                       batch_size=2, seq_len=SEQ_LEN, pad_id=0)
    assert got["pairs"] == 3 and got["skipped_too_long"] == 1
    assert traced == [(4, SEQ_LEN)]  # 2 batches of 2 pairs (the second filled), one trace
    with pytest.raises(ValueError, match="no DPO eval pair fits train.seq_len=12"):
        evaluate_dpo(logits_fn, logits_fn, [too_long], BETA, batch_size=2, seq_len=SEQ_LEN)
    with pytest.raises(ValueError, match="train.dpo_beta=0"):
        evaluate_dpo(logits_fn, logits_fn, PAIRS, 0, batch_size=2, seq_len=SEQ_LEN)


# Chinese arithmetic prompts, answered in Chinese numerals
GRPO = [("二十三加五十八等于", "八十一"), ("十二加十二等于", "二十四"),
        ("七加八等于", "十五"), ("九十加九等于", "九十九"), ("一加一等于", "二")]
ANSWERS = {"二十三加五十八等于": "<think>二十加五十是七十</think>八十一",  # right, in format
           "十二加十二等于": "二十四",  # right, no format
           "七加八等于": "十六",  # wrong
           "九十加九等于": "<think>想一想</think>九十八",  # wrong, in format
           "一加一等于": " 二 "}  # right (stripped)


def test_evaluate_grpo_scores_pass_at_1_and_the_runs_reward():
    calls = []

    def generate_fn(prompts, max_new_tokens):
        calls.append((len(prompts), max_new_tokens))
        return [ANSWERS[p] for p in prompts]

    metrics, samples = evaluate_grpo(generate_fn, GRPO, Reward("exact_match,format"),
                                     max_new_tokens=8, batch_size=2, samples=3)
    assert calls == [(2, 8)] * 3  # 5 prompts in 3 calls of 2 (the last one filled up)
    hits = np.array([1, 1, 0, 0, 1], np.float64)
    assert metrics["pass_at_1"] == pytest.approx(0.6)
    assert metrics["pass_at_1_stderr"] == pytest.approx(math.sqrt(hits.var(ddof=1) / 5))
    rewards = hits + np.array([1, 0, 0, 1, 0])  # exact_match + format
    assert metrics["mean_reward"] == pytest.approx(rewards.mean())
    assert metrics["completion_length"] == pytest.approx(
        np.mean([len(ANSWERS[p]) for p, _ in GRPO]))
    assert metrics["prompts"] == 5
    assert samples[0] == {"prompt": "二十三加五十八等于", "completion": ANSWERS["二十三加五十八等于"],
                          "answer": "八十一", "reward": 2.0, "exact_match": 1.0}
    assert len(samples) == 3
    with pytest.raises(ValueError, match="nothing to score"):
        evaluate_grpo(generate_fn, [], Reward("exact_match"), 8, 2)


def test_grpo_eval_records_decode_prompt_and_answer_and_skip_what_cannot_fit():
    chars = ["<pad>", "<s>", "</s>"] + list("七加八等于十五九")
    decode = "".join  # ids -> text through `chars`

    def ids(text):
        return [chars.index(c) for c in text]

    records = [([1] + ids("七加八等于") + ids("十五") + [2], 6, 6),
               ([1] + ids("九加九等于") + ids("十八"[:1]) + [2], 6, 3)]
    texts, skipped = grpo_eval_records(records, lambda i: decode(chars[t] for t in i),
                                       seq_len=10, max_new_tokens=4)
    assert texts == [("<s>七加八等于", "十五"), ("<s>九加九等于", "十")] and skipped == 0
    texts, skipped = grpo_eval_records(records, lambda i: decode(chars[t] for t in i),
                                       seq_len=9, max_new_tokens=4)  # 6 + 4 > 9
    assert texts == [] and skipped == 2


def _config(task, **eval_settings):
    return get_config("tiny", {"data.task": task,
                               **{f"eval.{k}": v for k, v in eval_settings.items()}})


def test_dpo_blessing_gates_on_reward_accuracy_and_absolute_bits_per_byte():
    config = _config("dpo", min_reward_accuracy=0.6, max_bits_per_byte=3.0)
    good = {"bits_per_byte": 2.5, "reward_accuracy": 0.7, "reward_margin": 0.25}
    blessed, message = decide_blessing(good, None, config)
    assert blessed
    assert "reward_accuracy 0.7000 >= eval.min_reward_accuracy 0.6000" in message
    # worse bits per byte than the baseline is no failure for dpo
    blessed, message = decide_blessing(good, {"bits_per_byte": 1.0}, config)
    assert blessed and "no rule against the baseline's bits_per_byte" in message
    blessed, message = decide_blessing({**good, "reward_accuracy": 0.55, "bits_per_byte": 3.5},
                                       None, config)
    assert not blessed
    assert "reward_accuracy 0.5500 < eval.min_reward_accuracy 0.6000" in message
    assert "bits_per_byte 3.5000 > eval.max_bits_per_byte 3.0000" in message
    with pytest.raises(ValueError, match="data.task=dpo: the evaluation has no 'reward_accuracy'"):
        decide_blessing({"bits_per_byte": 2.5}, None, config)


def test_grpo_blessing_gates_on_pass_at_1_and_the_baseline_within_noise():
    config = _config("grpo", min_pass_at_1=0.3, task_tolerance=0.02)
    candidate = {"bits_per_byte": 2.0, "pass_at_1": 0.40, "pass_at_1_stderr": 0.03}
    blessed, message = decide_blessing(candidate, None, config)
    assert blessed and "pass_at_1 0.4000 >= eval.min_pass_at_1 0.3000" in message
    blessed, message = decide_blessing({**candidate, "pass_at_1": 0.2}, None, config)
    assert not blessed and "pass_at_1 0.2000 < eval.min_pass_at_1 0.3000" in message
    # allowed drop = max(0.02, 2 * hypot(0.03, 0.04) = 0.10): 0.40 vs 0.49 is noise
    baseline = {"bits_per_byte": 1.0, "pass_at_1": 0.49, "pass_at_1_stderr": 0.04}
    blessed, message = decide_blessing(candidate, baseline, config)
    assert blessed and "allowed down to 0.3900" in message
    blessed, message = decide_blessing(candidate, {**baseline, "pass_at_1": 0.51}, config)
    assert not blessed
    assert ("pass_at_1 0.4000 is worse than the last blessed model's 0.5100 (allowed down "
            "to 0.4100") in message and "0.1000)" in message
    # with no standard errors the tolerance alone decides
    blessed, message = decide_blessing({"bits_per_byte": 2.0, "pass_at_1": 0.40}, {
        "bits_per_byte": 2.0, "pass_at_1": 0.43}, config)
    assert not blessed and "allowed down to 0.4100" in message


def test_pretrain_blessing_keeps_the_relative_bits_per_byte_rule():
    config = get_config("tiny", {"eval.max_bits_per_byte": 3.0})
    blessed, message = decide_blessing({"bits_per_byte": 2.5, "reward_accuracy": 0.0},
                                       {"bits_per_byte": 1.0}, config)
    assert not blessed and "worse than the last blessed model's 1.0000" in message


UNITS = {"二十": 30, "三": 20, "加": 40, "五十": 20, "八": 20, "等于": 40, "一": 20, "七": 10,
         "十": 30, "九": 10}
TINY_VOCAB, CONTEXT = 300, 64


def _write_examples(path, rows):
    """Transformed eval examples: {feature: list[int] or int} per row, gzip TFRecords."""
    import tensorflow as tf

    split = path / "Split-eval"
    split.mkdir(parents=True)
    with tf.io.TFRecordWriter(str(split / "data.gz"), options="GZIP") as writer:
        for row in rows:
            feature = {k: tf.train.Feature(int64_list=tf.train.Int64List(
                value=v if isinstance(v, list) else [v])) for k, v in row.items()}
            writer.write(tf.train.Example(
                features=tf.train.Features(feature=feature)).SerializeToString())
