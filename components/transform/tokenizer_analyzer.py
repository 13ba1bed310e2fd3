"""The tf.Transform analyzers that put the tokenizer into the transform graph (Beam).

`tft.experimental.ptransform_analyzer` runs one of these over the whole training
split during Transform's analyze phase. Both output three asset files, which
tf.Transform stores in the transform graph (recorded in ML Metadata as part of the
TransformGraph artifact):

  tokenizer_<id>.json   the Hugging Face tokenizer.json (the source of truth)
  tokenizer_config_<id>.json  its tokenizer_config.json (special tokens, chat
                        template; `{}` for a learned tokenizer)
  bpe_tables_<id>.tsv   its merge table and byte ids, which the in-graph encoder
                        loads (`ByteLevelBpe.table_lines`)

`LearnByteLevelBpe` learns the tokenizer: Beam sums the counts of the units of the
text (`tokenizer.units`; a combiner, so counting scales out), and one worker runs
Hugging Face `tokenizers`' BpeTrainer on them. `CopyTokenizer` writes a given
tokenizer.json (`tokenizer.path`) and reads no data.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import time
import uuid

import apache_beam as beam
import tensorflow as tf
from tensorflow_transform.beam import experimental as tft_beam_experimental

from tokenization import tokenizer
from tokenization.byte_level_bpe import ByteLevelBpe


class _CountUnits(beam.CombineFn):
    """Sums Counters of `tokenizer.units`: bytes -> count."""

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


def _write(spec: ByteLevelBpe, temp_dir: str,
           extra_config: dict | None = None) -> list[bytes]:
    """Writes the three assets; returns their paths (bytes, as tf.Transform wants).
    `extra_config` entries (an SFT run's `chat_template`) are added to tokenizer_config.json."""
    tf.io.gfile.makedirs(temp_dir)
    name = uuid.uuid4().hex
    paths = [os.path.join(temp_dir, f"{tokenizer.TOKENIZER_ASSET_PREFIX}{name}.json"),
             os.path.join(temp_dir, f"{tokenizer.TOKENIZER_CONFIG_ASSET_PREFIX}{name}.json"),
             os.path.join(temp_dir, f"{tokenizer.TABLES_ASSET_PREFIX}{name}.tsv")]
    contents = [spec.to_json_string(),
                json.dumps({**spec.tokenizer_config, **(extra_config or {})},
                           ensure_ascii=False, indent=2),
                spec.table_lines()]
    for path, content in zip(paths, contents, strict=True):
        with tf.io.gfile.GFile(path, "w") as f:
            f.write(content)
    return [p.encode("utf-8") for p in paths]


def _outputs(pcoll):
    """One PCollection per output path, as ptransform_analyzer expects."""
    return tuple(pcoll | f"Path{i}" >> beam.Map(lambda paths, i=i: paths[i]) for i in range(3))


class LearnByteLevelBpe(tft_beam_experimental.PTransformAnalyzer):
    """Beam PTransform: batches of (units, counts) -> paths of the three assets.

    Input PCollection elements: tuples `(units, counts)`: the distinct
    `tokenizer.units` of a batch (ndarray of bytes) and how often each occurs.
    """

    def __init__(self, vocab_size: int, pre_tokenizer: str, min_frequency: int,
                 extra_config: dict | None = None):
        super().__init__()
        self._args = (vocab_size, pre_tokenizer, min_frequency)
        self._extra_config = extra_config

    def expand(self, pcoll):
        vocab_size, pre_tokenizer, min_frequency = self._args
        temp_dir, extra_config = self.base_temp_dir, self._extra_config

        def learn_and_write(unit_counts):
            start = time.perf_counter()
            spec = tokenizer.learn(unit_counts, vocab_size, pre_tokenizer, min_frequency)
            logging.info("learned a byte-level BPE of %d tokens (%d merges) from %d distinct "
                         "units in %.1f s", spec.vocab_size, len(spec.merges), len(unit_counts),
                         time.perf_counter() - start)
            return _write(spec, temp_dir, extra_config)

        return _outputs(pcoll
                        | "CountUnits" >> beam.CombineGlobally(_CountUnits())
                        | "Learn" >> beam.Map(learn_and_write))


class CopyTokenizer(tft_beam_experimental.PTransformAnalyzer):
    """Beam PTransform: (ignored input) -> paths of the three assets of a given tokenizer
    (`extra_config` entries added to its tokenizer_config.json)."""

    def __init__(self, path: str, extra_config: dict | None = None):
        super().__init__()
        self._path = path
        self._extra_config = extra_config

    def expand(self, pcoll):
        path, temp_dir, extra = self._path, self.base_temp_dir, self._extra_config
        return _outputs(pcoll
                        | "Once" >> beam.combiners.Count.Globally()
                        | "Copy" >> beam.Map(lambda _: _write(ByteLevelBpe.from_file(path),
                                                              temp_dir, extra)))
