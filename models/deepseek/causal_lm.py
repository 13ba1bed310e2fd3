"""DeepSeekCausalLM: embeddings, decoder blocks, final norm, LM head and MTP modules.

Layout of HF transformers `DeepseekV3ForCausalLM` (`model.embed_tokens`,
`model.layers.N`, `model.norm`, `lm_head`) plus the multi-token-prediction
modules of DeepSeek-V3 (arXiv 2412.19437) §2.2, which HF stores at layer index
num_hidden_layers + k - 1 and does not run. Here `call` is the plain LM
(no MTP); `forward_train` also runs MTP and returns the MoE statistics;
`compute_loss` turns them into the training loss; `call_with_cache` decodes
with the latent KV cache of MLA.
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.deepseek.decoder_block import DeepSeekDecoderBlock
from models.deepseek.mla_attention import init_layer_cache
from models.deepseek.mtp import MultiTokenPredictionLayer
from models.layers.causal_lm_base import CausalLMBase
from models.layers.rms_norm import RMSNorm
from models.layers.training_outputs import training_outputs


@keras.saving.register_keras_serializable(package="deepseek")
class DeepSeekCausalLM(CausalLMBase):
    """A DeepSeek-V3-style decoder-only language model (MLA + DeepSeekMoE + MTP).

    All weights are created in the constructor (no lazy build): normal(0,
    initializer_range) for every matrix and the embedding, ones for RMSNorm
    scales, zeros for the router biases; no projection has a bias.

    Args:
      config: a DeepSeekConfig (or its `to_dict()`).
      **kwargs: keras.Model arguments (name, dtype, ...).

    Attributes:
      embed_tokens: keras Embedding (vocab_size, hidden_size).
      decoder_layers: list of DeepSeekDecoderBlock, one per hidden layer.
      norm: final RMSNorm.
      lm_head: Dense (hidden_size -> vocab_size), None when tie_word_embeddings
        (logits then use embed_tokens.embeddings transposed).
      mtp_layers: list of num_nextn_predict_layers MultiTokenPredictionLayer.
      moe_layers: the DeepSeekMoE layers, main blocks first then MTP blocks; the
        row order of `expert_load`.

    Example:
      model = DeepSeekCausalLM(DeepSeekConfig(vocab_size=64, hidden_size=32, ...))
      logits = model(tf.constant([[1, 2, 3]], tf.int32))  # (1, 3, 64) float32

    Note: `compute_loss` has a different signature from keras.Model's, so train
    with a custom loop (tf.GradientTape), not `model.fit`.

    Reference: HF transformers `modeling_deepseek_v3.py`; DeepSeek-V2 arXiv
    2405.04434; DeepSeek-V3 arXiv 2412.19437.
    """

    config_class = DeepSeekConfig

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        config = self.checked_config(config)
        self.config = config
        c = config

        # Layers.
        self.embed_tokens = self.make_embedding(c)
        self.decoder_layers = self.make_decoder_layers(DeepSeekDecoderBlock, c)
        self.norm = RMSNorm(c.rms_norm_eps, name="norm", dtype=self.dtype_policy)
        self.lm_head = self.make_lm_head(c)
        self.mtp_layers = self.make_mtp_layers(MultiTokenPredictionLayer, c)

        # Weights, created now so that count_params() and tf.function tracing
        # never create variables.
        self.build((None, None))

    def build(self, input_shape=None):
        c = self.config
        self.embed_tokens.build((None, None))
        for block in self.decoder_layers:
            block.build((None, None, c.hidden_size))
        self.build_output_head()
        for mtp in self.mtp_layers:
            mtp.build((None, None, c.hidden_size))

    def call(self, input_ids, training=False):
        """Next-token logits (MTP modules are not run).

        Args:
          input_ids: int32 tensor (B, T), ids in [0, vocab_size).
          training: enables dropout (if any).

        Returns:
          float32 tensor (B, T, vocab_size); position t scores the token after t.
        """
        h = self.embed_tokens(input_ids)  # (B, T, C)
        for block in self.decoder_layers:
            h, _, _ = block(h, training=training)  # (B, T, C)
        return self.logits_from_hidden(self.norm(h))

    def forward_train(self, input_ids, training=True, recompute_blocks=False,
                      moe_capacity_factor=None):
        """Main and MTP logits plus MoE statistics, for the training loss.

        Args:
          input_ids: int32 tensor (B, T).
          training: passed to every layer.
          recompute_blocks: activation recomputation (gradient checkpointing):
            each decoder block and MTP module keeps only its input for the
            backward pass and recomputes its activations there
            (`tf.recompute_grad`); same values and gradients, less memory,
            about one more forward pass of compute.
          moe_capacity_factor: None for the dropless MoE dispatch, or a float
            > 0: every MoE layer (MTP blocks included) uses the static-shape
            capacity dispatch (`DeepSeekMoE`), which XLA can compile.

        Returns:
          dict:
            `logits`: float32 (B, T, V), as `call`;
            `mtp_logits`: list of num_nextn_predict_layers float32 tensors;
              entry d (depth k = d + 1) has shape (B, max(T - k, 0), V) and its
              position t predicts the token at absolute position t + 1 + k,
              i.e. labels[t + k] (positions whose target lies beyond the
              sequence are not computed);
            `balance_loss`: float32 scalar, sum over all MoE layers (MTP
              blocks included) of aux_loss_alpha * L_Bal;
            `expert_load`: float32 (num_moe_layers, n_routed_experts), tokens
              routed to each expert in this batch (before any dropping), rows
              as `moe_layers`;
            `moe_dropped`: float32 (num_moe_layers,), (token, expert) pairs
              dropped for lack of capacity (zeros when dropless);
            `moe_pairs`: float32 (num_moe_layers,), the (token, expert) pairs
              routed, N*K (= expert_load summed over experts); the dropped
              fraction is moe_dropped / moe_pairs;
            `indexer_loss`: float32 scalar, the sum over the decoder layers of the
              lightning indexer's KL loss (DeepSeek-V3.2 DSA, `lightning_indexer.
              indexer_kl_loss`; it reaches only the indexers' weights), the MTP blocks'
              included; 0.0 without DeepSeek Sparse Attention.
        """
        moe_kwargs = dict(training=training, moe_capacity_factor=moe_capacity_factor)
        with_indexer = self.config.uses_sparse_attention
        embeddings = self.embed_tokens(input_ids)  # (B, T, C)
        h = embeddings
        moe_stats = []  # (expert_load, balance_loss, dropped) per MoE layer
        indexer_losses = []  # float32 scalars, one per decoder layer with DSA
        for block in self.decoder_layers:
            def block_fn(x, block=block):
                outs = block(x, return_indexer_loss=with_indexer, **moe_kwargs)
                x, moe_aux = outs[0], outs[2]  # (B, T, C), None or MoE statistics
                extra = outs[3:]  # (indexer_loss,) with DSA
                return (x, *extra) if moe_aux is None else (x, *extra, *moe_aux)

            outs = tf.recompute_grad(block_fn)(h) if recompute_blocks else block_fn(h)
            h = outs[0]  # (B, T, C)
            if with_indexer:
                indexer_losses.append(outs[1])
                outs = outs[1:]
            if len(outs) > 1:
                moe_stats.append(outs[1:])
        logits = self.logits_from_hidden(self.norm(h))  # (B, T, V)
        mtp_logits = self._mtp_forward(h, embeddings, moe_kwargs, with_indexer,
                                       recompute_blocks, moe_stats, indexer_losses)
        return training_outputs(logits, mtp_logits, moe_stats, indexer_losses,
                                self.config.n_routed_experts)

    def _mtp_forward(self, h, embeddings, moe_kwargs, with_indexer, recompute_blocks,
                     moe_stats, indexer_losses):
        """`forward_train`'s MTP depths (DeepSeek-V3 §2.2): depth k combines h^{k-1}_i with
        Emb(t_{i+k}). h: float (B, T, C), the last decoder block's output; embeddings:
        (B, T, C). Appends each depth's MoE statistics and indexer loss to `moe_stats` and
        `indexer_losses`; returns the list of MTP logits, float32 (B, T-k, V) each."""
        mtp_logits = []
        for k, mtp in enumerate(self.mtp_layers, start=1):
            next_embeddings = embeddings[:, k:]  # (B, T-k, C)  Emb(t_{i+k})
            h = h[:, : tf.shape(next_embeddings)[1]]  # (B, T-k, C)  h^{k-1}_i

            def mtp_fn(x, e, mtp=mtp):
                x, normed, moe_aux, *extra = mtp(
                    x, e, return_indexer_loss=with_indexer, **moe_kwargs)  # (B, T-k, C) x 2
                return ((x, normed, *extra) if moe_aux is None
                        else (x, normed, *extra, *moe_aux))

            outs = (tf.recompute_grad(mtp_fn)(h, next_embeddings) if recompute_blocks
                    else mtp_fn(h, next_embeddings))
            h = outs[0]  # (B, T-k, C)
            mtp_logits.append(self.logits_from_hidden(outs[1]))  # (B, T-k, V)
            if with_indexer:
                indexer_losses.append(outs[2])
                outs = outs[:2] + outs[3:]
            if len(outs) > 2:
                moe_stats.append(outs[2:])
        return mtp_logits

    # ------------------------------------------------------------------ cached decoding

    # False: the latent cache is position-indexed, so a caller may rewind to an earlier
    # index (serving/chat.py keeps the shared prefix of a conversation).
    bounded_cache = False

    def init_cache(self, batch_size, max_length):
        """An empty latent KV cache.

        Args:
          batch_size: int or int32 scalar tensor B.
          max_length: int or int32 scalar tensor S, the most positions it can hold.

        Returns:
          a tuple of num_hidden_layers dicts of zeros in the model's compute dtype
          (`mla_attention.init_layer_cache`): "kv" (B, S, kv_lora_rank +
          qk_rope_head_dim), per token the normalized latent c_kv and the rotated shared
          key k_pe; with DeepSeek Sparse Attention (V3.2) also "index_keys"
          (B, S, index_head_dim), the lightning indexer's key. config.cache_width
          numbers per token and layer. One buffer per layer and kind, so a cached call
          copies each once (its scatter), with no stacking or slicing of the whole.
        """
        return tuple(init_layer_cache(self.config, batch_size, max_length,
                                      self.compute_dtype)
                     for _ in range(self.config.num_hidden_layers))

    def call_with_cache(self, input_ids, cache, cache_index, absorb=True, lengths=None,
                        in_place=False):
        """Logits of new tokens given the cache of the tokens before them.

        Args:
          input_ids: int32 tensor (B, T), the tokens of row b at positions
            cache_index[b] .. cache_index[b] + T - 1 (T = prompt length to
            prefill, or 1).
          cache: from `init_cache` or a previous call: L dicts of (B, S, ...) buffers.
          cache_index: int32 scalar, or (B,) vector, the number of positions
            already in the cache of each row (rows of a right-padded batch
            decode at their own positions; see `MultiHeadLatentAttention`).
          absorb: attend in the latent space (W_UK and W_UV absorbed, the cache
            never re-expanded); False expands the cache through kv_b_proj. Same
            logits up to float32 rounding.
          lengths: accepted for V4's interface (`DeepSeekV4CausalLM.call_with_cache`)
            and ignored: this cache is position-indexed, so padding written past a row's
            prompt is overwritten before any query reads it, and a rewind is safe.
          in_place: write the new slots into `cache`'s own buffers (`tf.raw_ops.
            InplaceUpdate`, no copy of the cache per call) for a caller that owns the
            cache: `cache` must not be used again except as the returned cache (a rewind
            through the returned cache stays safe). False copies each buffer once
            (`tf.tensor_scatter_nd_update`), ~4 ms per 21 MB on CPU.

        Returns:
          (logits float32 (B, T, V), new_cache, as `cache`).

        Raises:
          ValueError: if `cache` is not L layer caches as `init_cache` gives.
          InvalidArgumentError (at run time): if cache_index + T > S.
        """
        del lengths
        n = len(self.decoder_layers)
        if not isinstance(cache, (tuple, list)) or len(cache) != n:
            got = (f"{len(cache)} of them" if isinstance(cache, (tuple, list))
                   else type(cache).__name__)
            raise ValueError(f"cache must be a tuple of {n} layer caches (init_cache), "
                             f"got {got}")
        h = self.embed_tokens(input_ids)  # (B, T, C)
        new_caches = []
        for i, block in enumerate(self.decoder_layers):
            h, layer_cache, _ = block(h, cache=cache[i], cache_index=cache_index,
                                      absorb=absorb, in_place=in_place)  # (B, T, C)
            new_caches.append(layer_cache)  # {"kv": (B, S, R + Dr), ...}
        return self.logits_from_hidden(self.norm(h)), tuple(new_caches)
