"""DeepSeek-V4's sparse stateless attention (`attn_implementation="sparse"`, the default)
against the dense reference (`"dense"`): the same logits at every position and the same
gradients, at 2,048 tokens where the lightning indexer keeps 1/8 of the entries.

Near-ties of the indexer. The sparse path scores the entries one block of queries at a
time (`LightningIndexer.select`); the dense path in one matrix. Float rounding alone can
then order two entries differently when their index scores are within rounding of each
other at the k-th place, and the query attends another entry: that is not a difference
between the two attentions. Rule: a query is a near-tie when it sees more than k entries
and its k-th and (k + 1)-th best scores (the dense path's) differ, by less than `TIE_GAP`
relative; its position is excluded, and everything else must agree to 1e-4. Exact ties
stay in: they are the entries whose index score is exactly 0 (every head's ReLU is 0),
computed exactly by both paths, and `tf.math.top_k` keeps the lower index in both.
CSA is the model's last layer, so a near-tie changes no other position's logits.
"""

import numpy as np
import pytest
import tensorflow as tf
from v4_random_model import random_v4_model

from models.deepseek_v4 import sparse_attention
from models.deepseek_v4.attention import DeepSeekV4Attention
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config

SEQ = 2048
# CSA rate 4: N = 512 entries at 2,048 tokens; the indexer keeps 64 = N / 8 of them.
CONFIG = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, HCA, CSA),
    compress_rates={CSA: 4, HCA: 16}, mlp_layer_types=("hash_moe", "moe", "moe"),
    hc_mult=2, sliding_window=16, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=64, max_position_embeddings=SEQ)
TIE_GAP = 1e-5


