"""A DeepSeekV4CausalLM with random weights everywhere, for tests, and a small config.

Keras draws the matrices; the weights V4 initializes to zeros (sinks, the compressors'
position biases) get normal values, and each hash layer's `tid2eid` table gives every
token 2 distinct random experts, so no branch of the model is trivial.
"""

import keras
import numpy as np

from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config

# 4 layers, sliding / CSA / HCA / CSA, compress rates 4 and 8, sliding window 6, top-k 3.
SMALL_V4 = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA, CSA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "moe", "moe", "moe"),
    hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=3, swiglu_limit=1.0, max_position_embeddings=64)


def random_v4_model(config, seed: int = 0) -> DeepSeekV4CausalLM:
    keras.utils.set_random_seed(seed)
    model = DeepSeekV4CausalLM(config)
    rng = np.random.default_rng(seed)
    for block in model.decoder_layers:  # zero-initialized weights made non-trivial
        attn = block.self_attn
        attn.sinks.assign(rng.normal(size=attn.sinks.shape).astype(np.float32))
        for comp in (attn.compressor, attn.indexer and attn.indexer.compressor):
            if comp is not None:
                comp.position_bias.assign(
                    rng.normal(size=comp.position_bias.shape).astype(np.float32))
        gate = block.mlp.gate
        if gate.tid2eid is not None:
            table = np.stack([rng.permutation(config.n_routed_experts)[:2]
                              for _ in range(config.vocab_size)])
            gate.tid2eid.assign(table.astype(np.int32))
    return model
