"""The servable SavedModel: raw text in, generated text out.

`export_serving_model` writes a SavedModel holding the trained model and its
tokenizer, with signatures:

  serving_default  prompt tf.string [batch] -> completion, text tf.string [batch]
                   (sampling with the config's generation defaults, seed 0 in every row)
  generate         prompt tf.string [batch], and one value per prompt of
                   max_new_tokens int32 [batch], temperature float32 [batch],
                   top_k int32 [batch], top_p float32 [batch], seed int32 [batch]
                   -> completion, text tf.string [batch], num_generated int32 [batch]
  logits           input_ids int32 [batch, seq] -> logits float32 [batch, seq, vocab]
  tokenize         text tf.string [batch] -> input_ids int32 [batch, max_len] (padded
                   with the pad id), lengths int32 [batch]
  detokenize       input_ids int32 [batch, seq] -> text tf.string [batch] (special
                   tokens, padding included, decode to nothing)

Besides the signatures, the module carries the serving engine's two functions
(`serving/engine.py`; tf.functions of the SavedModel, not signatures: their KV cache is the
caller's state between calls, which TF Serving does not keep):

  engine_prefill   input_ids int32 [B, P], prompt_lengths int32 [B], cache_len int32 [],
                   and per row temperature, top_k, top_p, seed, bitmask int32 [B, W],
                   bias_ids int32 [B, K], bias_values float32 [B, K]
                   -> token int32 [B] (each row's first new token), cache
  engine_decode    tokens int32 [B], positions int32 [B], cache, steps int32 [B],
                   num_steps int32 [], and the same per-row inputs -> token int32
                   [B, num_steps] (each row's next tokens), cache (written in place)

(`models/deepseek/engine_steps.py`). `generate` runs its prompts through
`engine_prefill` too, so the SavedModel holds one prefill graph of the model.

A model fine-tuned on chat records (`data.task = "sft"`) answers prompts: its
`serving_default` and `generate` wrap each prompt in the chat template's
prefix and suffix (`chat_template.prompt_affixes`; `assets.extra/chat_prompt.json`
names them) before tokenizing, exactly as its training prompts were rendered,
and return the response as `completion` (`text` = the prompt as given +
completion). Such a model also has

  generate_raw     the inputs and outputs of `generate`, on the prompt as given
                   (no template; `deepseek-tfx generate --raw`)

Generation runs all the prompts of a call as one batch, each row on its own: the
prompts are tokenized in one call, each is prefixed with [EOS] (the document
separator; a plain language model) or wrapped in the chat affixes, cropped to its
last max_position_embeddings - max_new_tokens tokens, and one batched
`models.deepseek.generate` decodes them all (right-padded, per-row positions, stops,
knobs and seed streams). Row b samples step t with the stateless seed (seed[b], t),
so a row's completion does not depend on the other rows of the call: a server may
concatenate the rows of different requests into one call. Each completion ends
before its first [EOS].

It loads with only `tensorflow` and `tensorflow_text` imported (the regex ops live
in tensorflow_text), which is what TensorFlow Serving needs too.

The tokenizer is the Hugging Face tokenizer.json that Transform learned or copied
(`tokenization/tokenizer.py`), or that `hf-import` found beside the weights,
run by the same in-graph `BytePairEncoder` as Transform, so training and serving
tokenize alike. The file travels with the model: `assets/tokenizer.json` and
`assets/tokenizer_config.json`; `assets.extra/` holds the model's `config.json` and a
`generation_config.json` (the defaults of `serving_default`), and a pushed model also
the pipeline config (`deepseek_tfx_config.json`). `hf-export` writes these beside the
weights in transformers' layout (`savedmodel/hf_interop.py`).

Warm-up. `assets.extra/tf_serving_warmup_requests` is TF Serving's SavedModel warm-up
file (a TFRecord of `PredictionLog`s, at most 1,000), which TF Serving replays when it
loads the model and `serve` before it reports ready (`serving/warmup.py` reads it). A
signature's first call after loading pays for instantiating and optimizing its graph,
once per signature. Measured on the cpu_small model (fresh `tf.saved_model.load`, 2 cores
shared with other work, load average 2-7): first calls took 2.7-10.9 s for `generate`,
3.6-10.6 s for `serving_default` (its own graph, even after `generate` ran), 1.4-5.3 s
for `tokenize`, 0.3-1.6 s for `logits` and 7-28 ms for `detokenize`, where later calls
take 0.2-0.6 s (`generate`, 8 rows, 16 tokens), 0.01 s (`tokenize`) and 0.03 s (`logits`).
Batch sizes, prompt lengths, max_new_tokens and the sampling branch (greedy or not) are
dynamic in the graph: once a signature ran, a batch size it has not seen costs within
the noise of a warm call (measured up to 32 rows). After replaying this file (~30 s
there), the first calls of every signature at 8 and 32 rows ran at warm speed. So the
file holds one request per signature: two short rows (English and Chinese;
`serving_default` one row), 2 new tokens for `generate` (the decoding loop's body runs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile

import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the regex ops the graph uses)
from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

from common.json_file import write_json
from config import GenerationConfig, PipelineConfig
from config.data import CHAT_TASKS
from models import checkpoints
from models.deepseek.engine_steps import (
    decode_rows,
    decode_steps,
    generate_with_steps,
    prefill_rows,
)
from savedmodel.hf_generation import generation_config_to_hf
from savedmodel.layout import (
    CHAT_PROMPT_ASSET,
    GENERATION_CONFIG_NAME,
    MAX_WARMUP_RECORDS,
    MODEL_CONFIG_NAME,
    PIPELINE_CONFIG_ASSET,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    WARMUP_REQUESTS_ASSET,
    WarmupRequest,
    extra_path,
    warmup_requests,
    weight_dtype_of,
    write_weight_dtype,
)
from tokenization.byte_level_bpe import ByteLevelBpe
from tokenization.byte_pair_encoder import BytePairEncoder
from tokenization.tokenizer import load_tokenizer

# Serving never differentiates through the SavedModel's functions, so their gradient
# functions are not traced and saved: at 1.36B parameters that tracing took 42 s and
# 0.23 GB of RSS (benchmarks/hf_checkpoint_memory.py).
SAVE_OPTIONS = tf.saved_model.SaveOptions(experimental_custom_gradients=False)

# The inputs of `generate` and `generate_raw`: one value of each per prompt, so rows
# of different requests can share one call.
GENERATE_SIGNATURE = [
    tf.TensorSpec([None], tf.string, name="prompt"),
    tf.TensorSpec([None], tf.int32, name="max_new_tokens"),
    tf.TensorSpec([None], tf.float32, name="temperature"),
    tf.TensorSpec([None], tf.int32, name="top_k"),
    tf.TensorSpec([None], tf.float32, name="top_p"),
    tf.TensorSpec([None], tf.int32, name="seed"),
]


# The serving engine's per-row inputs besides the tokens (`models.deepseek.engine_steps`):
# sampling knobs, then the constraints (an allowed-token bitmask, logit_bias entries).
ENGINE_ROW_SIGNATURE = [
    tf.TensorSpec([None], tf.float32, name="temperature"),
    tf.TensorSpec([None], tf.int32, name="top_k"),
    tf.TensorSpec([None], tf.float32, name="top_p"),
    tf.TensorSpec([None], tf.int32, name="seed"),
    tf.TensorSpec([None, None], tf.int32, name="bitmask"),
    tf.TensorSpec([None, None], tf.int32, name="bias_ids"),
    tf.TensorSpec([None, None], tf.float32, name="bias_values"),
]


def cache_spec(model):
    """The structure of `model.init_cache(B, S)` as TensorSpecs, batch and length-dependent
    dimensions None: two small eager caches (1 row; 64 and 128 positions) are compared."""
    small, large = model.init_cache(1, 64), model.init_cache(1, 128)
    return tf.nest.map_structure(
        lambda a, b: tf.TensorSpec(
            [None] + [x if x == y else None for x, y in zip(a.shape[1:], b.shape[1:],
                                                            strict=True)], a.dtype),
        small, large)


class ServingModule(tf.Module):
    """Wraps a trained model and its tokenizer into serving signatures.

    The signatures are traced without autograph: their code and what it calls build
    control flow explicitly (tf.while_loop, tf.cond), and transpiling it took half of
    the export's time (12.8-13.2 s for the tiny model, against 5.9-7.7 s without).

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
        # The serving engine's two steps (`serving/engine.py`): tf.functions of the
        # module, not signatures (their cache is the caller's state between calls).
        self.engine_prefill = tf.function(
            self._engine_prefill, autograph=False, input_signature=[
                tf.TensorSpec([None, None], tf.int32, name="input_ids"),
                tf.TensorSpec([None], tf.int32, name="prompt_lengths"),
                tf.TensorSpec([], tf.int32, name="cache_len"), *ENGINE_ROW_SIGNATURE])
        self.engine_decode = tf.function(
            self._engine_decode, autograph=False, input_signature=[
                tf.TensorSpec([None], tf.int32, name="tokens"),
                tf.TensorSpec([None], tf.int32, name="positions"),
                cache_spec(model),
                tf.TensorSpec([None], tf.int32, name="steps"),
                tf.TensorSpec([], tf.int32, name="num_steps"), *ENGINE_ROW_SIGNATURE])
        if chat_prompt is not None:
            # Only a chat model has it: every tf.function of the module is traced when
            # it is saved, and this one is a whole second decoding loop.
            self.generate_raw = tf.function(self._generate_raw, autograph=False,
                                            input_signature=GENERATE_SIGNATURE)

    # -- tokenization -------------------------------------------------------------
    def _encode(self, text):
        ids = self.encoder.encode(tf.reshape(text, [-1]))  # (B, (T))
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        return tf.cast(ids.to_tensor(default_value=self.pad_id), tf.int32), lengths

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="text")])
    def tokenize(self, text):
        ids, lengths = self._encode(text)
        return {"input_ids": ids, "lengths": lengths}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def detokenize(self, input_ids):
        return {"text": self.encoder.decode(input_ids)}

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def logits(self, input_ids):
        return {"logits": tf.cast(self.model(input_ids, training=False), tf.float32)}

    # -- generation ---------------------------------------------------------------
    def _prompt_ids(self, prompt, max_new_tokens, templated):
        """All prompts tokenized in one call, right-padded, each cropped to fit its output.

        Args:
          prompt: tf.string [B]. max_new_tokens: int32 [B].
          templated: wrap each prompt in the chat template's prefix (its BOS
            included) and suffix; else start each from [EOS], the document
            separator (a plain prompt continues a document).

        Returns:
          (ids int32 [B, P] right-padded with pad_id, lengths int32 [B]): row b
          keeps its last max(max_context - max_new_tokens[b], 1) tokens.
        """
        if templated:
            prefix, suffix = self.chat_prompt
            prompt = tf.strings.join([prefix, prompt, suffix])  # [B]
        ids = tf.cast(self.encoder.encode(prompt), tf.int32)  # [B, (T)]
        if not templated:
            eos = tf.fill([tf.shape(prompt)[0], 1], self.eos_id)  # [B, 1]
            ids = tf.concat([tf.RaggedTensor.from_tensor(eos), ids], axis=1)  # [B, (1+T)]
        lengths = tf.cast(ids.row_lengths(), tf.int32)  # [B]
        kept = tf.minimum(lengths, tf.maximum(self.max_context - max_new_tokens, 1))  # [B]
        dense = ids.to_tensor(default_value=self.pad_id)  # [B, T]
        width = tf.reduce_max(tf.concat([kept, [0]], axis=0))  # 0 for no prompts
        columns = tf.range(width)[None, :]  # [1, P]
        source = tf.minimum((lengths - kept)[:, None] + columns, tf.shape(dense)[1] - 1)
        cropped = tf.gather(dense, source, batch_dims=1)  # [B, P] each row's last `kept`
        return tf.where(columns < kept[:, None], cropped, self.pad_id), kept

    def _generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed, raw=False):
        """One batched `generate` over all prompts, each with its own knobs ([B] each)."""
        templated = self.chat_prompt is not None and not raw
        ids, lengths = self._prompt_ids(prompt, max_new_tokens, templated)  # [B, P], [B]
        tf.debugging.assert_greater_equal(max_new_tokens, 1, message="max_new_tokens must be >= 1")
        tf.debugging.assert_less_equal(
            tf.reduce_max(tf.concat([lengths + max_new_tokens, [0]], 0)), self.max_context,
            message="prompt + max_new_tokens exceeds max_position_embeddings (cached mode)")
        # `generate`'s decoding: the prompts through the engine's prefill function (one
        # call: the SavedModel holds no second prefill graph), then the decoding loop
        # traced in place (a function call per step would cost ~2 ms a token on CPU).
        tokens, _ = generate_with_steps(
            self.engine_prefill, self._decode_step, ids, lengths, max_new_tokens,
            (temperature, top_k, top_p, seed), stop_token_id=self.eos_id,
        )  # [B, P + max(max_new_tokens)]
        steps = tf.range(tf.reduce_max(tf.concat([max_new_tokens, [0]], 0)))[None, :]  # [1, N]
        columns = tf.minimum(lengths[:, None] + steps, tf.shape(tokens)[1] - 1)  # [B, N]
        new_tokens = tf.gather(tokens, columns, batch_dims=1)  # [B, N] each row's new tokens
        # The first [EOS] and what follows it (or the row's max_new_tokens) are not
        # part of the completion.
        before_eos = tf.equal(tf.cumsum(tf.cast(tf.equal(new_tokens, self.eos_id), tf.int32),
                                        axis=1), 0)
        alive = tf.logical_and(before_eos, steps < max_new_tokens[:, None])  # [B, N]
        completion = self.encoder.decode(tf.where(alive, new_tokens, self.pad_id))  # [B]
        return {
            "completion": completion,
            "text": tf.strings.join([prompt, completion]),
            "num_generated": tf.reduce_sum(tf.cast(alive, tf.int32), axis=1),
        }

    @tf.function(autograph=False, input_signature=[tf.TensorSpec([None], tf.string, name="prompt")])
    def serving_default(self, prompt):
        g = self.generation
        batch = tf.shape(prompt)[0]
        # A call of `generate`'s function, not a second trace of the model's decoding
        # loop: the SavedModel holds one copy of that graph (smaller, and less memory
        # to save).
        out = self.generate(
            prompt,
            tf.fill([batch], g.max_new_tokens),
            tf.fill([batch], tf.cast(g.temperature, tf.float32)),
            tf.fill([batch], g.top_k),
            tf.fill([batch], tf.cast(g.top_p, tf.float32)),
            tf.zeros([batch], tf.int32),
        )
        return {"completion": out["completion"], "text": out["text"]}

    @tf.function(autograph=False, input_signature=GENERATE_SIGNATURE)
    def generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        return self._generate(prompt, max_new_tokens, temperature, top_k, top_p, seed)

    # -- the serving engine's steps (models/deepseek/engine_steps.py) ---------------
    def _engine_prefill(self, input_ids, prompt_lengths, cache_len, temperature, top_k, top_p,
                        seed, bitmask, bias_ids, bias_values):
        token, cache = prefill_rows(self.model, input_ids, prompt_lengths, cache_len,
                                    (temperature, top_k, top_p, seed),
                                    (bitmask, bias_ids, bias_values))
        return {"token": token, "cache": cache}

    def _decode_step(self, tokens, positions, cache, steps, temperature, top_k, top_p, seed,
                     bitmask, bias_ids, bias_values):
        """One step of `engine_decode`, traced where it is called (`generate`'s loop)."""
        token, cache = decode_rows(self.model, tokens, positions, cache,
                                   (temperature, top_k, top_p, seed), steps,
                                   (bitmask, bias_ids, bias_values))
        return {"token": token, "cache": cache}

    def _engine_decode(self, tokens, positions, cache, steps, num_steps, temperature, top_k,
                       top_p, seed, bitmask, bias_ids, bias_values):
        token, cache = decode_steps(self.model, tokens, positions, cache,
                                    (temperature, top_k, top_p, seed), steps,
                                    (bitmask, bias_ids, bias_values), num_steps)
        return {"token": token, "cache": cache}  # token (B, num_steps)

    def _generate_raw(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        """`generate_raw` (chat models only): `generate` on the prompt as given."""
        return self._generate(prompt, max_new_tokens, temperature, top_k, top_p, seed, raw=True)


def save_text_model(model, tokenizer: ByteLevelBpe, generation: GenerationConfig,
                    export_dir: str, chat_prompt: tuple[str, str] | None = None) -> str:
    """Writes `model` with its tokenizer and text signatures as a SavedModel; returns it.

    Besides the SavedModel (signatures above; tokenizer.json and tokenizer_config.json
    as assets), writes in `assets.extra/`, in transformers' forms, what `hf-export`
    passes on: `config.json` (the model's config, `checkpoints.config_to_hf`) and
    `generation_config.json` (the defaults of `serving_default` and the tokenizer's
    bos/eos/pad ids, `hf_interop.generation_config_to_hf`); `precision.json`, the
    dtype of the model's variables (`layout.write_weight_dtype`), which readers build
    the model in; and TF Serving's warm-up file `tf_serving_warmup_requests`
    (`text_warmup_requests`). The `logits` signature returns float32 whatever that dtype.

    Args:
      model: a `DeepSeekCausalLM` (variables float32 or bfloat16) whose vocab_size
        covers the tokenizer's ids.
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
        tf.saved_model.save(module, export_dir, signatures=signatures, options=SAVE_OPTIONS)
        write_warmup_requests(export_dir, text_warmup_requests(module, signatures, tokenizer))
    extras = {MODEL_CONFIG_NAME: checkpoints.config_to_hf(model.config),
              GENERATION_CONFIG_NAME: generation_config_to_hf(generation, tokenizer)}
    if chat_prompt is not None:
        extras[CHAT_PROMPT_ASSET] = {"prefix": chat_prompt[0], "suffix": chat_prompt[1]}
    for name, value in extras.items():
        write_json(extra_path(export_dir, name), value, ensure_ascii=True)
    write_weight_dtype(export_dir, weight_dtype_of(model))
    return export_dir


def export_serving_model(model, transform_output_dir: str, config: PipelineConfig, export_dir: str) -> str:
    """Writes the servable SavedModel to `export_dir` and returns it.

    Args:
      model: the trained `DeepSeekCausalLM`.
      transform_output_dir: Transform's `transform_graph` artifact directory (its
        tokenizer.json asset is the model's tokenizer).
      config: the pipeline config (stored beside the model, with the model's own
        config as its `model` section: experts pruned after training change
        n_routed_experts; and generation defaults).
      export_dir: destination (TFX: `fn_args.serving_model_dir`).
    """
    config = dataclasses.replace(config, model=model.config)  # what the weights are
    tokenizer = load_tokenizer(transform_output_dir)
    chat_prompt = None
    if config.data.task in CHAT_TASKS:  # answer prompts as the training prompts were rendered
        from tokenization import chat_template

        template = chat_template.resolve(config.data, tokenizer)
        chat_prompt = chat_template.prompt_affixes(template,
                                                   *chat_template.special_tokens(tokenizer))
    save_text_model(model, tokenizer, config.generation, export_dir, chat_prompt)
    with tf.io.gfile.GFile(extra_path(export_dir, PIPELINE_CONFIG_ASSET), "w") as f:
        f.write(json.dumps(config.to_dict(), indent=2, sort_keys=True))  # no final newline, as ever
    return export_dir



# ----------------------------------------------------------------------------- warm-up


def text_warmup_requests(module: ServingModule, signatures: dict,
                         tokenizer: ByteLevelBpe) -> list[WarmupRequest]:
    """`layout.warmup_requests` for the functions `signatures` ({name: tf.function})
    of `module`, its prompts tokenized by Hugging Face `tokenizers` on the same
    tokenizer.json (the ids the in-graph `tokenize` gives, tests/components/
    test_bpe_parity.py), right-padded with the pad id. Not `module.tokenize` itself:
    calling it here would trace its graph once more after the save (hf-import's peak)."""
    import tokenizers

    hf = tokenizers.Tokenizer.from_str(tokenizer.to_json_string())

    def tokenize(texts: np.ndarray) -> np.ndarray:  # [B] bytes -> int32 [B, T]
        rows = [hf.encode(t.decode("utf-8"), add_special_tokens=False).ids for t in texts]
        out = np.full([len(rows), max(map(len, rows), default=0)], tokenizer.pad_id, np.int32)
        for i, row in enumerate(rows):
            out[i, :len(row)] = row
        return out

    inputs = {name: {spec.name: spec for spec in fn.input_signature}
              for name, fn in signatures.items()}
    return warmup_requests(inputs, module.max_context, module.model.config.vocab_size,
                           tokenize=tokenize)


def write_warmup_requests(export_dir: str, requests: list[WarmupRequest]) -> str:
    """Writes TF Serving's warm-up file, `assets.extra/tf_serving_warmup_requests`, and
    returns its path.

    Each request becomes one TFRecord: a serialized `PredictionLog` whose
    `predict_log.request` is a `PredictRequest` with `model_spec.signature_name` and
    one `TensorProto` per input (`tf.make_tensor_proto`: the array's dtype and shape).
    `model_spec.name` is left empty: TF Serving's warm-up does not read it, and the
    served name is chosen when serving (`--model_name`).

    Raises:
      ValueError: more than `layout.MAX_WARMUP_RECORDS` (1,000) requests, which
        TF Serving refuses to load, or none.
    """
    if not 1 <= len(requests) <= MAX_WARMUP_RECORDS:
        raise ValueError(f"{WARMUP_REQUESTS_ASSET}: {len(requests)} requests; TF Serving "
                         f"replays 1 to {MAX_WARMUP_RECORDS}")
    path = extra_path(export_dir, WARMUP_REQUESTS_ASSET)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.TFRecordWriter(path) as writer:
        for name, inputs in requests:
            request = predict_pb2.PredictRequest(
                model_spec=model_pb2.ModelSpec(signature_name=name))
            for key, value in inputs.items():
                request.inputs[key].CopyFrom(tf.make_tensor_proto(value))
            log = prediction_log_pb2.PredictionLog(
                predict_log=prediction_log_pb2.PredictLog(request=request))
            writer.write(log.SerializeToString())
    return path
