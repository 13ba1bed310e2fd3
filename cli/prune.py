"""`deepseek-tfx prune`: keep the most-routed experts of every MoE layer
(`models/deepseek/expert_pruning.py`, Lu et al. 2024, arXiv 2402.14800).

  deepseek-tfx prune --model DIR --keep-experts N --data PATH --output DIR
                     [--seq-len N] [--max-tokens N]

--model is a SavedModel (a pushed serving dir: its newest version; or an hf-import) or
a Hugging Face checkpoint directory (config.json + safetensors + tokenizer.json). The
router load is measured with the model's own router on `--data` (text files, read
into documents with the run's data config as `evaluate` reads them), tokenized with
the model's own tokenizer, in windows of `--seq-len` tokens. The pruned model is
written as a HF checkpoint (`hf-export`'s files: config.json with the new
n_routed_experts, safetensors, tokenizer and generation config) plus
`expert_pruning.json` (the kept experts and the measured load of each MoE layer);
`hf-import` turns it into a SavedModel.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil

from cli import quiet_commands
from cli.data import split_data_path
from cli.model_dir import resolve_model_dir
from common import memory

PRUNING_FILE = "expert_pruning.json"
DEFAULT_MAX_TOKENS = 65536
DEFAULT_SEQ_LEN = 256
WINDOWS_PER_BATCH = 8


def _is_hf_dir(path: str) -> bool:
    return (os.path.isfile(os.path.join(path, "config.json"))
            and not os.path.isfile(os.path.join(path, "saved_model.pb")))


def token_windows(docs: list[list[int]], eos_id: int, seq_len: int, max_tokens: int):
    """`[EOS] d1 [EOS] d2 ...` cut at `max_tokens`, in int32 (B, seq_len) batches of
    WINDOWS_PER_BATCH full windows (a stream shorter than one window is one window)."""
    import numpy as np

    from savedmodel.scoring import token_stream

    stream = token_stream(docs, max_tokens, eos_id=eos_id)[:max_tokens]  # (S,) int32
    seq_len = min(seq_len, len(stream))
    n = len(stream) // seq_len
    windows = stream[: n * seq_len].reshape(n, seq_len)  # (n, seq_len)
    return [np.ascontiguousarray(windows[i : i + WINDOWS_PER_BATCH])
            for i in range(0, n, WINDOWS_PER_BATCH)]


def prune_model_dir(model: str, keep: int, data: str, out_dir: str, *,
                    seq_len: int | None = None, max_tokens: int = DEFAULT_MAX_TOKENS) -> dict:
    """Measures the router load of `model` on `data`, keeps `keep` experts per MoE layer
    and writes the pruned model to `out_dir` as a HF checkpoint.

    Args:
      model: a SavedModel directory (or a serving dir) or a HF checkpoint directory.
      keep: routed experts kept per MoE layer.
      data: a text file, directory or glob (`--data`).
      out_dir: where the HF checkpoint and PRUNING_FILE go.
      seq_len: window length; default min(the run's train.seq_len or DEFAULT_SEQ_LEN,
        max_position_embeddings).
      max_tokens: tokens measured at most.

    Returns:
      The PRUNING_FILE's content: {"keep", "n_routed_experts" (before), "tokens",
      "seq_len", "layers": [{"kept": [...], "load": [...]} per MoE layer]}.

    Raises:
      SystemExit: one line: no tokenizer, no documents, or a refusal of
        `select_experts` (keep not a multiple of n_group, ...).
    """
    import numpy as np
    import tensorflow_text  # noqa: F401  (the tokenizer's regex_split)

    from models.deepseek.expert_pruning import prune_experts, select_experts
    from models.layers.expert_load import expert_load

    hf = _is_hf_dir(model)
    model_dir = model if hf else resolve_model_dir(model)
    tokenizer, pipeline = _model_tokenizer(model_dir, hf)
    docs = _tokenized_documents(data, tokenizer, pipeline)

    lm, weight_dtype = _load_model(model_dir, hf)
    c = lm.config
    if seq_len is None:
        seq_len = pipeline.train.seq_len if pipeline else DEFAULT_SEQ_LEN
    seq_len = min(seq_len, c.max_position_embeddings)
    batches = token_windows(docs, tokenizer.eos_id, seq_len, max_tokens)
    if lm.num_moe_layers == 0:
        raise SystemExit(f"error: prune: {model_dir} has no MoE layer")
    try:  # refuse a bad --keep-experts before measuring
        select_experts(c, keep, np.zeros((lm.num_moe_layers, c.n_routed_experts)))
    except ValueError as e:
        raise SystemExit(f"error: prune: --keep-experts {keep}: {e}") from e
    load = expert_load(lm, batches)
    kept = select_experts(c, keep, load)
    pruned = prune_experts(lm, keep, load)
    del lm
    memory.release_free_memory()

    _save_pruned(pruned, model_dir, out_dir, hf, weight_dtype, tokenizer)
    summary = {
        "keep": int(keep), "n_routed_experts": c.n_routed_experts,
        "tokens": int(sum(b.size for b in batches)), "seq_len": int(batches[0].shape[1]),
        "layers": [{"kept": k.tolist(), "load": row.tolist()}
                   for k, row in zip(kept, load, strict=True)],
    }
    with open(os.path.join(out_dir, PRUNING_FILE), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


def _model_tokenizer(model_dir: str, hf: bool):
    """(tokenizer, the run's PipelineConfig or None) of `model_dir`: a HF checkpoint's
    tokenizer.json (no config), or a SavedModel's tokenizer and pipeline config.

    Raises:
      SystemExit: `model_dir` has no tokenizer.
    """
    from savedmodel.layout import read_pipeline_config, read_tokenizer
    from tokenization.byte_level_bpe import TOKENIZER_FILE, ByteLevelBpe

    if hf:
        path = os.path.join(model_dir, TOKENIZER_FILE)
        tokenizer = ByteLevelBpe.from_file(path) if os.path.isfile(path) else None
        pipeline = None
    else:
        tokenizer, pipeline = read_tokenizer(model_dir), read_pipeline_config(model_dir)
    if tokenizer is None:
        raise SystemExit(f"error: prune: {model_dir} has no tokenizer: the load is measured "
                         "on text")
    return tokenizer, pipeline


def _tokenized_documents(data: str, tokenizer, pipeline) -> list[list[int]]:
    """The token ids of each document of `data` (a text file, directory or glob), read
    with the run's data config (`DataConfig()` without one), rejected ones left out.

    Raises:
      SystemExit: `data` holds no documents.
    """
    import tensorflow as tf

    from config import DataConfig
    from corpus.documents import read_documents
    from tokenization.byte_pair_encoder import BytePairEncoder

    input_base, pattern = split_data_path(data)
    files = sorted(p for p in tf.io.gfile.glob(os.path.join(input_base, pattern))
                   if not tf.io.gfile.isdir(p))
    data_config = pipeline.data if pipeline else DataConfig()
    texts = [d.text for path in files for d in read_documents(path, path, data_config)
             if not d.reject_reason and d.text]
    if not texts:
        raise SystemExit(f"error: prune: --data {data}: no documents")
    encoder = BytePairEncoder(tokenizer.pre_tokenizer_config, tokenizer.added_tokens, tokenizer)
    return [row.tolist() for i in range(0, len(texts), 64)
            for row in encoder.encode(tf.constant(texts[i : i + 64])).numpy()]


def _load_model(model_dir: str, hf: bool):
    """(the model, the HF checkpoint's weight dtype or None for a SavedModel): a HF
    checkpoint in its own precision, as hf-import reads it."""
    from models.deepseek import hf_checkpoint
    from savedmodel.hf_interop import checkpoint_weight_dtype, load_model_from_savedmodel
    from savedmodel.precision import keras_policy

    if not hf:
        return load_model_from_savedmodel(model_dir), None
    weight_dtype = checkpoint_weight_dtype(model_dir)
    lm = hf_checkpoint.load_hf_checkpoint(model_dir, dtype=keras_policy(weight_dtype))
    return lm, weight_dtype


def _save_pruned(pruned, model_dir: str, out_dir: str, hf: bool, weight_dtype,
                 tokenizer) -> None:
    """Writes `pruned` to `out_dir` as a HF checkpoint: a HF input's own files beside it
    (tokenizer, generation config) and its token ids in config.json, as hf-export
    writes them; a SavedModel input through `hf_export`."""
    from common.json_file import read_json, write_json
    from models.deepseek import hf_checkpoint
    from savedmodel.hf_generation import token_ids
    from savedmodel.hf_interop import hf_export

    if hf:
        hf_checkpoint.save_hf_checkpoint(pruned, out_dir, dtype=weight_dtype)
        for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if os.path.isfile(os.path.join(model_dir, name)):
                shutil.copy(os.path.join(model_dir, name), out_dir)
        config_path = os.path.join(out_dir, "config.json")  # the token ids, as hf-export
        write_json(config_path, {**read_json(config_path, "the pruned config.json"),
                                 **token_ids(tokenizer)})
    else:
        hf_export(model_dir, out_dir, model=pruned)


def cmd_prune(args: argparse.Namespace) -> int:
    """Prints the kept experts' share of the measured routings per MoE layer."""
    memory.use_system_allocator()  # before TensorFlow loads: see common/memory.py
    if args.keep_experts < 1 or args.max_tokens < 1:
        raise SystemExit("error: prune: --keep-experts and --max-tokens must be >= 1")
    summary = prune_model_dir(args.model, args.keep_experts, args.data, args.output,
                              seq_len=args.seq_len, max_tokens=args.max_tokens)
    print(f"kept {summary['keep']} of {summary['n_routed_experts']} routed experts per MoE "
          f"layer (load measured on {summary['tokens']} tokens): "
          f"{os.path.abspath(args.output)}")
    for i, layer in enumerate(summary["layers"]):
        total = sum(layer["load"]) or 1.0
        share = sum(layer["load"][e] for e in layer["kept"]) / total
        print(f"  MoE layer {i}: experts {layer['kept']} took {share:.1%} of the routings")
    return 0


def add_parsers(sub) -> None:
    """Registers `prune` on `sub`, the top-level parser's `add_subparsers()`."""
    p = sub.add_parser("prune", help="keep the most-routed experts of each MoE layer "
                       "(router load measured on --data) -> HF checkpoint")
    p.add_argument("--model", required=True, help="a SavedModel (or serving dir: its newest "
                   "version) or a HF checkpoint dir with tokenizer.json")
    p.add_argument("--keep-experts", type=int, required=True,
                   help="routed experts kept per MoE layer (a multiple of n_group under "
                   "group-limited routing)")
    p.add_argument("--data", required=True, help="text to measure the router load on: a "
                   "file, directory or glob (e.g. the run's held-out text)")
    p.add_argument("--output", required=True, help="where the pruned HF checkpoint and "
                   f"{PRUNING_FILE} are written")
    p.add_argument("--seq-len", type=int, default=None,
                   help=f"window length (default the run's train.seq_len, else "
                   f"{DEFAULT_SEQ_LEN})")
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"tokens measured at most (default {DEFAULT_MAX_TOKENS})")
    quiet_commands.add_arguments(p, "prune")
    p.set_defaults(fn=cmd_prune)
