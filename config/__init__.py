"""The one typed configuration of deepseek-tfx, and its named presets.

Everything a run needs flows from one `PipelineConfig`: the CLI builds it from a
preset plus overrides, `create_pipeline(...)` hands it to every component as JSON
(`custom_config` / execution properties), and the trained model records it. No
component reads environment variables or globals for its settings.

  sections.py       PipelineConfig (the whole) and the serving sections
  data.py           the input sections: data, tokenizer, validation
  sources.py        named data sources with weights (`data.sources`), and their
                    `--data NAME=PATH --weight NAME=W --source-set` form
  train.py          the training sections: train, eval
  presets.py        the presets (tiny, cpu_small, gpu_base, deepseek_v3) as changes
                    from the defaults, and get_config
  overrides.py      dotted SECTION.FIELD overrides; values parsed into declared types
  serialization.py  to and from dict / JSON
  checks.py         the range and choice checks of the sections

This package imports neither TFX nor TensorFlow, so the CLI can validate a config
(and print errors) before paying for those imports.
"""

from config.data import (
    DOCUMENT_BOUNDARIES,
    INVALID_UTF8_POLICIES,
    NORMALIZATION_FORMS,
    PRE_TOKENIZER_NAMES,
    TASKS,
    DataConfig,
    TokenizerConfig,
    ValidationConfig,
)
from config.overrides import coerce, parse_set, typed_section
from config.presets import DEFAULT_PRESET, PRESETS, get_config
from config.sections import PIPELINE_NAME, GenerationConfig, PipelineConfig, ServeConfig
from config.sources import (
    DEFAULT_SOURCE,
    REPLAY_SOURCE,
    SOURCE_SETTINGS,
    DataSource,
    normalized_weights,
    parse_sources,
    split_source_arg,
)
from config.train import (
    JIT_COMPILE,
    LORA_TARGETS,
    ON_SOURCE_EXHAUSTED,
    PRECISIONS,
    STRATEGIES,
    EvalConfig,
    TrainConfig,
)

__all__ = [
    "DEFAULT_PRESET", "DEFAULT_SOURCE", "DOCUMENT_BOUNDARIES", "INVALID_UTF8_POLICIES", "JIT_COMPILE",
    "LORA_TARGETS", "NORMALIZATION_FORMS", "ON_SOURCE_EXHAUSTED", "PIPELINE_NAME", "PRECISIONS", "PRESETS",
    "PRE_TOKENIZER_NAMES", "REPLAY_SOURCE", "SOURCE_SETTINGS", "STRATEGIES", "TASKS", "DataConfig",
    "DataSource", "EvalConfig",
    "GenerationConfig", "PipelineConfig", "ServeConfig", "TokenizerConfig", "TrainConfig",
    "ValidationConfig", "coerce", "get_config", "normalized_weights", "parse_set",
    "parse_sources", "split_source_arg", "typed_section",
]
