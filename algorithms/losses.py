"""Clipped policy-gradient losses: ppo_clip, dapo (clip-higher) and gspo (sequence ratio).

Every loss has the one signature `fn(inputs: LossInputs, cfg) -> LossOutput`; shared steps
(TIS, KL, aggregation, padding) live in loss_utils. Metrics each loss adds: `clip_fraction`
(share of valid tokens whose clipped branch is active, i.e. gets no gradient), `ratio_mean`,
`ratio_max`, and for the dual clip `dual_clip_fraction`.

Every config has `tis_cap`: truncated importance sampling for rollouts from an external
sampler (vLLM). "auto" (the default): the engine turns it on (C = 2.0) when rollouts come
from an external sampler and leaves it off otherwise; a number sets C, null turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_zoo.algorithms.loss_utils import (
    Aggregation,
    TisCap,
    check_aggregation,
    check_tis_cap,
    finish,
    fraction,
    log_ratio,
    prepare,
    ratio_metrics,
    row_mean,
    token_ratio,
)
from grpo_zoo.registry import LOSSES
from grpo_zoo.types import LossInputs, LossOutput


def check_clip(owner: str, eps_low: float, eps_high: float, dual_clip: float | None) -> None:
    """Shared __post_init__ checks of the clip ranges (ppo_clip, dapo, clip_cov)."""
    if not 0 <= eps_low < 1:
        raise ValueError(f"{owner}.eps_low must be in [0, 1) so 1 - eps_low stays positive, got {eps_low}")
    if eps_high < 0:
        raise ValueError(f"{owner}.eps_high must be >= 0, got {eps_high}")
    if dual_clip is not None and not dual_clip > 1:
        raise ValueError(f"{owner}.dual_clip must be > 1 (3.0 is usual) or null to turn it off, got {dual_clip}")


@dataclass
class PPOClipConfig:
    """PPO clipped surrogate (Schulman et al. 2017) as GRPO uses it (arXiv 2402.03300)."""

    eps_low: float = 0.2  # ratio clipped below at 1 - eps_low (for A < 0)
    eps_high: float = 0.2  # ratio clipped above at 1 + eps_high (for A > 0); DAPO raises it
    # c of dual clip (Ye et al. 2020): caps the loss of A < 0 tokens at -A c; None = off, DIVA's released script 3.0
    dual_clip: float | None = None
    aggregation: Aggregation = "token-mean"  # see loss_utils.aggregate; Dr.GRPO wants seq-mean-token-sum-norm
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        check_clip("ppo_clip", self.eps_low, self.eps_high, self.dual_clip)
        check_aggregation("ppo_clip", self.aggregation)
        check_tis_cap("ppo_clip", self.tis_cap)


@dataclass
class DAPOConfig:
    """DAPO (arXiv 2503.14476): the ppo_clip loss with clip-higher, token-mean aggregation."""

    eps_low: float = 0.2  # lower clip, unchanged from PPO
    eps_high: float = 0.28  # clip-higher: room for low-probability tokens to grow (keeps entropy up)
    dual_clip: float | None = None  # c of dual clip for A < 0; off in DAPO
    aggregation: Aggregation = "token-mean"  # DAPO's token-level loss: long responses weigh by length
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        check_clip("dapo", self.eps_low, self.eps_high, self.dual_clip)
        check_aggregation("dapo", self.aggregation)
        check_tis_cap("dapo", self.tis_cap)


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, eps_low: float, eps_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """max(-A r, -A clip(r, 1-eps_low, 1+eps_high)) and the mask where the clip binds. [N, T]"""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@LOSSES.register("ppo_clip", config=PPOClipConfig, description="PPO clipped surrogate (GRPO's loss), opt. dual clip")
def ppo_clip(inputs: LossInputs, cfg: PPOClipConfig | DAPOConfig) -> LossOutput:
    """PPO-clip per token: max(-A r_t, -A clip(r_t, 1 - eps_low, 1 + eps_high)).

    r_t = exp(clamp(logp - old_logp, +-20)); A is the response's advantage broadcast over its
    tokens. Dual clip (Ye et al. 2020, arXiv 1912.09729): for A < 0 the loss is further capped
    at -A c, so a token whose ratio exploded cannot dominate the batch (its gradient is 0 there).
    Shapes: logp/old_logp/mask [N, T], advantages [N]. All-zero advantages give loss 0 (plus KL).
    """
    p = prepare(inputs)
    ratio = token_ratio(p.logp, p.old_logp)  # [N, T]
    loss, clip_active = clipped_surrogate(ratio, p.adv, cfg.eps_low, cfg.eps_high)  # [N, T]
    metrics = {"clip_fraction": fraction(clip_active, p.mask), **ratio_metrics(ratio, p.mask)}
    if cfg.dual_clip is not None:
        cap = -p.adv * cfg.dual_clip  # [N, 1], positive where A < 0
        negative = (p.adv < 0).expand_as(loss)
        dual_active = negative & (loss > cap)
        loss = torch.where(negative, torch.minimum(loss, cap), loss)
        metrics["dual_clip_fraction"] = fraction(dual_active, p.mask)
    return finish(loss, inputs, cfg.aggregation, tis_cap=cfg.tis_cap, metrics=metrics)


# DAPO is the same function with its own defaults: an alias, not a copy of the code.
LOSSES.alias("dapo", "ppo_clip", config=DAPOConfig, description="DAPO: ppo_clip with clip-higher (eps_high 0.28)")


@dataclass
class GSPOConfig:
    """GSPO (arXiv 2507.18071): one length-normalised ratio per sequence, clipped tightly."""

    eps_low: float = 3e-4  # sequence ratio clipped below at 1 - eps_low (paper sec. 5.1)
    eps_high: float = 4e-4  # sequence ratio clipped above at 1 + eps_high
    aggregation: Aggregation = "seq-mean-token-mean"  # the paper's 1/|y_i| per sequence, mean over sequences
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        check_clip("gspo", self.eps_low, self.eps_high, None)
        check_aggregation("gspo", self.aggregation)
        check_tis_cap("gspo", self.tis_cap)


@LOSSES.register("gspo", config=GSPOConfig, description="GSPO: sequence-level clipped ratio (GSPO-token form)")
def gspo(inputs: LossInputs, cfg: GSPOConfig) -> LossOutput:
    """GSPO-token (arXiv 2507.18071, eq. 13-14).

    s_i = exp(mean_t (logp_t - old_logp_t)) over the response's valid tokens; per token
    log s_it = sg[log s_i] + logp_t - sg[logp_t], so s_it has the value s_i but each token's
    gradient is s_i * grad logp_t. Loss per token max(-A s_it, -A clip(s_it, 1-eps_low,
    1+eps_high)); the clip, decided per sequence, drops whole responses. No dual clip.
    ratio_mean / ratio_max are over sequences (non-empty rows). A fully masked row has s = 1
    and no tokens, so it contributes nothing.
    """
    p = prepare(inputs)
    token_log_ratio = log_ratio(p.logp, p.old_logp)  # [N, T]
    seq_log_ratio = row_mean(token_log_ratio, p.mask).unsqueeze(-1)  # [N, 1], within +-20
    log_s = seq_log_ratio.detach() + p.logp - p.logp.detach()  # [N, T], value = log s_i
    ratio = torch.exp(log_s)  # [N, T]
    loss, clip_active = clipped_surrogate(ratio, p.adv, cfg.eps_low, cfg.eps_high)
    rows = p.mask.sum(-1, keepdim=True) > 0  # [N, 1]
    metrics = {"clip_fraction": fraction(clip_active, p.mask), **ratio_metrics(seq_log_ratio.exp(), rows)}
    return finish(loss, inputs, cfg.aggregation, tis_cap=cfg.tis_cap, metrics=metrics)
