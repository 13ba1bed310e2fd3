"""Transform's module: `preprocessing_fn`, the entry point TFX calls. Thin by design:
its steps (which tokenizer, its analyzer, the ids) are in `encoding.py`.

Text -> token ids with a byte-level BPE (`tokenizer.py`): learned from the
training split during this very run (the default), or given by `tokenizer.path`
and copied. Either way the tokenizer.json and its tables become assets of the
transform graph (`tokenizer_analyzer.py`), and the ids come from the in-graph
`BytePairEncoder`, the same code the pushed model runs. Outputs per document:

  input_ids  int64 [tokens]  (VarLen) token ids, no special tokens.
  num_bytes  int64 scalar    UTF-8 bytes of the document, for bits per byte.
  source_name  bytes scalar  the mixture source the document came from (ExampleGen's
                             `source_name`; "default" when the examples have none).

A supervised fine-tuning run (`data.task = "sft"`: the examples have a `prompt`
feature, the chat-rendered prompt, and `text` is the response) gives instead:

  input_ids      int64 [tokens]  encode(prompt) ++ encode(response) ++ [eos_id]; the
                                 prompt's special tokens (the template's BOS text)
                                 are added tokens, so they become their ids.
  prompt_length  int64 scalar    len(encode(prompt)): the loss covers the ids after it.
  num_bytes      int64 scalar    UTF-8 bytes of the response, for bits per byte.
  source_name    bytes scalar    as above.

and records the chat template (`data.chat_template`, else `chat_template.resolve`)
in the tokenizer_config.json asset, so the pushed model and `hf-export` keep it.
A tokenizer learned in an SFT run is learned from the prompts and responses, with
the added tokens' text removed from the prompts.

A GRPO run (`data.task = "grpo"`) has SFT examples, `text` being the reference answer:
the same features. A preference optimization run (`data.task = "dpo"`: the examples
also have `rejected`, the rejected response; `text` is the chosen one) gives:

  input_ids           int64 [tokens]  encode(prompt) ++ encode(chosen) ++ [eos_id]
  rejected_ids        int64 [tokens]  encode(prompt) ++ encode(rejected) ++ [eos_id]
  prompt_length       int64 scalar    len(encode(prompt)), the same in both sequences.
  num_bytes           int64 scalar    UTF-8 bytes of the chosen response.
  rejected_num_bytes  int64 scalar    UTF-8 bytes of the rejected response.
  source_name         bytes scalar    as above.

with the chat template recorded as in SFT; a tokenizer learned in a DPO run is
learned from the prompts (added tokens' text removed), the chosen and the rejected
responses.

Packing documents into fixed-length sequences happens in the Trainer's input
pipeline: tf.Transform maps rows to rows and cannot change their number.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from components.transform import encoding
from config.sources import DEFAULT_SOURCE
from tokenization import chat_template
from tokenization.byte_level_bpe import ByteLevelBpe

TEXT_KEY = "text"
PROMPT_KEY = "prompt"  # SFT runs only; TEXT_KEY is then the response
INPUT_IDS_KEY = "input_ids"
NUM_BYTES_KEY = "num_bytes"
PROMPT_LENGTH_KEY = "prompt_length"  # SFT, GRPO and DPO runs
REJECTED_KEY = "rejected"  # DPO runs only: the rejected response (TEXT_KEY is the chosen)
REJECTED_IDS_KEY = "rejected_ids"  # DPO runs only
REJECTED_NUM_BYTES_KEY = "rejected_num_bytes"  # DPO runs only
# The tasks whose examples have a prompt, and those with a rejected response too.
PROMPT_TASKS = ("sft", "grpo", "dpo")
# The mixture source of each example (issue 28), passed through from ExampleGen.
SOURCE_NAME_KEY = "source_name"
DEFAULT_SOURCE_NAME = DEFAULT_SOURCE.encode()
TOKENIZER_ANALYZER_NAME = "tokenizer"


def preprocessing_fn(inputs: dict[str, Any], custom_config: dict[str, Any]) -> dict[str, Any]:
    """tf.Transform preprocessing_fn (called by TFX Transform).

    Args:
      inputs: `text` as tf.string [batch, 1] (the curated schema fixes one value);
        in an SFT or GRPO run also `prompt`, tf.string [batch, 1]; in a DPO run
        `prompt` and `rejected`, tf.string [batch, 1] each.
      custom_config: `{"pipeline_config": <PipelineConfig JSON>}`.

    Returns:
      `input_ids` (tf.SparseTensor int64 [batch, tokens]), `num_bytes`
      (int64 [batch]) and `source_name` (tf.string [batch]: the input's
      `source_name`, [batch, 1] dense or sparse, or "default" when the examples
      have none); in an SFT or GRPO run (a `prompt` input, or `data.task` "sft" or
      "grpo") also `prompt_length` (int64 [batch]); in a DPO run (a `rejected` input)
      also `rejected_ids` (tf.SparseTensor int64 [batch, tokens]) and
      `rejected_num_bytes` (int64 [batch]).

    Raises:
      ValueError: `data.task` is `sft` or `grpo` but the examples have no `prompt`;
        `data.task` is `dpo` but they have no `prompt` or no `rejected`.
    """
    from config import PipelineConfig

    pipeline_config = PipelineConfig.from_json(custom_config["pipeline_config"])
    config = pipeline_config.tokenizer
    sft = PROMPT_KEY in inputs
    dpo = REJECTED_KEY in inputs
    check_features(inputs, pipeline_config.data.task)
    text = tf.reshape(inputs[TEXT_KEY], [-1])  # (B,)
    num_bytes = tf.cast(tf.strings.length(text, unit="BYTE"), tf.int64)  # (B,)
    prompt = tf.reshape(inputs[PROMPT_KEY], [-1]) if sft else None  # (B,)
    rejected = tf.reshape(inputs[REJECTED_KEY], [-1]) if dpo else None  # (B,)

    given = ByteLevelBpe.from_file(config.path) if config.path else None
    extra_config = ({"chat_template": chat_template.resolve(pipeline_config.data, given)}
                    if sft else None)
    plan = encoding.tokenizer_plan(config, given, extra_config, text, prompt, rejected)
    tables_path = encoding.analyze_tokenizer(plan, TOKENIZER_ANALYZER_NAME)
    ids, prompt_ids, rejected_ids = encoding.encode_texts(plan, tables_path, text, prompt,
                                                          rejected)
    outputs = {INPUT_IDS_KEY: ids.to_sparse(), NUM_BYTES_KEY: num_bytes,
               SOURCE_NAME_KEY: source_names(inputs, text)}
    if sft:
        outputs[PROMPT_LENGTH_KEY] = prompt_ids.row_lengths()  # (B,) int64
    if dpo:
        outputs[REJECTED_IDS_KEY] = rejected_ids.to_sparse()
        outputs[REJECTED_NUM_BYTES_KEY] = tf.cast(
            tf.strings.length(rejected, unit="BYTE"), tf.int64)  # (B,)
    return outputs


def check_features(inputs: dict[str, Any], task: str) -> None:
    """Checks that the examples have the features `task` (`data.task`) reads: a `prompt`
    for sft and grpo; a `prompt` and a `rejected` for dpo, or when they have a
    `rejected` feature.

    Raises:
      ValueError: naming the missing features and the features there are.
    """
    dpo = REJECTED_KEY in inputs
    needed = ([PROMPT_KEY, REJECTED_KEY] if task == "dpo" or dpo
              else [PROMPT_KEY] if task in PROMPT_TASKS else [])
    missing = [key for key in needed if key not in inputs]
    if missing:
        raise ValueError(f"data.task={task}, but the examples have no "
                         f"{' or '.join(repr(k) for k in missing)} feature (features: "
                         f"{sorted(inputs)}); were they made by a {task} run?")


def source_names(inputs: dict[str, Any], text: tf.Tensor) -> tf.Tensor:
    """The `source_name` of each example, tf.string [batch]: the input feature (dense
    [batch, 1] or sparse; a missing value is "default"), or "default" for every example
    when the examples have no such feature (made before mixtures existed). `text`
    (tf.string [batch]) gives the batch size."""
    names = inputs.get(SOURCE_NAME_KEY)
    if names is None:
        return tf.fill(tf.shape(text), tf.constant(DEFAULT_SOURCE_NAME))  # (B,)
    if isinstance(names, tf.SparseTensor):
        names = tf.sparse.to_dense(names, default_value=DEFAULT_SOURCE_NAME)
        names = tf.concat([names, tf.fill([tf.shape(text)[0], 1],
                                          tf.constant(DEFAULT_SOURCE_NAME))], axis=1)  # (B, n+1)
    if names.shape.rank == 1:
        return names  # (B,)
    return tf.reshape(names[:, :1], [-1])  # (B,)
