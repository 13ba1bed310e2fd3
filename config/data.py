"""The input side of the config: documents (`data`), the tokenizer (`tokenizer`) and the
drift check between runs (`validation`)."""

from __future__ import annotations

import dataclasses

from config.checks import check_choice, check_positive
from config.sources import DEFAULT_SOURCE, DataSource, data_sources, normalized_weights

DOCUMENT_BOUNDARIES = ("blank_line", "line", "file", "jsonl")
NORMALIZATION_FORMS = ("NFC", "NFKC", "none")
# The names of `tokenization.pre_tokenizer.PRE_TOKENIZERS` (this package stays light).
PRE_TOKENIZER_NAMES = ("deepseek_v3",)
INVALID_UTF8_POLICIES = ("replace", "reject")
TASKS = ("pretrain", "sft", "dpo", "grpo")
# The tasks whose records are prompts rendered by the chat template (and responses).
CHAT_TASKS = ("sft", "dpo", "grpo")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """How raw text becomes documents, and how documents are cleaned.

    Attributes:
      document_boundary: where one document ends: `blank_line` (paragraphs),
        `line`, `file` (one document per file) or `jsonl` (one per JSON record).
        Files ending in `.jsonl`/`.jsonl.gz` are always read as JSONL.
      jsonl_text_field: the JSON field holding the text of a JSONL record.
      train_buckets, eval_buckets: hash buckets of the deterministic train/eval
        split (ExampleGen `SplitConfig`, partitioned on the text, so duplicates
        fall into the same split). 9:1 is a 90/10 split.
      normalization: Unicode normalization form (`NFC`, `NFKC` or `none`).
      min_chars, max_chars: documents outside [min_chars, max_chars] Unicode
        characters after cleaning are dropped (counted as `too_short`/`too_long`).
      deduplicate: drop exact duplicates (after normalization), keeping one.
      max_reject_fraction: the run stops before training if more than this
        fraction of the records read is dropped.
      csv_text_column, parquet_text_column: the column holding the text of
        `*.csv` / `*.parquet` files.
      invalid_utf8: bytes that are not UTF-8: `replace` (by U+FFFD, counted as
        a repair) or `reject` (the record is dropped as `invalid_utf8`).
      near_dedup: drop near-duplicates (MinHash LSH over word n-grams), keeping
        the first (train before eval, then file and record order).
      near_dedup_threshold: estimated Jaccard similarity at or above which two
        documents are near-duplicates.
      near_dedup_num_perm, near_dedup_ngram: MinHash permutations; words per shingle.
      quality_filter: apply the Gopher quality rules (off by default: dialogue
        paragraphs such as Tiny Shakespeare's are far below their 50-word floor).
      min_words, max_words, min_mean_word_length, max_mean_word_length: the Gopher
        thresholds (Rae et al. 2021, appendix A.1.1).
      max_symbol_word_ratio, max_duplicate_line_fraction, min_alpha_word_fraction: the
        Gopher thresholds (Rae et al. 2021, appendix A.1.1).
      redact_pii: replace e-mail addresses, IP addresses and phone numbers by
        `<EMAIL>`, `<IP_ADDRESS>`, `<PHONE_NUMBER>` (counted per kind).
      task: `pretrain` (documents of text, packed; every token is a target),
        `sft` (supervised fine-tuning: prompt/response records; the loss covers
        response tokens only), `dpo` (preference pairs: a prompt, a chosen and a
        rejected response) or `grpo` (prompts with a reference answer, for
        group relative policy optimization). `deepseek-tfx run --task sft`.
      prompt_field, response_field: the fields of an SFT record holding the prompt
        and the response (JSONL keys, CSV/Parquet columns). A DPO or GRPO record
        without `prompt_field` takes its prompt from the field "prompt" (TRL's name).
      messages_field: the field of an SFT record holding a chat, a list of
        `{"role", "content"}` (Hugging Face chat form); used when a record has it.
        In a DPO or GRPO record the chat is the whole prompt (its last turn is not
        the assistant's).
      chosen_field, rejected_field: the fields of a DPO record holding the preferred
        and the dispreferred response (strings).
      answer_field: the field of a GRPO record holding the reference answer (a string)
        the reward compares completions with.
      chat_template: a Jinja chat template (transformers' form) for SFT prompts;
        empty: the tokenizer's `chat_template` when it has one, else the default.
      sources: a mixture: named sources with weights, each with its own reading and
        cleaning settings (`config/sources.py`, `deepseek-tfx run --data NAME=PATH
        --weight NAME=W`). Empty: the one source given to the pipeline as a path
        (`--data PATH`), named "default".
      replay_fraction: when continuing from a base model (`--base-model`), the share of
        the training tokens drawn from the base model's own training data (found
        through ML Metadata lineage, or given by `--replay-data PATH`), in [0, 1).
        The replayed data is the source named "replay" (`REPLAY_SOURCE`).
    """

    document_boundary: str = "blank_line"
    jsonl_text_field: str = "text"
    train_buckets: int = 9
    eval_buckets: int = 1
    normalization: str = "NFC"
    min_chars: int = 1
    max_chars: int = 1_000_000
    deduplicate: bool = True
    max_reject_fraction: float = 0.5
    csv_text_column: str = "text"
    parquet_text_column: str = "text"
    invalid_utf8: str = "replace"
    near_dedup: bool = True
    near_dedup_threshold: float = 0.8
    near_dedup_num_perm: int = 128
    near_dedup_ngram: int = 5
    quality_filter: bool = False
    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_duplicate_line_fraction: float = 0.3
    min_alpha_word_fraction: float = 0.8
    redact_pii: bool = False
    task: str = "pretrain"
    prompt_field: str = "context"
    response_field: str = "response"
    messages_field: str = "messages"
    chosen_field: str = "chosen"
    rejected_field: str = "rejected"
    answer_field: str = "answer"
    chat_template: str = ""
    sources: tuple[DataSource, ...] = ()
    replay_fraction: float = 0.0

    def __post_init__(self) -> None:
        check_choice("data.task", self.task, TASKS)
        check_choice("data.document_boundary", self.document_boundary, DOCUMENT_BOUNDARIES)
        check_choice("data.normalization", self.normalization, NORMALIZATION_FORMS)
        check_positive("data.train_buckets", self.train_buckets)
        check_positive("data.eval_buckets", self.eval_buckets)
        check_positive("data.min_chars", self.min_chars)
        if self.max_chars < self.min_chars:
            raise ValueError(
                f"data.max_chars={self.max_chars} must be >= data.min_chars={self.min_chars}"
            )
        if not 0.0 <= self.max_reject_fraction <= 1.0:
            raise ValueError(
                f"data.max_reject_fraction={self.max_reject_fraction} must be in [0, 1]"
            )
        check_choice("data.invalid_utf8", self.invalid_utf8, INVALID_UTF8_POLICIES)
        if not 0.0 < self.near_dedup_threshold <= 1.0:
            raise ValueError(
                f"data.near_dedup_threshold={self.near_dedup_threshold} must be in (0, 1]")
        for name in ("near_dedup_num_perm", "near_dedup_ngram", "min_words",
                     "min_mean_word_length"):
            check_positive(f"data.{name}", getattr(self, name))
        if self.max_words < self.min_words:
            raise ValueError(f"data.max_words={self.max_words} must be >= data.min_words")
        if self.max_mean_word_length < self.min_mean_word_length:
            raise ValueError("data.max_mean_word_length must be >= data.min_mean_word_length")
        for name in ("max_symbol_word_ratio", "max_duplicate_line_fraction",
                     "min_alpha_word_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"data.{name}={getattr(self, name)} must be in [0, 1]")
        if isinstance(self.replay_fraction, bool) or not isinstance(
                self.replay_fraction, (int, float)) or not 0.0 <= self.replay_fraction < 1.0:
            raise ValueError(f"data.replay_fraction={self.replay_fraction!r} must be a number "
                             "in [0, 1)")
        object.__setattr__(self, "sources", data_sources(self.sources))
        for source in self.sources:  # each source's own settings, checked as its section
            try:
                self.for_source(source.name)
            except ValueError as e:
                raise ValueError(f"data.sources.{source.name}: {e}") from None

    def for_source(self, name: str) -> DataConfig:
        """This section as the records of source `name` see it: its own settings
        (`DataSource.settings`) in place of the mixture's, and no sources. The one
        source of a config without sources is "default" (this section, sources aside).

        Raises:
          KeyError: no source `name`.
        """
        if not self.sources and name == DEFAULT_SOURCE:
            return self
        source = next((s for s in self.sources if s.name == name), None)
        if source is None:
            raise KeyError(f"no data source {name!r}; the sources are "
                           f"{[s.name for s in self.sources] or [DEFAULT_SOURCE]}")
        return dataclasses.replace(self, sources=(), **source.settings())

    def source_weights(self) -> dict[str, float]:
        """{source name: its share of the training batches}, summing to 1, in order
        (`{"default": 1.0}` without sources)."""
        return normalized_weights(self.sources)

    def without_weights(self) -> DataConfig:
        """This section with every source's weight 1: what the components before the
        Trainer should be given, so that re-weighting a mixture keeps their cache."""
        return dataclasses.replace(self, sources=tuple(
            dataclasses.replace(s, weight=1.0) for s in self.sources))


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """The tokenizer: a byte-level BPE (Hugging Face tokenizer.json, DeepSeek-V3 family).

    Learned by Transform from the training split with `tokenizers`' BpeTrainer, or
    given as a file; see `tokenization/tokenizer.py`.

    Attributes:
      vocab_size: the size to learn (added tokens, 256 byte tokens, merges). The
        model's `vocab_size` must equal it. Ignored with `path`, where the model's
        `vocab_size` must cover the given tokenizer instead.
      path: a tokenizer.json, or a directory holding one (and tokenizer_config.json),
        used as it is; empty to learn one.
      pre_tokenizer: the pre-tokenizer to learn with (`pre_tokenizer.PRE_TOKENIZERS`).
      min_frequency: the least count of a pair that the learner merges.
    """

    vocab_size: int = 8192
    path: str = ""
    pre_tokenizer: str = "deepseek_v3"
    min_frequency: int = 2

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"tokenizer.vocab_size={self.vocab_size} must be >= 300")
        if self.pre_tokenizer not in PRE_TOKENIZER_NAMES:
            raise ValueError(f"tokenizer.pre_tokenizer={self.pre_tokenizer!r} must be one of "
                             f"{list(PRE_TOKENIZER_NAMES)}")
        check_positive("tokenizer.min_frequency", self.min_frequency)


