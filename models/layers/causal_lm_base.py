"""What DeepSeekCausalLM (V2/V3/V3.2) and DeepSeekV4CausalLM share: the config handling,
the embedding and output head, the training loss, the router-bias update and
serialization.

A family's model inherits `CausalLMBase`, sets `config_class`, builds its own blocks in
`__init__` (in its own attribute order: the order is the order of `model.weights`) and
writes `call`, `forward_train`, `init_cache` and `call_with_cache`.

Reference: HF transformers `DeepseekV3ForCausalLM` and `DeepseekV4ForCausalLM`, whose
`lm_head`, tied embeddings and loss are the same; DeepSeek-V3 (arXiv 2412.19437) §2.1.2
(auxiliary-loss-free balancing) and §2.2 (MTP).
"""

from typing import Any, ClassVar

import keras
import tensorflow as tf

from models.layers import initializers
from models.layers.losses import causal_lm_loss
from models.layers.tracking import no_default_save_signature, with_layer_lists


class CausalLMBase(keras.Model):
    """Base of a DeepSeek causal LM: a Keras Model holding `config`, `embed_tokens`,
    `decoder_layers`, `mtp_layers` (each with a `block`) and `lm_head`.

    Attributes:
      config_class: the family's config dataclass (a `ModelConfig`); `checked_config`
        builds it from a `to_dict()`.
    """

    config_class: ClassVar[type]

    @classmethod
    def checked_config(cls, config: Any) -> Any:
        """`config` itself, or the family's config built from its `to_dict()` dict.

        Raises:
          ValueError: a dict with keys that are not config fields (`from_dict`), or a
            field value the config rejects.
        """
        if isinstance(config, dict):
            config = cls.config_class.from_dict(config)
        return config

    def make_embedding(self, c: Any) -> keras.layers.Embedding:
        """The token embedding (vocab_size, hidden_size), normal(0, initializer_range)."""
        return keras.layers.Embedding(
            c.vocab_size, c.hidden_size, name="embed_tokens", dtype=self.dtype_policy,
            embeddings_initializer=initializers.normal(c.initializer_range))

    def make_lm_head(self, c: Any) -> keras.layers.Dense | None:
        """The output projection hidden_size -> vocab_size without bias, or None when
        `tie_word_embeddings` (the logits then use `embed_tokens.embeddings`)."""
        if c.tie_word_embeddings:
            return None
        return keras.layers.Dense(
            c.vocab_size, use_bias=False, name="lm_head", dtype=self.dtype_policy,
            kernel_initializer=initializers.normal(c.initializer_range))

    def make_decoder_layers(self, block_class: type, c: Any) -> list:
        """num_hidden_layers blocks `block_class(c, i)`, named `layers.{i}`."""
        return [block_class(c, i, name=f"layers.{i}", dtype=self.dtype_policy)
                for i in range(c.num_hidden_layers)]

    def make_mtp_layers(self, mtp_class: type, c: Any) -> list:
        """num_nextn_predict_layers MTP modules `mtp_class(c, num_hidden_layers + d)`,
        named `mtp.{d}` (HF stores depth d at layer index num_hidden_layers + d)."""
        return [mtp_class(c, c.num_hidden_layers + d, name=f"mtp.{d}", dtype=self.dtype_policy)
                for d in range(c.num_nextn_predict_layers)]

    def build_output_head(self) -> None:
        """Builds the final norm and (untied) `lm_head` on (B, T, hidden_size) inputs."""
        hidden = self.config.hidden_size
        self.norm.build((None, None, hidden))
        if self.lm_head is not None:
            self.lm_head.build((None, None, hidden))

    @property
    def moe_layers(self) -> list:
        """The MoE layers in `expert_load` row order: the decoder blocks', then the MTP
        blocks'."""
        blocks = list(self.decoder_layers) + [mtp.block for mtp in self.mtp_layers]
        return [block.mlp for block in blocks if block.is_moe]

    @property
    def num_moe_layers(self) -> int:
        return len(self.moe_layers)

    def logits_from_hidden(self, hidden_states):
        """Output head: (B, T, C) normalized hidden states -> float32 logits (B, T, V)."""
        if self.lm_head is None:
            embeddings = tf.cast(self.embed_tokens.embeddings, hidden_states.dtype)  # (V, C)
            logits = tf.einsum("btc,vc->btv", hidden_states, embeddings)  # (B, T, V)
        else:
            logits = self.lm_head(hidden_states)  # (B, T, V)
        return tf.cast(logits, tf.float32)

    def compute_loss(self, input_ids, labels, training=True, recompute_blocks=False,
                     moe_capacity_factor=None):
        """Training loss: lm_loss + mtp_loss_weight * mtp_loss + balance_loss.

        Args:
          input_ids: int32 tensor (B, T).
          labels: int32 tensor (B, T), already shifted by the caller: labels[t]
            is the token after input_ids[t]. Negative labels are ignored.
          training: passed to `forward_train`.
          recompute_blocks: activation recomputation, see `forward_train`.
          moe_capacity_factor: MoE dispatch, see `forward_train`.

        Returns:
          dict of float32 tensors: `loss`, `lm_loss` (mean next-token
          cross-entropy), `mtp_loss` (mean over MTP depths of their mean
          cross-entropy, depth k scored against labels shifted k more; 0.0
          without MTP), `balance_loss`, `expert_load` (num_moe_layers, E),
          `moe_dropped` (num_moe_layers,). See `losses.causal_lm_loss`.
        """
        outputs = self.forward_train(input_ids, training=training,
                                     recompute_blocks=recompute_blocks,
                                     moe_capacity_factor=moe_capacity_factor)
        return causal_lm_loss(outputs, labels, self.config.mtp_loss_weight)

    def update_router_biases(self, expert_load, update_speed=None):
        """Auxiliary-loss-free bias update (DeepSeek-V3 §2.1.2) of every MoE layer, MTP
        blocks included (a V4 hash-routed layer has no bias and is left unchanged).

        Args:
          expert_load: float tensor (num_moe_layers, n_routed_experts), e.g.
            `compute_loss(...)["expert_load"]` (summed over replicas if distributed).
          update_speed: gamma; defaults to config.router_bias_update_speed.

        Returns:
          None. Assigns the routers' e_score_correction_bias.
        """
        if update_speed is None:
            update_speed = self.config.router_bias_update_speed
        for i, moe in enumerate(self.moe_layers):
            moe.update_bias(expert_load[i], update_speed)

    # ------------------------------------------------------------------ config

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # Let tf.train.Checkpoint see the layers held in lists (models/layers/tracking.py).
        children = super()._trackable_children(save_type, **kwargs)
        return with_layer_lists(self, children, save_type)

    # No trace of `call` in SavedModels that hold the model (see models/layers/tracking.py).
    _default_save_signature = property(no_default_save_signature)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
