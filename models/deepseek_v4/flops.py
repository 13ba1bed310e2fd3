"""Training and decoding FLOPs per token of a DeepSeek-V4 model (the MFU numerator).

The convention of `models/deepseek/flops.py` (nanoGPT `estimate_mfu`, from the PaLM paper,
arXiv 2204.02311, appendix B), which the Trainer's MFU uses
(`components/trainer/train_loop.py`): a matmul costs 2 FLOPs per multiply-add forward and
4 backward, so a weight used once per token costs 6 FLOPs per trained token, and the
activation-by-activation products (attention, the mHC mixes) cost 3 x their forward FLOPs.
With T = seq_len, C = hidden_size, H = num_attention_heads, D = head_dim, n = hc_mult,
nI / DI = index_n_heads / index_head_dim, m = a layer's compress rate, W = sliding_window,
k = index_topk:

    flops_per_token(T) = 6 N_active + 3 A(T) + 3 M + 3 P + 3 I(T)

  N_active   `activated_params`: every parameter a token multiplies by (DeepSeek's published
             convention, `memory_plan.parameter_summary(config).activated`): the projections
             wq_a, wq_b, wkv, the grouped wo_a (g blocks of H D / g x Ro) and wo_b; the CSA /
             HCA compressors' wkv and wgate and the indexer's compressor, wq_b and
             weights_proj; the mHC `fn` matrices (n(2+n) x nC, twice per block, and hc_head's
             n x nC); the router, K of E routed experts and the shared expert; the head; the
             norms and other vectors. Not the embedding (a row lookup). With MTP (training),
             each depth's own parameters plus its use of the head.
  A(T)       attention, forward, per token: 4 H D per key (q.k and a.v, each 2 H D: one shared
             key = value head of width D), over the keys the query attends
             (`attended_keys`, DeepSeek-V4 paper §2.3):
               sliding layer   min(T, W)
               CSA layer       min(T, W) + min(T // m, k)       (the indexer's top-k entries)
               HCA layer       min(T, W) + T // m'              (every compressed entry)
             Like the V3 formula, every token is charged the keys of position T (full, not
             causal).
  I(T)       the lightning indexer of each CSA layer, forward: 2 nI (DI + 1) per compressed
             key over all T // m keys (q^I . K^I per head, then the weighted sum over heads;
             paper eq. 16, as `models/deepseek/flops.py` counts V3.2's). Trained (x3): the
             indexer has its own loss (V3.2's KL towards the main attention), so its
             parameters are in N_active at 6 and its scores at 3 x forward.
  M          the mHC mixes of each sub-block (attention and MoE), forward, per token
             (`hyper_connection.py`, paper §2.2): the collapse sum_j pre_j X_j, 2 n C, and the
             expansion X'_k = post_k y + sum_j comb_jk X_j, 2 n (n + 1) C: 2 n (n + 2) C per
             sub-block; hc_head's collapse 2 n C; Sinkhorn 4 n^2 t_max per sub-block (t_max =
             hc_sinkhorn_iters: a row and a column normalization of n x n per iteration).
  P          the compressors' pooling, forward, per token: the softmax-weighted sum of each
             projected slot, 2 coff w (coff = 2 for CSA's overlapping windows, 1 for HCA;
             w = D for the attention's compressor, DI for the indexer's).

The elementwise work (norms, RoPE, softmax, SwiGLU, routing) is not counted, as in the V3
formula. `counted="computed"` charges the attention what this implementation's stateless
training path executes instead, by `attn_implementation`: "sparse" (`sparse_attention.py`)
2W window keys per query (blocks of W queries against 2W keys) plus the k gathered CSA
picks or all T // m' HCA entries; "dense" (`attention.py`) a score matrix over all T
tokens under the sliding-window mask, plus all T // m entries of CSA / HCA layers under
the block mask: T keys per query in sliding layers and T + T // m in CSA / HCA layers. "attended" (the default) is the model's work, the figure to
compare across implementations and with V3's; "computed" is what the CPU runs here, so
that MFU against it says how busy the hardware was.

The pieces (`attended_keys`, `attention_forward_flops`, `mix_forward_flops`,
`decode_flops_per_token`) live in `memory_plan.py`, whose planner uses them (it cannot import
this module: `models.deepseek_v4` has no import cycles), and are re-exported here.
This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

from models.deepseek_v4 import memory_plan
from models.deepseek_v4.config import DeepSeekV4Config
from models.deepseek_v4.memory_plan import (
    COUNTED,
    attended_keys,
    attention_forward_flops,
    decode_flops_per_token,
    mix_forward_flops,
)

__all__ = ["COUNTED", "activated_params", "attended_keys", "attention_forward_flops",
           "decode_flops_per_token", "flops_per_token", "mix_forward_flops"]


def activated_params(config: DeepSeekV4Config, include_mtp: bool = False) -> int:
    """Parameters one token multiplies by (`memory_plan.parameter_summary(config).activated`:
    all but the unchosen routed experts and the embedding). With include_mtp, adds each MTP
    depth's own activated parameters and its use of the head (vocab_size x hidden_size)."""
    c = config
    s = memory_plan.parameter_summary(c)
    n = s.activated
    if include_mtp and c.num_nextn_predict_layers:
        n += s.mtp_activated + c.num_nextn_predict_layers * c.vocab_size * c.hidden_size
    return n


def flops_per_token(config: DeepSeekV4Config, seq_len: int, include_mtp: bool = True,
                    counted: str = "attended") -> int:
    """Training FLOPs per token: 6 N_active + 3 (A(T) + I(T) + M + P) (module docstring).

    Args:
      config: the model.
      seq_len: T, the training sequence length.
      include_mtp: count the `num_nextn_predict_layers` MTP depths (sliding-window blocks,
        `memory_plan.MTP_LAYER_TYPE`, each with its own use of the head), as the V3 formula
        does by default; no effect without MTP.
      counted: "attended" (the model's work) or "computed" (this implementation's dense
        masked attention), see the module docstring.

    Raises:
      ValueError: if seq_len < 1 or `counted` is unknown.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len={seq_len!r} must be an integer >= 1")
    c = config
    return (6 * activated_params(c, include_mtp)
            + 3 * attention_forward_flops(c, seq_len, counted, include_mtp)
            + 3 * mix_forward_flops(c, include_mtp))
