"""Transform's module: `preprocessing_fn`, the entry point TFX calls.

Text -> token ids with a byte-level BPE (`tokenizer.py`): learned from the
training split during this very run (the default), or given by `tokenizer.path`
and copied. Either way the tokenizer.json and its tables become assets of the
transform graph (`tokenizer_analyzer.py`), and the ids come from the in-graph
`BytePairEncoder`, the same code the pushed model runs. Outputs per document:

  input_ids  int64 [tokens]  (VarLen) token ids, no special tokens.
  num_bytes  int64 scalar    UTF-8 bytes of the document, for bits per byte.

Packing documents into fixed-length sequences happens in the Trainer's input
pipeline: tf.Transform maps rows to rows and cannot change their number.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tensorflow_transform as tft

from components.transform import tokenizer
from components.transform.byte_level_bpe import ByteLevelBpe
from components.transform.byte_pair_encoder import BytePairEncoder
from components.transform.pre_tokenizer import PRE_TOKENIZERS, PreTokenizer
from components.transform.tokenizer_analyzer import CopyTokenizer, LearnByteLevelBpe

TEXT_KEY = "text"
INPUT_IDS_KEY = "input_ids"
NUM_BYTES_KEY = "num_bytes"
TOKENIZER_ANALYZER_NAME = "tokenizer"
# Placeholder asset contents while the analyzer has not run (tf.Transform needs them).
_DEFAULT_ASSETS = [b"{}", b"{}", b"-1\t-1\n"]


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

    config = PipelineConfig.from_json(custom_config["pipeline_config"]).tokenizer
    text = tf.reshape(inputs[TEXT_KEY], [-1])  # (B,)
    num_bytes = tf.cast(tf.strings.length(text, unit="BYTE"), tf.int64)  # (B,)

    if config.path:
        given = ByteLevelBpe.from_file(config.path)
        pre_tokenizer, added_tokens = given.pre_tokenizer_config, given.added_tokens
        analyzer_inputs = [tf.zeros([0], tf.string)]
        ptransform = CopyTokenizer(config.path)
    else:
        pre_tokenizer, added_tokens = PRE_TOKENIZERS[config.pre_tokenizer], \
            tokenizer.LEARNED_ADDED_TOKENS
        # Analyze pass: count the units of the text (cheap), not the pre-tokens;
        # the analyzer gets each batch's distinct units and their counts.
        units = tokenizer.units(text, PreTokenizer(pre_tokenizer))  # (B, units)
        distinct, _, counts = tf.unique_with_counts(units.flat_values, out_idx=tf.int64)
        analyzer_inputs = [distinct, counts]  # (U,), (U,)
        ptransform = LearnByteLevelBpe(config.vocab_size, config.pre_tokenizer,
                                       config.min_frequency)
    _, _, tables_path = tft.experimental.ptransform_analyzer(
        inputs=analyzer_inputs, ptransform=ptransform, output_dtypes=[tf.string] * 3,
        output_shapes=[[]] * 3, output_asset_default_values=_DEFAULT_ASSETS,
        name=TOKENIZER_ANALYZER_NAME)
    if _analyze_phase():
        # Only the analyzer's inputs are computed in this trace, but the
        # encoder's table lookups are stateful ops, which a tf.function runs even
        # when nothing reads them: left in, they would tokenize the whole corpus
        # once more. No ids in this phase.
        ids = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64),
                                               tf.zeros_like(num_bytes))  # (B, 0)
    else:
        encoder = BytePairEncoder(pre_tokenizer, added_tokens, tables_path)
        ids = encoder.encode(text)  # (B, tokens)
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
