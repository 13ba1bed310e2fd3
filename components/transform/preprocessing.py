"""Transform's module: `preprocessing_fn`, the entry point TFX calls.

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

import re
from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from components.transform.tokenizer_analyzer import CopyTokenizer, LearnByteLevelBpe
from config.sources import DEFAULT_SOURCE
from tokenization import chat_template, tokenizer
from tokenization.byte_level_bpe import ByteLevelBpe
from tokenization.byte_pair_encoder import BytePairEncoder
from tokenization.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer

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
# Placeholder asset contents while the analyzer has not run (tf.Transform needs them).
_DEFAULT_ASSETS = [b"{}", b"{}", b"-1\t-1\n"]


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
    task = pipeline_config.data.task
    sft = PROMPT_KEY in inputs
    dpo = REJECTED_KEY in inputs
    needed = ([PROMPT_KEY, REJECTED_KEY] if task == "dpo" or dpo
              else [PROMPT_KEY] if task in PROMPT_TASKS else [])
    missing = [key for key in needed if key not in inputs]
    if missing:
        raise ValueError(f"data.task={task}, but the examples have no "
                         f"{' or '.join(repr(k) for k in missing)} feature (features: "
                         f"{sorted(inputs)}); were they made by a {task} run?")
    text = tf.reshape(inputs[TEXT_KEY], [-1])  # (B,)
    num_bytes = tf.cast(tf.strings.length(text, unit="BYTE"), tf.int64)  # (B,)
    prompt = tf.reshape(inputs[PROMPT_KEY], [-1]) if sft else None  # (B,)
    rejected = tf.reshape(inputs[REJECTED_KEY], [-1]) if dpo else None  # (B,)

    given = ByteLevelBpe.from_file(config.path) if config.path else None
    extra_config = ({"chat_template": chat_template.resolve(pipeline_config.data, given)}
                    if sft else None)
    if given is not None:
        pre_tokenizer, added_tokens = given.pre_tokenizer_config, given.added_tokens
        eos_id = given.eos_id if sft else None
        analyzer_inputs = [tf.zeros([0], tf.string)]
        ptransform = CopyTokenizer(config.path, extra_config)
    else:
        pre_tokenizer, added_tokens = PRE_TOKENIZERS[config.pre_tokenizer], \
            tokenizer.LEARNED_ADDED_TOKENS
        eos_id = tokenizer.EOS_ID
        learn_from = text
        if sft:  # (2B,): the prompts without their added tokens' text, and the responses
            learn_from = tf.concat([_without_added_tokens(prompt, added_tokens), text], 0)
        if dpo:  # (3B,): and the rejected responses
            learn_from = tf.concat([learn_from, rejected], 0)
        # Analyze pass: count the units of the text (cheap), not the pre-tokens;
        # the analyzer gets each batch's distinct units and their counts.
        units = tokenizer.units(learn_from, PreTokenizer(pre_tokenizer))  # (B, units)
        distinct, _, counts = tf.unique_with_counts(units.flat_values, out_idx=tf.int64)
        analyzer_inputs = [distinct, counts]  # (U,), (U,)
        ptransform = LearnByteLevelBpe(config.vocab_size, config.pre_tokenizer,
                                       config.min_frequency, extra_config)
    _, _, tables_path = tft.experimental.ptransform_analyzer(
        inputs=analyzer_inputs, ptransform=ptransform, output_dtypes=[tf.string] * 3,
        output_shapes=[[]] * 3, output_asset_default_values=_DEFAULT_ASSETS,
        name=TOKENIZER_ANALYZER_NAME)
    if _analyze_phase():
        # Only the analyzer's inputs are computed in this trace, but the
        # encoder's table lookups are stateful ops, which a tf.function runs even
        # when nothing reads them: left in, they would tokenize the whole corpus
        # once more. No ids in this phase.
        # tf.Transform also finds the features the transform reads from a trace of this
        # phase (`get_transform_input_columns`): the empty ids depend on every text
        # feature the final trace encodes, or a run with a given tokenizer (whose
        # analyzer reads no feature) would not be fed its `prompt` ("Unexpected output
        # keys requested").
        none = tf.add_n([tf.cast(tf.strings.length(t), tf.int64) * 0
                         for t in (text, prompt, rejected) if t is not None])  # (B,) zeros
        ids = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64), none)  # (B, 0)
        prompt_ids = rejected_ids = ids
    elif dpo:
        encoder = BytePairEncoder(pre_tokenizer, added_tokens, tables_path)
        batch = tf.shape(text, out_type=tf.int64)[0]
        three = encoder.encode(tf.concat([prompt, text, rejected], 0))  # (3B, tokens), one pass
        prompt_ids, chosen_ids = three[:batch], three[batch:2 * batch]  # (B, P), (B, C)
        rejected_ids = three[2 * batch:]  # (B, R)
        eos = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], tf.constant(eos_id, tf.int64)))
        ids = tf.concat([prompt_ids, chosen_ids, eos], axis=1)  # (B, P + C + 1)
        rejected_ids = tf.concat([prompt_ids, rejected_ids, eos], axis=1)  # (B, P + R + 1)
    elif sft:
        encoder = BytePairEncoder(pre_tokenizer, added_tokens, tables_path)
        batch = tf.shape(text, out_type=tf.int64)[0]
        both = encoder.encode(tf.concat([prompt, text], 0))  # (2B, tokens), one pass
        prompt_ids, response_ids = both[:batch], both[batch:]  # (B, P), (B, R)
        eos = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], tf.constant(eos_id, tf.int64)))
        ids = tf.concat([prompt_ids, response_ids, eos], axis=1)  # (B, P + R + 1)
    else:
        encoder = BytePairEncoder(pre_tokenizer, added_tokens, tables_path)
        ids = encoder.encode(text)  # (B, tokens)
    outputs = {INPUT_IDS_KEY: ids.to_sparse(), NUM_BYTES_KEY: num_bytes,
               SOURCE_NAME_KEY: source_names(inputs, text)}
    if sft:
        outputs[PROMPT_LENGTH_KEY] = prompt_ids.row_lengths()  # (B,) int64
    if dpo:
        outputs[REJECTED_IDS_KEY] = rejected_ids.to_sparse()
        outputs[REJECTED_NUM_BYTES_KEY] = tf.cast(
            tf.strings.length(rejected, unit="BYTE"), tf.int64)  # (B,)
    return outputs


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


def _without_added_tokens(texts: tf.Tensor, added_tokens) -> tf.Tensor:
    """texts (tf.string [N]) with every added token's text removed (RE2 literal match)."""
    if not added_tokens:
        return texts
    pattern = "|".join(re.escape(t.content).replace("\\ ", " ") for t in
                       sorted(added_tokens, key=lambda t: -len(t.content.encode())))
    return tf.strings.regex_replace(texts, pattern, "")


def _analyze_phase() -> bool:
    """True while tf.Transform traces preprocessing_fn to compute analyzer inputs.

    An analyzer whose value is not known yet leaves its tensor in the graph's
    TENSOR_REPLACEMENTS collection; tf.Transform itself checks that collection to
    decide that a trace returns analyzer inputs only (tensorflow_transform
    `impl_helper.get_traced_transform_fn`). The final trace, whose outputs are
    written, has every analyzer evaluated and the collection empty.
    """
    from tensorflow_transform import analyzer_nodes

    graph = tf.compat.v1.get_default_graph()
    return bool(graph.get_collection(analyzer_nodes.TENSOR_REPLACEMENTS))
