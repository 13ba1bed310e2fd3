"""Transform's module: `preprocessing_fn`, the entry point TFX calls.

Text -> token ids, with the WordPiece vocabulary learned from the training split
during this very run (see `vocabulary_analyzer.py`). Outputs per document:

  input_ids  int64 [tokens]  (VarLen) WordPiece ids, no special tokens.
  num_bytes  int64 scalar    UTF-8 bytes of the document, for bits per byte.

Packing documents into fixed-length sequences happens in the Trainer's input
pipeline: tf.Transform maps rows to rows and cannot change their number.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from components.transform import tokenizer
from components.transform.vocabulary_analyzer import LearnWordPieceVocabulary

TEXT_KEY = "text"
INPUT_IDS_KEY = "input_ids"
NUM_BYTES_KEY = "num_bytes"
VOCABULARY_ASSET_NAME = "wordpiece_vocabulary"
_DEFAULT_VOCABULARY = "\n".join(tokenizer.SPECIAL_TOKENS).encode("utf-8")


def preprocessing_fn(inputs: dict[str, Any], custom_config: dict[str, Any]) -> dict[str, Any]:
    """tf.Transform preprocessing_fn (called by TFX Transform).

    Args:
      inputs: `text` as tf.string [batch, 1] (the curated schema fixes one value).
      custom_config: `{"pipeline_config": <PipelineConfig JSON>}`.

    Returns:
      `input_ids` (tf.SparseTensor int64 [batch, tokens]) and `num_bytes`
      (int64 [batch]).
    """
    from pipeline.configs import PipelineConfig

    config = PipelineConfig.from_json(custom_config["pipeline_config"])
    text = tf.reshape(inputs[TEXT_KEY], [-1])  # (B,)

    # Analyze pass: count space-delimited units (cheap), not pre-tokens (the
    # regular expression is most of the tokenizer's cost); the analyzer gets each
    # batch's distinct units and pre-tokenizes each distinct unit once.
    units = tokenizer.split_at_spaces(text)  # (B, units)
    distinct, _, counts = tf.unique_with_counts(units.flat_values, out_idx=tf.int64)  # (U,), (N,), (U,)
    vocabulary_path = tft.experimental.ptransform_analyzer(
        inputs=[distinct, counts],
        ptransform=LearnWordPieceVocabulary(
            vocab_size=config.tokenizer.vocab_size,
            max_unique_chars=config.tokenizer.max_unique_chars,
        ),
        output_dtypes=[tf.string],
        output_shapes=[[]],
        output_asset_default_values=[_DEFAULT_VOCABULARY],
        name=VOCABULARY_ASSET_NAME,
    )[0]
    num_bytes = tf.cast(tf.strings.length(text, unit="BYTE"), tf.int64)  # (B,)
    if _analyze_phase():
        # Only the analyzer's inputs are computed in this trace, but the
        # tokenizer's table lookups are stateful ops, which a tf.function runs
        # even when nothing reads them: left in, they would tokenize the whole
        # corpus once more (16 s of 45 s on 10 MB). No ids in this phase.
        ids = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64),
                                               tf.zeros_like(num_bytes))  # (B, 0)
    else:
        wordpiece = tokenizer.make_wordpiece_tokenizer(vocabulary_path)
        pieces = tokenizer.pretokenize(text)  # (B, pieces)
        ids = wordpiece.tokenize(pieces).merge_dims(1, 2)  # (B, tokens)
    return {INPUT_IDS_KEY: ids.to_sparse(), NUM_BYTES_KEY: num_bytes}


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
