"""The servable SavedModel: raw text in, generated text out.

`export_serving_model` writes a SavedModel holding the trained model and its
tokenizer, with signatures:

  serving_default  prompt tf.string [batch] -> completion, text tf.string [batch]
                   (sampling with the config's generation defaults)
  generate         prompt, max_new_tokens, temperature, top_k, top_p, seed
                   -> completion, text, num_generated int32 [batch]
  logits           input_ids int32 [batch, seq] -> logits float32 [batch, seq, vocab]
  tokenize         text tf.string [batch] -> input_ids int32 [batch, max_len] (padded
                   with the pad id), lengths int32 [batch]
  detokenize       input_ids int32 [batch, seq] -> text tf.string [batch] (special
                   tokens, padding included, decode to nothing)

A model fine-tuned on chat records (`data.task = "sft"`) answers prompts: its
`serving_default` and `generate` wrap each prompt in the chat template's
prefix and suffix (`chat_template.prompt_affixes`; `assets.extra/chat_prompt.json`
names them) before tokenizing, exactly as its training prompts were rendered,
and return the response as `completion` (`text` = the prompt as given +
completion). Such a model also has

  generate_raw     the inputs and outputs of `generate`, on the prompt as given
                   (no template; `deepseek-tfx generate --raw`)

It loads with only `tensorflow` and `tensorflow_text` imported (the regex ops live
in tensorflow_text), which is what TensorFlow Serving needs too.

The tokenizer is the Hugging Face tokenizer.json that Transform learned or copied
(`components/transform/tokenizer.py`), or that `hf-import` found beside the weights,
run by the same in-graph `BytePairEncoder` as Transform, so training and serving
tokenize alike. The file travels with the model: `assets/tokenizer.json` and
`assets/tokenizer_config.json`; `assets.extra/` holds the model's `config.json` and a
`generation_config.json` (the defaults of `serving_default`), and a pushed model also
the pipeline config (`deepseek_tfx_config.json`). `hf-export` writes these beside the
weights in transformers' layout (`serving/hf_interop.py`).
"""

from __future__ import annotations

import json
import os
import tempfile

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the regex ops the graph uses)

from components.transform.byte_level_bpe import (
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    ByteLevelBpe,
)
from components.transform.byte_pair_encoder import BytePairEncoder
from components.transform.tokenizer import load_tokenizer
from models.deepseek import hf_checkpoint
from models.deepseek.generation import generate
from pipeline.configs import GenerationConfig, PipelineConfig
from serving.hf_interop import GENERATION_CONFIG_NAME, generation_config_to_hf
from serving.hf_interop import PIPELINE_CONFIG_ASSET as CONFIG_ASSET

CHAT_PROMPT_ASSET = "chat_prompt.json"
# The inputs of `generate` and `generate_raw`.
GENERATE_SIGNATURE = [
    tf.TensorSpec([None], tf.string, name="prompt"),
    tf.TensorSpec([], tf.int32, name="max_new_tokens"),
    tf.TensorSpec([], tf.float32, name="temperature"),
    tf.TensorSpec([], tf.int32, name="top_k"),
    tf.TensorSpec([], tf.float32, name="top_p"),
    tf.TensorSpec([], tf.int32, name="seed"),
]  # assets.extra/: the chat template's prompt affixes


