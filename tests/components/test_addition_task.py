"""The two-digit addition task of issue 29's end-to-end runs (`corpus/addition.py`)."""

from __future__ import annotations

import pytest

from corpus import addition


def test_the_split_is_deterministic_disjoint_and_about_one_tenth_held_out():
    train, held_out = addition.problems("train"), addition.problems("held_out")
    assert len(train) + len(held_out) == 90 * 90
    assert not set(train) & set(held_out)
    assert 0.08 < len(held_out) / 8100 < 0.12
    assert addition.problems("held_out") == held_out
    assert all(int(a) == sum(map(int, p[:-1].split("+"))) for p, a in held_out)
    with pytest.raises(ValueError, match="split='test'"):
        addition.problems("test")


def test_records_and_pairs():
    (record,) = addition.sft_records(limit=1, seed=3)
    assert set(record) == {"context", "response"}
    assert addition.reward(record["context"], record["response"]) == 1.0
    pairs = addition.preference_pairs(limit=200, seed=1)
    assert len(pairs) == 200
    for pair in pairs:
        assert addition.reward(pair["prompt"], pair["chosen"]) == 1.0
        assert addition.reward(pair["prompt"], pair["rejected"]) == 0.0
    assert addition.preference_pairs(limit=5, seed=1) == pairs[:5]


@pytest.mark.parametrize("completion, expected", [
    ("81", 1.0), ("81<|end▁of▁sentence|>", 1.0), (" 81 and more", 1.0), ("80", 0.0),
    ("", 0.0), ("eighty-one", 0.0), ("811", 0.0),
])
def test_reward(completion, expected):
    assert addition.reward("23+58=", completion) == expected
    with pytest.raises(ValueError, match="expected 'A\\+B='"):
        addition.reward("23 plus 58", "81")
