"""Policy losses that late-2026 peers ship: cispo, sapo, gmpo, clip_cov, kl_cov.

Same signature as every loss, `fn(inputs: LossInputs, cfg) -> LossOutput`; shared steps (TIS,
KL, aggregation, padding) live in loss_utils. Formulas and defaults: /work/shared/ALGORITHMS.md
("More baselines that late-2026 peers ship"), read from the papers and verl's core_algos.

Every config has `tis_cap`: truncated importance sampling for rollouts from an external
sampler (vLLM). "auto" (the default): the engine turns it on (C = 2.0) when rollouts come
from an external sampler and leaves it off otherwise; a number sets C, null turns it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpo_zoo.algorithms.loss_utils import (
    Aggregation,
    Prepared,
    TisCap,
    check_aggregation,
    check_tis_cap,
    finish,
    fraction,
    log_ratio,
    masked_mean,
    prepare,
    ratio_metrics,
    row_mean,
    token_ratio,
)
from grpo_zoo.algorithms.losses import check_clip, clipped_surrogate
from grpo_zoo.registry import LOSSES
from grpo_zoo.types import LossInputs, LossOutput

# --------------------------------------------------------------------------------------
# CISPO (MiniMax-M1, arXiv 2506.13585)
# --------------------------------------------------------------------------------------


@dataclass
class CISPOConfig:
    """CISPO: clip the importance-sampling weight, never the token's gradient."""

    eps_low: float = 0.2  # IS weight clipped below at 1 - eps_low (inferred; the paper tunes only eps_high)
    eps_high: float = 0.28  # IS weight clipped above at 1 + eps_high
    aggregation: Aggregation = "token-mean"  # the paper normalises by the total token count
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        check_clip("cispo", self.eps_low, self.eps_high, None)
        check_aggregation("cispo", self.aggregation)
        check_tis_cap("cispo", self.tis_cap)


@LOSSES.register("cispo", config=CISPOConfig, description="CISPO: clipped, detached IS weight times REINFORCE")
def cispo(inputs: LossInputs, cfg: CISPOConfig) -> LossOutput:
    """CISPO (arXiv 2506.13585, eq. 4): loss_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A logp_t.

    Gradient flows only through logp_t, so tokens outside the clip range keep a (bounded)
    gradient instead of dropping out as in PPO. clip_fraction = share of valid tokens whose
    weight was clipped. [N, T] log-probs, [N] advantages.
    """
    p = prepare(inputs)
    ratio = token_ratio(p.logp, p.old_logp).detach()  # [N, T]
    weight = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)  # [N, T]
    loss = -weight * p.adv * p.logp
    clipped = (ratio < 1.0 - cfg.eps_low) | (ratio > 1.0 + cfg.eps_high)
    metrics = {"clip_fraction": fraction(clipped, p.mask), **ratio_metrics(ratio, p.mask)}
    return finish(loss, inputs, cfg.aggregation, tis_cap=cfg.tis_cap, metrics=metrics)


# --------------------------------------------------------------------------------------
# SAPO (arXiv 2511.20347)
# --------------------------------------------------------------------------------------


@dataclass
class SAPOConfig:
    """SAPO: a smooth sigmoid gate in place of the hard clip."""

    tau_pos: float = 1.0  # gate temperature for A > 0 tokens; larger = gradient fades faster off-policy
    tau_neg: float = 1.05  # gate temperature for A <= 0 tokens; slightly sharper, negative updates are riskier
    aggregation: Aggregation = "seq-mean-token-mean"  # the paper's per-sequence mean
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        if not (self.tau_pos > 0 and self.tau_neg > 0):
            raise ValueError(f"sapo.tau_pos and sapo.tau_neg must be > 0, got {self.tau_pos}, {self.tau_neg}")
        check_aggregation("sapo", self.aggregation)
        check_tis_cap("sapo", self.tis_cap)


@LOSSES.register("sapo", config=SAPOConfig, description="SAPO: soft sigmoid gate instead of the clip")
def sapo(inputs: LossInputs, cfg: SAPOConfig) -> LossOutput:
    """SAPO (arXiv 2511.20347): loss_t = -f(r_t) A with f(x) = sigmoid(tau (x - 1)) 4 / tau.

    tau = tau_pos where A > 0, else tau_neg. df/dr = 4 s (1 - s) with s = sigmoid(tau (r - 1)),
    which is 1 on-policy (r = 1, the plain policy gradient) and decays smoothly as r leaves 1.
    gate_mean = mean of that factor over valid tokens. [N, T] log-probs, [N] advantages.
    """
    p = prepare(inputs)
    ratio = token_ratio(p.logp, p.old_logp)  # [N, T]
    tau = torch.where(p.adv > 0, cfg.tau_pos, cfg.tau_neg)  # [N, 1]
    gate = torch.sigmoid(tau * (ratio - 1.0))  # [N, T]
    loss = -gate * (4.0 / tau) * p.adv
    metrics = {"gate_mean": float(masked_mean((4.0 * gate * (1.0 - gate)).detach(), p.mask))}
    metrics.update(ratio_metrics(ratio, p.mask))
    return finish(loss, inputs, cfg.aggregation, tis_cap=cfg.tis_cap, metrics=metrics)


