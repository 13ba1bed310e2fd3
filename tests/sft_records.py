"""Supervised fine-tuning records made from Tiny Shakespeare, for tests.

`shakespeare_sft_jsonl` writes {"context": line, "response": next line} for each
pair of consecutive non-empty lines: a small, real SFT corpus (the default
`data.prompt_field` / `data.response_field`). Import it as
`from sft_records import shakespeare_sft_jsonl` (pytest puts tests/ on sys.path).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CORPUS = Path(__file__).resolve().parent.parent.parent / "shared" / "corpora" / "tinyshakespeare.txt"


def shakespeare_pairs(text: str, max_records: int) -> list[dict[str, str]]:
    """[{"context": line, "response": next line}] over consecutive non-empty lines of
    `text` (lines stripped of their line break), at most `max_records` of them."""
    records = []
    lines = text.splitlines()
    for line, following in zip(lines, lines[1:], strict=False):
        if len(records) >= max_records:
            break
        if line.strip() and following.strip():
            records.append({"context": line, "response": following})
    return records


def shakespeare_sft_jsonl(path: str | os.PathLike, max_records: int,
                          corpus: str | os.PathLike = CORPUS) -> list[dict[str, str]]:
    """Writes `shakespeare_pairs` of the corpus to `path` (JSONL, UTF-8), returns them.

    Raises:
      FileNotFoundError: no corpus at `corpus` (tests should skip: see the
        `shakespeare` fixture in tests/conftest.py).
    """
    text = Path(corpus).read_text(encoding="utf-8")
    records = shakespeare_pairs(text, max_records)
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return records
