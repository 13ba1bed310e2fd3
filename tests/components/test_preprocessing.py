"""Transform's preprocessing_fn under tf.Transform's Beam implementation (no TFX).

The vocabulary the Beam analyzer learns (in-graph per-batch counts, summed by a
combiner over many batches) must be the one `learn_vocabulary` learns from the
same documents counted in one go, and the transformed `input_ids` must be what
the tokenizer gives with that vocabulary.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from components.transform import preprocessing, tokenizer
from pipeline.configs import get_config


@pytest.fixture(scope="module")
def transformed(shakespeare, tmp_path_factory):
    import apache_beam as beam
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    config = get_config("tiny")
    docs = [d for d in shakespeare[:80_000].split("\n\n") if d.strip()]
    metadata = tft.DatasetMetadata.from_feature_spec(
        {preprocessing.TEXT_KEY: tf.io.FixedLenFeature([1], tf.string)})
    temp = tmp_path_factory.mktemp("tft")

    def preprocessing_fn(inputs):
        return preprocessing.preprocessing_fn(
            inputs, {"pipeline_config": config.to_json()})

    # desired_batch_size well below the number of documents: many batches, so the
    # per-batch counts must be summed across batches to match one global count.
    with beam.Pipeline() as p, tft_beam.Context(temp_dir=str(temp), desired_batch_size=64):
        data = p | beam.Create([{preprocessing.TEXT_KEY: [d]} for d in docs])
        (rows, _), transform_fn = (data, metadata) | tft_beam.AnalyzeAndTransformDataset(
            preprocessing_fn)
        _ = rows | beam.combiners.ToList() | beam.Map(
            lambda r: np.save(os.path.join(str(temp), "rows.npy"), np.array(r, dtype=object),
                              allow_pickle=True))
        _ = transform_fn | tft_beam.WriteTransformFn(str(temp / "transform_fn"))
    rows = list(np.load(os.path.join(str(temp), "rows.npy"), allow_pickle=True))
    (vocab_file,) = glob.glob(str(temp / "transform_fn" / "transform_fn" / "assets" / "*"))
    return config, docs, rows, vocab_file


def test_beam_vocabulary_equals_one_pass_vocabulary(transformed):
    config, docs, _, vocab_file = transformed
    expected = tokenizer.learn_vocabulary(tokenizer.count_pieces(docs),
                                          config.tokenizer.vocab_size,
                                          config.tokenizer.max_unique_chars)
    assert tokenizer.read_vocabulary(vocab_file) == expected


def test_input_ids_are_the_tokenizers_ids(transformed):
    _, docs, rows, vocab_file = transformed
    wordpiece = tokenizer.make_wordpiece_tokenizer(vocab_file)
    expected = tokenizer.encode(tf.constant(docs), wordpiece).to_list()
    got = sorted((list(r[preprocessing.INPUT_IDS_KEY]), int(r[preprocessing.NUM_BYTES_KEY]))
                 for r in rows)
    want = sorted((ids, len(d.encode("utf-8"))) for ids, d in zip(expected, docs, strict=True))
    assert got == want
    assert len(rows) == len(docs)
