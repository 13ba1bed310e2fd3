"""The micro-batch objectives of DPO and GRPO for the training step (`train_step.py`).

Each has the interface of `train_step.LanguageModelObjective`: `figure_names`,
`prepare(batch)` (no gradient: the frozen reference's log-probs) and
`loss(batch, aux, targets, scale)` (the differentiated part). Their loss and figures
are means over the micro-batch's pairs or completions, multiplied by `scale` = 1 / (k R)
(k micro-batches, R replicas, each of the same size), so the step's all-reduced sums
are means over the global batch. The LOSS_TERMS they fill: `loss` (objective +
MoE balance loss), `lm_loss` (the DPO or GRPO objective alone), `balance_loss`;
`mtp_loss` and `distill_loss` are 0 (the MTP modules are not trained after SFT).

The reference runs in the same step, in inference mode, as a distillation teacher does:
memory for a second model (the frozen base) instead of a pass over the data before
training and per-record log-probs stored with the examples; it stays right when the data
or the reference changes between runs, and costs one forward pass of the reference per
micro-batch (for DPO the two responses of each pair: 2 b sequences).
"""

from __future__ import annotations

import tensorflow as tf

from components.trainer import preference

DPO_FIGURES = ("reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward")
GRPO_FIGURES = ("reward_mean", "reward_std", "zero_variance_groups", "kl", "clip_fraction",
                "completion_length")


def _terms(objective: tf.Tensor, outputs: dict, scale: float) -> dict:
    balance = tf.cast(outputs["balance_loss"], tf.float32) * scale
    zero = tf.zeros([])
    out = {"loss": objective + balance, "lm_loss": objective, "mtp_loss": zero,
           "balance_loss": balance, "distill_loss": zero, "expert_load": outputs["expert_load"]}
    if "moe_dropped" in outputs:
        out["moe_dropped"] = outputs["moe_dropped"]
    return out


class DPOObjective:
    """DPO on pairs (Rafailov et al. 2023, eq. 7; `preference.dpo_loss`).

    Batches {"input_ids", "labels"}: int32 (b, 2, T); [:, 0] the prompt and chosen
    response, [:, 1] the prompt and rejected one; labels are IGNORE_LABEL on the prompt
    and padding, so only response tokens (and their EOS) count in log pi(y|x).

    Args:
      model: the policy (`DeepSeekCausalLM`); reference: the frozen base model.
      beta: `train.dpo_beta`.
      recompute, forward_kwargs: as for `forward_train`.
    """

    figure_names = DPO_FIGURES

    def __init__(self, model, reference, beta: float, recompute: bool = False,
                 forward_kwargs: dict | None = None):
        self.model, self.reference, self.beta = model, reference, beta
        self.recompute, self.forward_kwargs = recompute, dict(forward_kwargs or {})

    @staticmethod
    def _flat(batch):
        ids, labels = batch["input_ids"], batch["labels"]  # (b, 2, T)
        t = ids.shape[-1]
        return tf.reshape(ids, [-1, t]), tf.reshape(labels, [-1, t])  # (2b, T)

    def prepare(self, batch):
        ids, labels = self._flat(batch)
        logits = self.reference(ids, training=False)  # (2b, T, V)
        return tf.stop_gradient(tf.reshape(preference.sequence_logps(logits, labels),
                                           [-1, 2]))  # (b, 2)

    def loss(self, batch, ref, targets, scale):
        del targets
        ids, labels = self._flat(batch)
        outputs = self.model.forward_train(ids, training=True, recompute_blocks=self.recompute,
                                           **self.forward_kwargs)
        policy = tf.reshape(preference.sequence_logps(outputs["logits"], labels), [-1, 2])  # (b, 2)
        loss, fig = preference.dpo_loss(policy[:, 0], policy[:, 1], ref[:, 0], ref[:, 1],
                                        self.beta)
        out = _terms(loss * scale, outputs, scale)
        out["figures"] = tf.stack([fig["reward_accuracy"], fig["margin"], fig["chosen_reward"],
                                   fig["rejected_reward"]]) * scale  # (4,)
        return out


class GRPOObjective:
    """GRPO's clipped surrogate with the k3 KL to the reference (DeepSeekMath eq. 3;
    `preference.grpo_loss`) on sampled completions (`grpo.py` makes the batches).

    Batches: "input_ids", "labels" int32 (n, T) with n = p G completions, G per prompt
    in consecutive rows (labels IGNORE_LABEL except on the completion's tokens, its EOS
    included); "rewards" float32 (n,); optionally "old_logps" float32 (n, T) (the
    sampling policy's per-token log-probs; absent when `train.grpo_inner_steps` is 1:
    then the policy is the sampling one and old = stop_gradient(new), ratio 1).

    Args:
      model, reference: the policy and the frozen base; group_size: G;
      clip_epsilon, kl_beta: `train.grpo_clip_epsilon`, `train.grpo_kl_beta`.
    """

    figure_names = GRPO_FIGURES

    def __init__(self, model, reference, group_size: int, clip_epsilon: float, kl_beta: float,
                 recompute: bool = False, forward_kwargs: dict | None = None):
        self.model, self.reference, self.group_size = model, reference, group_size
        self.clip_epsilon, self.kl_beta = clip_epsilon, kl_beta
        self.recompute, self.forward_kwargs = recompute, dict(forward_kwargs or {})

    def prepare(self, batch):
        logits = self.reference(batch["input_ids"], training=False)  # (n, T, V)
        return tf.stop_gradient(preference.token_logps(logits, batch["labels"]))  # (n, T)

    def loss(self, batch, ref_logp, targets, scale):
        del targets
        labels = batch["labels"]  # (n, T)
        outputs = self.model.forward_train(batch["input_ids"], training=True,
                                           recompute_blocks=self.recompute, **self.forward_kwargs)
        logp = preference.token_logps(outputs["logits"], labels)  # (n, T)
        old = batch.get("old_logps")
        old = tf.stop_gradient(logp) if old is None else old
        rewards = tf.reshape(batch["rewards"], [-1, self.group_size])  # (p, G)
        advantages = tf.reshape(preference.grpo_advantages(rewards), [-1])  # (n,)
        mask = tf.not_equal(labels, preference.IGNORE_LABEL)
        loss, fig = preference.grpo_loss(logp, old, ref_logp, advantages, mask,
                                         self.clip_epsilon, self.kl_beta)
        std = tf.math.reduce_std(rewards, axis=1)  # (p,)
        out = _terms(loss * scale, outputs, scale)
        out["figures"] = tf.stack([
            tf.reduce_mean(rewards), tf.reduce_mean(std),
            tf.reduce_mean(tf.cast(std == 0.0, tf.float32)), fig["kl"], fig["clip_fraction"],
            fig["completion_length"]]) * scale  # (6,)
        return out
