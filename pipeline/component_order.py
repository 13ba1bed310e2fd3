"""The pipeline's component ids in run order, as plain data (no TFX import).

`pipeline/pipeline.py` builds the components in this order and re-exports these names;
the CLI reads `COMPONENT_ORDER` for `--until` without importing TFX (~40 s).
"""

from __future__ import annotations

COMPONENT_ORDER = (
    "TextExampleGen",
    "StatisticsGen",
    "ImportSchemaGen",
    "ExampleValidator",
    "TextCleaner",
    "latest_blessed_statistics_resolver",
    "DriftValidator",
    "Transform",
    "latest_blessed_model_resolver",
    "Trainer",
    "LmEvaluator",
    "Pusher",
)

# `--base-model PATH` puts this Importer where the resolver would be.
BASE_MODEL_IMPORTER = "base_model_importer"
# Replay through ML Metadata lineage imports the base run's Examples with this Importer.
REPLAY_EXAMPLES_IMPORTER = "replay_examples_importer"
# COMPONENT_ORDER with the Importers: the ids `create_pipeline(until=...)` may cut after.
BUILD_ORDER = COMPONENT_ORDER[:COMPONENT_ORDER.index("Trainer")] + (
    BASE_MODEL_IMPORTER, REPLAY_EXAMPLES_IMPORTER) + COMPONENT_ORDER[
        COMPONENT_ORDER.index("Trainer"):]