def _rel(a, b) -> float:
    """max |a - b| / max |b| (0 when both are zero)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = np.abs(b).max()
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a).max())


def near_ties(index_scores, top_k: int, compress_rate: int) -> np.ndarray:
    """bool (B, T): the queries the module docstring's rule excludes.

    Args: index_scores float32 (B, T, N), -inf where an entry is not complete.
    """
    scores = np.sort(np.asarray(index_scores, np.float64), axis=-1)[..., ::-1]  # best first
    visible = (np.arange(scores.shape[1]) + 1) // compress_rate  # (T,)
    kth, next_ = scores[..., top_k - 1], scores[..., top_k]  # (B, T) each
    gap = np.abs(kth - next_) / np.maximum(np.abs(kth), 1e-30)
    return (visible[None, :] > top_k) & (gap > 0) & (gap < TIE_GAP)


def _ids(seed=0, batch=1):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.integers(0, CONFIG.vocab_size, (batch, SEQ)), tf.int32)


def test_sparse_logits_equal_dense_at_every_position_but_near_ties():
    ids = _ids()
    dense = random_v4_model(CONFIG.replace(attn_implementation="dense"), seed=0)
    sparse = random_v4_model(CONFIG, seed=0)
    assert sparse.config.attn_implementation == "sparse"  # the default
    indexer = sparse.decoder_layers[2].self_attn.indexer
    select, recorded = indexer.select, []

    def recording_select(hidden_states, q_residual, **kwargs):
        # The dense path's scores of the same inputs, for the near-tie rule.
        recorded.append(indexer(hidden_states, q_residual, return_scores=True)[1].numpy())
        return select(hidden_states, q_residual, **kwargs)

    indexer.select = recording_select
    got, want = sparse(ids).numpy(), dense(ids).numpy()  # (1, T, V)
    ties = near_ties(recorded[0], CONFIG.index_topk, 4)[0]  # (T,)
    assert ties.sum() <= SEQ // 100, f"{ties.sum()} near-ties"
    per_position = np.abs(got - want).max(axis=(0, 2))  # (T,)
    assert per_position[~ties].max() < 1e-4, np.nonzero(per_position > 1e-4)[0][:10]


@pytest.mark.parametrize("layer_idx", [0, 1, 2], ids=["sliding", "hca", "csa"])
def test_sparse_gradients_equal_dense(layer_idx):
    """One layer at 2,048 tokens: d(sum(out * w) + indexer loss) / d(every weight and the
    input) within 1e-4 relative; the seed has no near-tie (asserted)."""
    layers = {}
    for impl in ("sparse", "dense"):
        model = random_v4_model(CONFIG.replace(attn_implementation=impl), seed=0)
        layers[impl] = model.decoder_layers[layer_idx].self_attn
    rng = np.random.default_rng(2)  # seeds 1 and 3 have near-ties (2 and 1 queries)
    hidden = tf.constant(rng.normal(size=(1, SEQ, CONFIG.hidden_size)), tf.float32)
    weights = tf.constant(rng.normal(size=(1, SEQ, CONFIG.hidden_size)), tf.float32)
    layer = layers["dense"]
    if layer.indexer is not None:
        with tf.GradientTape():  # the dense path's scores: no near-tie in this seed
            q_residual, _, _ = layer._queries_and_kv(hidden, *_rope(layer))
            _, scores = layer.indexer(hidden, q_residual, return_scores=True)
        assert not near_ties(scores, CONFIG.index_topk, 4).any()

    grads, losses = {}, {}
    for impl, attn in layers.items():
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            out, indexer_loss = attn(hidden, return_indexer_loss=True)
            loss = tf.reduce_sum(out * weights) + indexer_loss
        variables = [hidden] + attn.trainable_variables
        grads[impl] = tape.gradient(loss, variables)
        losses[impl] = float(indexer_loss)
    assert losses["sparse"] == pytest.approx(losses["dense"], rel=1e-4, abs=1e-7)
    names = ["input"] + [v.path for v in layers["sparse"].trainable_variables]
    for name, a, b in zip(names, grads["sparse"], grads["dense"], strict=True):
        if b is None:
            assert a is None, name
            continue
        assert _rel(tf.convert_to_tensor(a), tf.convert_to_tensor(b)) < 1e-4, name


def _rope(layer):
    from models.deepseek_v4.ops import rope_cos_sin
    return rope_cos_sin(tf.range(SEQ), layer.inv_freq)


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_recomputed_query_chunks_equal_one_pass():
    """`attend_sequence` in chunks under tf.recompute_grad (long sequences) gives the
    one-pass values and gradients, with picks, HCA entries and a window alone."""
    rng = np.random.default_rng(2)
    batch, seq, heads, dim, top_k = 2, 96, 2, 8, 5  # sliding window 8 below
    q = tf.constant(rng.normal(size=(batch, seq, heads, dim)), tf.float32)
    kv = tf.constant(rng.normal(size=(batch, seq, dim)), tf.float32)
    entries = tf.constant(rng.normal(size=(batch, seq // 4, dim)), tf.float32)
    sinks = tf.constant(rng.normal(size=(heads,)), tf.float32)
    visible = (np.arange(seq) + 1) // 4
    picks = np.stack([[rng.permutation(max(v, top_k))[:top_k] for v in visible]
                      for _ in range(batch)])  # (B, T, k)
    picks = tf.constant(np.where(picks < visible[None, :, None], picks, -1), tf.int32)
    cases = {"window": {}, "hca": dict(entries=entries, compress_rate=4),
             "csa": dict(entries=entries, compress_rate=4, picks=picks)}
    for case, kwargs in cases.items():
        results = []
        for chunk in (10**9, 32):
            fn = tf.function(lambda q, kv, e, s, chunk=chunk, kwargs=kwargs: _attend_grads(
                q, kv, e, s, chunk, kwargs))
            results.append(fn(q, kv, entries, sinks))
        for a, b in zip(results[0], results[1], strict=True):
            if a is None:
                continue
            assert _rel(b, a) < 1e-5, case


def _attend_grads(q, kv, entries, sinks, chunk, kwargs):
    """[out, entry mass or None, d(sum(out^2)) / d(q, kv, entries, sinks)]."""
    kwargs = dict(kwargs)
    with_entries = "entries" in kwargs
    if with_entries:
        kwargs["entries"] = entries
    with tf.GradientTape() as tape:
        tape.watch([q, kv, entries, sinks])
        got = sparse_attention.attend_sequence(q, kv, sinks, 0.3, 8, query_chunk=chunk,
                                               return_entry_mass=with_entries, **kwargs)
        out, mass = got if with_entries else (got, None)
        loss = tf.reduce_sum(out * out)
    return [out, mass] + tape.gradient(loss, [q, kv, entries, sinks])


def test_unknown_attn_implementation_is_named():
    with pytest.raises(ValueError, match="attn_implementation='flash'.*sparse.*dense"):
        CONFIG.replace(attn_implementation="flash")


def test_attn_implementation_round_trips_and_is_not_a_config_json_key():
    from models.deepseek_v4 import hf_config

    config = CONFIG.replace(attn_implementation="dense")
    assert DeepSeekV4Config.from_dict(config.to_dict()).attn_implementation == "dense"
    assert "attn_implementation" not in hf_config.config_to_hf(config)


def test_sparse_layer_compiles_with_xla_at_static_length():
    model = random_v4_model(CONFIG.replace(max_position_embeddings=256), seed=0)
    attn = model.decoder_layers[2].self_attn
    hidden = tf.random.stateless_normal((1, 256, CONFIG.hidden_size), seed=(0, 1))
    compiled = tf.function(lambda h: attn(h, return_indexer_loss=True), jit_compile=True)
    out, loss = compiled(hidden)
    eager_out, eager_loss = attn(hidden, return_indexer_loss=True)
    assert _rel(out, eager_out) < 1e-5 and abs(float(loss) - float(eager_loss)) < 1e-5
    assert isinstance(attn, DeepSeekV4Attention)


def test_indexer_picks_and_scores_in_blocks_and_chunks_equal_one_pass():
    """`LightningIndexer.select` scoring 64 queries a block (map_fn) and computing the
    picks' scores in recomputed chunks of 96 gives the one-pass picks, scores and
    gradients of its KL-loss inputs."""
    indexer = random_v4_model(CONFIG.replace(max_position_embeddings=256), seed=0
                              ).decoder_layers[2].self_attn.indexer
    rng = np.random.default_rng(3)
    hidden = tf.constant(rng.normal(size=(2, 256, CONFIG.hidden_size)), tf.float32)
    q_residual = tf.constant(rng.normal(size=(2, 256, CONFIG.q_lora_rank)), tf.float32)
    weights = tf.constant(rng.normal(size=(2, 256, 256 // 4 // 8 * 8)), tf.float32)
    results = []
    for block, chunk in ((10**9, 10**9), (64, 96)):
        with tf.GradientTape() as tape:
            picks, scores = indexer.select(hidden, q_residual, return_scores=True,
                                           query_block=block, query_chunk=chunk)
            loss = tf.reduce_sum(scores * weights[..., :scores.shape[-1]])
        results.append((picks, scores, tape.gradient(loss, indexer.trainable_variables)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    assert _rel(results[1][1], results[0][1]) < 1e-6
    for a, b in zip(results[1][2], results[0][2], strict=True):
        assert _rel(tf.convert_to_tensor(a), tf.convert_to_tensor(b)) < 1e-5
