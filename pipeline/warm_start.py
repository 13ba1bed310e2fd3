"""`--base-model latest|PATH`: the config of a run that starts from a model.

The wiring itself is in `create_pipeline` (an `Importer` for a PATH, the
`LatestBlessedModelStrategy` resolver for `latest`, both feeding the Trainer's
`base_model` and the LmEvaluator's `baseline_model`). What has to be known
before the pipeline is built is here: which model `latest` is (the same rule as
the resolver: the newest Model with a blessed ModelBlessing naming it), and the
config the run takes from it: the base model's architecture (`model`) and its
tokenizer (`tokenizer.path`), so Transform copies the tokenizer and learns nothing.
"""

from __future__ import annotations

import dataclasses
import os

from config import PipelineConfig

LATEST = "latest"
_BLESSED_VALUE = 1  # tfx.components.evaluator.constants.BLESSED_VALUE
_CURRENT_MODEL_ID = "current_model_id"  # ...ARTIFACT_PROPERTY_CURRENT_MODEL_ID_KEY


def latest_blessed_model(metadata_path: str) -> tuple[str, int]:
    """(URI, MLMD id) of the newest blessed Model in a SQLite ML Metadata store.

    Raises:
      ValueError: the store does not exist or holds no blessed model.
    """
    if not os.path.exists(metadata_path):
        raise ValueError(f"--base-model latest: no ML Metadata at {metadata_path} yet; run "
                         f"once without --base-model into the same --output")
    return latest_blessed_model_in(open_readonly_store(metadata_path), metadata_path)


def open_readonly_store(metadata_path: str):
    """A read-only `ml_metadata.MetadataStore` on an existing SQLite file."""
    from ml_metadata import metadata_store
    from ml_metadata.proto import metadata_store_pb2

    connection = metadata_store_pb2.ConnectionConfig()
    connection.sqlite.filename_uri = metadata_path
    connection.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(connection)


def latest_blessed_model_in(store, where: str) -> tuple[str, int]:
    """`latest_blessed_model` of an open `ml_metadata.MetadataStore` (`where` names it)."""
    from ml_metadata.proto import metadata_store_pb2

    blessed_ids = [
        b.custom_properties[_CURRENT_MODEL_ID].int_value
        for b in store.get_artifacts_by_type("ModelBlessing")
        if b.custom_properties["blessed"].int_value == _BLESSED_VALUE
        and _CURRENT_MODEL_ID in b.custom_properties
    ]
    models = [m for m in store.get_artifacts_by_id(sorted(set(blessed_ids)))
              if m.state == metadata_store_pb2.Artifact.LIVE]
    if not models:
        raise ValueError(f"--base-model latest: no blessed model in {where} yet; run "
                         f"once without --base-model into the same --output")
    newest = max(models, key=lambda m: (m.create_time_since_epoch, m.id))
    return newest.uri, newest.id


def warm_start_config(config: PipelineConfig, base_dir: str, overrides: dict) -> PipelineConfig:
    """`config` with the base model's architecture and tokenizer.

    Args:
      config: the run's config (preset + overrides).
      base_dir: the base model (see `savedmodel/base_model.py`).
      overrides: the run's `--set` overrides; a `model.*` one that contradicts
        the base model is refused.

    Raises:
      ValueError: a contradicting override; a base model without a tokenizer
        (a logits-only import).
      base_model.BaseModelError: no model at `base_dir`.
    """
    from savedmodel import base_model

    model_config = base_model.read_model_config(base_dir)
    base_model.check_model_overrides(model_config, overrides, base_dir)
    tokenizer = base_model.tokenizer_path(base_dir)
    if tokenizer is None:
        raise ValueError(f"base model {base_dir} carries no tokenizer.json: a warm start "
                         f"keeps the base model's tokenizer, so it needs one")
    if config.train.seq_len > model_config.max_position_embeddings:
        raise ValueError(f"train.seq_len={config.train.seq_len} exceeds the base model's "
                         f"max_position_embeddings={model_config.max_position_embeddings}")
    return dataclasses.replace(
        config, model=model_config,
        tokenizer=dataclasses.replace(config.tokenizer, path=tokenizer,
                                      vocab_size=model_config.vocab_size))


def distillation_config(config: PipelineConfig, teacher_dir: str, overrides: dict) -> PipelineConfig:
    """`config` with the teacher's tokenizer (a student must tokenize as its teacher):
    `tokenizer.path` and, unless overridden, `model.vocab_size` become the teacher's.

    Raises:
      ValueError: the teacher carries no tokenizer, or `model.vocab_size` is set
        to another value than the teacher's.
      base_model.BaseModelError: no model at `teacher_dir`.
    """
    from savedmodel import base_model

    tokenizer = base_model.tokenizer_path(teacher_dir)
    if tokenizer is None:
        raise ValueError(f"teacher {teacher_dir} carries no tokenizer.json: distillation "
                         f"needs the teacher's tokenizer")
    vocab = base_model.read_model_config(teacher_dir).vocab_size
    asked = overrides.get("model.vocab_size", vocab)
    if asked != vocab:
        raise ValueError(f"--set model.vocab_size={asked} contradicts the teacher "
                         f"{teacher_dir}, which has vocab_size={vocab}: student and teacher "
                         f"share one vocabulary")
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, vocab_size=vocab),
        tokenizer=dataclasses.replace(config.tokenizer, path=tokenizer, vocab_size=vocab))
