"""`models.families`: the code outside models/ asks a config's family, not its class."""

from __future__ import annotations

import pytest

from config import get_config
from models import families
from models.deepseek import flops as v3_flops
from models.deepseek_v4 import flops as v4_flops


def test_each_config_names_its_family_and_its_modules():
    v3, v4 = get_config("tiny").model, get_config("tiny_v4").model
    assert families.family_of(v3) is families.DEEPSEEK
    assert families.family_of(v4) is families.DEEPSEEK_V4
    assert families.DEEPSEEK.module("flops") is v3_flops
    assert families.DEEPSEEK_V4.module("flops") is v4_flops
    assert families.DEEPSEEK.flops_per_token(v3, 32) == v3_flops.flops_per_token(v3, 32)
    assert families.DEEPSEEK_V4.flops_per_token(v4, 32) == v4_flops.flops_per_token(v4, 32)
    for family in families.FAMILIES:  # the module names both families keep
        for name in ("flops", "expert_pruning", "memory_plan", "config", "causal_lm"):
            assert family.module(name).__name__ == f"models.{family.package}.{name}"
    assert (families.DEEPSEEK.int8, families.DEEPSEEK_V4.int8) == (True, False)
    assert families.DEEPSEEK.hash_routers(object()) == []  # no hash routing: never looked at


def test_anything_else_is_named_and_refused():
    with pytest.raises(TypeError, match=r"not a model config of a known family: dict "
                                        r"\(expected DeepSeekConfig or DeepSeekV4Config\)"):
        families.family_of({"model_type": "deepseek_v3"})
    with pytest.raises(ModuleNotFoundError):
        families.DEEPSEEK.module("hash_routing")  # V3 has none
