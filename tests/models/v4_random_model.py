"""A DeepSeekV4CausalLM with random weights everywhere, for tests.

Keras draws the matrices; the weights V4 initializes to zeros (sinks, the compressors'
position biases) get normal values, and each hash layer's `tid2eid` table gives every
token 2 distinct random experts, so no branch of the model is trivial.
"""

import keras
import numpy as np

from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM


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
