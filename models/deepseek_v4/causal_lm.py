"""DeepSeekV4CausalLM: embeddings, hc_mult residual streams, V4 blocks, hyper head, norm, head.

transformers 5.24 `DeepseekV4Model` / `DeepseekV4ForCausalLM`:

    X_0 = broadcast(Embed(ids)) to hc_mult streams          (B, T, n, C)
    X_l = Block_l(X_{l-1}, ids)                              l = 1..L
    logits = head(RMSNorm(HyperHead(X_L)))                   (B, T, V), float32

plus `num_nextn_predict_layers` multi-token-prediction depths on V4 blocks
(`models.deepseek_v4.mtp`, DeepSeek-V3 §2.2 as DeepSeek's V4 release builds them), run by
`forward_train` only (transformers builds none; a release checkpoint imports with none,
`hf_config.config_from_hf`). `call` is the stateless forward over positions 0 .. T-1;
`init_cache` / `call_with_cache` decode with V4's caches (`models.deepseek_v4.kv_cache`)
under the contract of `DeepSeekCausalLM`'s, so `models.deepseek.generation.generate` and
the serving code run a V4 model unchanged.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4 import kv_cache
from models.deepseek_v4.config import DeepSeekV4Config
from models.deepseek_v4.decoder_block import DeepSeekV4DecoderBlock
from models.deepseek_v4.hyper_head import HyperHead
from models.deepseek_v4.mtp import DeepSeekV4MTPLayer
from models.layers.causal_lm_base import CausalLMBase
from models.layers.rms_norm import RMSNorm
from models.layers.training_outputs import training_outputs


@keras.saving.register_keras_serializable(package="deepseek_v4")
class DeepSeekV4CausalLM(CausalLMBase):
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
      mtp_layers: num_nextn_predict_layers DeepSeekV4MTPLayer [release `mtp.{d}`], each
        with a `block` (a DeepSeekV4DecoderBlock at layer num_hidden_layers + d).
      moe_layers: the MoE layers, decoder blocks then MTP blocks (rows of `expert_load`).
      num_moe_layers: len(moe_layers) (every V4 block is a MoE block, `is_moe`).

    Example:
      model = DeepSeekV4CausalLM(DeepSeekV4Config())
      logits = model(tf.constant([[1, 2, 3]], tf.int32))  # (1, 3, vocab_size) float32

    Reference: transformers `models/deepseek_v4/modular_deepseek_v4.py`; DeepSeek-V4 paper.
    """

    config_class = DeepSeekV4Config

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = c = self.checked_config(config)
        self.embed_tokens = self.make_embedding(c)
        self.decoder_layers = self.make_decoder_layers(DeepSeekV4DecoderBlock, c)
        self.hc_head = HyperHead(c.hc_mult, c.hidden_size, c.hc_eps, c.rms_norm_eps,
                                 c.initializer_range, name="hc_head")
        self.norm = RMSNorm(c.rms_norm_eps, name="norm", dtype="float32")
        self.lm_head = self.make_lm_head(c)
        self.mtp_layers = self.make_mtp_layers(DeepSeekV4MTPLayer, c)
        self.build((None, None))

    def build(self, input_shape=None):
        self.embed_tokens.build((None, None))
        for block in self.decoder_layers:
            block.build()
        self.hc_head.build()
        self.build_output_head()
        for mtp in self.mtp_layers:
            mtp.build()

    # ------------------------------------------------------------------ forward passes

    def logits_from_hidden(self, hidden_states):
        """Output head: (B, T, C) normalized hidden states (float32 from V4's float32
        norm) in the compute dtype -> float32 logits (B, T, V)."""
        return super().logits_from_hidden(tf.cast(hidden_states, self.compute_dtype))

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

    def forward_train(self, input_ids, training=True, recompute_blocks=False,
                      moe_capacity_factor=None):
        """Main and MTP logits plus the MoE and indexer statistics, for the training loss
        (the contract of `DeepSeekCausalLM.forward_train`, plus `indexer_loss`).

        Args:
          input_ids: int tensor (B, T), positions 0 .. T-1.
          training: passed to every layer.
          recompute_blocks: activation recomputation (gradient checkpointing): each
            decoder block and MTP depth keeps only its inputs for the backward pass and
            recomputes its activations there (`tf.recompute_grad`, as V3); same values
            and gradients, less memory, about one more forward pass of compute.
          moe_capacity_factor: None for the dropless MoE dispatch, or a float > 0: every
            MoE layer (MTP blocks included) uses the static-capacity dispatch.

        Returns:
          dict:
            `logits`: float32 (B, T, V), as `call`;
            `mtp_logits`: list of num_nextn_predict_layers float32 tensors; entry d
              (depth k = d + 1) has shape (B, max(T - k, 0), V) and its position t
              predicts the token at position t + 1 + k, i.e. labels[t + k]
              (`losses.causal_lm_loss`);
            `balance_loss`: float32 scalar, the sum over the score-routed MoE layers
              (MTP blocks included) of aux_loss_alpha * L_Bal (hash layers add 0);
            `expert_load`: float32 (num_moe_layers, n_routed_experts), rows as
              `moe_layers`;
            `moe_dropped`: float32 (num_moe_layers,), pairs the capacity dropped;
            `moe_pairs`: float32 (num_moe_layers,), the (token, expert) pairs routed;
            `indexer_loss`: float32 scalar, the sum over the blocks (MTP blocks
              included) of their attention's lightning-indexer loss
              (`DeepSeekV4Attention.call(..., return_indexer_loss=True)`, 0.0 for
              blocks without an indexer).
        """
        input_ids = tf.convert_to_tensor(input_ids)
        c = self.config
        block_kwargs = dict(training=training, moe_capacity_factor=moe_capacity_factor,
                            return_indexer_loss=True)
        embeddings = self.embed_tokens(input_ids)  # (B, T, C)
        streams = tf.repeat(embeddings[:, :, None, :], c.hc_mult, axis=2)  # (B, T, n, C)
        moe_stats, indexer_losses = [], []  # (expert_load, balance_loss, dropped) per layer
        for block in self.decoder_layers:
            def block_fn(x, block=block):
                x, moe_aux, indexer_loss = block(x, input_ids=input_ids,
                                                 **block_kwargs)  # (B, T, n, C)
                return (x, indexer_loss, *moe_aux)

            outs = tf.recompute_grad(block_fn)(streams) if recompute_blocks else block_fn(
                streams)
            streams = outs[0]  # (B, T, n, C)
            indexer_losses.append(outs[1])
            moe_stats.append(outs[2:])
        logits = self.logits_from_hidden(self.norm(self.hc_head(streams)))  # (B, T, V)

        # MTP (DeepSeek-V3 §2.2 on V4 blocks, `mtp.py`): depth k combines X^{k-1}_i with
        # Emb(t_{i+k}) and predicts t_{i+1+k}.
        mtp_logits = []
        for k, mtp in enumerate(self.mtp_layers, start=1):
            next_embeddings = embeddings[:, k:]  # (B, T-k, C)  Emb(t_{i+k})
            next_ids = input_ids[:, k:]  # (B, T-k)
            streams = streams[:, : tf.shape(next_embeddings)[1]]  # (B, T-k, n, C)

            def mtp_fn(x, e, mtp=mtp, next_ids=next_ids):
                x, normed, moe_aux, indexer_loss = mtp(x, e, next_ids, **block_kwargs)
                return (x, normed, indexer_loss, *moe_aux)  # (B,T-k,n,C), (B,T-k,C), ...

            outs = (tf.recompute_grad(mtp_fn)(streams, next_embeddings) if recompute_blocks
                    else mtp_fn(streams, next_embeddings))
            streams = outs[0]  # (B, T-k, n, C)
            mtp_logits.append(self.logits_from_hidden(outs[1]))  # (B, T-k, V)
            indexer_losses.append(outs[2])
            moe_stats.append(outs[3:])

        return training_outputs(logits, mtp_logits, moe_stats, indexer_losses,
                                c.n_routed_experts)

    # ------------------------------------------------------------------ cached decoding

    # True: a cache cannot go back to an earlier index (its rings hold only the last
    # positions); a caller that rewinds starts a new cache (serving/chat.py).
    bounded_cache = True

    def init_cache(self, batch_size, max_length):
        """An empty KV cache: one dict of zero buffers per layer, bounded.

        Args:
          batch_size: int or int32 scalar tensor B.
          max_length: int or int32 scalar tensor S, the most positions it can hold.

        Returns:
          A tuple of num_hidden_layers dicts (tf.nest-compatible, fixed shapes): every
          layer "kv" (B, sliding_window, head_dim), a ring of the last keys; CSA / HCA
          layers also "comp_kv", "comp_gate" (B, coff*m, coff*head_dim) float32 rings of
          the compressor's open windows and "entries" (B, S // m + 1, head_dim); CSA
          layers also "index_kv", "index_gate" (B, 2*m, 2*index_head_dim) and
          "index_entries" (B, S // m + 1, index_head_dim). Only the entries grow with S
          (`kv_cache`'s docstring; `memory_plan.kv_cache_items` counts the same items).
          Reference: DeepSeek's inference/model.py (`kv_cache`, `kv_state`,
          `score_state`), transformers `DeepseekV4HCACache` / `DeepseekV4CSACache`;
          DeepSeek-V4 paper §2.3.
        """
        return tuple(kv_cache.init_layer_cache(self.config, i, batch_size, max_length,
                                               self.compute_dtype)
                     for i in range(self.config.num_hidden_layers))

    def call_with_cache(self, input_ids, cache, cache_index, absorb=True, lengths=None,
                        in_place=False):
        """Logits of new tokens given the cache of the tokens before them.

        Rows of a right-padded batch run at their own positions. Unlike the MLA cache
        (`DeepSeekCausalLM.call_with_cache`, position-indexed), V4's cache is bounded
        (`bounded_cache`): a call continues each row where its kept tokens ended, and
        padding is kept out by `lengths` rather than overwritten later.

        Args:
          input_ids: int32 tensor (B, T), the tokens of row b at positions
            cache_index[b] .. cache_index[b] + T - 1 (a prompt to prefill, or 1).
          cache: the tuple from `init_cache` or a previous call.
          cache_index: int32 scalar, or (B,) vector: the positions already in the cache
            of each row (the previous call's cache_index + lengths).
          absorb: accepted for the V3 interface and ignored (V4 has no latent to absorb
            into).
          in_place: write the compressed entries and the indexer's keys (the buffers
            that grow with the context, T/m rows) into the given cache's own buffers
            (`models.layers.cache_buffers`): a caller that owns its cache (`generate`,
            a chat session) must not use `cache` again except as the returned one. False:
            a call that closes a window copies those buffers. The rings (O(W) rows) are
            copied either way.
          lengths: None (every row keeps all T), or int32 (B,), each in [0, T]: row b's
            first lengths[b] tokens are kept, the rest are padding (their logits are
            garbage and no later call sees them).

        Returns:
          (logits float32 (B, T, V), the new cache, same structure and shapes).

        Raises:
          ValueError: `cache` is not a tuple/list of num_hidden_layers dicts.
          InvalidArgumentError (at run time): if cache_index + T exceeds the positions
            the entries hold ((S // m + 1) * m for the smallest compress rate m, >= S + 1)
            in some row.
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
        lengths = (tf.fill([batch], seq) if lengths is None
                   else tf.broadcast_to(tf.cast(lengths, tf.int32), [batch]))  # (B,)
        limits = [tf.shape(layer["entries"])[1] * c.compress_rates[kind]
                  for kind, layer in zip(c.layer_types, cache, strict=True) if "entries" in layer]
        if limits:
            assert_fits = tf.debugging.assert_less_equal(
                tf.reduce_max(tf.concat([index, [0]], 0)) + seq, tf.reduce_min(limits),
                message="KV cache overflow: cache_index + T > the positions init_cache's "
                        "max_length holds")
            with tf.control_dependencies([assert_fits]):
                index = tf.identity(index)
        h = self.embed_tokens(input_ids)  # (B, T, C)
        streams = tf.repeat(h[:, :, None, :], c.hc_mult, axis=2)  # (B, T, n, C)
        new_cache = []
        for block, layer_cache in zip(self.decoder_layers, cache, strict=True):
            streams, _, layer_cache = block(streams, input_ids=input_ids, cache=layer_cache,
                                            cache_index=index, cache_lengths=lengths,
                                            cache_in_place=in_place)  # (B, T, n, C)
            new_cache.append(layer_cache)
        hidden = self.norm(self.hc_head(streams))  # (B, T, C) float32
        return self.logits_from_hidden(hidden), tuple(new_cache)
