"""GRPO's verifiable rewards (`components/trainer/rewards.py`): the built-in exact match
and R1 format rewards, a user's reward_fn from a module file, and their errors."""

from __future__ import annotations

import pytest

from components.trainer import rewards


@pytest.mark.parametrize("completion, answer, expected", [
    ("81", "81", 1.0), (" 81\n", "81", 1.0), ("82", "81", 0.0), ("", "81", 0.0),
    ("<think>8+1=9, 2+5+1=8</think> 81", "81", 1.0),  # the text after the last </think>
    ("<think>81</think> 80", "81", 0.0),
    ("八十一", "八十一", 1.0), ("八十", "八十一", 0.0),
])
def test_exact_match_compares_the_final_answer(completion, answer, expected):
    assert rewards.exact_match("23+58=", completion, answer) == expected


@pytest.mark.parametrize("completion, expected", [
    ("<think>carry the one</think>81", 1.0), ("<think>\n两步\n</think>\n 81", 1.0),
    ("81", 0.0), ("<think>no answer</think>  ", 0.0), ("<think>unclosed 81", 0.0),
    ("text <think>late</think> 81", 0.0),
])
def test_format_reward_is_r1s_think_then_answer(completion, expected):
    assert rewards.format_reward("p", completion, "81") == expected


def test_the_reward_sums_builtins_and_a_module_files_reward_fn(tmp_path):
    module = tmp_path / "my_reward.py"
    module.write_text("def reward_fn(prompt, completion, answer):\n"
                      "    return 0.5 if completion.startswith(answer[:1]) else 0.0\n",
                      encoding="utf-8")
    reward = rewards.Reward("exact_match,format", str(module))
    got = reward(["23+58="] * 3, ["81", "<think>x</think>81", "72"], ["81"] * 3)
    assert got == [1.5, 2.0, 0.0]
    assert rewards.Reward("", str(module))(["p"], ["8"], ["81"]) == [0.5]


def test_reward_errors_name_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match=r"unknown reward\(s\) \['exact'\]"):
        rewards.Reward("exact")
    with pytest.raises(ValueError, match="needs a reward"):
        rewards.Reward("")
    with pytest.raises(FileNotFoundError, match="no such file"):
        rewards.Reward("", str(tmp_path / "missing.py"))
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="defines no function reward_fn"):
        rewards.Reward("", str(empty))
    bad = tmp_path / "bad.py"
    bad.write_text("def reward_fn(prompt, completion, answer):\n"
                   "    return 1.0 if completion == '一' else float('nan')\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"returned nan for completion 1 \('二'\)"):
        rewards.Reward("", str(bad))(["p", "p"], ["一", "二"], ["a", "a"])
