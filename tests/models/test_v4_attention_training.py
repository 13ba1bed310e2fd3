"""DeepSeek-V4 attention for training: the grouped output projection as an ExpertProjection
(`o_a_proj`: per-group LoRA, int8, checkpoint `wo_a` both ways), the lightning indexer's KL
loss (`return_indexer_loss=True`), and XLA compilation of the stateless forward.

Tiny config (one layer of each type); every test runs in seconds.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.deepseek_v4 import hf_checkpoint as v4_checkpoint
from models.deepseek_v4.attention import DeepSeekV4Attention
from models.deepseek_v4.config import CSA, HCA, SLIDING, DeepSeekV4Config
from models.deepseek_v4.hf_names import GroupedKernel
from models.layers.expert_projection import ExpertProjection

TINY = DeepSeekV4Config(
    vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
    num_attention_heads=4, head_dim=16, q_lora_rank=16, qk_rope_head_dim=4,
    n_routed_experts=4, num_experts_per_tok=2, layer_types=(SLIDING, CSA, HCA, CSA),
    compress_rates={CSA: 4, HCA: 8}, mlp_layer_types=("hash_moe", "moe", "moe", "moe"),
    hc_mult=2, sliding_window=6, o_groups=2, o_lora_rank=8, index_n_heads=2,
    index_head_dim=8, index_topk=3, swiglu_limit=1.0)
SEQ = 24  # CSA: 6 entries (3 picked of them), HCA: 3 entries


def _attention(layer_idx, seed=0):
    """A built attention layer of TINY with random sinks and position biases."""
    keras.utils.set_random_seed(seed)
    layer = DeepSeekV4Attention(TINY, layer_idx)
    layer.build()
    rng = np.random.default_rng(seed)
    layer.sinks.assign(rng.normal(size=layer.sinks.shape).astype(np.float32))
    for comp in (layer.compressor, layer.indexer and layer.indexer.compressor):
        if comp is not None:
            comp.position_bias.assign(
                rng.normal(size=comp.position_bias.shape).astype(np.float32))
    return layer


def _hidden(batch=2, seq=SEQ, seed=1):
    return tf.constant(np.random.default_rng(seed).normal(size=(batch, seq, TINY.hidden_size)),
                       tf.float32)


def _max_diff(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())


# ----------------------------------------------------------------------------- o_a_proj


def test_o_a_proj_is_transformers_grouped_linear():
    """o_a_proj (g, H*D/g, R) applied to the grouped heads equals transformers'
    `DeepseekV4GroupedLinear.forward` on the checkpoint tensor wo_a [g*R, H*D/g]."""
    layer = _attention(1)
    assert isinstance(layer.o_a_proj, ExpertProjection)
    assert tuple(layer.o_a_proj.kernel.shape) == (2, 4 * 16 // 2, 8)
    g, width, rank = 2, 32, 8
    wo_a = tf.transpose(tf.convert_to_tensor(GroupedKernel(layer.o_a_proj))).numpy()  # (g*R, HD/g)
    assert wo_a.shape == (g * rank, width)
    x = np.random.default_rng(3).normal(size=(5, g, width)).astype(np.float32)  # (N, g, HD/g)
    # transformers: w = weight.view(g, -1, hd).transpose(1, 2); bmm(x.transpose(0, 1), w)
    w = wo_a.reshape(g, rank, width).transpose(0, 2, 1)  # (g, HD/g, R)
    expected = np.einsum("gni,gir->ngr", x.transpose(1, 0, 2), w)  # (N, g, R)
    got = layer.o_a_proj(tf.transpose(tf.constant(x), [1, 0, 2]))  # (g, N, R)
    assert _max_diff(tf.transpose(got, [1, 0, 2]), expected) < 1e-5


def test_grouped_kernel_assigns_both_ways():
    layer = _attention(1)
    view = GroupedKernel(layer.o_a_proj)
    value = np.random.default_rng(4).normal(size=view.shape).astype(np.float32)  # (HD/g, g*R)
    view.assign(value)
    np.testing.assert_array_equal(tf.convert_to_tensor(view).numpy(), value)
    np.testing.assert_array_equal(layer.o_a_proj.kernel.numpy()[1], value[:, 8:])
    view.assign_group(0, value[:, 8:])
    np.testing.assert_array_equal(layer.o_a_proj.kernel.numpy()[0], value[:, 8:])


def test_o_a_proj_takes_lora_and_int8():
    """Per-group LoRA starts at the same output and trains only the adapters; int8 stays
    close to float and the weight map reads its Q / s."""
    layer = _attention(1)
    x = _hidden()
    before = layer(x)
    layer.o_a_proj.enable_lora(2)
    assert _max_diff(layer(x), before) == 0.0
    assert [w.path.split("/")[-1] for w in layer.o_a_proj.trainable_weights] == [
        "lora_kernel_a", "lora_kernel_b"]
    assert tuple(layer.o_a_proj.lora_kernel_a.shape) == (2, 32, 2)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(layer(x)))
    grad_a, grad_b = tape.gradient(loss, layer.o_a_proj.trainable_weights)
    assert grad_a is not None and float(tf.reduce_max(tf.abs(grad_b))) > 0  # B = 0: dA = 0

    layer = _attention(1)
    float_kernel = tf.convert_to_tensor(GroupedKernel(layer.o_a_proj)).numpy()
    layer.o_a_proj.quantize("int8")
    assert layer.o_a_proj.kernel_variable().dtype == "int8"
    diff = _max_diff(layer(x), before)
    assert 0 < diff < 2e-2 * float(np.abs(before.numpy()).max())
    view = GroupedKernel(layer.o_a_proj)
    assert view.dtype == tf.float32
    assert _max_diff(tf.convert_to_tensor(view), float_kernel) < 1e-2 * np.abs(float_kernel).max()
    with pytest.raises(ValueError, match="is int8"):
        view.assign(float_kernel)


def test_wo_a_streams_group_by_group(tmp_path, monkeypatch):
    """A wo_a above the loader's block size is assigned one group (o_lora_rank rows) at a
    time; save -> load returns the same kernel (and the same outputs)."""
    from v4_random_model import random_v4_model

    model = random_v4_model(TINY, seed=5)
    v4_checkpoint.save_hf_checkpoint(model, str(tmp_path))
    monkeypatch.setattr(v4_checkpoint, "ASSIGN_BLOCK_BYTES", 64)  # every wo_a is 2 KiB
    calls = []
    original = GroupedKernel.assign_group
    monkeypatch.setattr(GroupedKernel, "assign_group",
                        lambda self, g, v: (calls.append(g), original(self, g, v)))
    loaded = v4_checkpoint.load_v4_checkpoint(str(tmp_path))
    assert calls == [0, 1] * TINY.num_hidden_layers
    for a, b in zip(model.decoder_layers, loaded.decoder_layers, strict=True):
        np.testing.assert_array_equal(a.self_attn.o_a_proj.kernel.numpy(),
                                      b.self_attn.o_a_proj.kernel.numpy())


# ----------------------------------------------------------------------------- indexer loss


def _non_indexer(layer):
    ids = {id(v) for v in layer.indexer.trainable_weights}
    return [v for v in layer.trainable_weights if id(v) not in ids]


def test_indexer_loss_default_output_unchanged_and_zero_without_indexer():
    x = _hidden()
    for layer_idx in (0, 2):  # sliding, HCA: no indexer
        layer = _attention(layer_idx)
        out, loss = layer(x, return_indexer_loss=True)
        assert loss.dtype == tf.float32 and float(loss) == 0.0
        assert _max_diff(out, layer(x)) == 0.0
    layer = _attention(1)
    out, loss = layer(x, return_indexer_loss=True)
    assert _max_diff(out, layer(x)) == 0.0
    assert loss.dtype == tf.float32 and loss.shape == () and float(loss) > 0
    cache = {}
    with pytest.raises(ValueError, match="return_indexer_loss is for the stateless"):
        layer(x, cache=cache, cache_index=0, return_indexer_loss=True)


def test_indexer_loss_is_the_kl_to_the_attention_mass_on_the_kept_entries():
    """The loss against a numpy recomputation from the layer's own pieces: the attention
    probabilities of the compressed columns summed over heads, renormalized over the picked
    entries, KL to the softmax of the index scores over the same entries, mean over the
    queries that have picks."""
    from models.deepseek_v4.attention import compressed_block_mask
    from models.deepseek_v4.ops import rope_cos_sin, sliding_window_mask

    layer = _attention(3, seed=2)
    x = _hidden(seed=3)
    _, loss = layer(x, return_indexer_loss=True)
    positions = tf.range(SEQ)
    cos, sin = rope_cos_sin(positions, layer.inv_freq)
    q_residual, q, kv = layer._queries_and_kv(x, cos, sin)
    entries = layer.compressor(x)  # (B, N, D)
    topk, scores = layer.indexer(x, q_residual, positions, return_scores=True)
    n = entries.shape[1]
    block = compressed_block_mask(positions, n, 4, 2, topk).numpy()  # (B, T, N)
    mask = tf.concat([tf.broadcast_to(sliding_window_mask(positions, positions, 6)[None],
                                      [2, SEQ, SEQ]), block], axis=-1)
    keys = tf.concat([kv, entries], axis=1)
    _, probs = layer._attend_and_project(q, keys, mask, cos, sin, False, return_probs=True)
    mass = probs.numpy()[..., SEQ:].sum(axis=1)  # (B, T, N)
    scores = scores.numpy()
    total, count = 0.0, 0
    for b in range(2):
        for t in range(SEQ):
            kept = block[b, t]
            if not kept.any():
                continue
            p = mass[b, t, kept] / mass[b, t, kept].sum()
            s = scores[b, t, kept]
            log_q = s - s.max() - np.log(np.exp(s - s.max()).sum())
            total += float((p * (np.log(p) - log_q)).sum())
            count += 1
    assert count == 2 * (SEQ - 3)  # queries 0..2 have no complete entry yet
    assert abs(float(loss) - total / count) < 1e-5


def test_indexer_loss_trains_only_the_indexer():
    layer = _attention(1, seed=4)
    x = _hidden(seed=5)
    with tf.GradientTape(persistent=True) as tape:
        out, loss = layer(x, return_indexer_loss=True)
        lm_like = tf.reduce_sum(tf.square(out))
    main = _non_indexer(layer)
    assert all(g is None for g in tape.gradient(loss, main))
    index_grads = tape.gradient(loss, layer.indexer.trainable_weights)
    moved = [g is not None and float(tf.reduce_max(tf.abs(g))) > 0 for g in index_grads]
    # The indexer's q path and weights_proj get a gradient; its compressor's keys too.
    names = [w.path for w in layer.indexer.trainable_weights]
    assert all(moved), [n for n, m in zip(names, moved, strict=True) if not m]
    # ... and the main output does not reach the indexer (its picks are integers).
    assert all(g is None for g in tape.gradient(lm_like, layer.indexer.trainable_weights))

    variables = layer.indexer.trainable_weights
    optimizer = keras.optimizers.SGD(learning_rate=5.0)  # tiny init: small scores, small grads
    first = float(loss)
    for _ in range(8):
        with tf.GradientTape() as tape:
            _, loss = layer(x, return_indexer_loss=True)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables, strict=True))
    _, last = layer(x, return_indexer_loss=True)
    assert float(last) < 0.5 * first, (first, float(last))  # 0.061 -> 0.017 measured


# ----------------------------------------------------------------------------- XLA


@pytest.mark.parametrize("layer_idx", [0, 1, 2])
def test_stateless_forward_compiles_with_xla(layer_idx):
    """tf.function(jit_compile=True) with a static (B, T) compiles the stateless forward
    (compressor windows, the indexer's top-k) and the indexer loss; equal to eager."""
    layer = _attention(layer_idx, seed=6)
    x = _hidden(seed=7)
    eager_out, eager_loss = layer(x, return_indexer_loss=True)

    @tf.function(jit_compile=True, input_signature=[tf.TensorSpec(x.shape, tf.float32)])
    def forward(h):
        return layer(h), layer(h, return_indexer_loss=True)

    out, (out2, loss) = forward(x)
    assert _max_diff(out, eager_out) < 1e-5
    assert _max_diff(out2, eager_out) < 1e-5
    assert abs(float(loss) - float(eager_loss)) < 1e-5


@pytest.mark.slow  # 18 s: compiling the whole model
def test_model_forward_train_compiles_with_xla():
    """The whole tiny model's forward_train (static-capacity MoE dispatch, the dropless one
    has data-dependent shapes) under jit_compile equals eager, indexer_loss included."""
    from v4_random_model import random_v4_model

    model = random_v4_model(TINY, seed=8)
    ids = tf.constant(np.random.default_rng(9).integers(0, TINY.vocab_size, (2, SEQ)), tf.int32)
    eager = model.forward_train(ids, training=False, moe_capacity_factor=2.0)

    @tf.function(jit_compile=True)
    def forward(t):
        return model.forward_train(t, training=False, moe_capacity_factor=2.0)

    compiled = forward(ids)
    assert _max_diff(compiled["logits"], eager["logits"]) < 1e-5
    assert float(eager["indexer_loss"]) > 0
    assert abs(float(compiled["indexer_loss"]) - float(eager["indexer_loss"])) < 1e-5
