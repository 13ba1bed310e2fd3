"""DeepSeekV4CausalLM: embeddings, hc_mult residual streams, V4 blocks, hyper head, norm, head.

transformers 5.24 `DeepseekV4Model` / `DeepseekV4ForCausalLM`:

    X_0 = broadcast(Embed(ids)) to hc_mult streams          (B, T, n, C)
    X_l = Block_l(X_{l-1}, ids)                              l = 1..L
    logits = head(RMSNorm(HyperHead(X_L)))                   (B, T, V), float32

The multi-token-prediction modules of the release (`mtp.*`) are not built (transformers
does not run them either). `call` is the stateless forward over positions 0 .. T-1;
`init_cache` / `call_with_cache` decode with V4's caches (`models.deepseek_v4.kv_cache`)
under the contract of `DeepSeekCausalLM`'s, so `models.deepseek.generation.generate` and
the serving code run a V4 model unchanged.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek import initializers
from models.deepseek._tracking import with_layer_lists
from models.deepseek.losses import causal_lm_loss
from models.deepseek.rms_norm import RMSNorm
from models.deepseek_v4 import kv_cache
from models.deepseek_v4.config import DeepSeekV4Config
from models.deepseek_v4.decoder_block import DeepSeekV4DecoderBlock
from models.deepseek_v4.hyper_head import HyperHead


@keras.saving.register_keras_serializable(package="deepseek_v4")
class DeepSeekV4CausalLM(keras.Model):
    """A DeepSeek-V4 decoder-only language model (CSA/HCA attention, mHC, hash/top-k MoE).

    All weights are created in the constructor: normal(0, initializer_range) for the
    matrices, the embedding and the mHC `fn`s; ones for RMSNorm scales and mHC scales;
    zeros for the mHC bases, sinks, compressor position biases, router biases and the
    `tid2eid` tables (load real tables from a checkpoint).

    Args:
      config: a DeepSeekV4Config (or its `to_dict()`).
      **kwargs: keras.Model arguments (name, dtype, ...).

    Attributes:
      embed_tokens: Embedding (vocab_size, C) [release `embed`].
      decoder_layers: L DeepSeekV4DecoderBlock [`layers.N`].
      hc_head: HyperHead [`hc_head_*`].
      norm: final RMSNorm, float32 [`norm`].
      lm_head: Dense C -> vocab_size [`head`]; None when tie_word_embeddings.
      moe_layers: the MoE layers in block order (rows of `expert_load`).

    Example:
      model = DeepSeekV4CausalLM(DeepSeekV4Config())
      logits = model(tf.constant([[1, 2, 3]], tf.int32))  # (1, 3, vocab_size) float32

    Reference: transformers `models/deepseek_v4/modular_deepseek_v4.py`; DeepSeek-V4 paper.
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekV4Config.from_dict(config)
        self.config = c = config
        self.embed_tokens = keras.layers.Embedding(
            c.vocab_size, c.hidden_size, name="embed_tokens", dtype=self.dtype_policy,
            embeddings_initializer=initializers.normal(c.initializer_range))
        self.decoder_layers = [
            DeepSeekV4DecoderBlock(c, i, name=f"layers.{i}", dtype=self.dtype_policy)
            for i in range(c.num_hidden_layers)
        ]
        self.hc_head = HyperHead(c.hc_mult, c.hidden_size, c.hc_eps, c.rms_norm_eps,
                                 c.initializer_range, name="hc_head")
        self.norm = RMSNorm(c.rms_norm_eps, name="norm", dtype="float32")
        self.lm_head = None
        if not c.tie_word_embeddings:
            self.lm_head = keras.layers.Dense(
                c.vocab_size, use_bias=False, name="lm_head", dtype=self.dtype_policy,
                kernel_initializer=initializers.normal(c.initializer_range))
        self.build((None, None))

    def build(self, input_shape=None):
        c = self.config
        self.embed_tokens.build((None, None))
        for block in self.decoder_layers:
            block.build()
        self.hc_head.build()
        self.norm.build((None, None, c.hidden_size))
        if self.lm_head is not None:
            self.lm_head.build((None, None, c.hidden_size))

    @property
    def moe_layers(self):
        """Every block's DeepSeekV4MoE, in block order."""
        return [block.mlp for block in self.decoder_layers]

    # ------------------------------------------------------------------ forward passes

    def logits_from_hidden(self, hidden_states):
        """Output head: (B, T, C) normalized hidden states -> float32 logits (B, T, V)."""
        hidden_states = tf.cast(hidden_states, self.compute_dtype)
        if self.lm_head is None:
            embeddings = tf.cast(self.embed_tokens.embeddings, hidden_states.dtype)  # (V, C)
            logits = tf.einsum("btc,vc->btv", hidden_states, embeddings)  # (B, T, V)
        else:
            logits = self.lm_head(hidden_states)  # (B, T, V)
        return tf.cast(logits, tf.float32)

    def _run(self, input_ids, training=False, moe_capacity_factor=None):
        """Final normalized hidden states (B, T, C) and the per-block MoE statistics."""
        c = self.config
        input_ids = tf.convert_to_tensor(input_ids)
        h = self.embed_tokens(input_ids)  # (B, T, C)
        streams = tf.repeat(h[:, :, None, :], c.hc_mult, axis=2)  # (B, T, n, C)
        stats = []
        for block in self.decoder_layers:
            streams, moe_aux = block(streams, input_ids=input_ids, training=training,
                                     moe_capacity_factor=moe_capacity_factor)  # (B, T, n, C)
            stats.append(moe_aux)
        return self.norm(self.hc_head(streams)), stats  # (B, T, C) float32

    def call(self, input_ids, training=False):
        """Next-token logits.

        Args:
          input_ids: int tensor (B, T), ids in [0, vocab_size), positions 0 .. T-1.
          training: enables dropout (if any).

        Returns:
          float32 (B, T, vocab_size); position t scores the token after t.
        """
        hidden, _ = self._run(input_ids, training=training)
        return self.logits_from_hidden(hidden)

    def forward_train(self, input_ids, training=True, moe_capacity_factor=None):
        """Logits plus MoE statistics, as `DeepSeekCausalLM.forward_train` (no MTP).

        Returns:
          dict: `logits` float32 (B, T, V); `mtp_logits` [] (MTP not built);
          `balance_loss` float32 scalar (sum over the top-k MoE layers); `expert_load`
          float32 (L, E); `moe_dropped` float32 (L,); `moe_pairs` float32 (L,).
        """
        hidden, stats = self._run(input_ids, training=training,
                                  moe_capacity_factor=moe_capacity_factor)
        loads, balance_losses, dropped = (list(t) for t in zip(*stats, strict=True))
        expert_load = tf.stack(loads)  # (L, E)
        return {
            "logits": self.logits_from_hidden(hidden),
            "mtp_logits": [],
            "balance_loss": tf.add_n(balance_losses),
            "expert_load": expert_load,
            "moe_dropped": tf.stack(dropped),  # (L,)
            "moe_pairs": tf.reduce_sum(expert_load, axis=-1),  # (L,)
        }

    def compute_loss(self, input_ids, labels, training=True, moe_capacity_factor=None):
        """lm_loss + balance_loss (`losses.causal_lm_loss`); labels (B, T) already shifted,
        negative labels ignored. Returns its dict of float32 tensors."""
        outputs = self.forward_train(input_ids, training=training,
                                     moe_capacity_factor=moe_capacity_factor)
        return causal_lm_loss(outputs, labels, self.config.mtp_loss_weight)

    def update_router_biases(self, expert_load, update_speed=None):
        """Auxiliary-loss-free bias update of every top-k MoE layer (hash layers: none).

        Args:
          expert_load: float (L, E), e.g. `compute_loss(...)["expert_load"]`.
          update_speed: gamma; defaults to config.router_bias_update_speed.
        """
        for i, moe in enumerate(self.moe_layers):
            moe.update_bias(expert_load[i], update_speed)

    # ------------------------------------------------------------------ cached decoding

    def init_cache(self, batch_size, max_length):
        """An empty KV cache: one dict of zero buffers per layer.

        Args:
          batch_size: int or int32 scalar tensor B.
          max_length: int or int32 scalar tensor S, the most positions it can hold.

        Returns:
          A tuple of num_hidden_layers dicts (tf.nest-compatible, fixed shapes, the
          model's compute dtype): every layer "kv" (B, S, head_dim); CSA / HCA layers
          also "comp_kv", "comp_gate" (B, S, coff*head_dim) and "entries"
          (B, S // m + 1, head_dim); CSA layers also "index_kv", "index_gate"
          (B, S, 2*index_head_dim) and "index_entries" (B, S // m + 1, index_head_dim).
          What each holds, and the memory per token (O(S) projections, where
          `memory_plan.plan` counts a deployment's bounded form): `kv_cache`'s
          docstring. Reference: transformers `DeepseekV4HCACache` / `DeepseekV4CSACache`;
          DeepSeek-V4 paper §2.3.
        """
        return tuple(kv_cache.init_layer_cache(self.config, i, batch_size, max_length,
                                               self.compute_dtype)
                     for i in range(self.config.num_hidden_layers))

    def call_with_cache(self, input_ids, cache, cache_index, absorb=True):
        """Logits of new tokens given the cache of the tokens before them.

        The contract of `DeepSeekCausalLM.call_with_cache`: rows of a right-padded batch
        decode at their own positions; a write at position p overwrites slot p, so
        padding written past a row's prompt and a rewind to an earlier index are safe
        (positions >= cache_index are never read before they are rewritten).

        Args:
          input_ids: int32 tensor (B, T), the tokens of row b at positions
            cache_index[b] .. cache_index[b] + T - 1 (a prompt to prefill, or 1).
          cache: the tuple from `init_cache` or a previous call.
          cache_index: int32 scalar, or (B,) vector, the number of positions already
            in the cache of each row.
          absorb: accepted for the V3 interface and ignored (V4 has no latent to absorb
            into).

        Returns:
          (logits float32 (B, T, V), the new cache, same structure and shapes).

        Raises:
          ValueError: `cache` is not a tuple/list of num_hidden_layers dicts.
          InvalidArgumentError (at run time): if cache_index + T > S in some row.
        """
        del absorb
        c = self.config
        if not isinstance(cache, (tuple, list)) or len(cache) != c.num_hidden_layers or not all(
                isinstance(layer, dict) for layer in cache):
            raise ValueError("causal_lm.call_with_cache: cache must be init_cache's tuple of "
                             f"{c.num_hidden_layers} dicts, got {type(cache).__name__}")
        input_ids = tf.convert_to_tensor(input_ids)
        batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
        index = tf.broadcast_to(tf.cast(cache_index, tf.int32), [batch])  # (B,)
        assert_fits = tf.debugging.assert_less_equal(
            tf.reduce_max(tf.concat([index, [0]], 0)) + seq, tf.shape(cache[0]["kv"])[1],
            message="KV cache overflow: cache_index + T > S")
        with tf.control_dependencies([assert_fits]):
            index = tf.identity(index)
        h = self.embed_tokens(input_ids)  # (B, T, C)
        streams = tf.repeat(h[:, :, None, :], c.hc_mult, axis=2)  # (B, T, n, C)
        new_cache = []
        for block, layer_cache in zip(self.decoder_layers, cache, strict=True):
            streams, _, layer_cache = block(streams, input_ids=input_ids, cache=layer_cache,
                                            cache_index=index)  # (B, T, n, C)
            new_cache.append(layer_cache)
        hidden = self.norm(self.hc_head(streams))  # (B, T, C) float32
        return self.logits_from_hidden(hidden), tuple(new_cache)

    # ------------------------------------------------------------------ config

    def _trackable_children(self, save_type="checkpoint", **kwargs):
        # Let tf.train.Checkpoint see the layers held in lists (models/deepseek/_tracking.py).
        children = super()._trackable_children(save_type, **kwargs)
        return with_layer_lists(self, children, save_type)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config):
        return cls(**config)
