"""`deepseek-tfx prune` on a tiny text SavedModel (no pipeline run): the router load is
measured on text, the pruned HF checkpoint has the kept experts' weights and the new
n_routed_experts, and hf-import reads it back."""

import json

import numpy as np
import pytest

import cli

UNITS = {"the": 40, " the": 60, " quick": 12, " brown": 9, " fox": 9, " jumps": 5, " over": 7,
         "\n\n": 10}
TEXT = "the quick brown fox jumps over the the fox\n\nthe brown the quick over\n\n" * 20


# Slow: the module's fixture builds, exports and imports a 2-block MoE model (~10 s), and
# the first test prunes and re-imports it (~9 s).
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_text_model(tmp_path_factory):
    """The `tiny` preset without MTP: block 0 dense, block 1 MoE (8 experts, 4 groups)."""
    import dataclasses

    import keras

    from config import GenerationConfig, get_config
    from models.deepseek.causal_lm import DeepSeekCausalLM
    from savedmodel.export import save_text_model
    from tokenization.byte_level_bpe import ByteLevelBpe
    from tokenization.tokenizer import learn

    keras.utils.set_random_seed(0)
    config = dataclasses.replace(get_config("tiny").model, num_nextn_predict_layers=0)
    model = DeepSeekCausalLM(config)
    rng = np.random.default_rng(0)
    gate = model.moe_layers[0].gate
    gate.weight.assign(rng.normal(0.0, 0.5, gate.weight.shape).astype("float32"))
    out = tmp_path_factory.mktemp("prune") / "saved"
    save_text_model(model, ByteLevelBpe(learn(UNITS, 300).json),
                    GenerationConfig(max_new_tokens=4), str(out))
    return out, gate.weight.numpy(), model.moe_layers[0].experts


def test_prune_writes_the_kept_experts_and_imports_back(moe_text_model, tmp_path, capsys):
    from models.deepseek.hf_checkpoint import load_hf_checkpoint

    saved, gate_weight, experts = moe_text_model
    (tmp_path / "data.txt").write_text(TEXT)
    out = tmp_path / "pruned"
    assert cli.main(["prune", "--model", str(saved), "--keep-experts", "4", "--data",
                     str(tmp_path / "data.txt"), "--output", str(out), "--seq-len", "32"]) == 0
    printed = capsys.readouterr().out
    assert "kept 4 of 8 routed experts" in printed

    summary = json.loads((out / "expert_pruning.json").read_text())
    (layer,) = summary["layers"]  # one MoE layer
    # Every token routes to num_experts_per_tok = 2 experts.
    assert sum(layer["load"]) == 2 * summary["tokens"] > 0
    kept = layer["kept"]
    assert len(kept) == 4 and [e // 2 for e in kept] == [0, 1, 2, 3]  # one per group
    assert json.loads((out / "config.json").read_text())["n_routed_experts"] == 4
    assert (out / "tokenizer.json").is_file()

    pruned = load_hf_checkpoint(str(out))
    moe = pruned.moe_layers[0]
    np.testing.assert_array_equal(moe.gate.weight.numpy(), gate_weight[kept])
    for new_index, old_index in enumerate(kept):
        np.testing.assert_array_equal(moe.experts[new_index].gate_proj.kernel.numpy(),
                                      experts[old_index].gate_proj.kernel.numpy())
    assert cli.main(["hf-import", str(out), str(tmp_path / "saved_pruned")]) == 0


def test_prune_refuses_with_the_reason(moe_text_model, tmp_path):
    saved, _, _ = moe_text_model
    (tmp_path / "data.txt").write_text(TEXT)
    with pytest.raises(SystemExit, match="--keep-experts 6: keep=6 must be a multiple of "
                       "n_group=4"):
        cli.main(["prune", "--model", str(saved), "--keep-experts", "6", "--data",
                  str(tmp_path / "data.txt"), "--output", str(tmp_path / "out")])


def test_prune_reads_a_hf_checkpoint(moe_text_model, tmp_path):
    """hf-export's directory as --model: pruned (here to all 4 experts of a 4-expert
    model, so every weight must come back unchanged), with its tokenizer and token ids."""
    from models.deepseek.hf_checkpoint import load_hf_checkpoint

    saved, _, _ = moe_text_model
    (tmp_path / "data.txt").write_text(TEXT)
    assert cli.main(["prune", "--model", str(saved), "--keep-experts", "4", "--data",
                     str(tmp_path / "data.txt"), "--output", str(tmp_path / "a")]) == 0
    assert cli.main(["prune", "--model", str(tmp_path / "a"), "--keep-experts", "4",
                     "--data", str(tmp_path / "data.txt"), "--output", str(tmp_path / "b")]) == 0
    first, second = (load_hf_checkpoint(str(tmp_path / d)) for d in "ab")
    for w1, w2 in zip(first.weights, second.weights, strict=True):
        np.testing.assert_array_equal(w1.numpy(), w2.numpy(), err_msg=w1.path)
    config_a = json.loads((tmp_path / "a" / "config.json").read_text())
    config_b = json.loads((tmp_path / "b" / "config.json").read_text())
    assert config_b == config_a and "eos_token_id" in config_b
    assert (tmp_path / "b" / "tokenizer.json").read_text() == \
        (tmp_path / "a" / "tokenizer.json").read_text()


def test_prune_measures_the_load_on_chinese_text(moe_text_model, chinese_poems, tmp_path, capsys):
    """Tang and Song poems as the calibration text: every document is measured, tokenized
    with the model's byte-level tokenizer (Chinese falls back to bytes, losslessly)."""
    from tokenizers import Tokenizer

    saved, _, _ = moe_text_model
    poems = [p for p in chinese_poems if "\n\n" not in p][:40]
    (tmp_path / "poems.txt").write_text("\n\n".join(poems) + "\n", encoding="utf-8")
    out = tmp_path / "pruned_zh"
    assert cli.main(["prune", "--model", str(saved), "--keep-experts", "4", "--data",
                     str(tmp_path / "poems.txt"), "--output", str(out), "--seq-len", "32"]) == 0
    summary = json.loads((out / "expert_pruning.json").read_text())
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    documents = [p + "\n" for p in poems]  # a document keeps its line's end
    encoded = [tokenizer.encode(d, add_special_tokens=False).ids for d in documents]
    assert [tokenizer.decode(ids) for ids in encoded] == documents  # lossless on Chinese
    stream = 1 + sum(len(ids) + 1 for ids in encoded) - 1  # [EOS] p1 [EOS] p2 ... pN
    assert summary["tokens"] == (stream // 32) * 32 > 0  # every full window of the text
    (layer,) = summary["layers"]
    assert sum(layer["load"]) == 2 * summary["tokens"]