# --------------------------------------------------------------------------------------
# GMPO (arXiv 2507.20673)
# --------------------------------------------------------------------------------------


@dataclass
class GMPOConfig:
    """GMPO: geometric mean of token ratios per sequence, clipped per token in log space."""

    eps_low: float = 0.4  # token log-ratio clipped below at -eps_low (when A < 0)
    eps_high: float = 0.4  # token log-ratio clipped above at +eps_high (when A > 0)
    aggregation: Aggregation = "seq-mean-token-mean"  # = mean over sequences of the sequence loss
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        if not (self.eps_low >= 0 and self.eps_high >= 0):
            raise ValueError(f"gmpo.eps_low and gmpo.eps_high must be >= 0 (log-ratio units), got {self.eps_low}, "
                             f"{self.eps_high}")
        check_aggregation("gmpo", self.aggregation)
        check_tis_cap("gmpo", self.tis_cap)


@LOSSES.register("gmpo", config=GMPOConfig, description="GMPO: geometric-mean sequence ratio, log-space token clip")
def gmpo(inputs: LossInputs, cfg: GMPOConfig) -> LossOutput:
    """GMPO (arXiv 2507.20673, eq. 7): loss_i = -A_i exp(mean_t d_t).

    l_t = clamp(logp_t - old_logp_t, +-20); d_t = sign(A) min(sign(A) l_t, sign(A) clip(l_t,
    -eps_low, eps_high)), the pessimistic side: for A > 0 only the upper clip binds, for A < 0
    only the lower one; a clipped token gets no gradient. The sequence loss is broadcast over
    the row's tokens, so seq-mean-token-mean gives the mean over sequences; TIS weights then act
    through their per-row mean. ratio_mean / ratio_max are over sequences.
    """
    p = prepare(inputs)
    lr = log_ratio(p.logp, p.old_logp)  # [N, T]
    sign = torch.sign(p.adv)  # [N, 1]
    d = sign * torch.minimum(sign * lr, sign * lr.clamp(-cfg.eps_low, cfg.eps_high))  # [N, T]
    seq_ratio = torch.exp(row_mean(d, p.mask)).unsqueeze(-1)  # [N, 1]
    loss = (-p.adv * seq_ratio).expand_as(p.logp)  # [N, T]
    clipped = ((sign > 0) & (lr > cfg.eps_high)) | ((sign < 0) & (lr < -cfg.eps_low))
    rows = p.mask.sum(-1, keepdim=True) > 0  # [N, 1]
    metrics = {"clip_fraction": fraction(clipped, p.mask), **ratio_metrics(seq_ratio, rows)}
    return finish(loss, inputs, cfg.aggregation, tis_cap=cfg.tis_cap, metrics=metrics)


# --------------------------------------------------------------------------------------
# Clip-Cov / KL-Cov (arXiv 2505.22617, "The Entropy Mechanism of RL for Reasoning LMs")
# --------------------------------------------------------------------------------------


def token_covariance(p: Prepared) -> torch.Tensor:
    """cov_t = (A_t - mean A)(logp_t - mean logp), means over valid tokens; -inf on padding. [N, T]

    This is each token's contribution to Cov(logp, A), which the paper shows drives the
    entropy change; high-covariance tokens are the ones that collapse entropy.
    """
    with torch.no_grad():
        adv = p.adv.expand_as(p.logp)  # [N, T]
        logp = p.logp.detach()
        cov = (adv - masked_mean(adv, p.mask)) * (logp - masked_mean(logp, p.mask))
        return cov.masked_fill(~p.valid, float("-inf"))


def pick_count(share: float, p: Prepared) -> int:
    """max(1, floor(share * valid tokens)) as verl does; 0 when no token is valid."""
    n_valid = int(p.mask.sum())
    return max(1, int(share * n_valid)) if n_valid > 0 else 0


@dataclass
class ClipCovConfig:
    """Clip-Cov: PPO-clip plus detaching the gradient of a few random high-covariance tokens."""

    eps_low: float = 0.2  # PPO lower clip
    eps_high: float = 0.2  # PPO upper clip
    token_share: float = 2e-4  # share r of all valid tokens to detach (at least one token)
    cov_lb: float = 1.0  # candidates have cov_lb < cov_t < cov_ub
    cov_ub: float = 5.0
    aggregation: Aggregation = "token-mean"
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        check_clip("clip_cov", self.eps_low, self.eps_high, None)
        if not 0 < self.token_share <= 1:
            raise ValueError(f"clip_cov.token_share must be in (0, 1], got {self.token_share}")
        if not self.cov_lb < self.cov_ub:
            raise ValueError(f"clip_cov.cov_lb must be below clip_cov.cov_ub, got {self.cov_lb} >= {self.cov_ub}")
        check_aggregation("clip_cov", self.aggregation)
        check_tis_cap("clip_cov", self.tis_cap)


