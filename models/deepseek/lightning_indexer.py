"""The lightning indexer of DeepSeek Sparse Attention (DSA, DeepSeek-V3.2).

DeepSeek-V3.2 (DeepSeek-AI 2025, "DeepSeek-V3.2-Exp: Boosting Long-Context Efficiency
with DeepSeek Sparse Attention", §2.1) adds to every MLA layer a small scorer that
picks, for each query token t, the `index_topk` earlier tokens s it attends:

    I[t, s] = sum_j w[t, j] * ReLU(q[t, j] . k[s])                        (eq. 1)

in the layout of HF transformers 5.24 `DeepseekV32Indexer`
(`models/deepseek_v32/modular_deepseek_v32.py`):

    q[t, j] = RoPE_half(c_q[t] W_qb)[j]     (Hi heads of width Di; c_q = q_a_layernorm(
                                             q_a_proj(x)), MLA's query latent)   wq_b
    k[s]    = RoPE_half(LayerNorm(x[s] W_k))  (one key of width Di, eps 1e-6, with bias)
                                                                          wk, k_norm
    w[t, j] = (x[t] W_w)[j] * Hi^-0.5          (float32)                  weights_proj
    I[t, s] = sum_j w[t, j] * ReLU(q[t, j] . k[s] * Di^-0.5)   scores in float32

RoPE_half is the rotate_half (NOT interleaved) rotation of the FIRST qk_rope_head_dim
dims of each head, `[rot | pass]`, with the model's cos/sin tables (YaRN attention factor
included), whereas MLA rotates interleaved pairs at the END of its query heads
(`[nope | rope]`). Causally invisible keys score -inf; each query keeps the
min(index_topk, S) best (`tf.math.top_k`; a query that sees fewer keys keeps all it
sees), and MLA attends to the kept tokens only (its mask is `keep`).

DeepSeek's own inference code also applies a Hadamard rotation and FP8 to q and k
before scoring; transformers skips both (the rotation is orthogonal; FP8 is a precision
choice), and so does this layer, which matches transformers.

Training (§2.1.1). The indexer is not trained by the language-model loss (top-k selection
has no gradient; transformers runs it under `torch.no_grad`). DeepSeek trains it with a
KL loss towards the main attention: in the dense warm-up, for query t,

    p_t = sum_h A_{h,t,:} / ||sum_h A_{h,t,:}||_1     (main attention, summed over heads)
    L^I = sum_t KL(p_t || softmax(I_t))

and in the sparse stage the same restricted to the selected set S_t,
L^I = sum_t KL(p_{t,S_t} || softmax(I_{t,S_t})), with "the indexer input detached from
the computational graph for separate optimization": the indexer is trained by L^I only,
the main model by the LM loss only. `indexer_kl_loss` is the sparse-stage form (p is
stop-gradient, renormalized over S_t), averaged over the queries (Megatron-LM's
`compute_dsa_indexer_loss` averages the per-query KL the same way) instead of summed, so
its scale does not grow with B*T; `MultiHeadLatentAttention(..., return_indexer_loss=True)`
and `DeepSeekCausalLM.forward_train` (`indexer_loss`) return it. The indexer's inputs
pass through `tf.stop_gradient` (the detach), and its top-k selection has no gradient,
so its weights are trainable and `indexer_loss` is their only training signal (the
trainer adds it to the loss: `losses.causal_lm_loss`). Set `indexer.trainable = False`
(Keras' public attribute) to keep an imported indexer as it is: a GradientTape then
records none of its ops and keeps none of its (B, T, Hi, S) scores for a backward pass.
"""

import keras
import tensorflow as tf

from models.deepseek.config import DeepSeekConfig
from models.layers import initializers
from models.layers.indexer_scores import one_query_index_scores
from models.layers.rotary_embedding import apply_rotary_pos_emb, rope_cos_sin

# transformers' DeepseekV32Indexer: nn.LayerNorm(index_head_dim, eps=1e-6).
K_NORM_EPS = 1e-6


