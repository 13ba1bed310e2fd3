"""The tf.Transform analyzer that learns the WordPiece vocabulary in Beam.

`tft.experimental.ptransform_analyzer` runs `LearnWordPieceVocabulary` over the
whole training split during Transform's analyze phase: Beam counts the
space-delimited units of the text (`tokenizer.split_at_spaces`; a combiner, so
counting scales out); one worker pre-tokenizes each distinct unit once, which
gives the pre-token counts, runs Hugging Face `tokenizers`' WordPieceTrainer on
them and writes the vocabulary file; tf.Transform stores that file as an asset of
the transform graph (recorded in ML Metadata as part of the TransformGraph
artifact).
"""

from __future__ import annotations

import collections
import logging
import os
import time
import uuid

import apache_beam as beam
import tensorflow as tf
from tensorflow_transform.beam import experimental as tft_beam_experimental

from components.transform import tokenizer


class _CountUnits(beam.CombineFn):
    """Sums Counters of `tokenizer.split_at_spaces` units: bytes -> count."""

    def create_accumulator(self):
        return collections.Counter()

    def add_input(self, accumulator, batch):
        # `batch`: (units, counts), ndarrays [distinct units in a batch of
        # documents] of bytes and int64 (`tf.unique_with_counts` in the graph).
        units, counts = batch
        accumulator.update(dict(zip(units.tolist(), counts.tolist(), strict=True)))
        return accumulator

    def merge_accumulators(self, accumulators):
        merged = collections.Counter()
        for acc in accumulators:
            merged.update(acc)
        return merged

    def extract_output(self, accumulator):
        return accumulator


class LearnWordPieceVocabulary(tft_beam_experimental.PTransformAnalyzer):
    """Beam PTransform: batches of pre-tokens -> path of a vocabulary file.

    Input PCollection elements: tuples `(units, counts)`: the distinct
    `tokenizer.split_at_spaces` units of a batch (ndarray of bytes) and how
    often each occurs (int64).
    Output: a PCollection with one element, the vocabulary file path (bytes).
    """

    def __init__(self, vocab_size: int, max_unique_chars: int):
        super().__init__()
        self._vocab_size = vocab_size
        self._max_unique_chars = max_unique_chars

    def expand(self, pcoll):
        vocab_size, max_unique_chars = self._vocab_size, self._max_unique_chars
        temp_dir = self.base_temp_dir

        def learn_and_write(unit_counts):
            start = time.perf_counter()
            counts = tokenizer.count_unit_pieces(unit_counts)
            vocabulary = tokenizer.learn_vocabulary(counts, vocab_size, max_unique_chars)
            logging.info("learned a WordPiece vocabulary of %d entries from %d distinct "
                         "pre-tokens (%d in all; %d distinct units) in %.1f s", len(vocabulary),
                         len(counts), sum(counts.values()), len(unit_counts),
                         time.perf_counter() - start)
            tf.io.gfile.makedirs(temp_dir)
            path = os.path.join(temp_dir, f"wordpiece_vocab_{uuid.uuid4().hex}.txt")
            tokenizer.write_vocabulary(vocabulary, path)
            return path.encode("utf-8")

        return (
            pcoll
            | "CountUnits" >> beam.CombineGlobally(_CountUnits())
            | "LearnVocabulary" >> beam.Map(learn_and_write)
        )
