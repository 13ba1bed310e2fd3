"""`deepseek-tfx hf-import` / `hf-export`: HF DeepSeek-V3 checkpoints <-> SavedModels.

  hf_import(CHECKPOINT_DIR, OUT_DIR)  config.json + safetensors -> SavedModel with a
                                      `logits` signature (input_ids int32 [batch, seq]
                                      -> logits float32 [batch, seq, vocab]), also
                                      `serving_default`; the HF config.json is kept in
                                      `assets.extra/config.json`.
  hf_export(MODEL_DIR, OUT_DIR)       a SavedModel written by hf-import or by the
                                      pipeline's Trainer/Pusher -> config.json + safetensors

The weights travel through `models/deepseek/hf_checkpoint.py`; the SavedModel's
variables are read back into a freshly built model with `tf.train.Checkpoint`
(the exported module keeps the model under the attribute `model`).
Needs only TensorFlow (and safetensors); no torch, no TFX.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf

from models.deepseek import hf_checkpoint

PIPELINE_CONFIG_ASSET = "deepseek_tfx_config.json"  # the PipelineConfig beside a pushed model


class LogitsModule(tf.Module):
    """A SavedModel root holding the model (`self.model`) and its `logits` signature."""

    def __init__(self, model):
        super().__init__(name="deepseek_logits")
        self.model = model

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name="input_ids")])
    def logits(self, input_ids):
        return {"logits": tf.cast(self.model(input_ids, training=False), tf.float32)}


def hf_import(checkpoint_dir: str, out_dir: str) -> str:
    """Reads a HF DeepSeek-V3 checkpoint and writes a SavedModel; returns out_dir.

    Raises:
      FileNotFoundError, hf_checkpoint.CheckpointError: see `load_hf_checkpoint`.
    """
    model = hf_checkpoint.load_hf_checkpoint(checkpoint_dir)
    module = LogitsModule(model)
    tf.saved_model.save(module, out_dir,
                        signatures={"serving_default": module.logits, "logits": module.logits})
    extra = os.path.join(out_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    with tf.io.gfile.GFile(os.path.join(extra, hf_checkpoint.CONFIG_NAME), "w") as f:
        json.dump(hf_checkpoint.config_to_hf(model.config), f, indent=2, sort_keys=True)
    return out_dir


def model_config_of_savedmodel(model_dir: str):
    """The DeepSeekConfig stored beside a SavedModel (hf-import's or the pipeline's).

    Raises:
      FileNotFoundError: neither `assets.extra/config.json` nor the pipeline's config.
    """
    from models.deepseek.config import DeepSeekConfig

    extra = os.path.join(model_dir, "assets.extra")
    hf_path = os.path.join(extra, hf_checkpoint.CONFIG_NAME)
    pipeline_path = os.path.join(extra, PIPELINE_CONFIG_ASSET)
    if tf.io.gfile.exists(hf_path):
        with tf.io.gfile.GFile(hf_path) as f:
            return hf_checkpoint.config_from_hf(json.load(f))
    if tf.io.gfile.exists(pipeline_path):
        with tf.io.gfile.GFile(pipeline_path) as f:
            return DeepSeekConfig.from_dict(json.load(f)["model"])
    raise FileNotFoundError(
        f"{model_dir}: no assets.extra/{hf_checkpoint.CONFIG_NAME} or "
        f"assets.extra/{PIPELINE_CONFIG_ASSET}; not a deepseek-tfx SavedModel")


def load_model_from_savedmodel(model_dir: str):
    """Rebuilds the DeepSeekCausalLM of a SavedModel with its trained weights.

    Raises:
      FileNotFoundError: no config beside the SavedModel.
      AssertionError: the SavedModel's variables do not cover the model.
    """
    from models.deepseek.causal_lm import DeepSeekCausalLM

    model = DeepSeekCausalLM(model_config_of_savedmodel(model_dir))
    reader = tf.train.Checkpoint(model=model)
    status = reader.read(os.path.join(model_dir, "variables", "variables"))
    status.expect_partial()  # the SavedModel also holds tokenizer tables etc.
    status.assert_existing_objects_matched()
    return model


def hf_export(model_dir: str, out_dir: str, max_shard_bytes: int = hf_checkpoint.DEFAULT_MAX_SHARD_BYTES,
              config_form: str = "5.x", dtype: str = "float32") -> list[str]:
    """Writes the model of a SavedModel as a HF checkpoint; returns the safetensors files."""
    model = load_model_from_savedmodel(model_dir)
    return hf_checkpoint.save_hf_checkpoint(model, out_dir, max_shard_bytes=max_shard_bytes,
                                            config_form=config_form, dtype=dtype)
