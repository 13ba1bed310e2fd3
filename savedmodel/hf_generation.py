"""transformers' `generation_config.json` <-> the pipeline's `GenerationConfig`.

A SavedModel's `assets.extra/generation_config.json` (the defaults of its
`serving_default`) and hf-export's `generation_config.json` are in transformers' form:
`do_sample`, `temperature`, `top_k`, `top_p`, `max_new_tokens`, and the tokenizer's
`bos_token_id` / `eos_token_id` / `pad_token_id`. Beam search and penalties are not used.
"""

from __future__ import annotations

from config import GenerationConfig
from tokenization.byte_level_bpe import ByteLevelBpe

# transformers' GenerationConfig defaults, for keys a generation_config.json leaves out.
_HF_GENERATION_DEFAULTS = {"do_sample": False, "temperature": 1.0, "top_k": 50, "top_p": 1.0}
# The keys that say how `serving_default` samples (the rest are token ids and bookkeeping).
SAMPLING_KEYS = (*_HF_GENERATION_DEFAULTS, "max_new_tokens")


def generation_config_from_hf(hf: dict) -> GenerationConfig:
    """The sampling defaults of a transformers `generation_config.json` dict.

    Keys it leaves out take transformers' defaults (`do_sample` false, temperature
    1.0, top_k 50, top_p 1.0), so the result decodes as `model.generate()` would:
    `do_sample` false becomes greedy (temperature 0). `max_new_tokens` defaults to
    the pipeline's (`GenerationConfig().max_new_tokens`; transformers' `max_length`
    counts the prompt too and is not used). Beam search and penalties are not used.
    """
    # A key set to null is "off" in transformers (no top-k / nucleus filter, no scaling).
    off = {"do_sample": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    get = {k: (off[k] if hf[k] is None else hf[k]) if k in hf else default
           for k, default in _HF_GENERATION_DEFAULTS.items()}
    greedy = not get["do_sample"] or float(get["temperature"]) <= 0
    return GenerationConfig(
        max_new_tokens=int(hf.get("max_new_tokens") or GenerationConfig().max_new_tokens),
        temperature=0.0 if greedy else float(get["temperature"]),
        top_k=int(get["top_k"]),
        top_p=float(get["top_p"]),
    )


def generation_config_to_hf(generation: GenerationConfig,
                            tokenizer: ByteLevelBpe | None = None) -> dict:
    """`generation` as a transformers `generation_config.json` dict.

    Temperature 0 (greedy) is `do_sample: false` without sampling keys (transformers
    warns about sampling keys that greedy decoding ignores, and refuses to save them);
    top_k 0 and top_p 1.0 mean "off" in both. With a tokenizer, also `bos_token_id` (when it has a
    beginning token), `eos_token_id` and `pad_token_id`.
    """
    hf: dict = {"do_sample": generation.temperature > 0,
                "max_new_tokens": generation.max_new_tokens}
    if generation.temperature > 0:
        hf.update(temperature=generation.temperature, top_k=generation.top_k,
                  top_p=generation.top_p)
    if tokenizer is not None:
        hf.update(token_ids(tokenizer))
    return hf


def token_ids(tokenizer: ByteLevelBpe) -> dict[str, int]:
    """`bos_token_id` (if any), `eos_token_id` and `pad_token_id`, as transformers names them."""
    ids = {"eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id}
    if tokenizer.bos_token is not None:
        ids["bos_token_id"] = tokenizer.token_id(tokenizer.bos_token)
    return ids
