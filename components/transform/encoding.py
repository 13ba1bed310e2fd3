"""The steps of Transform's `preprocessing_fn` (`preprocessing.py`): which tokenizer,
its analyzer, and the token ids of a batch.

  tokenizer_plan     a given tokenizer (`tokenizer.path`, copied) or one learned from
                     the text of this run (the analyzer's inputs: the units' counts)
  analyze_tokenizer  the analyzer that puts the tokenizer into the transform graph
                     (`tokenizer_analyzer.py`); the path of its BPE tables
  encode_texts       the ids: of a document, of prompt ++ response ++ [eos] (SFT,
                     GRPO), or of prompt ++ chosen / rejected ++ [eos] (DPO); empty
                     in the analyze phase
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import tensorflow as tf
import tensorflow_transform as tft

from components.transform.tokenizer_analyzer import CopyTokenizer, LearnByteLevelBpe
from tokenization import tokenizer
from tokenization.byte_level_bpe import ByteLevelBpe
from tokenization.byte_pair_encoder import BytePairEncoder
from tokenization.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer

# Placeholder asset contents while the analyzer has not run (tf.Transform needs them).
_DEFAULT_ASSETS = [b"{}", b"{}", b"-1\t-1\n"]


class TokenizerPlan(NamedTuple):
    """The tokenizer of a Transform run and the analyzer that records it.

    Attributes:
      pre_tokenizer: the pre-tokenizer's config (`PRE_TOKENIZERS` entry, or the given
        tokenizer's).
      added_tokens: the added (special) tokens.
      eos_id: the id appended after a response (SFT, GRPO, DPO); None for documents
        with a given tokenizer.
      analyzer_inputs: the analyzer's input tensors: tf.string (0,) for a given
        tokenizer; the distinct units (tf.string (U,)) and their counts (int64 (U,))
        for a learned one.
      ptransform: `CopyTokenizer` or `LearnByteLevelBpe`.
    """

    pre_tokenizer: Any
    added_tokens: Any
    eos_id: int | None
    analyzer_inputs: list[tf.Tensor]
    ptransform: Any


def tokenizer_plan(config, given: ByteLevelBpe | None, extra_config: dict | None,
                   text: tf.Tensor, prompt: tf.Tensor | None,
                   rejected: tf.Tensor | None) -> TokenizerPlan:
    """The tokenizer to copy (`given`) or to learn from this batch's texts.

    Args:
      config: the pipeline config's `tokenizer` section.
      given: the tokenizer at `config.path`, or None to learn one.
      extra_config: tokenizer_config.json entries to record (the chat template), or None.
      text: tf.string (B,), the documents or responses (DPO: the chosen ones).
      prompt: tf.string (B,), the prompts (SFT, GRPO, DPO), or None.
      rejected: tf.string (B,), DPO's rejected responses, or None.

    Returns:
      The `TokenizerPlan`. A learned tokenizer learns from the prompts without their
      added tokens' text, the responses, and the rejected responses.
    """
    sft = prompt is not None
    if given is not None:
        return TokenizerPlan(given.pre_tokenizer_config, given.added_tokens,
                             given.eos_id if sft else None, [tf.zeros([0], tf.string)],
                             CopyTokenizer(config.path, extra_config))
    pre_tokenizer, added_tokens = PRE_TOKENIZERS[config.pre_tokenizer], \
        tokenizer.LEARNED_ADDED_TOKENS
    learn_from = text
    if sft:  # (2B,): the prompts without their added tokens' text, and the responses
        learn_from = tf.concat([_without_added_tokens(prompt, added_tokens), text], 0)
    if rejected is not None:  # (3B,): and the rejected responses
        learn_from = tf.concat([learn_from, rejected], 0)
    # Analyze pass: count the units of the text (cheap), not the pre-tokens;
    # the analyzer gets each batch's distinct units and their counts.
    units = tokenizer.units(learn_from, PreTokenizer(pre_tokenizer))  # (B, units)
    distinct, _, counts = tf.unique_with_counts(units.flat_values, out_idx=tf.int64)
    return TokenizerPlan(pre_tokenizer, added_tokens, tokenizer.EOS_ID,
                         [distinct, counts],  # (U,), (U,)
                         LearnByteLevelBpe(config.vocab_size, config.pre_tokenizer,
                                           config.min_frequency, extra_config))


def analyze_tokenizer(plan: TokenizerPlan, name: str) -> tf.Tensor:
    """Runs `plan`'s analyzer (`tft.experimental.ptransform_analyzer`, named `name`).

    Returns:
      tf.string scalar: the path of the tokenizer's BPE tables asset (a placeholder's
      until the analyzer has run).
    """
    _, _, tables_path = tft.experimental.ptransform_analyzer(
        inputs=plan.analyzer_inputs, ptransform=plan.ptransform, output_dtypes=[tf.string] * 3,
        output_shapes=[[]] * 3, output_asset_default_values=_DEFAULT_ASSETS, name=name)
    return tables_path


def encode_texts(plan: TokenizerPlan, tables_path: tf.Tensor, text: tf.Tensor,
                 prompt: tf.Tensor | None, rejected: tf.Tensor | None):
    """The token ids of a batch, with the in-graph `BytePairEncoder` (none in the analyze
    phase: `_empty_ids`).

    Args:
      plan: the run's `TokenizerPlan`.
      tables_path: tf.string scalar, `analyze_tokenizer`'s tables.
      text, prompt, rejected: tf.string (B,) each, as `tokenizer_plan`'s.

    Returns:
      (ids, prompt ids, rejected ids), int64 tf.RaggedTensor (B, tokens) each: ids are
      the document's, or prompt ++ response ++ [eos] (prompt given; DPO: the chosen
      response), rejected ids prompt ++ rejected ++ [eos] (DPO); the prompt ids (SFT,
      GRPO, DPO) and rejected ids (DPO) are None when the run has none.
    """
    if _analyze_phase():
        return _empty_ids(text, prompt, rejected)
    encoder = BytePairEncoder(plan.pre_tokenizer, plan.added_tokens, tables_path)
    if rejected is not None:
        return _encode_pairs(encoder, plan.eos_id, prompt, text, rejected)
    if prompt is not None:
        ids, prompt_ids = _encode_prompted(encoder, plan.eos_id, prompt, text)
        return ids, prompt_ids, None
    return encoder.encode(text), None, None  # (B, tokens)


def _empty_ids(text: tf.Tensor, prompt: tf.Tensor | None, rejected: tf.Tensor | None):
    """No ids, int64 tf.RaggedTensor (B, 0), three times (as `encode_texts` returns them):
    the analyze phase's.

    Only the analyzer's inputs are computed in this trace, but the encoder's table
    lookups are stateful ops, which a tf.function runs even when nothing reads them:
    left in, they would tokenize the whole corpus once more.
    tf.Transform also finds the features the transform reads from a trace of this
    phase (`get_transform_input_columns`): the empty ids depend on every text feature
    the final trace encodes, or a run with a given tokenizer (whose analyzer reads no
    feature) would not be fed its `prompt` ("Unexpected output keys requested").
    """
    none = tf.add_n([tf.cast(tf.strings.length(t), tf.int64) * 0
                     for t in (text, prompt, rejected) if t is not None])  # (B,) zeros
    ids = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64), none)  # (B, 0)
    return ids, ids, ids


def _encode_pairs(encoder: BytePairEncoder, eos_id: int, prompt: tf.Tensor,
                  chosen: tf.Tensor, rejected: tf.Tensor):
    """A DPO batch's ids, in one pass of `encoder` over tf.string (B,) prompts, chosen
    and rejected responses.

    Returns:
      int64 tf.RaggedTensor: prompt ++ chosen ++ [eos] (B, P + C + 1), the prompts'
      (B, P), prompt ++ rejected ++ [eos] (B, P + R + 1).
    """
    batch = tf.shape(chosen, out_type=tf.int64)[0]
    three = encoder.encode(tf.concat([prompt, chosen, rejected], 0))  # (3B, tokens), one pass
    prompt_ids, chosen_ids = three[:batch], three[batch:2 * batch]  # (B, P), (B, C)
    rejected_ids = three[2 * batch:]  # (B, R)
    eos = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], tf.constant(eos_id, tf.int64)))
    ids = tf.concat([prompt_ids, chosen_ids, eos], axis=1)  # (B, P + C + 1)
    rejected_ids = tf.concat([prompt_ids, rejected_ids, eos], axis=1)  # (B, P + R + 1)
    return ids, prompt_ids, rejected_ids


def _encode_prompted(encoder: BytePairEncoder, eos_id: int, prompt: tf.Tensor,
                     response: tf.Tensor):
    """An SFT or GRPO batch's ids, in one pass of `encoder` over tf.string (B,) prompts
    and responses.

    Returns:
      int64 tf.RaggedTensor: prompt ++ response ++ [eos] (B, P + R + 1), the prompts'
      (B, P).
    """
    batch = tf.shape(response, out_type=tf.int64)[0]
    both = encoder.encode(tf.concat([prompt, response], 0))  # (2B, tokens), one pass
    prompt_ids, response_ids = both[:batch], both[batch:]  # (B, P), (B, R)
    eos = tf.RaggedTensor.from_tensor(tf.fill([batch, 1], tf.constant(eos_id, tf.int64)))
    ids = tf.concat([prompt_ids, response_ids, eos], axis=1)  # (B, P + R + 1)
    return ids, prompt_ids


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
