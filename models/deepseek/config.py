"""DeepSeekConfig: the single source of truth for a DeepSeek-V3- or V2-style model.

Field names and meanings follow Hugging Face `DeepseekV3Config`
(transformers `configuration_deepseek_v3.py`), so a config.json maps field by
field. Three training-rule fields that HF lacks come from the DeepSeek-V3 paper
(arXiv 2412.19437): `router_bias_update_speed` (gamma, §2.1.2),
`aux_loss_alpha` (alpha, §2.1.2 eq. 17) and `mtp_loss_weight` (lambda, §2.2 eq. 25).

The router is chosen by DeepSeek's own config.json keys `topk_method` and
`scoring_func` (with `seq_aux` for the balance loss):

  topk_method            scoring_func  router (router.py)                     released in
  "noaux_tc" (default)   "sigmoid"     bias-adjusted, group score = top-2 sum  DeepSeek-V3, R1
  "greedy"               "softmax"     plain top-k, no bias                    DeepSeek-V2-Lite
  "group_limited_greedy" "softmax"     group score = group max, no bias        DeepSeek-V2

Any other combination is refused by name.

This module imports neither TensorFlow nor Keras, so configs can be built and
validated cheaply (the pipeline's CLI does so before importing TensorFlow).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from models.layers.config_checks import check_float, check_int, check_keep_range
from models.layers.model_config import ModelConfig
from models.layers.rope_scaling import normalize_rope_scaling

# topk_method -> the scoring_func it is supported with (DeepSeek's config.json names).
TOPK_METHODS = {"noaux_tc": "sigmoid", "greedy": "softmax", "group_limited_greedy": "softmax"}
# `attn_implementation` values: DSA gathered, and the masked reference.
ATTN_IMPLEMENTATIONS = ("sparse", "dense")


@dataclasses.dataclass(frozen=True)
class DeepSeekConfig(ModelConfig):
    """Hyper-parameters of a DeepSeek-V3-style causal language model.

    Defaults describe a small model (~10M parameters) that trains on a CPU.

    Attributes:
      vocab_size: number of token ids.
      hidden_size: model width C.
      intermediate_size: width of the dense SwiGLU MLPs (first layers).
      moe_intermediate_size: width of each routed expert (and, times
        `n_shared_experts`, of the shared expert).
      num_hidden_layers: number of decoder blocks L (MTP blocks not included).
      num_attention_heads: attention heads n_h.
      q_lora_rank: query compression rank d_c' (DeepSeek-V2 §2.1.2 eq. 12);
        None = a plain `q_proj`.
      kv_lora_rank: key/value compression rank d_c (eq. 9).
      qk_nope_head_dim: per-head query/key width without RoPE (d_h).
      qk_rope_head_dim: per-head width of the decoupled RoPE part (d_h^R), even.
      v_head_dim: per-head value width.
      n_routed_experts: routed experts N_r per MoE layer.
      n_shared_experts: shared experts N_s (fused into one MLP), may be 0.
      num_experts_per_tok: routed experts per token K_r.
      n_group: expert groups for group-limited routing.
      topk_group: groups kept per token.
      routed_scaling_factor: multiplies the routed experts' gating weights.
      norm_topk_prob: normalize the chosen gating weights to sum to one.
      first_k_dense_replace: the first k blocks use a dense MLP, the rest MoE.
      rms_norm_eps: epsilon of the block and final RMSNorms (the two latent
        norms in attention always use 1e-6, as HF does).
      rope_theta: RoPE base.
      rope_scaling: YaRN parameters with HF's keys (`type`/`rope_type` "yarn",
        `factor`, `original_max_position_embeddings`, `beta_fast`, `beta_slow`,
        `mscale`, `mscale_all_dim`), or None for plain RoPE; stored in the
        canonical form of `rope_scaling.normalize_rope_scaling`.
      max_position_embeddings: longest context the model is used with.
      tie_word_embeddings: share the embedding matrix with the output head.
      num_nextn_predict_layers: multi-token-prediction depth D (0 = no MTP).
      rope_interleave: HF `rope_interleave`: True = the rope dims of q/k are
        stored as interleaved (even, odd) pairs, as in the official weights.
      initializer_range: stddev of the normal weight initializer.
      attention_dropout: dropout on attention probabilities (training only).
      router_bias_update_speed: gamma of the auxiliary-loss-free balancing rule.
      aux_loss_alpha: alpha, weight of the balance loss (V3: §2.1.2 eq. 17;
        V2: the expert-level balance loss, DeepSeek-V2 arXiv 2405.04434 §2.2.3).
      mtp_loss_weight: lambda, weight of the MTP loss.
      topk_method: DeepSeek's `topk_method`: "noaux_tc" (DeepSeek-V3: sigmoid
        scores, `e_score_correction_bias`, auxiliary-loss-free balancing),
        "greedy" (DeepSeek-V2-Lite) or "group_limited_greedy" (DeepSeek-V2),
        both softmax scores without a router bias.
      scoring_func: DeepSeek's `scoring_func`: "sigmoid" for "noaux_tc",
        "softmax" for the two V2 methods (the only pairs supported).
      seq_aux: DeepSeek's `seq_aux`: True = the balance loss is computed per
        sequence and averaged over the batch; False = once over all tokens of
        the batch (V2 methods only; DeepSeek-V3 is sequence-wise).
      index_topk: DeepSeek Sparse Attention (DeepSeek-V3.2, HF `DeepseekV32Config`):
        every query attends only the `index_topk` earlier tokens its lightning
        indexer scores highest (`lightning_indexer.py`). None (with the two fields
        below) = no DSA, dense causal attention (V2 / V3).
      index_n_heads: the indexer's query heads (V3.2: 64); None without DSA.
      index_head_dim: width of the indexer's query heads and of its single key
        (V3.2: 128), >= qk_rope_head_dim (RoPE rotates its first qk_rope_head_dim
        dims); None without DSA. DSA needs q_lora_rank (the indexer's queries are
        projected from the query latent c_q).
      attn_implementation: how DSA attends, in the spirit of transformers'
        `attn_implementation`: "sparse" (the default) gathers each query's
        min(index_topk, visible) picked latents and attends them in the absorbed form
        (`mla_attention.py`: O(T*k) scores, where the sequence or cache is longer than
        index_topk); "dense" builds the whole (B, H, T, S) score matrix and masks it to
        the picks, the reference the sparse path is tested against. No effect without
        DSA. Not a config.json key: an import takes the default.

    Raises:
      ValueError: on construction, naming the offending field and value.
    """

    vocab_size: int = 8192
    hidden_size: int = 256
    intermediate_size: int = 768
    moe_intermediate_size: int = 256
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    q_lora_rank: int | None = None
    kv_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    qk_rope_head_dim: int = 16
    v_head_dim: int = 32
    n_routed_experts: int = 8
    n_shared_experts: int = 1
    num_experts_per_tok: int = 2
    n_group: int = 4
    topk_group: int = 2
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    first_k_dense_replace: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = False
    num_nextn_predict_layers: int = 1
    rope_interleave: bool = True
    initializer_range: float = 0.02
    attention_dropout: float = 0.0
    # Training rules from the DeepSeek-V3 paper (not in HF's config).
    router_bias_update_speed: float = 0.001
    aux_loss_alpha: float = 0.0001
    mtp_loss_weight: float = 0.3
    # The router variant, named as in DeepSeek's config.json (appended last so
    # positional construction of the fields above is unchanged).
    topk_method: str = "noaux_tc"
    scoring_func: str = "sigmoid"
    seq_aux: bool = True
    # DeepSeek Sparse Attention (DeepSeek-V3.2); None = dense attention (appended last).
    index_topk: int | None = None
    index_n_heads: int | None = None
    index_head_dim: int | None = None
    attn_implementation: str = "sparse"

    def __post_init__(self) -> None:
        for name in (
            "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
            "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim", "n_routed_experts", "num_experts_per_tok",
            "n_group", "topk_group", "max_position_embeddings",
        ):
            check_int(name, getattr(self, name), minimum=1)
        for name in ("n_shared_experts", "first_k_dense_replace", "num_nextn_predict_layers"):
            check_int(name, getattr(self, name), minimum=0)
        if self.q_lora_rank is not None:
            check_int("q_lora_rank", self.q_lora_rank, minimum=1)
        for name in ("norm_topk_prob", "tie_word_embeddings", "rope_interleave", "seq_aux"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a bool")
        for name in ("routed_scaling_factor", "rms_norm_eps", "rope_theta", "initializer_range"):
            check_float(name, getattr(self, name), positive=True)
        for name in ("router_bias_update_speed", "aux_loss_alpha", "mtp_loss_weight"):
            check_float(name, getattr(self, name), positive=False)
        if not 0.0 <= self.attention_dropout < 1.0:
            raise ValueError(f"attention_dropout={self.attention_dropout} must be in [0, 1)")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim={self.qk_rope_head_dim} must be even")
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be <= "
                f"n_routed_experts={self.n_routed_experts}"
            )
        self._check_router()
        if self.n_routed_experts % self.n_group:
            raise ValueError(
                f"n_routed_experts={self.n_routed_experts} must be divisible by "
                f"n_group={self.n_group}"
            )
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group={self.topk_group} must be <= n_group={self.n_group}")
        experts_in_kept_groups = self.topk_group * (self.n_routed_experts // self.n_group)
        if self.topk_method != "greedy" and self.num_experts_per_tok > experts_in_kept_groups:
            raise ValueError(
                f"num_experts_per_tok={self.num_experts_per_tok} must be <= topk_group * "
                f"(n_routed_experts // n_group) = {experts_in_kept_groups}"
            )
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError(
                f"first_k_dense_replace={self.first_k_dense_replace} must be <= "
                f"num_hidden_layers={self.num_hidden_layers}"
            )
        self._check_sparse_attention()
        if self.attn_implementation not in ATTN_IMPLEMENTATIONS:
            raise ValueError(f"attn_implementation={self.attn_implementation!r} is not "
                             f"supported; choose one of {list(ATTN_IMPLEMENTATIONS)}")
        # A frozen dataclass: store the canonical (validated, defaults filled) form.
        object.__setattr__(self, "rope_scaling", normalize_rope_scaling(
            self.rope_scaling, self.max_position_embeddings))

    def _check_router(self) -> None:
        """Refuses, by name, a topk_method / scoring_func / seq_aux combination
        that the router does not implement."""
        if self.topk_method not in TOPK_METHODS:
            raise ValueError(f"topk_method={self.topk_method!r} is not supported; "
                             f"choose one of {sorted(TOPK_METHODS)}")
        expected = TOPK_METHODS[self.topk_method]
        if self.scoring_func != expected:
            raise ValueError(f"scoring_func={self.scoring_func!r} with topk_method="
                             f"{self.topk_method!r} is not supported: {self.topk_method!r} "
                             f"scores with {expected!r}")
        if self.topk_method == "noaux_tc" and not self.seq_aux:
            raise ValueError("seq_aux=False with topk_method='noaux_tc' is not supported: the "
                             "DeepSeek-V3 balance loss is sequence-wise (arXiv 2412.19437 eq. 17)")

    def _check_sparse_attention(self) -> None:
        """Refuses, by name, a partial or invalid DeepSeek Sparse Attention setting."""
        names = ("index_topk", "index_n_heads", "index_head_dim")
        given = [n for n in names if getattr(self, n) is not None]
        if not given:
            return
        if len(given) != len(names):
            missing = [n for n in names if n not in given]
            raise ValueError(f"{', '.join(f'{n}={getattr(self, n)!r}' for n in given)} given "
                             f"without {', '.join(missing)}: DeepSeek Sparse Attention needs "
                             "all three (or none)")
        for name in names:
            check_int(name, getattr(self, name), minimum=1)
        if self.index_head_dim < self.qk_rope_head_dim:
            raise ValueError(f"index_head_dim={self.index_head_dim} must be >= "
                             f"qk_rope_head_dim={self.qk_rope_head_dim}: the indexer rotates "
                             "the first qk_rope_head_dim dims of its heads")
        if self.q_lora_rank is None:
            raise ValueError(f"index_topk={self.index_topk} needs q_lora_rank (got None): the "
                             "DeepSeek-V3.2 indexer projects its queries from the query "
                             "latent c_q (indexer.wq_b)")

    # ------------------------------------------------------------------ derived sizes

    @property
    def uses_sparse_attention(self) -> bool:
        """True with DeepSeek Sparse Attention (DeepSeek-V3.2's lightning indexer)."""
        return self.index_topk is not None

    @property
    def cache_width(self) -> int:
        """Numbers per token and layer in the inference cache (`DeepSeekCausalLM.init_cache`):
        kv_lora_rank + qk_rope_head_dim (MLA's latent and rotated shared key), plus
        index_head_dim (the indexer's key) with DeepSeek Sparse Attention."""
        extra = self.index_head_dim if self.uses_sparse_attention else 0
        return self.kv_lora_rank + self.qk_rope_head_dim + extra

    @property
    def uses_router_bias(self) -> bool:
        """True if the router has `e_score_correction_bias` (topk_method "noaux_tc")."""
        return self.topk_method == "noaux_tc"

    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width: qk_nope_head_dim + qk_rope_head_dim."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer_idx: int) -> bool:
        """True if block `layer_idx` uses DeepSeekMoE (HF: idx >= first_k_dense_replace).

        MTP blocks sit at indices num_hidden_layers, num_hidden_layers + 1, ...
        """
        return layer_idx >= self.first_k_dense_replace

    @property
    def num_moe_layers(self) -> int:
        """DeepSeekMoE layers: the main blocks from first_k_dense_replace on, and every MTP
        block (at index num_hidden_layers + d >= first_k_dense_replace)."""
        return self.num_hidden_layers - self.first_k_dense_replace + self.num_nextn_predict_layers

    def check_keep_experts(self, keep: Any, name: str = "keep") -> int:
        """`keep` as an int if pruning every MoE layer to `keep` routed experts leaves a
        valid router (`expert_pruning.select_experts`' rules; no TensorFlow).

        Raises:
          ValueError: naming `name` and the value: not an integer in
            [num_experts_per_tok, n_routed_experts]; under group-limited routing, not a
            multiple of n_group, or fewer than num_experts_per_tok experts left in a
            token's topk_group groups.
        """
        keep = check_keep_range(keep, self.num_experts_per_tok, self.n_routed_experts, name)
        k = self.num_experts_per_tok
        if self.topk_method != "greedy" and self.n_group > 1:
            if keep % self.n_group:
                raise ValueError(
                    f"{name}={keep} must be a multiple of n_group={self.n_group} for "
                    f"topk_method={self.topk_method!r}: the router splits the experts into "
                    "n_group equal groups")
            reachable = self.topk_group * (keep // self.n_group)
            if k > reachable:
                raise ValueError(
                    f"{name}={keep} leaves topk_group * keep / n_group = {reachable} experts "
                    f"in a token's groups, fewer than num_experts_per_tok={k}")
        return keep