@keras.saving.register_keras_serializable(package="deepseek")
class LightningIndexer(keras.layers.Layer):
    """DeepSeek-V3.2's lightning indexer: which earlier tokens each query attends.

    Args:
      config: a DeepSeekConfig with DeepSeek Sparse Attention (`index_topk`,
        `index_n_heads`, `index_head_dim` and `q_lora_rank` set), or its `to_dict()`.

    Sublayers (HF names `model.layers.N.self_attn.indexer.*`): `wq_b` Dense
    (q_lora_rank -> index_n_heads * index_head_dim), `wk` Dense (hidden_size ->
    index_head_dim), `k_norm` LayerNormalization (index_head_dim; HF `weight` = gamma,
    `bias` = beta), `weights_proj` Dense (hidden_size -> index_n_heads), float32 under
    any policy (transformers keeps it float32: `_keep_in_fp32_modules`). No biases in
    the Dense layers. They train by `indexer_loss` only (module docstring).

    Methods:
      keys(hidden_states, positions) -> float (B, T, Di): the rotated, normalized keys
        k of the T tokens (what the inference cache holds per token).
      call(hidden_states, q_latent, keys, positions, visible, return_scores=False)
        -> bool (B, T, S) keep, or (keep, float32 (B, T, S) index scores I, -inf
        where not visible) with `return_scores`.
      select(...same args) -> (picks int32 (B, T, k), valid bool (B, T, k)[, scores]):
        the same picks as indices, for the sparse (gathered) attention.
      index_scores(...same args) -> float32 (B, T, S): I, -inf where not visible.

    Call args:
      hidden_states: float (B, T, C), the attention input (after input_layernorm).
      q_latent: float (B, T, q_lora_rank), MLA's c_q = q_a_layernorm(q_a_proj(x)).
      keys: float (B, S, Di) from `keys` (of the same tokens, or the cache's slots).
      positions: int32 (T,) or (B, T), the absolute positions of the T queries.
      visible: bool (B or 1, T, S), True where query t may attend key s (causal).

      return_scores: also return the index scores I (float32 (B, T, S)).

    Returns:
      keep: bool (B, T, S): each query's min(index_topk, S) highest index scores
      (invisible keys score -inf; ties go to the lower index, `tf.math.top_k`), AND
      visible: a query keeps min(index_topk, the keys it sees), never an invisible one.
      With `return_scores`: (keep, I).

    Memory: the (B, T, Hi, S) float32 per-head scores exist during the call (as in
    transformers' eager DeepseekV32Indexer). Under a GradientTape with trainable weights
    and the scores returned (the KL loss: `return_scores`, `select(return_scores=True)`),
    they are kept for the backward pass, 4 * Hi * S bytes per query; otherwise nothing is.

    Reference: DeepSeek-V3.2-Exp report §2.1 (eq. 1); HF transformers 5.24
    `models/deepseek_v32/modular_deepseek_v32.py` (DeepseekV32Indexer,
    DeepseekV32Attention).
    """

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekConfig.from_dict(config)
        if not config.uses_sparse_attention:
            raise ValueError("LightningIndexer needs a config with index_topk, index_n_heads "
                             "and index_head_dim (DeepSeek Sparse Attention); got "
                             f"index_topk={config.index_topk!r}")
        self.config = config
        c = config

        def dense(units, name, dtype):
            return keras.layers.Dense(
                units, use_bias=False, name=name, dtype=dtype,
                kernel_initializer=initializers.normal(c.initializer_range))

        self.wq_b = dense(c.index_n_heads * c.index_head_dim, "wq_b", self.dtype_policy)
        self.wk = dense(c.index_head_dim, "wk", self.dtype_policy)
        self.k_norm = keras.layers.LayerNormalization(epsilon=K_NORM_EPS, name="k_norm",
                                                      dtype=self.dtype_policy)
        self.weights_proj = dense(c.index_n_heads, "weights_proj", "float32")

    def build(self, input_shape=None):
        c = self.config
        self.wq_b.build((None, None, c.q_lora_rank))
        self.wk.build((None, None, c.hidden_size))
        self.k_norm.build((None, None, c.index_head_dim))
        self.weights_proj.build((None, None, c.hidden_size))

    def keys(self, hidden_states, positions):
        """k = RoPE_half(LayerNorm(x W_k)) of the T tokens at `positions`.

        Args: hidden_states float (B, T, C); positions int32 (T,) or (B, T).
        Returns: (B, T, Di) in the compute dtype.
        """
        k = self.k_norm(self.wk(tf.stop_gradient(hidden_states)))  # (B, T, Di)
        return self._rotate(k[:, :, None, :], positions)[:, :, 0, :]  # (B, T, Di)

    def call(self, hidden_states, q_latent, keys, positions, visible, return_scores=False):
        index = self.index_scores(hidden_states, q_latent, keys, positions, visible)  # (B,T,S)
        keys_len = index.shape[2] if index.shape[2] is not None else tf.shape(index)[2]
        top = self._top(index)  # (B, T, k)
        keep = tf.logical_and(_scatter_true(top, keys_len), visible)  # (B, T, S)
        return (keep, index) if return_scores else keep

    def index_scores(self, hidden_states, q_latent, keys, positions, visible):
        """I (eq. 1) of the T queries against the S keys, float32 (B, T, S), -inf where
        not `visible`. Args as `call`."""
        c = self.config
        nh, d = c.index_n_heads, c.index_head_dim
        batch, seq = tf.shape(hidden_states)[0], tf.shape(hidden_states)[1]
        hidden_states = tf.stop_gradient(hidden_states)  # (module docstring)
        q = self.wq_b(tf.stop_gradient(q_latent))  # (B, T, Hi*Di)
        q = tf.reshape(q, [batch, seq, nh, d])  # (B, T, Hi, Di)
        q = self._rotate(q, positions)  # (B, T, Hi, Di)
        # `keys` come from `keys()` (its input detached): the KL loss trains wk and k_norm.
        q, keys = tf.cast(q, tf.float32), tf.cast(keys, tf.float32)
        weights = self.weights_proj(tf.cast(hidden_states, tf.float32)) * nh ** -0.5  # (B,T,Hi)

        def by_query():  # (B, T, S)
            scores = tf.nn.relu(tf.einsum("bthd,bsd->bths", q, keys) * d ** -0.5)  # (B,T,Hi,S)
            return tf.einsum("bth,bths->bts", weights, scores)  # (B, T, S)

        def one_query():  # T = 1 (a decode step): the keys read once, in their own layout
            return one_query_index_scores(q[:, 0] * d ** -0.5, weights[:, 0], keys)

        if q.shape[1] is not None:
            index = one_query() if q.shape[1] == 1 else by_query()
        else:
            index = tf.cond(tf.equal(seq, 1), one_query, by_query)
        return tf.where(visible, index, float("-inf"))  # (B, T, S)

    def select(self, hidden_states, q_latent, keys, positions, visible, return_scores=False):
        """The picks as indices, for attention that gathers them (DSA's sparse path).

        Args as `call`.

        Returns:
          picks: int32 (B, T, k), k = min(index_topk, S) (static when S is), the slots of
            each query's k highest index scores, in no particular order (the same set as
            `call`'s `keep`, ties to the lower index);
          valid: bool (B, T, k), False for a pick the query may not see (a query that
            sees fewer than k keys fills its k with invisible ones);
          with `return_scores`, also float32 (B, T, k) index scores of the picks (-inf
          where not valid), differentiable towards the indexer's weights.
        """
        index = self.index_scores(hidden_states, q_latent, keys, positions, visible)  # (B,T,S)
        picks = self._top(index)  # (B, T, k)
        picked = tf.gather(index, picks, batch_dims=2)  # (B, T, k) float32
        valid = tf.math.is_finite(picked)  # (B, T, k): -inf exactly where not visible
        return (picks, valid, picked) if return_scores else (picks, valid)

    def _top(self, index):
        """int32 (B, T, min(index_topk, S)): each query's highest index scores, unsorted."""
        keys_len = index.shape[2]  # static when S is (XLA's top_k needs a constant k)
        if keys_len is None:
            k = tf.minimum(self.config.index_topk, tf.shape(index)[2])
        else:
            k = min(self.config.index_topk, keys_len)
        return tf.math.top_k(index, k=k, sorted=False).indices  # (B, T, k)

    def _rotate(self, x, positions):
        """rotate_half RoPE of the first qk_rope_head_dim dims of x (B, T, H, Di) at
        positions (T,) shared by the rows or (B, T) per row; the rest passes through."""
        c = self.config
        dr = c.qk_rope_head_dim
        x_rot, x_pass = x[..., :dr], x[..., dr:]  # (B, T, H, Dr), (B, T, H, Di-Dr)
        if positions.shape.rank == 1:
            cos, sin = rope_cos_sin(positions, dr, c.rope_theta, c.rope_scaling)  # (T, Dr)
            x_rot = apply_rotary_pos_emb(x_rot, cos, sin, interleave=False)  # (B, T, H, Dr)
        else:  # per-row positions: rotate the B*T tokens as one sequence of B*T positions
            cos, sin = rope_cos_sin(tf.reshape(positions, [-1]), dr, c.rope_theta,
                                    c.rope_scaling)  # (B*T, Dr)
            shape = tf.shape(x_rot)
            flat = tf.reshape(x_rot, [1, -1, shape[2], dr])  # (1, B*T, H, Dr)
            flat = apply_rotary_pos_emb(flat, cos, sin, interleave=False)  # (1, B*T, H, Dr)
            x_rot = tf.reshape(flat, shape)  # (B, T, H, Dr)
        return tf.concat([x_rot, x_pass], axis=-1)  # (B, T, H, Di)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict()}


def _scatter_true(indices, size):
    """bool (B, T, size): True at indices (B, T, k) of each row, False elsewhere."""
    shape = tf.shape(indices, out_type=tf.int64)
    rows, size = shape[0] * shape[1], tf.cast(size, tf.int64)  # int64: B*T*S may pass 2^31
    base = tf.range(rows)[:, None] * size  # (B*T, 1)
    flat = tf.reshape(tf.reshape(tf.cast(indices, tf.int64), [rows, -1]) + base,
                      [-1, 1])  # (B*T*k, 1)
    hits = tf.scatter_nd(flat, tf.ones(tf.shape(flat)[:1], tf.int8), [rows * size])  # (B*T*S,)
    return tf.reshape(hits > 0, [shape[0], shape[1], size])  # (B, T, S)


