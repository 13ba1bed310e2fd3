"""The servable SavedModel: raw text in, generated text out.

`export_serving_model` writes a SavedModel holding the trained model and the
tokenization graph, with signatures:

  serving_default  prompt tf.string [batch] -> completion, text tf.string [batch]
                   (sampling with the config's generation defaults)
  generate         prompt, max_new_tokens, temperature, top_k, top_p, seed
                   -> completion, text, num_generated int32 [batch]
  logits           input_ids int32 [batch, seq] -> logits float32 [batch, seq, vocab]
  tokenize         text tf.string [batch] -> input_ids int32 [batch, max_len] (padded
                   with 0), lengths int32 [batch]
  detokenize       input_ids int32 [batch, seq] -> text tf.string [batch]

It loads with only `tensorflow` and `tensorflow_text` imported (the WordPiece op
lives in tensorflow_text), which is what TensorFlow Serving needs too.

Tokenization is the graph tf.Transform produced (`transform_fn`, loaded with
`TFTransformOutput.transform_features_layer()`), so training and serving cannot
drift apart.
"""

from __future__ import annotations

import glob
import json
import os

import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the WordPiece ops the graph uses)

from components.transform import tokenizer
from components.transform.preprocessing import INPUT_IDS_KEY, TEXT_KEY
from models.deepseek.generation import generate
from pipeline.configs import PipelineConfig
from serving.hf_interop import PIPELINE_CONFIG_ASSET as CONFIG_ASSET


def find_vocabulary_file(transform_output_dir: str) -> str:
    """The WordPiece vocabulary asset written by Transform's analyzer."""
    pattern = os.path.join(transform_output_dir, "transform_fn", "assets", "wordpiece_vocab_*.txt")
    matches = glob.glob(pattern)
    if len(matches) != 1:
        raise FileNotFoundError(f"expected one vocabulary matching {pattern}, found {matches}")
    return matches[0]


class ServingModule(tf.Module):
    """Wraps the trained model and the transform graph into serving signatures."""

    def __init__(self, model, transform_layer, surfaces: list[str], config: PipelineConfig):
        super().__init__(name="deepseek_tfx")
        self.model = model
        self.transform_layer = transform_layer
        self.surfaces = tf.constant(surfaces, dtype=tf.string)
        self.max_context = config.model.max_position_embeddings
        self.generation = config.generation

    # -- tokenization -------------------------------------------------------------
    def _encode(self, text):
        features = self.transform_layer({TEXT_KEY: tf.reshape(text, [-1, 1])})
        ids = tf.cast(tf.sparse.to_dense(features[INPUT_IDS_KEY]), tf.int32)  # (B, T)
        row_lengths = tf.math.bincount(
            tf.cast(features[INPUT_IDS_KEY].indices[:, 0], tf.int32),
            minlength=tf.shape(text)[0],
            maxlength=tf.shape(text)[0],
        )
        return ids, row_lengths

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def tokenize(self, text):
        ids, lengths = self._encode(text)
        return {"input_ids": ids, "lengths": lengths}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def detokenize(self, input_ids):
        return {"text": tokenizer.decode_ids(input_ids, self.surfaces)}

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def logits(self, input_ids):
        return {"logits": tf.cast(self.model(input_ids, training=False), tf.float32)}

    # -- generation ---------------------------------------------------------------
    def _generate_one(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        ids, lengths = self._encode(tf.reshape(prompt, [1]))
        ids = ids[:, : lengths[0]]  # (1, T0)
        # An empty prompt starts from [EOS], the document separator.
        ids = tf.concat([tf.fill([1, 1], tokenizer.EOS_ID), ids], axis=1)
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
            stop_token_id=tokenizer.EOS_ID,
        )
        new_tokens = tokens[:, prompt_len:]  # (1, max_new_tokens)
        # Tokens after the first [EOS] are not part of the completion.
        is_eos = tf.cast(tf.equal(new_tokens, tokenizer.EOS_ID), tf.int32)
        alive = tf.equal(tf.cumsum(is_eos, axis=1), 0)
        new_tokens = tf.where(alive, new_tokens, tokenizer.PAD_ID)
        completion = tokenizer.decode_ids(new_tokens, self.surfaces)[0]
        return completion, tf.reduce_sum(tf.cast(alive, tf.int32))

    def _generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        def one(p):
            return self._generate_one(p, max_new_tokens, temperature, top_k, top_p, seed)

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

    @tf.function(
        input_signature=[
            tf.TensorSpec([None], tf.string, name="prompt"),
            tf.TensorSpec([], tf.int32, name="max_new_tokens"),
            tf.TensorSpec([], tf.float32, name="temperature"),
            tf.TensorSpec([], tf.int32, name="top_k"),
            tf.TensorSpec([], tf.float32, name="top_p"),
            tf.TensorSpec([], tf.int32, name="seed"),
        ]
    )
    def generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        return self._generate(prompt, max_new_tokens, temperature, top_k, top_p, seed)


def export_serving_model(model, transform_output_dir: str, config: PipelineConfig, export_dir: str) -> str:
    """Writes the servable SavedModel to `export_dir` and returns it.

    Args:
      model: the trained `DeepSeekCausalLM`.
      transform_output_dir: Transform's `transform_graph` artifact directory.
      config: the pipeline config (stored as an asset, and generation defaults).
      export_dir: destination (TFX: `fn_args.serving_model_dir`).
    """
    import tensorflow_transform as tft  # only the exporting process needs it

    tft_output = tft.TFTransformOutput(transform_output_dir)
    vocabulary = tokenizer.read_vocabulary(find_vocabulary_file(transform_output_dir))
    module = ServingModule(
        model, tft_output.transform_features_layer(), tokenizer.surface_forms(vocabulary), config
    )
    signatures = {
        "serving_default": module.serving_default,
        "generate": module.generate,
        "logits": module.logits,
        "tokenize": module.tokenize,
        "detokenize": module.detokenize,
    }
    tf.saved_model.save(module, export_dir, signatures=signatures)
    tf.io.gfile.makedirs(os.path.join(export_dir, "assets.extra"))
    with tf.io.gfile.GFile(os.path.join(export_dir, "assets.extra", CONFIG_ASSET), "w") as f:
        f.write(json.dumps(config.to_dict(), indent=2, sort_keys=True))
    return export_dir
