"""DeepSeek-V3.2's sparse attention (`attn_implementation="sparse"`, the default): each
query's picked latents gathered and attended in MLA's absorbed form, against the dense
reference (`"dense"`: the whole score matrix masked to the picks), at 2,048 tokens where
the lightning indexer keeps 256 = 1/8 of them.

Near-ties of the indexer. Both paths score the (query, key) pairs with the same
`LightningIndexer.index_scores` on the same inputs and take the same `tf.math.top_k`, so
their picks are the same set by construction, ties included (top_k keeps the lower
index in both): no query is excluded. The tests check that the picks matter (the logits
differ from attending every visible token) and that the two paths agree to 1e-4.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek import mla_attention
from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.deepseek.hf_config import config_to_hf

SEQ = 2048
TOP_K = 256  # SEQ / 8
CONFIG = DeepSeekConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
    num_hidden_layers=2, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=16,
    qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, n_routed_experts=4, n_group=2,
    topk_group=1, num_experts_per_tok=2, max_position_embeddings=SEQ + 64,
    num_nextn_predict_layers=0, index_topk=TOP_K, index_n_heads=2, index_head_dim=8,
    initializer_range=0.3)  # large weights: peaked attention, so a wrong pick shows


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


def test_cached_prefill_in_chunks_and_decode_equal_dense(models):
    """Prefill of 2,048 tokens in chunks of 512 (gathered in query blocks of
    `QUERY_BLOCK`, a chunk of unknown width included), then 4 decode steps: the same
    logits as the dense path and as the stateless forward."""
    assert 512 > mla_attention.QUERY_BLOCK
    ids = _ids(seed=3, seq=SEQ + 4)
    results = {}
    for impl, model in models.items():
        step = tf.function(model.call_with_cache, input_signature=[
            tf.TensorSpec([1, None], tf.int32), tf.TensorSpec(None, model.compute_dtype),
            tf.TensorSpec([], tf.int32)])
        cache = model.init_cache(1, SEQ + 8)
        logits = []
        for start in range(0, SEQ, 512):
            out, cache = step(ids[:, start:start + 512], cache, start)
            logits.append(out)
        for pos in range(SEQ, SEQ + 4):
            out, cache = step(ids[:, pos:pos + 1], cache, pos)
            logits.append(out)
        results[impl] = np.concatenate([x.numpy() for x in logits], axis=1)  # (1, T+4, V)
    assert np.abs(results["sparse"] - results["dense"]).max() < 1e-4
    full = models["sparse"](ids).numpy()
    assert np.abs(results["sparse"] - full).max() < 1e-4


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
