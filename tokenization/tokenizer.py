"""The pipeline's tokenizer: learned by Transform (byte-level BPE), or given as a file.

How the pieces fit (each file holds one part):
  - `byte_level_bpe.py`: `ByteLevelBpe`, a Hugging Face tokenizer.json of the
    DeepSeek-V3 family, checked on load; the single source of truth.
  - `pre_tokenizer.py`: its pre-tokenizer in TensorFlow ops (RE2), exact.
  - `byte_pair_encoder.py`: `BytePairEncoder`, encoding and decoding in TensorFlow
    ops, exact against Hugging Face `tokenizers`; used by Transform and by the
    pushed SavedModel.
  - this module: learning a tokenizer with `tokenizers`' BpeTrainer, the units that
    Transform's analyze pass counts, and where the files sit in a transform graph.
  - `tokenizer_analyzer.py`: the tf.Transform analyzer (Beam) that learns or copies
    the tokenizer into the transform graph's assets.

No `[UNK]` exists: every byte has a token, so `decode(encode(x)) == x` for every
valid UTF-8 string.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator, Mapping

import tensorflow as tf

from common.json_file import read_json
from tokenization import ragged_ops
from tokenization.byte_level_bpe import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    AddedToken,
    ByteLevelBpe,
)
from tokenization.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer, cut_before

# Asset file name prefixes in the transform graph (tf.Transform appends a suffix
# when it copies an asset; the analyzer names them uniquely).
TOKENIZER_ASSET_PREFIX = "tokenizer_"  # tokenizer_<id>.json (not tokenizer_config_)
TOKENIZER_CONFIG_ASSET_PREFIX = "tokenizer_config_"  # tokenizer_config_<id>.json
TABLES_ASSET_PREFIX = "bpe_tables_"  # bpe_tables_<id>.tsv
# The learned tokenizer's added tokens: DeepSeek's first three ids.
LEARNED_ADDED_TOKENS = [AddedToken(t, i, True, False) for i, t in enumerate(SPECIAL_TOKENS)]
BOS_ID, EOS_ID, PAD_ID = 0, 1, 2
# A unit of the analyze pass starts at a space followed by an ASCII letter.
_UNIT_START = " [A-Za-z]"
_DECODER = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
            "use_regex": True}

assert (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN) == SPECIAL_TOKENS


def units(texts: tf.Tensor, pre_tokenizer: PreTokenizer) -> tf.RaggedTensor:
    """Cuts texts into units that pre-tokenize independently (Transform's analyze pass).

    All Split steps but the last run as usual (cheap: digit runs, CJK runs); their
    pieces are then cut before each space that an ASCII letter follows. No
    pre-token crosses such a cut, and the last step resumes matching there even
    with its `\\s+(?!\\S)` (see `pre_tokenizer.py`), so the pre-tokens of a text are
    those of its units: `tokenizers`' trainer, given the units, counts exactly the
    pre-tokens of the corpus, while Beam only counts short strings.

    Args:
      texts: tf.string [N].

    Returns:
      tf.string ragged [N, (units)]; joining a row gives its text back.
    """
    pieces = pre_tokenizer.split_all_but_last(texts)  # (N, (pieces))
    cut = cut_before(pieces.flat_values, _UNIT_START)  # (P, (units))
    return ragged_ops.merge_inner(pieces, cut)  # (N, (units))


def learn(unit_counts: Mapping[str | bytes, int], vocab_size: int,
          pre_tokenizer: str = "deepseek_v3", min_frequency: int = 2) -> ByteLevelBpe:
    """Learns a byte-level BPE with Hugging Face `tokenizers`' BpeTrainer.

    Args:
      unit_counts: unit -> how often it occurs (`units` over the training split).
      vocab_size: the size to learn: added tokens, the 256 byte tokens and merges.
        A small corpus may stop short of it (no pair occurs `min_frequency` times).
      pre_tokenizer: a name in `pre_tokenizer.PRE_TOKENIZERS`.
      min_frequency: the least count of a pair that is merged.

    Returns:
      The tokenizer; its added tokens are `LEARNED_ADDED_TOKENS` (ids 0, 1, 2).

    Raises:
      ValueError: no text, an unknown pre-tokenizer, or `vocab_size` below
        the 256 bytes plus the added tokens.

    The trainer is deterministic run to run (`tests/components/test_bpe_learner.py`).
    """
    import tokenizers
    from tokenizers import pre_tokenizers, trainers

    if pre_tokenizer not in PRE_TOKENIZERS:
        raise ValueError(f"unknown pre-tokenizer {pre_tokenizer!r}; known: {list(PRE_TOKENIZERS)}")
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} is below the 256 byte tokens plus "
                         f"{len(SPECIAL_TOKENS)} added tokens")
    counts = {(u.decode("utf-8") if isinstance(u, bytes) else u): int(n)
              for u, n in unit_counts.items() if u and n}
    if not counts:
        raise ValueError("cannot learn a tokenizer from no text (the training split is empty)")
    empty = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
             "normalizer": None, "pre_tokenizer": PRE_TOKENIZERS[pre_tokenizer],
             "post_processor": None, "decoder": _DECODER,
             "model": {"type": "BPE", "dropout": None, "unk_token": None,
                       "continuing_subword_prefix": None, "end_of_word_suffix": None,
                       "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                       "vocab": {}, "merges": []}}
    model = tokenizers.Tokenizer.from_str(json.dumps(empty))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    model.train_from_iterator(_repeated(counts), trainer)
    return ByteLevelBpe(json.loads(model.to_str()), source="learned by BpeTrainer")


def _repeated(counts: Mapping[str, int], batch: int = 10_000) -> Iterator[list[str]]:
    """Each unit `count` times, in batches; sorted, so the input order never varies."""
    chunk: list[str] = []
    for unit, count in sorted(counts.items()):
        for _ in range(count):
            chunk.append(unit)
            if len(chunk) == batch:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def find_asset(transform_output_dir: str, prefix: str) -> str:
    """The asset of a transform graph whose name starts with `prefix`.

    Raises:
      FileNotFoundError: none, or more than one.
    """
    pattern = os.path.join(transform_output_dir, "transform_fn", "assets", prefix + "*")
    matches = [m for m in glob.glob(pattern) if prefix == TOKENIZER_CONFIG_ASSET_PREFIX
               or not os.path.basename(m).startswith(TOKENIZER_CONFIG_ASSET_PREFIX)]
    if len(matches) != 1:
        raise FileNotFoundError(f"expected one asset matching {pattern}, found {matches}")
    return matches[0]


def load_tokenizer(transform_output_dir: str) -> ByteLevelBpe:
    """The tokenizer.json (and tokenizer_config.json) that Transform learned or copied
    into its graph's assets."""
    path = find_asset(transform_output_dir, TOKENIZER_ASSET_PREFIX)
    config = read_json(find_asset(transform_output_dir, TOKENIZER_CONFIG_ASSET_PREFIX),
                       "the transform graph's tokenizer_config.json")
    return ByteLevelBpe(read_json(path, "the transform graph's tokenizer.json"), source=path,
                        tokenizer_config=config)
