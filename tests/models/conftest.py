"""Shared tiny configs for the model tests (no TensorFlow import here)."""

import pytest

from models.deepseek.config import DeepSeekConfig
from models.deepseek.deepseek_presets import deepseek_preset

# The tiny config of the model tests: the `tiny` preset at half its widths, untied;
# parameter counts are derived by hand in test_deepseek_causal_lm.py.
TINY = deepseek_preset("tiny").replace(
    vocab_size=64, hidden_size=32, max_position_embeddings=32, q_lora_rank=16, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, intermediate_size=64,
    moe_intermediate_size=16, tie_word_embeddings=False)


@pytest.fixture
def tiny_kwargs() -> dict:
    """Every field of `TINY`, as `DeepSeekConfig(**tiny_kwargs)` takes them."""
    return TINY.to_dict()


@pytest.fixture
def tiny_config() -> DeepSeekConfig:
    return TINY


@pytest.fixture(scope="module")
def tiny_model():
    """A tiny DeepSeekCausalLM shared by the tests of one module (do not mutate it)."""
    import keras

    from models.deepseek.causal_lm import DeepSeekCausalLM

    keras.utils.set_random_seed(0)
    return DeepSeekCausalLM(TINY)
