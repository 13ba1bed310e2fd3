"""A Hugging Face `tokenizer.json` of the DeepSeek-V3 family, parsed and checked.

The family (DeepSeek-V3 report §4.1; its `tokenizer.json`): model `BPE` over bytes
(no `[UNK]`, no byte fallback, no dropout), the pre-tokenizer of `pre_tokenizer.py`
(`Split` steps, then `ByteLevel`), a `ByteLevel` decoder, no normalizer, and added
tokens (special or not). `ByteLevelBpe` holds what the in-graph tokenizer needs:
the merge table, the id of each byte, the added tokens, the text of every id, and
the special tokens the pipeline uses (end of sequence, padding, beginning).

The file is the tokenizer's single source of truth: Transform learns or copies it
into the transform graph's assets, the pushed SavedModel carries it, and
`hf-export` writes it beside the weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from common.json_file import read_json
from tokenization.pre_tokenizer import PreTokenizer, UnsupportedTokenizerError

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# DeepSeek's special tokens, which the learned tokenizer uses too (ids 0, 1, 2).
BOS_TOKEN = "<｜begin▁of▁sentence｜>"
EOS_TOKEN = "<｜end▁of▁sentence｜>"
PAD_TOKEN = "<｜▁pad▁｜>"
SPECIAL_TOKENS = (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN)
# Names other tokenizers give their end-of-sequence token, tried in this order
# when no tokenizer_config.json names it.
_EOS_NAMES = (EOS_TOKEN, "</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]")
_PAD_NAMES = (PAD_TOKEN, "<pad>", "[PAD]", "<|pad|>")
_BOS_NAMES = (BOS_TOKEN, "<s>", "<|begin_of_text|>", "<bos>", "[BOS]")

# Ids and ranks are packed two to an int64 for the in-graph tables.
ID_BITS = 21
MAX_ID = (1 << ID_BITS) - 1


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which `ByteLevel` uses (Radford et al. 2019)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


_BYTE_OF_CHAR = {c: b for b, c in bytes_to_unicode().items()}


@dataclasses.dataclass(frozen=True)
class AddedToken:
    content: str
    id: int
    special: bool
    normalized: bool


class ByteLevelBpe:
    """A byte-level BPE `tokenizer.json` (DeepSeek-V3 family), checked on load.

    Args:
      tokenizer: the parsed tokenizer.json.
      source: where it came from, for error messages.
      tokenizer_config: the parsed tokenizer_config.json beside it, if any
        (`eos_token`, `pad_token`, `bos_token`, `chat_template`).

    Raises:
      UnsupportedTokenizerError: not of the family (the message names the field).
    """

    def __init__(self, tokenizer: dict[str, Any], source: str = "tokenizer.json",
                 tokenizer_config: dict[str, Any] | None = None):
        self.json = tokenizer
        self.source = source
        self.tokenizer_config = tokenizer_config or {}
        model = tokenizer.get("model") or {}

        def refuse(what: str):
            raise UnsupportedTokenizerError(f"{source}: {what}; supported: byte-level BPE of "
                                            "the DeepSeek-V3 family")

        if model.get("type") != "BPE":
            refuse(f"model type {model.get('type')!r}")
        for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                refuse(f"model.{key} = {model[key]!r}")
        if model.get("byte_fallback") or model.get("ignore_merges"):
            refuse("model.byte_fallback / model.ignore_merges set")
        normalizer = tokenizer.get("normalizer")
        if normalizer and not (normalizer.get("type") == "Sequence"
                               and not normalizer.get("normalizers")):
            refuse(f"normalizer {normalizer.get('type')!r}")
        decoder = tokenizer.get("decoder") or {}
        if decoder.get("type") != "ByteLevel":
            refuse(f"decoder {decoder.get('type')!r}")
        self.pre_tokenizer_config = tokenizer.get("pre_tokenizer") or {}
        self.pre_tokenizer = PreTokenizer(self.pre_tokenizer_config)

        self.vocab: dict[str, int] = dict(model.get("vocab") or {})
        self.merges: list[tuple[str, str]] = []
        for n, merge in enumerate(model.get("merges") or []):
            pair = merge.split(" ") if isinstance(merge, str) else list(merge)
            if len(pair) != 2 or pair[0] not in self.vocab or pair[1] not in self.vocab \
                    or pair[0] + pair[1] not in self.vocab:
                refuse(f"merge {n} {merge!r} is not two vocabulary entries whose join is one")
            self.merges.append((pair[0], pair[1]))
        self.added_tokens: list[AddedToken] = []
        for token in tokenizer.get("added_tokens") or []:
            if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
                refuse(f"added token {token.get('content')!r} with lstrip/rstrip/single_word")
            self.added_tokens.append(AddedToken(token["content"], int(token["id"]),
                                                bool(token.get("special")),
                                                bool(token.get("normalized"))))
        ids = list(self.vocab.values()) + [t.id for t in self.added_tokens]
        if not ids:
            refuse("an empty vocabulary")
        if max(ids) > MAX_ID:
            refuse(f"ids up to {max(ids)} (at most {MAX_ID})")
        self.vocab_size = max(ids) + 1
        self.eos_token = self._special("eos_token", _EOS_NAMES)
        self.pad_token = self._special("pad_token", _PAD_NAMES) or self.eos_token
        self.bos_token = self._special("bos_token", _BOS_NAMES)

    # -- loading -----------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str) -> ByteLevelBpe:
        """Reads a tokenizer.json, or a directory holding one (and tokenizer_config.json).

        Raises:
          FileNotFoundError: no tokenizer.json there.
          JsonFileError (a ValueError): not a JSON object (naming the file, and the
            line and column of invalid JSON).
          UnsupportedTokenizerError: not of the family.
        """
        import tensorflow as tf

        file = os.path.join(path, TOKENIZER_FILE) if tf.io.gfile.isdir(path) else path
        if not tf.io.gfile.exists(file):
            raise FileNotFoundError(f"{path}: no {TOKENIZER_FILE} there")
        config_file = os.path.join(os.path.dirname(file), TOKENIZER_CONFIG_FILE)
        config = (read_json(config_file, TOKENIZER_CONFIG_FILE)
                  if tf.io.gfile.exists(config_file) else None)
        return cls(read_json(file, TOKENIZER_FILE), source=file, tokenizer_config=config)

    # -- ids the pipeline needs --------------------------------------------------
    def token_id(self, token: str) -> int:
        for added in self.added_tokens:
            if added.content == token:
                return added.id
        return self.vocab[token]

    @property
    def eos_id(self) -> int:
        if self.eos_token is None:
            raise UnsupportedTokenizerError(
                f"{self.source}: no end-of-sequence token (none named in "
                f"{TOKENIZER_CONFIG_FILE}, and none of {list(_EOS_NAMES)} is an added token)")
        return self.token_id(self.eos_token)

    @property
    def pad_id(self) -> int:
        return self.token_id(self.pad_token) if self.pad_token else self.eos_id

    @property
    def chat_template(self) -> str | None:
        return self.tokenizer_config.get("chat_template")

    def _special(self, key: str, names: tuple[str, ...]) -> str | None:
        value = self.tokenizer_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        known = {t.content for t in self.added_tokens} | set(self.vocab)
        if value:
            if value not in known:
                raise UnsupportedTokenizerError(
                    f"{self.source}: {TOKENIZER_CONFIG_FILE} names {key} {value!r}, "
                    "which is not in the vocabulary")
            return value
        added = {t.content for t in self.added_tokens}
        return next((name for name in names if name in added), None)

    # -- tables for the in-graph tokenizer ---------------------------------------
    def byte_ids(self) -> list[int]:
        """Id of each byte's token (-1 where the vocabulary lacks it: BPE drops it)."""
        chars = bytes_to_unicode()
        return [self.vocab.get(chars[b], -1) for b in range(256)]

    def merge_table(self) -> tuple[list[int], list[int]]:
        """(keys, values): key `left << 21 | right`, value `rank << 21 | merged id`."""
        keys, values = [], []
        for rank, (left, right) in enumerate(self.merges):
            keys.append(self.vocab[left] << ID_BITS | self.vocab[right])
            values.append(rank << ID_BITS | self.vocab[left + right])
        return keys, values

    def table_lines(self) -> str:
        """The merge table and byte ids as `key<TAB>value` lines (bytes: key -(b+1))."""
        keys, values = self.merge_table()
        rows = [f"{-(b + 1)}\t{i}" for b, i in enumerate(self.byte_ids())]
        rows += [f"{k}\t{v}" for k, v in zip(keys, values, strict=True)]
        return "\n".join(rows) + "\n"

    def surfaces(self, skip_special: bool = True) -> list[bytes]:
        """The bytes each id stands for (id -> bytes; b"" for special tokens and gaps)."""
        out = [b""] * self.vocab_size
        for token, i in self.vocab.items():
            out[i] = bytes(_BYTE_OF_CHAR[c] for c in token if c in _BYTE_OF_CHAR)
        for added in self.added_tokens:
            out[added.id] = b"" if (added.special and skip_special) else added.content.encode()
        return out

    def to_json_string(self) -> str:
        return json.dumps(self.json, ensure_ascii=False, indent=2)

    def write(self, directory: str, extra_config: dict[str, Any] | None = None) -> None:
        """Writes tokenizer.json and tokenizer_config.json (eos/pad/bos tokens) to `directory`."""
        import tensorflow as tf

        tf.io.gfile.makedirs(directory)
        with tf.io.gfile.GFile(os.path.join(directory, TOKENIZER_FILE), "w") as f:
            f.write(self.to_json_string())
        config = dict(self.tokenizer_config)
        config.update({"tokenizer_class": "PreTrainedTokenizerFast",
                       "eos_token": self.eos_token, "pad_token": self.pad_token,
                       "bos_token": self.bos_token, "add_bos_token": False,
                       "add_eos_token": False, "clean_up_tokenization_spaces": False})
        config.update(extra_config or {})
        with tf.io.gfile.GFile(os.path.join(directory, TOKENIZER_CONFIG_FILE), "w") as f:
            f.write(json.dumps(config, ensure_ascii=False, indent=2, sort_keys=True))

