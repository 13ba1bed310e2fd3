"""Verifiable rewards for GRPO (issue 29): built-in rule-based rewards and a user's own.

A reward function scores one completion: `reward_fn(prompt, completion, answer) -> float`,
all three `str` (the rendered prompt, the decoded completion without its EOS, the
record's reference answer). The run's reward is the sum of the functions named in
`train.grpo_rewards` and, when `train.reward_module_file` names a Python file, that
file's `reward_fn` (passed the way TFX passes `run_fn`: a module file and a function
name). Built in (DeepSeek-R1 §2.2.2, "rule-based rewards"):

  exact_match  1.0 when the final answer equals `answer` (both stripped of surrounding
               whitespace), else 0.0. The final answer is the text after the last
               `</think>` when the completion has one, else the whole completion.
  format       1.0 when the completion is `<think>...</think>` followed by a non-empty
               answer (R1's format reward), else 0.0.

The same functions score the held-out prompts in the LmEvaluator (pass@1: greedy
decoding, `exact_match`), so training and evaluation reward alike.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
from collections.abc import Callable, Sequence

RewardFn = Callable[[str, str, str], float]
THINK_END = "</think>"
_FORMAT = re.compile(r"\A\s*<think>.*?</think>\s*\S", re.DOTALL)
USER_FUNCTION = "reward_fn"


def final_answer(completion: str) -> str:
    """The text after the last `</think>` (the whole completion without one), stripped."""
    return completion.rsplit(THINK_END, 1)[-1].strip()


def exact_match(prompt: str, completion: str, answer: str) -> float:
    """1.0 when `final_answer(completion)` equals `answer.strip()`, else 0.0."""
    del prompt
    return 1.0 if final_answer(completion) == answer.strip() else 0.0


def format_reward(prompt: str, completion: str, answer: str) -> float:
    """1.0 when `completion` is `<think>...</think>` then a non-empty answer, else 0.0."""
    del prompt, answer
    return 1.0 if _FORMAT.match(completion) else 0.0


BUILTIN_REWARDS: dict[str, RewardFn] = {"exact_match": exact_match, "format": format_reward}


def load_module_function(module_file: str, name: str = USER_FUNCTION) -> RewardFn:
    """`name` from the Python file `module_file` (imported under a private module name).

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: the file defines no callable `name`.
    """
    if not os.path.isfile(module_file):
        raise FileNotFoundError(f"train.reward_module_file={module_file!r}: no such file")
    spec = importlib.util.spec_from_file_location("deepseek_tfx_user_reward", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"train.reward_module_file={module_file!r} defines no function "
                         f"{name}(prompt, completion, answer) -> float")
    return fn


class Reward:
    """The run's reward: the sum of the named built-ins and the user's `reward_fn`.

    Args:
      names: comma-separated built-in names (`BUILTIN_REWARDS`), e.g. "exact_match,format";
        may be empty when `module_file` is given.
      module_file: a Python file defining `reward_fn(prompt, completion, answer)`, or "".

    Raises:
      ValueError: an unknown name, or no reward at all.
    """

    def __init__(self, names: str, module_file: str = ""):
        self.names = [n.strip() for n in names.split(",") if n.strip()]
        unknown = [n for n in self.names if n not in BUILTIN_REWARDS]
        if unknown:
            raise ValueError(f"train.grpo_rewards: unknown reward(s) {unknown}; built in: "
                             f"{sorted(BUILTIN_REWARDS)} (a reward of your own: "
                             "train.reward_module_file)")
        self.functions: list[tuple[str, RewardFn]] = [(n, BUILTIN_REWARDS[n]) for n in self.names]
        if module_file:
            self.functions.append((f"{module_file}:{USER_FUNCTION}",
                                   load_module_function(module_file)))
        if not self.functions:
            raise ValueError("GRPO needs a reward: set train.grpo_rewards (e.g. exact_match) "
                             "or train.reward_module_file")

    def __call__(self, prompts: Sequence[str], completions: Sequence[str],
                 answers: Sequence[str]) -> list[float]:
        """Rewards of the completions, one float per completion (row i of each list).

        Raises:
          ValueError: a function returned something that is not a finite number, naming
            the function, the row and the value.
        """
        rewards = []
        for i, (prompt, completion, answer) in enumerate(zip(prompts, completions, answers,
                                                             strict=True)):
            total = 0.0
            for name, fn in self.functions:
                value = fn(prompt, completion, answer)
                if isinstance(value, bool) or not isinstance(value, (int, float)) or \
                        not math.isfinite(value):
                    raise ValueError(f"reward {name} returned {value!r} for completion {i} "
                                     f"({completion[:80]!r}): it must return a finite number")
                total += float(value)
            rewards.append(total)
        return rewards
