"""Expert pruning round-trips into Hugging Face transformers.

tests/fixtures/hf_deepseek_v3_pruned/q_lora_keep4/ was made offline by its
`make_fixtures.py` (transformers + torch, float32): the `q_lora` checkpoint of
../fixtures/hf_deepseek_v3/ (8 routed experts in n_group 4 groups of 2, topk_group 2,
top-2, noaux_tc, an MTP layer) pruned to 4 experts in torch, the router load measured
by transformers' own router on `calibration_ids.npy`, saved with `save_pretrained`,
reloaded with `from_pretrained`, and its logits stored. Here only TensorFlow runs:
the same checkpoint goes through `load_hf_checkpoint` -> `expert_load` ->
`select_experts` -> `prune_experts` -> `save_hf_checkpoint` (what `deepseek-tfx prune`
does for a HF checkpoint), and the written files must be the ones transformers wrote:
same load, same kept experts, config.json read to the same values, the same tensors
bit for bit, and the same logits when our files are loaded back.

The MTP layer: transformers has no MTP module and drops the q_lora fixture's
`model.layers.3.*` tensors on load, so its pruned checkpoint has none. Ours keeps the
MTP block at layer 3, pruned by its own router load (measured by `expert_load`, which
runs the MTP module, with nothing in transformers to compare it to); transformers
reports those tensors as unexpected keys and ignores them, as it does for the released
DeepSeek-V3 checkpoints.
"""

import json
import pathlib
import types

import numpy as np
import pytest
import tensorflow as tf
from numerics import assert_float32_close
from safetensors.numpy import load_file

from models.deepseek import hf_checkpoint
from models.deepseek.expert_pruning import prune_experts, select_experts
from models.layers.expert_load import expert_load

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
SOURCE = FIXTURES / "hf_deepseek_v3" / "q_lora"
PRUNED = FIXTURES / "hf_deepseek_v3_pruned" / "q_lora_keep4"
KEEP = 4
MTP = "model.layers.3."  # the MTP layer of q_lora, at index num_hidden_layers


