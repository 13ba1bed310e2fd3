"""Shared tiny configs for the model tests (no TensorFlow import here)."""

import pytest

from models.deepseek.config import DeepSeekConfig

# The tiny config of the model tests; parameter counts are derived by hand in
# test_deepseek_causal_lm.py.
TINY = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    q_lora_rank=16,
    kv_lora_rank=16,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    n_routed_experts=8,
    n_shared_experts=1,
    num_experts_per_tok=2,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    num_nextn_predict_layers=1,
    max_position_embeddings=32,
    tie_word_embeddings=False,
)


@pytest.fixture
def tiny_kwargs() -> dict:
    return dict(TINY)


@pytest.fixture
def tiny_config() -> DeepSeekConfig:
    return DeepSeekConfig(**TINY)


@pytest.fixture(scope="module")
def tiny_model():
    """A tiny DeepSeekCausalLM shared by the tests of one module (do not mutate it)."""
    import keras

    from models.deepseek.causal_lm import DeepSeekCausalLM

    keras.utils.set_random_seed(0)
    return DeepSeekCausalLM(DeepSeekConfig(**TINY))