@LOSSES.register("clip_cov", config=ClipCovConfig, description="Clip-Cov: detach random high-covariance tokens")
def clip_cov(inputs: LossInputs, cfg: ClipCovConfig) -> LossOutput:
    """Clip-Cov (arXiv 2505.22617, sec. 4): PPO-clip, then among valid tokens not already clipped
    with cov_lb < cov_t < cov_ub, pick max(1, floor(token_share * valid)) at random and detach them.

    The pick uses a local torch.Generator seeded with LossInputs.seed (never the global RNG),
    so a step is reproducible and other randomness is untouched. Detaching keeps the token's
    loss value (verl zeroes it; the gradient is the same). touched_fraction = share of valid
    tokens detached.
    """
    p = prepare(inputs)
    ratio = token_ratio(p.logp, p.old_logp)  # [N, T]
    loss, clip_active = clipped_surrogate(ratio, p.adv, cfg.eps_low, cfg.eps_high)  # [N, T]
    cov = token_covariance(p)
    candidates = p.valid & ~clip_active & (cov > cfg.cov_lb) & (cov < cfg.cov_ub)
    flat = torch.nonzero(candidates.flatten()).squeeze(-1)  # [K]
    touched = torch.zeros(p.valid.numel(), dtype=torch.bool, device=p.valid.device)  # [N * T]
    if flat.numel() > 0:
        generator = torch.Generator().manual_seed(int(inputs.seed))
        order = torch.randperm(flat.numel(), generator=generator)[: pick_count(cfg.token_share, p)]
        touched[flat[order.to(flat.device)]] = True
    touched = touched.view_as(p.valid)  # [N, T]
    loss = torch.where(touched, loss.detach(), loss)
    metrics = {
        "clip_fraction": fraction(clip_active, p.mask),
        "touched_fraction": fraction(touched, p.mask),
        **ratio_metrics(ratio, p.mask),
    }
    return finish(loss, inputs, cfg.aggregation, tis_cap=cfg.tis_cap, metrics=metrics)


@dataclass
class KLCovConfig:
    """KL-Cov: an unclipped policy gradient plus a |log-ratio| penalty on the top-covariance tokens."""

    token_share: float = 2e-4  # share k of valid tokens, by largest cov_t, that get the penalty (at least one)
    coef: float = 0.1  # weight of |logp - old_logp| on those tokens; larger = stronger entropy protection
    aggregation: Aggregation = "token-mean"
    tis_cap: TisCap = "auto"  # TIS cap C; "auto" = 2.0 for an external sampler (vLLM), else off; null = off

    def __post_init__(self) -> None:
        if not 0 < self.token_share <= 1:
            raise ValueError(f"kl_cov.token_share must be in (0, 1], got {self.token_share}")
        if self.coef < 0:
            raise ValueError(f"kl_cov.coef must be >= 0, got {self.coef}")
        check_aggregation("kl_cov", self.aggregation)
        check_tis_cap("kl_cov", self.tis_cap)


@LOSSES.register("kl_cov", config=KLCovConfig, description="KL-Cov: |log-ratio| penalty on top-covariance tokens")
def kl_cov(inputs: LossInputs, cfg: KLCovConfig) -> LossOutput:
    """KL-Cov (arXiv 2505.22617, sec. 4): loss_t = -A r_t + coef |logp_t - old_logp_t| on the top
    max(1, floor(token_share * valid)) valid tokens by cov_t, and -A r_t elsewhere (no clip).

    Only tokens with cov_t > 0 qualify, so all-zero advantages give loss 0 and no gradient.

    touched_fraction = share of valid tokens that carry the penalty.
    """
    p = prepare(inputs)
    lr = log_ratio(p.logp, p.old_logp)  # [N, T]
    ratio = torch.exp(lr)
    cov = token_covariance(p).flatten()  # [N * T]
    touched = torch.zeros(p.valid.numel(), dtype=torch.bool, device=p.valid.device)  # [N * T]
    # Only cov > 0 tokens push entropy down; verl's plain top-k would also penalise cov <= 0
    # tokens when too few are positive (e.g. every advantage 0), which only adds noise.
    k = min(pick_count(cfg.token_share, p), int((cov > 0).sum()))
    if k > 0:
        touched[torch.topk(cov, k).indices] = True
    touched = touched.view_as(p.valid)  # [N, T]
    loss = -p.adv * ratio + cfg.coef * lr.abs() * touched.to(lr.dtype)
    metrics = {"touched_fraction": fraction(touched, p.mask), **ratio_metrics(ratio, p.mask)}
    return finish(loss, inputs, cfg.aggregation, tis_cap=cfg.tis_cap, metrics=metrics)
