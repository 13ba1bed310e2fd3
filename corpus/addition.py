"""Two-digit addition, the task issue 29's end-to-end runs learn on 2 cores.

Prompts `"23+58="`, answers `"81"`. Every pair (a, b) of two-digit numbers is one
problem (8,100 in all); a deterministic hash of the pair, not a random draw, puts it in
the training or the held-out set, so every run, worker and resume agrees on the split.

  problems(split)        the (prompt, answer) pairs of "train" or "held_out"
  sft_records(...)       {"context", "response"} records for the SFT step (JSONL-ready)
  preference_pairs(...)  {"prompt", "chosen", "rejected"}: the right sum vs a wrong one
  reward(prompt, text)   1.0 when the completion's first number is the sum, else 0.0
"""

from __future__ import annotations

import hashlib
import random
import re

SPLITS = ("train", "held_out")
HELD_OUT_PER_MILLE = 100  # 10% of the pairs are held out
_PROMPT = re.compile(r"^(\d+)\+(\d+)=$")
_ANSWER = re.compile(r"\s*(-?\d+)")


def _split_of(a: int, b: int) -> str:
    digest = hashlib.sha256(f"{a}+{b}".encode()).digest()
    return "held_out" if int.from_bytes(digest[:4], "big") % 1000 < HELD_OUT_PER_MILLE \
        else "train"


def problems(split: str) -> list[tuple[str, str]]:
    """[(prompt, answer)] of every two-digit pair in `split`, in (a, b) order.

    Raises:
      ValueError: `split` is not "train" or "held_out".
    """
    if split not in SPLITS:
        raise ValueError(f"split={split!r}: one of {SPLITS}")
    return [(f"{a}+{b}=", str(a + b)) for a in range(10, 100) for b in range(10, 100)
            if _split_of(a, b) == split]


def sft_records(split: str = "train", limit: int | None = None, seed: int = 0) -> list[dict]:
    """{"context": prompt, "response": answer} records, shuffled with `seed`, at most
    `limit` of them (the names of `data.prompt_field` / `data.response_field`)."""
    pairs = problems(split)
    random.Random(seed).shuffle(pairs)
    return [{"context": p, "response": a} for p, a in pairs[:limit]]


def preference_pairs(split: str = "train", limit: int | None = None,
                     seed: int = 0) -> list[dict]:
    """{"prompt", "chosen": the sum, "rejected": a wrong sum (off by 1 to 10, or by 10 in
    one digit, as a tiny model's errors are)}, shuffled with `seed`."""
    rng = random.Random(seed)
    pairs = problems(split)
    rng.shuffle(pairs)
    out = []
    for prompt, answer in pairs[:limit]:
        wrong = int(answer)
        while wrong == int(answer) or wrong < 0:
            wrong = int(answer) + rng.choice([-10, -2, -1, 1, 2, 10])
        out.append({"prompt": prompt, "chosen": answer, "rejected": str(wrong)})
    return out


def reward(prompt: str, completion: str) -> float:
    """1.0 when the first integer of `completion` is the sum asked by `prompt`, else 0.0
    (text after the number, e.g. an end-of-sequence token, is ignored).

    Raises:
      ValueError: `prompt` is not of the form "A+B=".
    """
    match = _PROMPT.match(prompt)
    if not match:
        raise ValueError(f"prompt {prompt!r}: expected 'A+B='")
    answer = _ANSWER.match(completion)
    return float(answer is not None and int(answer.group(1)) == int(match.group(1)) +
                 int(match.group(2)))
