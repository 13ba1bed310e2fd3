"""Runs Transform's preprocessing_fn under tf.Transform's Beam implementation (no TFX),
for tests: `AnalyzeAndTransformDataset` over in-memory string records."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from components.transform import preprocessing


def run_transform(config, records: list[dict[str, str]], temp, desired_batch_size: int = 64):
    """Analyzes and transforms `records` (feature name -> text, every record the same
    names) with the pipeline config `config`.

    Returns:
      (transformed rows as dicts of numpy values, the written transform_fn directory).
    """
    import apache_beam as beam
    import tensorflow_transform as tft
    import tensorflow_transform.beam as tft_beam

    metadata = tft.DatasetMetadata.from_feature_spec(
        {name: tf.io.FixedLenFeature([1], tf.string) for name in records[0]})

    def preprocessing_fn(inputs):
        return preprocessing.preprocessing_fn(inputs, {"pipeline_config": config.to_json()})

    with beam.Pipeline() as p, tft_beam.Context(temp_dir=str(temp),
                                                desired_batch_size=desired_batch_size):
        data = p | beam.Create([{k: [v] for k, v in r.items()} for r in records])
        (rows, _), transform_fn = (data, metadata) | tft_beam.AnalyzeAndTransformDataset(
            preprocessing_fn)
        _ = rows | beam.combiners.ToList() | beam.Map(
            lambda r: np.save(os.path.join(str(temp), "rows.npy"), np.array(r, dtype=object),
                              allow_pickle=True))
        _ = transform_fn | tft_beam.WriteTransformFn(os.path.join(str(temp), "transform_fn"))
    rows = list(np.load(os.path.join(str(temp), "rows.npy"), allow_pickle=True))
    return rows, os.path.join(str(temp), "transform_fn")
