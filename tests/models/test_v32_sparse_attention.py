"""DeepSeek-V3.2's sparse attention (`attn_implementation="sparse"`, the default): each
query's picked latents gathered and attended in MLA's absorbed form, against the dense
reference (`"dense"`: the whole score matrix masked to the picks), at 2,048 tokens where
the lightning indexer keeps 256 = 1/8 of them.

Near-ties of the indexer. The stateless paths score the (query, key) pairs with the same
`LightningIndexer.index_scores` and take the same `tf.math.top_k`, so in the first layer
their picks are the same set by construction, ties included. From the second layer on,
their inputs are the previous layers' outputs, which the gathered and the masked attention
round differently (summation order): seen on an AMD EPYC on 2026-11-29 (two indexer
heads), query 1,748's 256th and 257th picks of layer 1 swapped, a logit moved by 4e-3. The cached paths differ
from the first layer: the dense one scores each query against every cache slot, the
sparse one against the slots up to its block's last query, and a matmul of another shape
may round a score differently.
Rule: let delta = `TIE_GAP` x a query's largest |index score| (the dense path's), in any
layer. A query that sees more than k keys is a near-tie when its k-th and (k + 1)-th best
scores differ by less than delta (an exact tie included), except an exact tie at 0; there
it is a near-tie only when some key scores in (-delta, 0), or in (0, delta) at an index
past the first 0 that top_k leaves out (`_zero_tie_is_fragile`). Keys ReLU'd
to exactly 0 in every head score exactly 0 in both paths, and `tf.math.top_k` keeps the
lower index of a tie in both; a key whose score rounds to either side of 0 can join or
leave such a tie. A near-tie's position is excluded from the comparisons (at most 1/20 of
them: 56 and 42 of 2,048 here), and everything else must agree to 1e-4. Four indexer heads,
not two, so that fewer queries' k-th score falls among exact 0s (a key is ReLU'd to 0 in
every head with probability 1/16, not 1/4).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek import mla_attention
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.deepseek.hf_config import config_to_hf
from models.deepseek.lightning_indexer import LightningIndexer

SEQ = 2048
TOP_K = 256  # SEQ / 8
CONFIG = DeepSeekConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, n_group=2,
    topk_group=1, num_experts_per_tok=2, max_position_embeddings=SEQ + 64,
    num_nextn_predict_layers=0, index_topk=TOP_K, index_n_heads=4, index_head_dim=8,
    initializer_range=0.3)  # large weights: peaked attention, so a wrong pick shows
TIE_GAP = 1e-5


def _rel(a, b) -> float:
    """max |a - b| / max |b|."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _models(**changes):
    """{impl: model} with the same random weights."""
    keras.utils.set_random_seed(0)
    models = {impl: DeepSeekCausalLM(CONFIG.replace(attn_implementation=impl, **changes))
              for impl in ("sparse", "dense")}
    models["sparse"].set_weights(models["dense"].get_weights())
    return models


def _ids(seed=1, batch=1, seq=SEQ):
    rng = np.random.default_rng(seed)
    return tf.constant(rng.integers(0, CONFIG.vocab_size, (batch, seq)), tf.int32)


@pytest.fixture(scope="module")
def models():
    return _models()


def test_sparse_logits_equal_dense_at_every_position(models, monkeypatch):
    """The stateless forward at every position but near-ties (module docstring)."""
    assert CONFIG.attn_implementation == "sparse" and TOP_K * 8 <= SEQ
    ids = _ids()
    got = models["sparse"](ids).numpy()  # (1, T, V)
    recorded = _record_index_scores(monkeypatch)
    want = models["dense"](ids).numpy()
    monkeypatch.undo()
    assert len(recorded) == CONFIG.num_hidden_layers
    ties = np.zeros(SEQ, bool)
    for first, scores in recorded:
        ties |= near_ties(scores[0], first)
    assert ties.sum() <= SEQ // 20, f"{ties.sum()} near-ties"
    per_position = np.abs(got - want).max(axis=(0, 2))  # (T,)
    assert per_position[~ties].max() < 1e-4, np.nonzero(per_position > 1e-4)[0][:10]
    # The picks matter: attending every visible token gives other logits past TOP_K.
    everything = _models(index_topk=SEQ)["dense"](ids).numpy()
    assert np.abs(everything - want)[0, TOP_K + 1:].max() > 1e-2