class ServingModule(tf.Module):
    """Wraps a trained model and its tokenizer into serving signatures.

    Args:
      model: a `DeepSeekCausalLM`.
      tokenizer: its `ByteLevelBpe` (tokenizer.json).
      generation: defaults of `serving_default`.
      asset_dir: a directory holding tokenizer.json and tokenizer_config.json, which
        the SavedModel carries as assets.
    """

    def __init__(self, model, tokenizer: ByteLevelBpe, generation: GenerationConfig,
                 asset_dir: str, chat_prompt: tuple[str, str] | None = None):
        super().__init__(name="deepseek_tfx")
        self.model = model
        self.encoder = BytePairEncoder(tokenizer.pre_tokenizer_config, tokenizer.added_tokens,
                                       tokenizer, tokenizer.surfaces())
        self.tokenizer_file = tf.saved_model.Asset(os.path.join(asset_dir, TOKENIZER_FILE))
        self.tokenizer_config_file = tf.saved_model.Asset(
            os.path.join(asset_dir, TOKENIZER_CONFIG_FILE))
        self.eos_id = tokenizer.eos_id
        self.pad_id = tokenizer.pad_id
        self.max_context = model.config.max_position_embeddings
        self.generation = generation
        self.chat_prompt = chat_prompt

    # -- tokenization -------------------------------------------------------------
    def _encode(self, text):
        ids = self.encoder.encode(tf.reshape(text, [-1]))  # (B, (T))
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        return tf.cast(ids.to_tensor(default_value=self.pad_id), tf.int32), lengths

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def tokenize(self, text):
        ids, lengths = self._encode(text)
        return {"input_ids": ids, "lengths": lengths}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def detokenize(self, input_ids):
        return {"text": self.encoder.decode(input_ids)}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def logits(self, input_ids):
        return {"logits": tf.cast(self.model(input_ids, training=False), tf.float32)}

    # -- generation ---------------------------------------------------------------
    def _generate_one(self, prompt, max_new_tokens, temperature, top_k, top_p, seed,
                      templated=False):
        if templated:  # the chat template's prefix (its BOS included) and suffix
            prefix, suffix = self.chat_prompt
            prompt = tf.strings.join([prefix, prompt, suffix])
        ids, lengths = self._encode(tf.reshape(prompt, [1]))
        ids = ids[:, : lengths[0]]  # (1, T0)
        if not templated:
            # A plain prompt continues a document: it starts from [EOS], the separator.
            ids = tf.concat([tf.fill([1, 1], self.eos_id), ids], axis=1)
        keep = tf.maximum(self.max_context - max_new_tokens, 1)
        ids = ids[:, -keep:]  # crop the prompt to leave room for the new tokens
        prompt_len = tf.shape(ids)[1]
        tokens, _ = generate(
            self.model,
            ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_token_id=self.eos_id,
        )
        new_tokens = tokens[:, prompt_len:]  # (1, max_new_tokens)
        # Tokens after the first [EOS] are not part of the completion.
        is_eos = tf.cast(tf.equal(new_tokens, self.eos_id), tf.int32)
        alive = tf.equal(tf.cumsum(is_eos, axis=1), 0)
        new_tokens = tf.where(alive, new_tokens, self.pad_id)
        completion = self.encoder.decode(new_tokens)[0]
        return completion, tf.reduce_sum(tf.cast(alive, tf.int32))

    def _generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, raw=False):
        templated = self.chat_prompt is not None and not raw

        def one(p):
            return self._generate_one(p, max_new_tokens, temperature, top_k, top_p, seed,
                                      templated)

        completion, num_generated = tf.map_fn(
            one, prompt, fn_output_signature=(tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.int32))
        )
        return {
            "completion": completion,
            "text": tf.strings.join([prompt, completion]),
            "num_generated": num_generated,
        }

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="prompt")])
    def serving_default(self, prompt):
        g = self.generation
        out = self._generate(
            prompt,
            tf.constant(g.max_new_tokens),
            tf.constant(g.temperature),
            tf.constant(g.top_k),
            tf.constant(g.top_p),
            tf.constant(0),
        )
        return {"completion": out["completion"], "text": out["text"]}

    @tf.function(input_signature=GENERATE_SIGNATURE)
    def generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        return self._generate(prompt, max_new_tokens, temperature, top_k, top_p, seed)

    @tf.function(input_signature=GENERATE_SIGNATURE)
    def generate_raw(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        return self._generate(prompt, max_new_tokens, temperature, top_k, top_p, seed, raw=True)


def save_text_model(model, tokenizer: ByteLevelBpe, generation: GenerationConfig,
                    export_dir: str, chat_prompt: tuple[str, str] | None = None) -> str:
    """Writes `model` with its tokenizer and text signatures as a SavedModel; returns it.

    Besides the SavedModel (signatures above; tokenizer.json and tokenizer_config.json
    as assets), writes in `assets.extra/`, in transformers' forms, what `hf-export`
    passes on: `config.json` (the model's config, `hf_checkpoint.config_to_hf`) and
    `generation_config.json` (the defaults of `serving_default` and the tokenizer's
    bos/eos/pad ids, `hf_interop.generation_config_to_hf`).

    Args:
      model: a `DeepSeekCausalLM` whose vocab_size covers the tokenizer's ids.
      tokenizer: its `ByteLevelBpe`.
      generation: the defaults of `serving_default`.
      export_dir: the SavedModel directory to write.
      chat_prompt: (prefix, suffix) of the chat template around a user prompt, for a
        chat model (see the module docstring); None for a plain language model.

    Raises:
      pre_tokenizer.UnsupportedTokenizerError: a tokenizer outside the family, or
        one without an end-of-sequence token.
    """
    with tempfile.TemporaryDirectory() as asset_dir:
        tokenizer.write(asset_dir)
        module = ServingModule(model, tokenizer, generation, asset_dir, chat_prompt)
        signatures = {
            "serving_default": module.serving_default,
            "generate": module.generate,
            "logits": module.logits,
            "tokenize": module.tokenize,
            "detokenize": module.detokenize,
        }
        if chat_prompt is not None:
            signatures["generate_raw"] = module.generate_raw
        tf.saved_model.save(module, export_dir, signatures=signatures)
    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    for name, value in ((hf_checkpoint.CONFIG_NAME, hf_checkpoint.config_to_hf(model.config)),
                        (GENERATION_CONFIG_NAME, generation_config_to_hf(generation, tokenizer)),
                        *(((CHAT_PROMPT_ASSET, {"prefix": chat_prompt[0], "suffix": chat_prompt[1]}),)
                          if chat_prompt is not None else ())):
        with tf.io.gfile.GFile(os.path.join(extra, name), "w") as f:
            f.write(json.dumps(value, indent=2, sort_keys=True) + "\n")
    return export_dir


def export_serving_model(model, transform_output_dir: str, config: PipelineConfig, export_dir: str) -> str:
    """Writes the servable SavedModel to `export_dir` and returns it.

    Args:
      model: the trained `DeepSeekCausalLM`.
      transform_output_dir: Transform's `transform_graph` artifact directory (its
        tokenizer.json asset is the model's tokenizer).
      config: the pipeline config (stored beside the model, and generation defaults).
      export_dir: destination (TFX: `fn_args.serving_model_dir`).
    """
    tokenizer = load_tokenizer(transform_output_dir)
    chat_prompt = None
    if config.data.task == "sft":  # answer prompts as the training prompts were rendered
        from components.transform import chat_template

        template = chat_template.resolve(config.data, tokenizer)
        chat_prompt = chat_template.prompt_affixes(template,
                                                   *chat_template.special_tokens(tokenizer))
    save_text_model(model, tokenizer, config.generation, export_dir, chat_prompt)
    tf.io.gfile.makedirs(os.path.join(export_dir, "assets.extra"))
    with tf.io.gfile.GFile(os.path.join(export_dir, "assets.extra", CONFIG_ASSET), "w") as f:
        f.write(json.dumps(config.to_dict(), indent=2, sort_keys=True))
    return export_dir


def has_tokenizer(model_dir: str) -> bool:
    """Whether a SavedModel carries a tokenizer (`assets/tokenizer.json`): text signatures."""
    return tf.io.gfile.exists(os.path.join(model_dir, "assets", TOKENIZER_FILE))


def savedmodel_tokenizer(model_dir: str) -> ByteLevelBpe | None:
    """The tokenizer a SavedModel carries (`assets/tokenizer.json`), or None (logits only)."""
    path = os.path.join(model_dir, "assets", TOKENIZER_FILE)
    return ByteLevelBpe.from_file(path) if has_tokenizer(model_dir) else None


class NoTokenizerError(ValueError):
    """Text was asked of a SavedModel without a tokenizer (it serves logits only)."""

    def __init__(self, model_dir: str, what: str):
        super().__init__(
            f"{model_dir} has no tokenizer (no assets/{TOKENIZER_FILE}): it serves logits "
            f"only, so it cannot {what}; hf-import a checkpoint directory that holds "
            f"{TOKENIZER_FILE} to get the text signatures")
