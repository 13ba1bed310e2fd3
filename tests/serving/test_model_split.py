"""`--model NAME=DIR` and `--split A=90,B=10` (serving/model_split.py): parsing, the
one-line errors, the traffic shares and stickiness per user id. No TensorFlow."""

from __future__ import annotations

import ast
import collections
import os
import subprocess
import sys

import pytest

from serving.model_split import ModelSplit, parse_models, parse_split

# ----------------------------------------------------------------------------- --model


def test_one_bare_dir_is_named_by_model_name_as_before():
    assert parse_models(["serving/dir"], "deepseek") == {"deepseek": "serving/dir"}
    assert parse_models(["/m"], "mine") == {"mine": "/m"}


def test_named_models_keep_their_order_and_a_bare_dir_may_sit_beside_them():
    assert list(parse_models(["B=/b", "A=/a"], "x").items()) == [("B", "/b"), ("A", "/a")]
    assert parse_models(["/base", "sft-v2.1=/sft"], "base") == {"base": "/base",
                                                                 "sft-v2.1": "/sft"}
    # only the first "=" splits: the DIR keeps the rest
    assert parse_models(["A=runs/lr=3e-4"], "x") == {"A": "runs/lr=3e-4"}
    # the same directory under two names (an A/A test) is allowed
    assert parse_models(["A=/m", "B=/m"], "x") == {"A": "/m", "B": "/m"}


def test_an_existing_path_with_an_equals_sign_is_one_unnamed_model(tmp_path, monkeypatch):
    path = tmp_path / "lr=3e-4"
    path.mkdir()
    monkeypatch.chdir(tmp_path)
    assert parse_models(["lr=3e-4"], "deepseek") == {"deepseek": "lr=3e-4"}
    assert parse_models([str(path)], "deepseek") == {"deepseek": str(path)}
    # the same text where no such path exists is model "lr" in dir "3e-4"
    path.rmdir()
    assert parse_models(["lr=3e-4"], "deepseek") == {"lr": "3e-4"}


