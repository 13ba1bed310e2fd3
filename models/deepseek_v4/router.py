"""DeepSeek-V4's routers: learned top-k ("moe") and hash routing ("hash_moe").

transformers 5.24 `DeepseekV4TopKRouter` and `DeepseekV4HashRouter` (paper §2.1):

    s_t     = score(h_t W_g^T)          score = sqrt(softplus(x)) ("sqrtsoftplus") or sigmoid
    "moe":      I_t = top-K of s_t + b   (b = e_score_correction_bias, selection only)
    "hash_moe": I_t = tid2eid[input_id_t]    (a frozen int table (vocab, K))
    g_t,i   = s_t,i / (sum_{j in I_t} s_t,j + 1e-20) * routed_scaling_factor,  i in I_t

All routing math in float32.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from models.deepseek_v4.config import DeepSeekV4Config
from models.layers import initializers
from models.layers.router_bias import update_correction_bias


def router_scores(logits, scoring_func: str):
    """Affinities s from router logits (float32, same shape): sqrt(softplus) or sigmoid."""
    if scoring_func == "sqrtsoftplus":
        return tf.sqrt(tf.math.softplus(logits))
    return tf.sigmoid(logits)


@keras.saving.register_keras_serializable(package="deepseek_v4")
class DeepSeekV4Router(keras.layers.Layer):
    """Chooses num_experts_per_tok routed experts per token, learned or by hash.

    Weights (release names under `layers.N.ffn.gate.`): `weight` float32 (E, C) [`weight`];
    "moe": `e_score_correction_bias` float32 (E,), non-trainable [`bias`]; "hash_moe":
    `tid2eid` int32 (vocab_size, K), non-trainable [`tid2eid`, int64 on disk].

    Args:
      config: a DeepSeekV4Config (or its `to_dict()`).
      is_hash: hash routing (config.is_hash_layer(layer_idx)).

    Call args:
      x: float (N, C), one row per token.
      input_ids: int (N,) token ids (hash routing only; ids must be < vocab_size).

    Returns:
      (topk_indices int32 (N, K), topk_weights float32 (N, K), scores float32 (N, E)).
    """

    def __init__(self, config, is_hash: bool, **kwargs):
        kwargs.setdefault("dtype", "float32")  # routing stays in float32
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = DeepSeekV4Config.from_dict(config)
        self.config = config
        self.is_hash = is_hash
        self.e_score_correction_bias = None
        self.tid2eid = None

    def build(self, input_shape=None):
        c = self.config
        self.weight = self.add_weight(
            name="weight", shape=(c.n_routed_experts, c.hidden_size),
            initializer=initializers.normal(c.initializer_range))
        if self.is_hash:
            self.tid2eid = self.add_weight(
                name="tid2eid", shape=(c.vocab_size, c.num_experts_per_tok), dtype="int32",
                initializer="zeros", trainable=False)
        else:
            self.e_score_correction_bias = self.add_weight(
                name="e_score_correction_bias", shape=(c.n_routed_experts,),
                initializer="zeros", trainable=False)

    def call(self, x, input_ids=None):
        c = self.config
        logits = tf.matmul(tf.cast(x, tf.float32), self.weight, transpose_b=True)  # (N, E)
        scores = router_scores(logits, c.scoring_func)  # (N, E)
        if self.is_hash:
            if input_ids is None:
                raise ValueError(f"{self.name}: hash routing needs input_ids")
            # Keras' default save signature traces the model with float inputs: ids are
            # cast here, where they index (the embedding casts its own).
            ids = tf.cast(tf.reshape(input_ids, [-1]), tf.int32)  # (N,)
            topk_indices = tf.gather(self.tid2eid, ids)  # (N, K)
        else:
            choice = scores + self.e_score_correction_bias  # (N, E), selection only
            topk_indices = tf.math.top_k(choice, k=c.num_experts_per_tok).indices  # (N, K)
        topk_weights = tf.gather(scores, topk_indices, batch_dims=1)  # (N, K)
        topk_weights /= tf.reduce_sum(topk_weights, axis=-1, keepdims=True) + 1e-20
        topk_weights *= c.routed_scaling_factor
        return tf.cast(topk_indices, tf.int32), topk_weights, scores

    def update_bias(self, expert_load, update_speed):
        """b_i -= gamma * sign(load_i - mean(load)) (DeepSeek-V3 §2.1.2); None, nothing
        changed, for hash routing (no bias)."""
        return update_correction_bias(self.e_score_correction_bias, expert_load, update_speed)

    def get_config(self):
        return {**super().get_config(), "config": self.config.to_dict(), "is_hash": self.is_hash}
