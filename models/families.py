"""The two model families behind one interface, for the code outside models/.

`family_of(config)` gives a config object's `Family`. What the Trainer, expert pruning,
the planner CLI and Hugging Face import need to know about a family is a field or a
module of it, so they hold no `isinstance` branch of their own:

  family      package                  hash-routed MoE  int8 form  built-in chat format
  DeepSeek    models/deepseek          no               yes        no (the tokenizer's)
  DeepSeek-V4 models/deepseek_v4       yes              no         yes (DSML, encoding_dsv4)

Each family keeps the same module names for what both have (`flops`, `expert_pruning`,
`memory_plan`), which `Family.module` imports on first use: this module itself imports
no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType

from models.deepseek.config import DeepSeekConfig
from models.deepseek_v4.config import DeepSeekV4Config


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family.

    Attributes:
      name: "DeepSeek" (V2/V3/V3.2) or "DeepSeek-V4".
      package: its package under models/ ("deepseek", "deepseek_v4").
      config_class: its config dataclass.
      hash_routing: its first MoE layers route by token id (`tid2eid`, DeepSeek-V4 §2.2).
      int8: its weights have an int8 form (`models/formats/quantization.py`).
      builtin_chat_format: a chat model of the family has a chat format of its own
        (DeepSeek-V4's `encoding_dsv4.py`) when its tokenizer carries no chat template.
    """

    name: str
    package: str
    config_class: type
    hash_routing: bool
    int8: bool
    builtin_chat_format: bool

    def module(self, name: str) -> ModuleType:
        """The family's module `name` (e.g. "flops", "expert_pruning", "memory_plan").

        Raises:
          ModuleNotFoundError: the family has no such module.
        """
        return importlib.import_module(f"models.{self.package}.{name}")

    def flops_per_token(self, config, seq_len: int) -> int:
        """Training FLOPs per token at `seq_len` tokens (`models/<package>/flops.py`)."""
        return self.module("flops").flops_per_token(config, seq_len)

    def hash_routers(self, model) -> list:
        """The model's hash-routed MoE layers ([] in a family without hash routing)."""
        return self.module("hash_routing").hash_routers(model) if self.hash_routing else []


DEEPSEEK = Family("DeepSeek", "deepseek", DeepSeekConfig, hash_routing=False, int8=True,
                  builtin_chat_format=False)
DEEPSEEK_V4 = Family("DeepSeek-V4", "deepseek_v4", DeepSeekV4Config, hash_routing=True,
                     int8=False, builtin_chat_format=True)
FAMILIES = (DEEPSEEK, DEEPSEEK_V4)


def family_of(config) -> Family:
    """The family of a config object (a `DeepSeekConfig` or a `DeepSeekV4Config`).

    Raises:
      TypeError: anything else, naming its type.
    """
    for family in FAMILIES:
        if isinstance(config, family.config_class):
            return family
    raise TypeError(f"not a model config of a known family: {type(config).__name__} "
                    f"(expected {' or '.join(f.config_class.__name__ for f in FAMILIES)})")