@pytest.mark.parametrize("values, message", [
    ([], r"^--model: no model given"),
    ([""], r"^--model '': empty"),
    (["A="], r"^--model 'A=': no directory after 'A='$"),
    (["a b=/m"], r"^--model 'a b=/m': 'a b' is not a valid model name .* not an existing path$"),
    (["模型=/m"], r"^--model '模型=/m': '模型' is not a valid model name"),
    (["..=/m"], r"^--model '..=/m': '..' is not a valid model name"),
    (["x" * 129 + "=/m"], r"is not a valid model name \(1-128 characters"),
    (["A=/a", "A=/b"], r"^--model 'A=/b': the name 'A' is given twice \(also for '/a'\)$"),
    (["/a", "/b"], r"^--model '/b': a second model without a name \(after '/a'\)"),
    (["deepseek=/a", "/b"], r"^--model '/b': the name 'deepseek' \(--model-name\) is given "
                            r"twice"),
])
def test_bad_model_values_are_refused_in_one_line_naming_the_value(values, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_models(values, "deepseek")
    assert "\n" not in str(e.value)


def test_a_bad_model_name_flag_and_undecodable_bytes_are_named_without_a_crash():
    with pytest.raises(ValueError, match=r"^--model-name 'my model' is not a valid model name"):
        parse_models(["/m"], "my model")
    # an argument with undecodable bytes arrives with lone surrogates (PEP 383)
    bad = os.fsdecode(b"\xff=/m")
    with pytest.raises(ValueError, match=r"'\\udcff' is not a valid model name") as e:
        parse_models([bad], "deepseek")
    str(e.value).encode("ascii")  # printable anywhere: the surrogate is escaped


# ----------------------------------------------------------------------------- --split


def test_split_parses_percents_in_order():
    split = parse_split("A=90,B=10", ["A", "B", "C"])
    assert split.weights == (("A", 90.0), ("B", 10.0)) and split.names == ("A", "B")
    assert split.shares() == {"A": 0.9, "B": 0.1}
    assert str(split) == "A=90,B=10"
    assert parse_split(" A = 33.4, B=33.3 ,C=33.3", ["A", "B", "C"]).weights == (
        ("A", 33.4), ("B", 33.3), ("C", 33.3))
    assert parse_split("B=100", ["A", "B"]).choose("anyone") == "B"


@pytest.mark.parametrize("text, message", [
    ("", r"^--split '': empty"),
    ("A=90,", r"^--split 'A=90,': '' is not NAME=PERCENT"),
    ("A90,B=10", r"^--split 'A90,B=10': 'A90' is not NAME=PERCENT"),
    ("A=90,C=10", r"^--split 'A=90,C=10': 'C' is not a served model \(served: A, B\)$"),
    ("A=50,A=50", r"^--split 'A=50,A=50': 'A' is given twice$"),
    ("A=100,B=0", r"the weight '0' of 'B' is not a positive number"),
    ("A=110,B=-10", r"the weight '-10' of 'B' is not a positive number"),
    ("A=nan,B=10", r"the weight 'nan' of 'A'"),
    ("A=inf,B=10", r"the weight 'inf' of 'A'"),
    ("A=1e2", r"the weight '1e2' of 'A'"),
    ("A=９０,B=10", r"the weight '９０' of 'A'"),
    ("A=9,B=1", r"^--split 'A=9,B=1': the weights sum to 10, not 100 \(they are percents\)$"),
    ("A=90,B=11", r"the weights sum to 101, not 100"),
])
def test_bad_splits_are_refused_in_one_line_naming_the_value(text, message):
    with pytest.raises(ValueError, match=message) as e:
        parse_split(text, ["A", "B"])
    assert "\n" not in str(e.value)


# ----------------------------------------------------------------------------- choosing


def test_distinct_users_split_90_10_within_3_points_and_each_user_is_sticky():
    split = parse_split("A=90,B=10", ["A", "B"])
    users = [f"user-{i}" for i in range(1000)]
    chosen = {user: split.choose(user) for user in users}
    share_a = sum(model == "A" for model in chosen.values()) / len(users)
    assert 0.87 <= share_a <= 0.93, share_a
    for _ in range(3):  # the same id, the same model, every time
        assert all(split.choose(user) == model for user, model in chosen.items())
    # a fresh split (another server, seeded differently) agrees for every id
    assert all(parse_split("A=90,B=10", ["A", "B"], seed=7).choose(u) == m
               for u, m in chosen.items())
    # Chinese and other ids are sticky too
    assert len({split.choose("用户-张三") for _ in range(20)}) == 1


def test_users_go_to_b_when_the_weights_are_swapped_for_the_same_share():
    # The test can fail: a split that ignored the weights or reversed them.
    split = parse_split("A=10,B=90", ["A", "B"])
    counts = collections.Counter(split.choose(f"session-{i}") for i in range(1000))
    assert 870 <= counts["B"] <= 930, counts


def test_shrinking_a_share_moves_only_the_users_in_between():
    before = parse_split("A=90,B=10", ["A", "B"])
    after = parse_split("A=80,B=20", ["A", "B"])
    users = [f"u{i}" for i in range(1000)]
    moved = [u for u in users if before.choose(u) != after.choose(u)]
    assert all(before.choose(u) == "A" and after.choose(u) == "B" for u in moved)
    assert all(0.8 <= ModelSplit.point(u) < 0.9 for u in moved)
    assert 60 <= len(moved) <= 140  # ~10% of 1,000


def test_requests_without_an_id_split_at_random_in_the_shares_and_repeat_with_a_seed():
    split = parse_split("A=90,B=10", ["A", "B"], seed=1234)
    picks = [split.choose(None) for _ in range(1000)]
    share_a = picks.count("A") / len(picks)
    assert 0.87 <= share_a <= 0.93, share_a
    again = parse_split("A=90,B=10", ["A", "B"], seed=1234)
    assert [again.choose("") for _ in range(1000)] == picks  # "" is no id: random
    assert len(set(picks[:50])) == 2  # not sticky without an id


def test_the_sticky_point_is_the_same_in_another_process_with_another_hash_seed():
    users = ["alice", "用户-42", os.fsdecode(b"bad-\xff-bytes")]
    here = [ModelSplit.point(u) for u in users]
    code = ("import sys; from serving.model_split import ModelSplit; "
            "print(repr([ModelSplit.point(u) for u in sys.argv[1:]]))")
    out = subprocess.run(
        [sys.executable, "-c", code, *users], check=True, capture_output=True, text=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert ast.literal_eval(out.stdout) == here
    assert all(0 <= p < 1 for p in here)


def test_a_split_built_directly_checks_its_weights():
    assert ModelSplit((("A", 3), ("B", 1)), seed=0).shares() == {"A": 0.75, "B": 0.25}
    with pytest.raises(ValueError, match="given twice"):
        ModelSplit((("A", 50.0), ("A", 50.0)))
    with pytest.raises(ValueError, match="finite numbers > 0"):
        ModelSplit((("A", 100.0), ("B", 0.0)))
    with pytest.raises(ValueError, match="at least one model"):
        ModelSplit(())