@dataclasses.dataclass(frozen=True)
class ValidationConfig:
    """Drift between runs (DriftValidator).

    The text profile of this run's cleaned data (document length in characters
    and words, and the distribution of lower-cased word tokens) is compared with
    the profile of the run that produced the latest blessed model, by TFDV's
    Jensen-Shannon divergence drift comparator (in [0, 1]). A divergence above
    its threshold (`drift_threshold`, `token_drift_threshold`) in any split of
    at least `drift_min_documents` documents is an anomaly that stops the run before Transform and training, unless the run accepts drift
    (`deepseek-tfx run --accept-drift`).

    Attributes:
      check_drift: compare with the latest blessed run at all.
      drift_threshold: the largest Jensen-Shannon divergence of the length
        distributions (characters, words) that is not drift. The two halves of
        Tiny Shakespeare differ by 0.02-0.03; doubling every document gives 0.19.
      token_drift_threshold: the same for the token distribution, which is
        noisier on small samples (the halves of Tiny Shakespeare: 0.07; Python
        source against Shakespeare: 0.65).
      drift_min_documents: a split with fewer documents (in this run or the
        baseline) is measured and reported but cannot stop the run: the
        divergence of small samples is mostly sampling noise (two 40-document
        samples of the same text differ by ~0.25 on tokens).
    """

    check_drift: bool = True
    drift_threshold: float = 0.15
    token_drift_threshold: float = 0.3
    drift_min_documents: int = 200

    def __post_init__(self) -> None:
        for name in ("drift_threshold", "token_drift_threshold"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"validation.{name}={value} must be in (0, 1]")
        if self.drift_min_documents < 0:
            raise ValueError(
                f"validation.drift_min_documents={self.drift_min_documents} must be >= 0")
