"""A tiny text SavedModel for the serving tests: `save_text_model` on the `tiny` preset cut
to one dense block without an MTP head (its signatures trace and load in seconds); tiny V3
and V4 models; the OpenAI router over a `ModelServer` on a loopback port."""

from __future__ import annotations

import contextlib
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


def tiny_causal_lm(family: str, vocab_size: int, context: int, seed: int,
                   num_hidden_layers: int | None = None):
    """A built, randomly initialized (seeded) tiny causal LM: "v3" (the `tiny` preset) or
    "v4" (`tiny_v4`), without MTP, `num_hidden_layers` None keeping the preset's."""
    import keras
    import tensorflow as tf

    from config import get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from models.deepseek_v4.causal_lm import DeepSeekV4CausalLM

    keras.utils.set_random_seed(seed)
    preset, cls = {"v3": ("tiny", DeepSeekCausalLM), "v4": ("tiny_v4", DeepSeekV4CausalLM)}[family]
    config = get_config(preset).model
    layers = num_hidden_layers or config.num_hidden_layers
    model = cls(dataclasses.replace(config, vocab_size=vocab_size, max_position_embeddings=context,
                                    num_hidden_layers=layers, num_nextn_predict_layers=0))
    model(tf.zeros([1, 4], tf.int32))
    return model


@contextlib.contextmanager
def openai_app(server, name: str):
    """Yields the base URL (".../v1") of `make_openai_router` over `server` (a
    `ModelServer` served as `name`), under uvicorn in a thread on a free loopback port;
    closes the server after."""
    import socket
    import threading
    import time

    import fastapi
    import uvicorn

    from serving.openai_api import StaticModels, make_openai_router

    app = fastapi.FastAPI()
    app.include_router(make_openai_router(StaticModels({name: server})))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    http = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=http.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(600):
        if http.started:
            break
        time.sleep(0.05)
    assert http.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        http.should_exit = True
        thread.join(10)
        server.close()
