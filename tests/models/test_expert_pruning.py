"""Expert pruning (models/deepseek/expert_pruning.py): the kept experts, the pruned
config, the refusals, and logits equal to the unpruned model whose router masks the
dropped experts out before the top-k."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close

from models.deepseek.causal_lm import DeepSeekCausalLM
from models.deepseek.config import DeepSeekConfig
from models.deepseek.expert_pruning import prune_experts, pruned_config, select_experts
from models.layers.expert_load import expert_load

V2_GREEDY = dict(topk_method="greedy", scoring_func="softmax", norm_topk_prob=False,
                 n_group=1, topk_group=1)
V2_GROUPED = dict(topk_method="group_limited_greedy", scoring_func="softmax",
                  norm_topk_prob=False, routed_scaling_factor=2.0, n_group=2, topk_group=1)
V3_TWO_PER_GROUP = dict(n_group=2, topk_group=1, routed_scaling_factor=2.5)


def _model(config, seed=0):
    """A tiny model with random router biases (so that the bias moves choices)."""
    keras.utils.set_random_seed(seed)
    model = DeepSeekCausalLM(config)
    rng = np.random.default_rng(seed)
    for moe in model.moe_layers:
        if moe.gate.e_score_correction_bias is not None:
            moe.gate.e_score_correction_bias.assign(
                rng.normal(0.0, 0.05, config.n_routed_experts).astype("float32"))
        # Larger router weights than the init's 0.02, so that choices are not near-ties.
        moe.gate.weight.assign(rng.normal(0.0, 0.5, moe.gate.weight.shape).astype("float32"))
    return model


def _batches(config, n=2, batch=2, seq=16, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, config.vocab_size, (batch, seq), dtype=np.int32) for _ in range(n)]


class MaskedRouter:
    """The unpruned router with the dropped experts masked out before the top-k.

    Sigmoid (noaux_tc): the dropped experts' biased scores are -inf; a group's score
    is the sum of its top-min(2, m) biased scores, m the experts it keeps (all groups
    keep m). Softmax (V2): the dropped experts' logits are -inf, so the scores are a
    softmax over the kept experts. Gating weights as the router's: the chosen
    unbiased scores, / their sum when norm_topk_prob, * routed_scaling_factor.
    Indices stay the original ones, so the unpruned model's experts run.
    """

    def __init__(self, gate, kept):
        self.gate, self.config = gate, gate.config
        mask = np.zeros(self.config.n_routed_experts, bool)
        mask[kept] = True
        self.mask = tf.constant(mask)

    def _top_groups(self, choice, group_score):
        c = self.config
        per_group = c.n_routed_experts // c.n_group
        grouped = tf.reshape(choice, [-1, c.n_group, per_group])  # (N, G, E/G)
        top = tf.math.top_k(group_score(grouped), k=c.topk_group).indices  # (N, topk_group)
        keep_group = tf.reduce_sum(tf.one_hot(top, c.n_group), axis=1) > 0  # (N, G)
        keep_expert = tf.reshape(tf.repeat(keep_group[:, :, None], per_group, axis=2),
                                 [-1, c.n_routed_experts])  # (N, E)
        return tf.where(keep_expert, choice, float("-inf"))

    def __call__(self, x):
        c = self.config
        logits = tf.matmul(tf.cast(x, tf.float32), self.gate.weight, transpose_b=True)  # (N, E)
        grouped = c.topk_method != "greedy" and c.n_group > 1
        if c.topk_method == "noaux_tc":
            scores = tf.sigmoid(logits)
            choice = tf.where(self.mask, scores + self.gate.e_score_correction_bias,
                              float("-inf"))  # (N, E)
            m = int(np.sum(self.mask.numpy())) // c.n_group
            if grouped:
                choice = self._top_groups(choice, lambda g: tf.reduce_sum(
                    tf.math.top_k(g, k=min(2, m)).values, axis=-1))
        else:
            scores = tf.nn.softmax(tf.where(self.mask, logits, float("-inf")), axis=-1)  # (N, E)
            choice = tf.where(self.mask, scores, float("-inf"))
            if grouped:
                choice = self._top_groups(choice, lambda g: tf.reduce_max(g, axis=-1))
        indices = tf.math.top_k(choice, k=c.num_experts_per_tok).indices  # (N, K)
        weights = tf.gather(scores, indices, batch_dims=1)  # (N, K)
        if c.norm_topk_prob:
            weights /= tf.reduce_sum(weights, axis=-1, keepdims=True) + 1e-20
        return tf.cast(indices, tf.int32), weights * c.routed_scaling_factor, scores


def _mask_router(model, kept):
    """Replaces every MoE layer's router of `model` with its MaskedRouter, in place
    (object.__setattr__: a plain callable, not tracked as a Keras sublayer)."""
    for moe, experts in zip(model.moe_layers, kept, strict=True):
        object.__setattr__(moe, "gate", MaskedRouter(moe.gate, experts))


# ------------------------------------------------------------------------ selection


def test_select_keeps_the_most_routed_ties_by_lower_index(tiny_config):
    config = tiny_config.replace(n_group=1, topk_group=1)
    load = np.array([[5, 9, 1, 9, 0, 5, 7, 5]], float)
    # Ranked: 1 (9), 3 (9), 6 (7), then 0, 5, 7 (5 each, lower index first), 2, 4.
    assert select_experts(config, 4, load)[0].tolist() == [0, 1, 3, 6]
    assert select_experts(config, 5, load)[0].tolist() == [0, 1, 3, 5, 6]


def test_select_per_group_under_group_limited_routing(tiny_config):
    # tiny_config: 8 experts, n_group 4 -> groups {0,1} {2,3} {4,5} {6,7}; keep 4 = 1 per group,
    # though the 4 most routed overall (6, 7, 4, 5) lie in two groups.
    load = np.array([[1, 2, 3, 0, 8, 9, 10, 11]], float)
    assert select_experts(tiny_config, 4, load)[0].tolist() == [1, 2, 5, 7]
    config = tiny_config.replace(n_group=2, topk_group=1)  # groups {0..3} {4..7}, 2 each
    assert select_experts(config, 4, load)[0].tolist() == [1, 2, 6, 7]


@pytest.mark.parametrize("changes, keep, message", [
    ({}, 6, "keep=6 must be a multiple of n_group=4"),
    ({}, 1, "keep=1 must be in [num_experts_per_tok=2, n_routed_experts=8]"),
    ({}, 9, "keep=9 must be in [num_experts_per_tok=2"),
    ({}, 2.0, "keep=2.0 must be an integer"),
    (dict(topk_group=1), 4,
     "keep=4 leaves topk_group * keep / n_group = 1 experts in a token's groups, fewer than "
     "num_experts_per_tok=2"),
])
def test_select_refuses_naming_the_value(tiny_config, changes, keep, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        select_experts(tiny_config.replace(**changes), keep, np.ones((2, 8)))


def test_select_refuses_a_bad_load(tiny_config):
    with pytest.raises(ValueError, match=r"load has shape \(2, 7\)"):
        select_experts(tiny_config, 4, np.ones((2, 7)))
    with pytest.raises(ValueError, match="finite and >= 0"):
        select_experts(tiny_config, 4, np.array([[np.nan] + [1.0] * 7]))


def test_greedy_pruned_config_drops_groups_that_no_longer_divide(tiny_config):
    config = tiny_config.replace(**{**V2_GREEDY, "n_group": 4, "topk_group": 2})  # groups unused by greedy
    assert select_experts(config, 6, np.ones((1, 8)))[0].tolist() == [0, 1, 2, 3, 4, 5]
    pruned = pruned_config(config, 6)
    assert (pruned.n_routed_experts, pruned.n_group, pruned.topk_group) == (6, 1, 1)
    assert pruned_config(config, 4).n_group == 4


def test_pruned_config_to_one_expert_per_group_drops_the_groups(tiny_config):
    # tiny_config: 8 experts in n_group 4, topk_group 2, top-2. Keeping 4 leaves groups of
    # one: the group limit keeps the 2 best experts and the top-2 takes both, the plain
    # top-2; transformers' router (topk(2) per group) raises on groups of one.
    pruned = pruned_config(tiny_config, 4)
    assert (pruned.n_routed_experts, pruned.n_group, pruned.topk_group) == (4, 1, 1)
    two_per_group = tiny_config.replace(**V3_TWO_PER_GROUP)  # 2 groups of 4
    assert (pruned_config(two_per_group, 4).n_group, pruned_config(two_per_group, 4).topk_group) \
        == (2, 1)


# ------------------------------------------------------------------------ the load


def test_expert_load_counts_every_routing(tiny_config):
    model = _model(tiny_config)
    batches = _batches(tiny_config)
    load = expert_load(model, batches)
    assert load.dtype == np.float64 and load.shape == (model.num_moe_layers, 8)  # (2, 8)
    # Main MoE block: 2 batches x 2 x 16 tokens x K=2 = 128; MTP depth 1: 2 x 2 x 15 x 2 = 120.
    np.testing.assert_array_equal(load.sum(axis=1), [128.0, 120.0])
    expected = sum(model.forward_train(tf.constant(b), training=False)["expert_load"].numpy()
                   for b in batches)
    np.testing.assert_array_equal(load, expected)
    with pytest.raises(ValueError, match="token_batches is empty"):
        expert_load(model, [])


# ------------------------------------------------------------------------ the pruned model


def test_pruned_model_config_weights_and_parameter_count(tiny_config):
    model = _model(tiny_config)
    load = expert_load(model, _batches(tiny_config))
    kept = select_experts(tiny_config, 4, load)
    pruned = prune_experts(model, 4, load)

    # 4 experts in 4 groups: groups of one, written as no groups (pruned_config).
    assert pruned.config == tiny_config.replace(n_routed_experts=4, n_group=1, topk_group=1)
    DeepSeekConfig.from_dict(pruned.config.to_dict())  # validates
    rebuilt = DeepSeekCausalLM.from_config(pruned.get_config())
    assert rebuilt.config == pruned.config
    # Each dropped expert: SwiGLU 3 * C * F = 3 * 32 * 16 = 1536, a router row of C = 32 and
    # a bias entry: 1569; 4 dropped in each of the 2 MoE layers (block 1, MTP block).
    assert model.count_params() - pruned.count_params() == 2 * 4 * 1569

    for old_moe, new_moe, experts in zip(model.moe_layers, pruned.moe_layers, kept, strict=True):
        np.testing.assert_array_equal(new_moe.gate.weight.numpy(),
                                      old_moe.gate.weight.numpy()[experts])
        np.testing.assert_array_equal(new_moe.gate.e_score_correction_bias.numpy(),
                                      old_moe.gate.e_score_correction_bias.numpy()[experts])
        for new_index, old_index in enumerate(experts):
            np.testing.assert_array_equal(new_moe.experts[new_index].down_proj.kernel.numpy(),
                                          old_moe.experts[old_index].down_proj.kernel.numpy())
    np.testing.assert_array_equal(pruned.embed_tokens.embeddings.numpy(),
                                  model.embed_tokens.embeddings.numpy())


@pytest.mark.parametrize("changes, keep", [
    ({}, 4),                      # noaux_tc, 4 groups keep 1 expert each, topk_group 2
    (V3_TWO_PER_GROUP, 4),        # noaux_tc, 2 groups keep 2 each, topk_group 1
    (dict(n_group=1, topk_group=1, norm_topk_prob=False), 6),  # noaux_tc, no groups
    (V2_GREEDY, 5),               # softmax, greedy
    (V2_GROUPED, 4),              # softmax, group_limited_greedy
], ids=["noaux_tc_4groups", "noaux_tc_2groups", "noaux_tc_ungrouped", "greedy",
        "group_limited_greedy"])
def test_pruned_logits_equal_the_masked_router(tiny_config, changes, keep):
    config = tiny_config.replace(**changes)
    model = _model(config)
    load = expert_load(model, _batches(config))
    kept = select_experts(config, keep, load)
    pruned = prune_experts(model, keep, load)

    ids = tf.constant(_batches(config, n=1, seed=7)[0])  # (2, 16), not the calibration tokens
    full_logits = model(ids).numpy()
    actual = pruned(ids).numpy()
    _mask_router(model, kept)
    expected = model(ids).numpy()
    # Not vacuous: masking changes the logits of the unpruned model.
    assert np.max(np.abs(expected - full_logits)) > 1e-3
    # Same experts chosen (kept experts keep their order, so the dispatch sums in the same
    # order); only the router's arithmetic may differ. Each router logit is a dot product
    # of C = 32 terms, over keep rows here and E = 8 rows in the reference, which a kernel
    # may block differently: up to C = 32 ulps (numerics.py); a softmax adds its sum of
    # up to E = 8 terms: a gating weight within 40 ulps, relative. That error enters the
    # residual stream of each MoE block (1 main block; `call` runs no MTP) and reaches the
    # logits through the final norm and the head, a sum of C = 32 terms: 40 + 32 = 72,
    # doubled for the routed and residual paths adding in another order: ~150; allowed 256.
    # Measured here: 0 ulps for the sigmoid routers, about 1 for the softmax ones.
    assert_float32_close(actual, expected, ulps=256, err_msg="pruned vs masked logits")


def test_keeping_every_expert_changes_nothing(tiny_config):
    model = _model(tiny_config)
    load = expert_load(model, _batches(tiny_config))
    same = prune_experts(model, tiny_config.n_routed_experts, load)
    assert same.config == tiny_config
    for old, new in zip(model.weights, same.weights, strict=True):
        np.testing.assert_array_equal(new.numpy(), old.numpy(), err_msg=old.path)
    ids = tf.constant(_batches(tiny_config, n=1, seed=7)[0])
    np.testing.assert_array_equal(same(ids).numpy(), model(ids).numpy())


def test_pruning_keeps_the_dtype_policy(tiny_config):
    keras.utils.set_random_seed(0)
    model = DeepSeekCausalLM(tiny_config, dtype="bfloat16")
    load = expert_load(model, _batches(tiny_config, n=1))
    pruned = prune_experts(model, 4, load)
    assert pruned.dtype_policy.name == "bfloat16"
    kept = select_experts(tiny_config, 4, load)[0]
    old, new = model.moe_layers[0], pruned.moe_layers[0]
    assert new.experts[0].up_proj.kernel.dtype == "bfloat16"
    np.testing.assert_array_equal(new.experts[1].up_proj.kernel.numpy(),
                                  old.experts[kept[1]].up_proj.kernel.numpy())
    np.testing.assert_array_equal(new.gate.weight.numpy(), old.gate.weight.numpy()[kept])
