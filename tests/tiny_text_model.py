"""A tiny text SavedModel for the serving tests: `save_text_model` on the `tiny` preset cut
to one dense block without an MTP head (its signatures trace and load in seconds)."""

from __future__ import annotations

import dataclasses
from pathlib import Path


def save_tiny_text_model(out: Path, tokenizer, *, context: int, max_new_tokens: int,
                         vocab_size: int = 512, seed: int = 0,
                         chat_prompt: tuple[str, str] | None = None) -> Path:
    """Writes a randomly initialized (seeded) tiny model with `tokenizer` (a
    `ByteLevelBpe`) to `out` and returns `out`.

    Args:
      context: max_position_embeddings. max_new_tokens: `serving_default`'s default.
      vocab_size: the model's (covering the tokenizer's ids).
      seed: keras' random seed for the weights. chat_prompt: (prefix, suffix) for a chat
        model, else None.
    """
    import keras
    import tensorflow as tf

    from config import GenerationConfig, get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from savedmodel.export import save_text_model

    keras.utils.set_random_seed(seed)
    config = dataclasses.replace(get_config("tiny").model, vocab_size=vocab_size,
                                 max_position_embeddings=context, num_hidden_layers=1,
                                 num_nextn_predict_layers=0)
    model = DeepSeekCausalLM(config)
    model(tf.zeros([1, 4], tf.int32))
    save_text_model(model, tokenizer, GenerationConfig(max_new_tokens=max_new_tokens), str(out),
                    chat_prompt)
    return out