def _record_index_scores(monkeypatch) -> list:
    """Spies on `LightningIndexer.index_scores` (eager calls): the returned list fills
    with (first query position, float (B, t, S) scores) per call."""
    recorded = []
    index_scores = LightningIndexer.index_scores

    def recording(self, hidden_states, q_latent, keys, positions, visible):
        got = index_scores(self, hidden_states, q_latent, keys, positions, visible)
        first = positions[0, 0] if len(positions.shape) == 2 else positions[0]
        recorded.append((int(first), got.numpy()))
        return got

    monkeypatch.setattr(LightningIndexer, "index_scores", recording)
    return recorded


def test_sparse_gradients_equal_dense():
    """One layer at 2,048 tokens: d(sum(out * w) + indexer loss) / d(every weight and the
    input) within 1e-4 relative, and the same indexer KL loss."""
    layers = {impl: m.decoder_layers[1].self_attn for impl, m in _models().items()}
    rng = np.random.default_rng(2)
    hidden = tf.constant(rng.normal(size=(1, SEQ, CONFIG.hidden_size)), tf.float32)
    weights = tf.constant(rng.normal(size=(1, SEQ, CONFIG.hidden_size)), tf.float32)
    grads, losses = {}, {}
    for impl, attn in layers.items():
        with tf.GradientTape() as tape:
            tape.watch(hidden)
            out, indexer_loss = attn(hidden, return_indexer_loss=True)
            loss = tf.reduce_sum(out * weights) + indexer_loss
        grads[impl] = tape.gradient(loss, [hidden] + attn.trainable_variables)
        losses[impl] = float(indexer_loss)
    assert losses["dense"] > 1e-3  # the KL is not trivially 0
    assert losses["sparse"] == pytest.approx(losses["dense"], rel=1e-4)
    names = ["input"] + [v.path for v in layers["sparse"].trainable_variables]
    assert any("indexer" in n for n in names)
    for name, a, b in zip(names, grads["sparse"], grads["dense"], strict=True):
        assert (a is None) == (b is None), name
        if b is not None:
            assert _rel(tf.convert_to_tensor(a), tf.convert_to_tensor(b)) < 1e-4, name


@pytest.mark.slow  # 4 s or more on a 2-core EPYC (fast tier budget)
def test_cached_prefill_in_chunks_and_decode_equal_dense(models, monkeypatch):
    """Prefill of 2,048 tokens in chunks of 512 (gathered in query blocks of
    `QUERY_BLOCK`, chunks of unknown width), then 4 decode steps: the same logits as the
    dense cached path and as the stateless forward at every position but near-ties
    (module docstring)."""
    assert 512 > mla_attention.QUERY_BLOCK
    ids = _ids(seed=3, seq=SEQ + 4)
    starts = list(range(0, SEQ, 512)) + list(range(SEQ, SEQ + 4))
    results = {}
    for impl in ("dense", "sparse"):
        model = models[impl]
        step = model.call_with_cache  # eager: the spy sees values
        if impl == "sparse":
            monkeypatch.undo()
        else:  # the dense path's index scores: (first position, float (1, t, S))
            recorded = _record_index_scores(monkeypatch)
        cache, logits = model.init_cache(1, SEQ + 8), []
        if impl == "sparse":  # the cache's length known at run time only, as in serving
            step = tf.function(model.call_with_cache, input_signature=[
                tf.TensorSpec([1, None], tf.int32),
                tf.nest.map_structure(lambda t: tf.TensorSpec([1, None, t.shape[-1]], t.dtype),
                                      cache),
                tf.TensorSpec([], tf.int32)])
        for start, end in zip(starts, starts[1:] + [SEQ + 4], strict=True):
            out, cache = step(ids[:, start:end], cache, tf.constant(start))
            logits.append(out.numpy())
        results[impl] = np.concatenate(logits, axis=1)  # (1, T+4, V)
    assert len(recorded) == len(starts) * CONFIG.num_hidden_layers
    ties = np.zeros(SEQ + 4, bool)
    for first, scores in recorded:
        ties[first:first + scores.shape[1]] |= near_ties(scores[0], first)
    assert ties.sum() <= (SEQ + 4) // 20, f"{ties.sum()} near-ties"
    per_position = np.abs(results["sparse"] - results["dense"]).max(axis=(0, 2))  # (T+4,)
    assert per_position[~ties].max() < 1e-4, np.nonzero(per_position > 1e-4)[0][:10]
    full = models["sparse"](ids).numpy()
    assert np.abs(results["sparse"] - full).max(axis=(0, 2))[~ties].max() < 1e-4


