"""DeepSeek-V3.2's sparse attention (`attn_implementation="sparse"`, the default): each
query's picked latents gathered and attended in MLA's absorbed form, against the dense
reference (`"dense"`: the whole score matrix masked to the picks), at 2,048 tokens where
the lightning indexer keeps 256 = 1/8 of them.

Near-ties of the indexer. The stateless paths score the (query, key) pairs with the same
`LightningIndexer.index_scores` on the same (T, T) inputs and take the same
`tf.math.top_k`, so their picks are the same set by construction, ties included (top_k
keeps the lower index in both): no query is excluded there. The cached paths differ: the
dense one scores each query against every cache slot, the sparse one against the slots up
to its block's last query, and a matmul of another shape may round a score differently.
Rule (as tests/models/test_v4_sparse_attention.py): a query is a near-tie when it sees
more than k keys and its k-th and (k + 1)-th best index scores (the dense path's) differ by
less than `TIE_GAP` relative, in any layer; its position is excluded from the cached
comparison, and everything else must agree to 1e-4.
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
    num_nextn_predict_layers=0, index_topk=TOP_K, index_n_heads=2, index_head_dim=8,
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


def test_sparse_logits_equal_dense_at_every_position(models):
    assert CONFIG.attn_implementation == "sparse" and TOP_K * 8 <= SEQ
    ids = _ids()
    got, want = models["sparse"](ids).numpy(), models["dense"](ids).numpy()  # (1, T, V)
    per_position = np.abs(got - want).max(axis=(0, 2))  # (T,)
    assert per_position.max() < 1e-4, np.nonzero(per_position > 1e-4)[0][:10]
    # The picks matter: attending every visible token gives other logits past TOP_K.
    everything = _models(index_topk=SEQ)["dense"](ids).numpy()
    assert np.abs(everything - want)[0, TOP_K + 1:].max() > 1e-2


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
    recorded = []  # the dense path's index scores: (first position, float (1, t, S))
    index_scores = LightningIndexer.index_scores

    def recording(self, hidden_states, q_latent, keys, positions, visible):
        got = index_scores(self, hidden_states, q_latent, keys, positions, visible)
        recorded.append((int(positions[0, 0]), got.numpy()))
        return got

    results = {}
    for impl in ("dense", "sparse"):
        model = models[impl]
        step = model.call_with_cache  # eager: the spy sees values
        if impl == "sparse":
            monkeypatch.undo()
        else:
            monkeypatch.setattr(LightningIndexer, "index_scores", recording)
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
    assert ties.sum() <= (SEQ + 4) // 100, f"{ties.sum()} near-ties"
    per_position = np.abs(results["sparse"] - results["dense"]).max(axis=(0, 2))  # (T+4,)
    assert per_position[~ties].max() < 1e-4, np.nonzero(per_position > 1e-4)[0][:10]
    full = models["sparse"](ids).numpy()
    assert np.abs(results["sparse"] - full).max(axis=(0, 2))[~ties].max() < 1e-4


def near_ties(scores, first: int) -> np.ndarray:
    """bool (t,): the queries at positions first .. of float (t, S) index scores (-inf
    where not visible) that the module docstring's rule excludes."""
    best = np.sort(np.asarray(scores, np.float64), axis=-1)[:, ::-1]  # best first
    visible = first + np.arange(scores.shape[0]) + 1  # keys each query sees
    kth, next_ = best[:, TOP_K - 1], best[:, TOP_K]
    with np.errstate(invalid="ignore"):  # -inf - -inf where fewer than k + 1 are visible
        gap = np.abs(kth - next_) / np.maximum(np.abs(kth), 1e-30)
    return (visible > TOP_K) & (gap > 0) & (gap < TIE_GAP)


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