def _tensors(folder: pathlib.Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint folder, read by the `safetensors` library."""
    tensors = {}
    for f in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """The q_lora checkpoint pruned to 4 experts by our code, written as a HF checkpoint."""
    meta = json.loads((PRUNED / "fixture.json").read_text())
    model = hf_checkpoint.load_hf_checkpoint(str(SOURCE))
    load = expert_load(model, [np.load(PRUNED / "calibration_ids.npy")])  # one (8, 32) batch
    kept = select_experts(model.config, KEEP, load)
    pruned = prune_experts(model, KEEP, load)
    out = tmp_path_factory.mktemp("pruned")
    hf_checkpoint.save_hf_checkpoint(pruned, str(out))
    return types.SimpleNamespace(meta=meta, model=model, load=load, kept=kept, out=out)


def test_router_load_equals_transformers(ours):
    layers = ours.meta["layers"]  # the 2 main MoE layers (transformers runs no MTP)
    assert [layer["prefix"] for layer in layers] == ["model.layers.1", "model.layers.2"]
    # Integer counts, exact: the fixture's smallest margins between a chosen and an
    # unchosen group / expert score (>= 2.8e-4, fixture.json) are far above float32
    # rounding of a sigmoid of a 64-term dot product.
    np.testing.assert_array_equal(ours.load[:2], np.array([layer["load"] for layer in layers]))
    # 8 x 32 tokens, top-2: 512 routings per main layer; the MTP layer (depth 1) sees
    # the 31 positions that have a next token: 8 x 31 x 2 = 496.
    assert ours.load.sum(axis=1).tolist() == [512, 512, 496]


def test_kept_experts_equal_transformers(ours):
    for ours_kept, layer in zip(ours.kept[:2], ours.meta["layers"], strict=True):
        assert ours_kept.tolist() == layer["kept"]
    # Not the 4 most routed overall: layer 1's load [35, 61, 41, 23, 63, 90, 68, 131]
    # ranks 7, 5, 6, 4 first, but groups {0,1} {2,3} {4,5} {6,7} keep one each.
    assert ours.kept[0].tolist() == [1, 2, 5, 7]


def test_config_json_reads_as_transformers_pruned_config(ours):
    """transformers reading our config.json gets the values of its own pruned one."""
    mine = json.loads((ours.out / "config.json").read_text())
    theirs = json.loads((PRUNED / "config.json").read_text())
    defaults = ours.meta["config_defaults"]  # DeepseekV3Config's value for an absent key
    assert (theirs["n_routed_experts"], theirs["n_group"], theirs["topk_group"],
            theirs["num_experts_per_tok"]) == (4, 1, 1, 2)
    for key, value in theirs.items():
        if key == "transformers_version":
            continue
        if key == "dtype":  # transformers 5.x's name; ours writes the 4.x name, read alike
            assert mine.get("dtype", mine.get("torch_dtype")) == value
        elif key == "qk_head_dim":  # DeepseekV3Config sets it from these two, whatever is stored
            assert mine["qk_nope_head_dim"] + mine["qk_rope_head_dim"] == value
        elif key in defaults:  # a DeepseekV3Config field: what transformers computes with
            assert mine.get(key, defaults[key]) == value, key
        # else DeepSeek's own keys (topk_method, ep_size, seq_aux, ...): not
        # DeepseekV3Config fields, kept as plain attributes and unused by transformers.
    extra = set(mine) - set(theirs) - {"torch_dtype"}
    assert not extra & set(defaults), extra  # our training keys only, no field of theirs


def test_tensors_equal_transformers_save_pretrained(ours):
    mine, theirs = _tensors(ours.out), _tensors(PRUNED)
    main = {name: t for name, t in mine.items() if not name.startswith(MTP)}
    assert sorted(main) == sorted(theirs)
    for name, expected in theirs.items():
        assert main[name].dtype == expected.dtype == np.float32, name
        assert main[name].shape == expected.shape, name
        np.testing.assert_array_equal(main[name], expected, err_msg=name)


def test_mtp_layer_is_pruned_by_its_own_load(ours):
    """The MTP tensors, which transformers' checkpoint lacks: the source's, with the
    experts our MTP load keeps and the embedding and head of the main model."""
    mine, source = _tensors(ours.out), _tensors(SOURCE)
    mtp_kept = ours.kept[2]
    assert mtp_kept.tolist() == [0, 2, 4, 7]  # one per group, by the MTP layer's own load
    mtp = {name: t for name, t in mine.items() if name.startswith(MTP)}
    source_mtp = {name for name in source if name.startswith(MTP)}
    dropped = {f"{MTP}mlp.experts.{e}.{w}_proj.weight" for e in range(KEEP, 8)
               for w in ("gate", "up", "down")}
    assert set(mtp) == source_mtp - dropped
    for name, value in mtp.items():
        if ".mlp.experts." in name:
            new, tail = name.removeprefix(f"{MTP}mlp.experts.").split(".", 1)
            expected = source[f"{MTP}mlp.experts.{mtp_kept[int(new)]}.{tail}"]
        elif name.endswith(".mlp.gate.weight") or name.endswith("e_score_correction_bias"):
            expected = source[name][mtp_kept]
        elif name == f"{MTP}embed_tokens.weight":  # DeepSeek-V3 §2.2: shared with the main model
            expected = source["model.embed_tokens.weight"]
        elif name == f"{MTP}shared_head.head.weight":
            expected = source["lm_head.weight"]
        else:
            expected = source[name]
        np.testing.assert_array_equal(value, expected, err_msg=name)


def test_logits_of_our_export_equal_transformers(ours):
    reloaded = hf_checkpoint.load_hf_checkpoint(str(ours.out))
    assert (reloaded.config.n_routed_experts, reloaded.config.n_group) == (KEEP, 1)
    input_ids = np.load(PRUNED / "input_ids.npy")
    logits = reloaded(tf.constant(input_ids, tf.int32)).numpy()
    expected = np.load(PRUNED / "expected_logits.npy")
    # Two implementations (TF, torch) of the same float32 model: same weights, same
    # experts chosen, every sum possibly in another order. Per block about ten chained
    # reductions (q_a, q_b, kv_a, kv_b, scores, softmax, AV, o, router, SwiGLU,
    # down, 2 norms), 3 blocks plus the final norm and head: ~35 reductions of
    # n <= 128 terms, each adding about sqrt(n) ~ 11 ulps of its scale with random
    # sign (numerics.py): sqrt(35) * 11 ~ 65 ulps of max|logit| (3.3); allowed 256,
    # test_hf_parity's 1e-4 at this scale. One token routed to another expert moves its
    # logits by ~0.1 to 1 (1e5 ulps and more). Measured: ~5 ulps (unpruned q_lora: ~6).
    assert_float32_close(logits, expected, ulps=256, err_msg="our pruned export vs transformers")
    # Not vacuous: pruning changed the model's logits.
    assert np.abs(expected - np.load(SOURCE / "expected_logits.npy")).max() > 0.1