def near_ties(scores, first: int) -> np.ndarray:
    """bool (t,): the queries at positions first .. of float (t, S) index scores (-inf
    where not visible) that the module docstring's rule excludes."""
    scores = np.asarray(scores, np.float64)
    best = np.sort(scores, axis=-1)[:, ::-1]  # best first
    visible = first + np.arange(scores.shape[0]) + 1  # keys each query sees
    kth, next_ = best[:, TOP_K - 1], best[:, TOP_K]  # (t,) each
    finite = np.isfinite(scores)
    delta = TIE_GAP * np.abs(np.where(finite, scores, 0.0)).max(axis=-1)  # (t,)
    with np.errstate(invalid="ignore"):  # -inf - -inf where fewer than k + 1 are visible
        gap = kth - next_
    zero_tie = (kth == 0) & (next_ == 0)  # (t,): keys ReLU'd to exactly 0 at the boundary
    fragile = (gap >= 0) & (gap < delta) & ~zero_tie
    for row in np.nonzero(zero_tie & (visible > TOP_K))[0]:
        fragile[row] = _zero_tie_is_fragile(scores[row], delta[row])
    return (visible > TOP_K) & fragile


def _zero_tie_is_fragile(scores, delta: float) -> bool:
    """Whether rounding within delta can change the picks of a query whose k-th and
    (k + 1)-th best scores are both exactly 0 (float64 (S,), -inf where not visible): a
    negative score within delta of 0 can round to 0 or above and displace the last picked
    0 (or any, above it); a positive one can round to 0 and lose its place to the first
    unpicked 0 when its index is past it (top_k keeps the lower indices of a tie)."""
    zeros = np.nonzero(scores == 0)[0]  # ascending
    picked = TOP_K - int((scores > 0).sum())  # the zeros top_k keeps: the lowest indices
    first_unpicked = zeros[picked]
    if ((scores < 0) & (scores > -delta)).any():
        return True
    return bool(((scores > 0) & (scores < delta) & (np.arange(len(scores)) > first_unpicked)
                 ).any())


def test_query_blocks_of_a_ragged_width_equal_one_pass():
    """`_in_query_blocks` pads the last block and cuts it off again."""
    rng = np.random.default_rng(4)
    q_nope = tf.constant(rng.normal(size=(2, 300, 2, 3)), tf.float32)
    q_pe = tf.constant(rng.normal(size=(2, 300, 2, 1)), tf.float32)
    picks = tf.constant(rng.integers(0, 50, (2, 300, 5)), tf.int32)
    valid = tf.constant(rng.random((2, 300, 5)) > 0.3)

    def fn(qn, qp, p, v):  # anything per query
        return qn * tf.cast(tf.reduce_sum(p * tf.cast(v, tf.int32), -1), tf.float32)[
            :, :, None, None] + tf.reduce_sum(qp, -1, keepdims=True)

    whole = fn(q_nope, q_pe, picks, valid)
    dynamic = tf.function(lambda *a: mla_attention._in_query_blocks(fn, 128, *a),
                          input_signature=[tf.TensorSpec([2, None, 2, 3]),
                                           tf.TensorSpec([2, None, 2, 1]),
                                           tf.TensorSpec([2, None, 5], tf.int32),
                                           tf.TensorSpec([2, None, 5], tf.bool)])
    np.testing.assert_array_equal(dynamic(q_nope, q_pe, picks, valid).numpy(), whole.numpy())


def test_unknown_attn_implementation_is_named_and_not_a_config_json_key():
    with pytest.raises(ValueError, match="attn_implementation='flash'.*sparse.*dense"):
        CONFIG.replace(attn_implementation="flash")
    config = CONFIG.replace(attn_implementation="dense")
    assert DeepSeekConfig.from_dict(config.to_dict()).attn_implementation == "dense"
    assert "attn_implementation" not in config_to_hf(config)
