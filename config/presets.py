"""The named presets, each written as its differences from the base config, and
`get_config`.

The base is the dataclass defaults: every section of `PipelineConfig` at its
defaults. A preset lists only the fields it changes, section by section, as
MaxText's preset files list only overrides of `base.yml`. Its model is the
architecture of the same name in `models/deepseek/deepseek_presets.py` (itself
written as changes from `DeepSeekConfig()`), and its tokenizer learns that model's
vocabulary size.

  tiny         tests: a 2-layer model that trains in seconds on a slice of text.
  cpu_small    the default main job: Tiny Shakespeare on a 2-core CPU in minutes.
  gpu_base     a ~100M-parameter model for one GPU.
  deepseek_v3  the released 671B DeepSeek-V3 architecture (arithmetic only).

  tiny_v4, cpu_small_v4, gpu_base_v4
               the same jobs with a DeepSeek-V4-style model (mHC, SWA/CSA/HCA with the
               lightning indexer, hash-routed first layers;
               `models/deepseek_v4/presets.py`): each is the V3 preset it is named
               after with the changes in `V4_PRESETS`.
  cpu_long_v4  cpu_small_v4's model with V4's released long-context attention settings,
               trained at 4,096-token sequences; accepts 131,072 positions.
"""

from __future__ import annotations

from typing import Any

from config.overrides import apply_overrides
from config.sections import PipelineConfig
from config.serialization import section_types
from models.deepseek.deepseek_presets import deepseek_preset
from models.deepseek_v4.presets import DEEPSEEK_V4_PRESETS, deepseek_v4_preset

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "train": dict(seq_len=32, batch_size=8, train_steps=30, learning_rate=3e-3,
                      min_learning_rate=3e-4, warmup_steps=5, checkpoint_every=10, log_every=5,
                      eval_batches=4, shuffle_buffer=1000),
        "eval": dict(max_bits_per_byte=8.0, batch_size=8),
        "generation": dict(max_new_tokens=16),
    },
    "cpu_small": {
        # 450 steps x 2,048 tokens (~3 epochs of the ~310K training tokens of Tiny
        # Shakespeare's first 90%) keep the whole main job under 15 minutes on a 2-core
        # CPU (~2,200 tokens/s).
        "train": dict(train_steps=450, learning_rate=2e-3, min_learning_rate=2e-4,
                      warmup_steps=50, checkpoint_every=150, log_every=50, eval_batches=40),
    },
    "gpu_base": {
        "train": dict(seq_len=1024, batch_size=32, train_steps=20_000, learning_rate=6e-4,
                      min_learning_rate=6e-5, warmup_steps=1000, checkpoint_every=1000,
                      log_every=100, eval_batches=100),
        "eval": dict(max_bits_per_byte=2.0),
    },
    # The paper's pre-training settings (DeepSeek-V3 §4.2: 4K sequences, peak lr 2.2e-4,
    # 2000 warmup steps): for FLOP and memory arithmetic (`models/deepseek/flops.py`),
    # not for training on these machines.
    "deepseek_v3": {
        "train": dict(seq_len=4096, batch_size=1920, train_steps=100_000, learning_rate=2.2e-4,
                      min_learning_rate=2.2e-5, warmup_steps=2000, checkpoint_every=1000,
                      log_every=100, eval_batches=100),
        "eval": dict(max_bits_per_byte=1.0, batch_size=8),
    },
}
# The V4-style presets: (the V3 preset they start from, their changes to it).
V4_PRESETS: dict[str, tuple[str, dict[str, dict[str, Any]]]] = {
    "tiny_v4": ("tiny", {}),
    # V4's step costs ~1.4x cpu_small's on 2 cores (mHC's four streams, the compressors and
    # the indexer): 300 steps keep the main job inside its 10 minutes.
    "cpu_small_v4": ("cpu_small", {"train": dict(train_steps=300, checkpoint_every=100)}),
    # Long context (`models/deepseek_v4/presets.py` cpu_long_v4: window 128, CSA 4 / top-128,
    # HCA 128, 131,072 positions): one 4,096-token sequence a step, the sparse attention's
    # O(T) step. A step takes ~6 s on a 2-core EPYC: 60 steps (246K tokens) ran the whole
    # pipeline in 10.5 minutes (2026-11-28), inside 15 with room for a slower machine.
    "cpu_long_v4": ("cpu_small", {
        "train": dict(seq_len=4096, batch_size=1, train_steps=60, warmup_steps=6,
                      checkpoint_every=20, log_every=5, eval_batches=8),
        "eval": dict(batch_size=1)}),
    "gpu_base_v4": ("gpu_base", {}),
}
for _name, (_base, _changes) in V4_PRESETS.items():
    PRESETS[_name] = {section: {**PRESETS[_base].get(section, {}), **_changes.get(section, {})}
                      for section in {**PRESETS[_base], **_changes}}
DEFAULT_PRESET = "cpu_small"


def preset_config(name: str) -> PipelineConfig:
    """The preset `name`: the base config with the preset's changes and its model.

    Raises:
      KeyError: `name` is not in `PRESETS`.
    """
    model = (deepseek_v4_preset(name) if name in DEEPSEEK_V4_PRESETS
             else deepseek_preset(name))
    changes = {section: dict(fields) for section, fields in PRESETS[name].items()}
    changes.setdefault("tokenizer", {}).setdefault("vocab_size", model.vocab_size)
    classes = section_types(PipelineConfig)
    return PipelineConfig(preset=name, model=model,
                          **{section: classes[section](**fields)
                             for section, fields in changes.items()})


def get_config(preset: str = DEFAULT_PRESET,
               overrides: dict[str, Any] | None = None) -> PipelineConfig:
    """Returns a preset, with dotted-key overrides applied and validated.

    Args:
      preset: one of `PRESETS`.
      overrides: e.g. `{"train.train_steps": 200, "model.hidden_size": 128}`; values
        may be text (`--set`), parsed into each field's declared type.

    Raises:
      ValueError: unknown preset, unknown key, or a value the config rejects
        (the message names the key and the value).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset '{preset}'; choose one of {sorted(PRESETS)}")
    config = preset_config(preset)
    if not overrides:
        return config
    return PipelineConfig.from_dict(apply_overrides(config.to_dict(), overrides))
