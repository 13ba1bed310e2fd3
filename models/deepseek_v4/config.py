"""DeepSeekV4Config: the single source of truth for a DeepSeek-V4-style model.

Field names and meanings follow transformers 5.24 `DeepseekV4Config`
(`models/deepseek_v4/configuration_deepseek_v4.py`), so a config.json maps field
by field (`hf_config.py` does the mapping, including the nested `rope_parameters`
and the legacy keys transformers folds in). Three training-rule fields that HF
lacks follow `DeepSeekConfig` (DeepSeek-V3 paper arXiv 2412.19437):
`router_bias_update_speed`, `aux_loss_alpha`, `mtp_loss_weight`.

Differences from `DeepSeekConfig` (DeepSeek-V4 paper §2):
  * every layer is MoE (no dense first layers); `mlp_layer_types` picks hash
    routing ("hash_moe", a frozen token-id -> expert-id table) or learned top-k
    routing ("moe") per layer;
  * attention has one shared KV head of width `head_dim` (no `kv_lora_rank`), a
    sliding window of `sliding_window` keys, and per `layer_types` entry either
    nothing more ("sliding_attention"), compressed sparse attention
    ("compressed_sparse_attention", CSA, compress rate m, overlapping windows,
    lightning indexer top-`index_topk`) or heavily compressed attention
    ("heavily_compressed_attention", HCA, compress rate m', no overlap);
  * RoPE: the trailing `qk_rope_head_dim` dims of each head, interleaved pairs;
    sliding layers use plain RoPE at `rope_theta`, CSA/HCA layers (and their
    compressors / indexer) RoPE at `compress_rope_theta` with `rope_scaling`
    (YaRN, cos/sin NOT multiplied by YaRN's mscale: `attention_factor` 1.0);
  * the residual is `hc_mult` streams mixed by manifold-constrained
    hyper-connections (mHC, §2.2);
  * multi-token prediction (`mtp.py`, DeepSeek-V3 §2.2 as DeepSeek's V4 release builds
    it) runs `num_nextn_predict_layers` extra V4 blocks at layer indices
    num_hidden_layers, num_hidden_layers + 1, ...: sliding-window attention (the
    release's `compress_ratios` gives its MTP block 0, i.e. sliding) and a score-routed
    MoE ("moe": the release hash-routes only layers below `num_hash_layers`); see
    `mtp_block_config`.

This module imports neither TensorFlow nor Keras.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from models.layers.config_checks import check_float, check_int, check_keep_range
from models.layers.model_config import ModelConfig
from models.layers.rope_scaling import normalize_rope_scaling

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"
HCA = "heavily_compressed_attention"
LAYER_TYPES = (SLIDING, CSA, HCA)
MLP_LAYER_TYPES = ("hash_moe", "moe")
# Router score functions the transformers reference supports through ACT2FN (elementwise).
SCORING_FUNCS = ("sqrtsoftplus", "sigmoid")
# `attn_implementation` values: the gathered path, and the masked reference.
ATTN_IMPLEMENTATIONS = ("sparse", "dense")
DEFAULT_COMPRESS_RATES = {CSA: 4, HCA: 128}
DEFAULT_NUM_HASH_LAYERS = 3  # transformers `default_num_hash_layers`
# The blocks of the MTP depths (DeepSeek's V4 release: `compress_ratios` ends with 0 for its
# MTP block, and its gate hashes only layer ids below `n_hash_layers`).
MTP_LAYER_TYPE = SLIDING
MTP_MLP_LAYER_TYPE = "moe"


@dataclasses.dataclass(frozen=True)
class DeepSeekV4Config(ModelConfig):
    """Hyper-parameters of a DeepSeek-V4 causal language model.

    Defaults describe a small model that runs on a CPU; `layer_types=None` and
    `mlp_layer_types=None` take transformers' default schedules (2 x HCA then
    HCA/CSA alternating; 3 x hash_moe then moe), `compress_rates=None` takes
    {CSA: 4, HCA: 128}. The stored values are always filled in (tuples / dict).

    Attributes:
      vocab_size: number of token ids.
      hidden_size: model width C.
      moe_intermediate_size: width F of each routed expert and of the one shared expert.
      num_hidden_layers: decoder blocks L (MTP blocks not included).
      num_attention_heads: query heads n_h (one shared KV head).
      head_dim: per-head width of q, the shared KV and the attention output.
      q_lora_rank: query compression rank d_c (q_a -> q_norm -> q_b).
      qk_rope_head_dim: trailing rotary dims of each head (even, <= head_dim and
        <= index_head_dim); transformers stores `partial_rotary_factor` =
        qk_rope_head_dim / head_dim.
      n_routed_experts: routed experts N_r per layer.
      n_shared_experts: shared experts; the reference builds exactly one, so must be 1.
      num_experts_per_tok: routed experts per token K_r (also the `tid2eid` width).
      scoring_func: router score function, "sqrtsoftplus" (sqrt(softplus(x))) or "sigmoid".
      norm_topk_prob: the reference always normalizes the chosen weights; must be True.
      routed_scaling_factor: multiplies the normalized routed weights.
      rope_theta: RoPE base of sliding-window layers ("main" rope).
      compress_rope_theta: RoPE base of CSA/HCA layers ("compress" rope).
      rope_scaling: YaRN dict (HF keys) for the compress rope, or None; stored in
        `rope_scaling.normalize_rope_scaling`'s canonical form with
        `attention_factor` 1.0 unless given (as transformers' V4 config does).
      max_position_embeddings: longest context.
      layer_types: per-layer attention type (LAYER_TYPES), length num_hidden_layers.
      compress_rates: {CSA: m, HCA: m'} compress rates (tokens per compressed entry).
      hc_mult: mHC streams n_hc (>= 1).
      hc_sinkhorn_iters: Sinkhorn-Knopp iterations t_max (>= 1).
      hc_eps: floor added in the mHC weights and Sinkhorn normalizations.
      mlp_layer_types: per-layer MoE routing ("hash_moe" | "moe").
      swiglu_limit: clamp of the expert SwiGLU pre-activations (gate <= limit,
        -limit <= up <= limit), routed and shared experts.
      sliding_window: window n_win of the sliding branch.
      o_groups: head groups g of the grouped output projection (divides n_h).
      o_lora_rank: per-group intermediate width d_g of the grouped output projection.
      index_n_heads, index_head_dim, index_topk: lightning indexer heads, head
        width and kept compressed entries per query (CSA layers).
      num_nextn_predict_layers: MTP depths D that DeepSeekV4CausalLM builds and trains
        (`mtp.py`); `hf_config.config_from_hf` imports 0 (transformers builds no MTP
        module and the importer reads no `mtp.*` tensor).
      rms_norm_eps: epsilon of every RMSNorm (weighted and unweighted).
      tie_word_embeddings: share the embedding matrix with the output head.
      initializer_range: stddev of the normal weight initializer.
      attention_dropout: dropout on attention probabilities (training only).
      attn_implementation: how the stateless forward (training, `logits`, prefill)
        attends, in the spirit of transformers' `attn_implementation`: "sparse" (the
        default) gathers each query's window keys, HCA entries and CSA picks
        (`sparse_attention.py`: O(T*(W + k + T/m')) scores); "dense" builds the whole
        (B, H, T, T + N) score matrix and masks it (`attention.attend_with_sink`), the
        reference the sparse path is tested against. Not a config.json key: an import
        takes the default.
      router_bias_update_speed, aux_loss_alpha, mtp_loss_weight: training rules
        as in `DeepSeekConfig`.

    Raises:
      ValueError: on construction, naming the offending field and value.
    """

    vocab_size: int = 1024
    hidden_size: int = 64
    moe_intermediate_size: int = 32
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    head_dim: int = 32
    q_lora_rank: int = 32
    qk_rope_head_dim: int = 8
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    scoring_func: str = "sqrtsoftplus"
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.5
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    layer_types: tuple[str, ...] | None = None
    compress_rates: dict | None = None
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    mlp_layer_types: tuple[str, ...] | None = None
    swiglu_limit: float = 10.0
    sliding_window: int = 16
    o_groups: int = 2
    o_lora_rank: int = 16
    index_n_heads: int = 2
    index_head_dim: int = 16
    index_topk: int = 8
    num_nextn_predict_layers: int = 0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    attn_implementation: str = "sparse"
    router_bias_update_speed: float = 0.001
    aux_loss_alpha: float = 0.0001
    mtp_loss_weight: float = 0.3

    list_fields: ClassVar[tuple[str, ...]] = ("layer_types", "mlp_layer_types")

    def __post_init__(self) -> None:
        for name in (
            "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers",
            "num_attention_heads", "head_dim", "q_lora_rank", "qk_rope_head_dim",
            "n_routed_experts", "num_experts_per_tok", "max_position_embeddings", "hc_mult",
            "hc_sinkhorn_iters", "sliding_window", "o_groups", "o_lora_rank", "index_n_heads",
            "index_head_dim", "index_topk",
        ):
            check_int(name, getattr(self, name), minimum=1)
        check_int("num_nextn_predict_layers", self.num_nextn_predict_layers, minimum=0)
        if self.n_shared_experts != 1:
            raise ValueError(f"n_shared_experts={self.n_shared_experts!r} must be 1: transformers' "
                             "DeepseekV4SparseMoeBlock builds exactly one shared expert")
        for name in ("norm_topk_prob", "tie_word_embeddings"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        if not self.norm_topk_prob:
            raise ValueError("norm_topk_prob=False is not supported: transformers' V4 routers "
                             "always normalize the chosen weights")
        for name in ("routed_scaling_factor", "rms_norm_eps", "rope_theta",
                     "compress_rope_theta", "initializer_range", "hc_eps", "swiglu_limit"):
            check_float(name, getattr(self, name), positive=True)
        for name in ("router_bias_update_speed", "aux_loss_alpha", "mtp_loss_weight"):
            check_float(name, getattr(self, name), positive=False)
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ValueError(f"attention_dropout={self.attention_dropout} must be in [0, 1)")
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation={self.attn_implementation!r} is not "
                             f"supported; choose one of {list(ATTN_IMPLEMENTATIONS)}")
        if self.scoring_func not in SCORING_FUNCS:
            raise ValueError(f"scoring_func={self.scoring_func!r} is not supported; choose one "
                             f"of {list(SCORING_FUNCS)}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        for name in ("head_dim", "index_head_dim"):
            if self.qk_rope_head_dim > getattr(self, name):
                raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be <= "
                                 f"{name}={getattr(self, name)}")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be <= "
                             f"n_routed_experts={self.n_routed_experts}")
        if self.num_attention_heads % self.o_groups:
            raise ValueError(f"o_groups={self.o_groups} must divide "
                             f"num_attention_heads={self.num_attention_heads}")
        object.__setattr__(self, "compress_rates", self._checked_compress_rates())
        object.__setattr__(self, "layer_types", self._checked_types(
            "layer_types", self.layer_types, LAYER_TYPES, self._default_layer_types()))
        object.__setattr__(self, "mlp_layer_types", self._checked_types(
            "mlp_layer_types", self.mlp_layer_types, MLP_LAYER_TYPES,
            self._default_mlp_layer_types()))
        object.__setattr__(self, "rope_scaling", self._checked_rope_scaling())

    # ------------------------------------------------------------------ validation helpers

    def _checked_compress_rates(self) -> dict[str, int]:
        rates = DEFAULT_COMPRESS_RATES if self.compress_rates is None else self.compress_rates
        if not isinstance(rates, dict):
            raise ValueError(f"compress_rates={rates!r} must be a dict {{{CSA!r}: m, {HCA!r}: m'}}")
        unknown = sorted(set(rates) - {CSA, HCA})
        if unknown:
            raise ValueError(f"compress_rates has unknown keys {unknown}; expected {CSA!r} and "
                             f"{HCA!r}")
        out = dict(DEFAULT_COMPRESS_RATES)
        out.update(rates)
        for key, value in out.items():
            check_int(f"compress_rates[{key!r}]", value, minimum=1)
        return out

    def _default_layer_types(self) -> tuple[str, ...]:
        n = self.num_hidden_layers  # transformers: 2 x HCA bootstrap, then HCA/CSA alternating
        interleave = [CSA if i % 2 else HCA for i in range(max(n - 2, 0))]
        return tuple([HCA] * min(n, 2) + interleave)

    def _default_mlp_layer_types(self) -> tuple[str, ...]:
        n, n_hash = self.num_hidden_layers, DEFAULT_NUM_HASH_LAYERS
        return tuple(["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash))

    def _checked_types(self, name: str, value: Any, allowed: tuple[str, ...],
                       default: tuple[str, ...]) -> tuple[str, ...]:
        if value is None:
            return default
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise ValueError(f"{name}={value!r} must be a list of strings")
        if len(value) != self.num_hidden_layers:
            raise ValueError(f"{name} has {len(value)} entries, must equal "
                             f"num_hidden_layers={self.num_hidden_layers}")
        bad = sorted({str(t) for t in value if t not in allowed})
        if bad:
            raise ValueError(f"{name} entries {bad} are not supported; choose from {list(allowed)}")
        return tuple(value)

    def _checked_rope_scaling(self) -> dict | None:
        scaling = normalize_rope_scaling(self.rope_scaling, self.max_position_embeddings)
        if scaling is None:
            return None
        if not scaling["truncate"]:
            raise ValueError("rope_scaling.truncate=False is not supported: transformers' V4 "
                             "compress rope always truncates the YaRN correction range")
        if scaling["attention_factor"] is None:
            scaling["attention_factor"] = 1.0  # transformers V4: cos/sin not scaled by mscale
        return scaling

    # ------------------------------------------------------------------ derived values

    @property
    def partial_rotary_factor(self) -> float:
        """transformers' `partial_rotary_factor` = qk_rope_head_dim / head_dim."""
        return self.qk_rope_head_dim / self.head_dim

    def compress_rate(self, layer_idx: int) -> int:
        """Tokens per compressed entry of block `layer_idx` (0 for a sliding-only layer)."""
        layer_type = self.layer_types[layer_idx]
        return 0 if layer_type == SLIDING else self.compress_rates[layer_type]

    @property
    def compress_ratios(self) -> tuple[int, ...]:
        """DeepSeek's legacy per-layer `compress_ratios` (0 / m / m')."""
        return tuple(self.compress_rate(i) for i in range(self.num_hidden_layers))

    def is_hash_layer(self, layer_idx: int) -> bool:
        """True if block `layer_idx` routes by the frozen `tid2eid` table (never an MTP
        block, layer_idx >= num_hidden_layers)."""
        if layer_idx >= self.num_hidden_layers:
            return MTP_MLP_LAYER_TYPE == "hash_moe"
        return self.mlp_layer_types[layer_idx] == "hash_moe"

    def mtp_block_config(self) -> DeepSeekV4Config:
        """The config the MTP depths' decoder blocks are built with (`mtp.py`).

        The same model with `layer_types` / `mlp_layer_types` extended by one entry per
        MTP depth, so that the block of depth k (k = 1..D) is a normal V4 block at layer
        index num_hidden_layers + k - 1: MTP_LAYER_TYPE (sliding-window attention, as the
        release's `compress_ratios` entry 0 for its MTP block) and MTP_MLP_LAYER_TYPE
        (score-routed top-k MoE with a selection bias; never hash routing). Its
        num_hidden_layers counts those blocks too and its num_nextn_predict_layers is 0.
        """
        depth = self.num_nextn_predict_layers
        return self.replace(
            num_hidden_layers=self.num_hidden_layers + depth,
            layer_types=tuple(self.layer_types) + (MTP_LAYER_TYPE,) * depth,
            mlp_layer_types=tuple(self.mlp_layer_types) + (MTP_MLP_LAYER_TYPE,) * depth,
            num_nextn_predict_layers=0)

    def check_keep_experts(self, keep: Any, name: str = "keep") -> int:
        """`keep` as an int if pruning every MoE layer (all are) to `keep` routed experts
        leaves valid routers: an integer in [num_experts_per_tok, n_routed_experts]
        (`models/layers/config_checks.check_keep_range`; hash layers' tables are rewritten to the
        kept experts, `expert_pruning.prune_tid2eid`).

        Raises:
          ValueError: naming `name` and the value.
        """
        return check_keep_range(keep, self.num_experts_per_tok, self.n_routed_experts, name)
