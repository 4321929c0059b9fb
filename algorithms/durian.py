"""Durian: difficulty-aware group normalisation (arXiv 2602.21743).

Prompts of a batch are re-grouped by difficulty; inside a difficulty group every prompt keeps
its own mean but the std is pooled over the whole difficulty group, so an easy prompt whose
G rewards barely differ is not blown up to unit scale. Two difficulty views:
  - perceptual: spectral entropy H of the image's patch features, 3 groups by quartiles;
  - reasoning: the policy's confidence c_p (mean summed log-prob of the G responses),
    b equal-frequency bins.
A = a_ori A_grpo + a_percep A_percep + a_reason A_reason, weights renormalised over the
views that are available (no image -> no perceptual term).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from grpo_zoo.algorithms import _groups as grp
from grpo_zoo.algorithms.advantages import LocalGroups, check_eps, finish
from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs, AdvantageOutput


def spectral_entropy(features: torch.Tensor) -> torch.Tensor:
    """Spectral entropy of patch features (Durian, arXiv 2602.21743, perceptual difficulty).

    features: [P, d] (one image) or [B, P, d] (a batch of images with equal P) -> [] or [B].
    Centre F over the P patches, take its singular values s_k, p_k = s_k^2 / sum_j s_j^2,
    H = -sum_k p_k log p_k (natural log; the paper's covariance eigenvalues give the same
    spectrum). Edge cases: P = 1 or constant features (no spread) give H = 0. Half-precision
    inputs are computed in float32.
    """
    if features.dim() not in (2, 3):
        raise ValueError(f"spectral_entropy: features must be [P, d] or [B, P, d], got shape {tuple(features.shape)}")
    if features.shape[-2] == 0 or features.shape[-1] == 0:
        raise ValueError(f"spectral_entropy: features has no patches or no channels: shape {tuple(features.shape)}")
    if not torch.isfinite(features).all():
        raise ValueError("spectral_entropy: features has NaN/inf values; check the vision encoder output")
    f = features.to(torch.float64 if features.dtype == torch.float64 else torch.float32)
    centred = f - f.mean(dim=-2, keepdim=True)  # [.., P, d]
    s2 = torch.linalg.svdvals(centred) ** 2  # [.., min(P, d)]
    total = s2.sum(dim=-1, keepdim=True)  # [.., 1]
    p = torch.where(total > 0, s2 / total.clamp_min(torch.finfo(f.dtype).tiny), torch.zeros_like(s2))
    return -torch.xlogy(p, p).sum(dim=-1)


@dataclass
class DurianConfig:
    """Options of the `durian` estimator (weights and bin count are not stated by the paper)."""

    bins: int = 12
    """b equal-frequency confidence bins for the reasoning view (inferred; the paper sweeps 4-48).
    More bins = finer difficulty groups = a std closer to each prompt's own."""
    length_normalize: bool = False
    """Divide each response's summed log-prob by its length before averaging (a figure caption says
    "normalized"); off = the paper's equations (summed log-prob), which rank long answers as less confident."""
    a_ori: float = 0.4
    """Weight of the plain GRPO advantage."""
    a_percep: float = 0.3
    """Weight of the perceptual (image spectral entropy) view; skipped when no visual_entropy is given."""
    a_reason: float = 0.3
    """Weight of the reasoning (confidence) view; skipped when no seq_logprob is given."""
    eps: float = 1e-6
    """Added to every std (the paper adds none) so that a constant group gives 0, not NaN."""

    def __post_init__(self) -> None:
        if isinstance(self.bins, bool) or not isinstance(self.bins, int) or self.bins < 1:
            raise ValueError(f"durian.bins must be an integer >= 1, got {self.bins!r}")
        weights = {"a_ori": self.a_ori, "a_percep": self.a_percep, "a_reason": self.a_reason}
        for name, w in weights.items():
            if not (math.isfinite(w) and w >= 0):
                raise ValueError(f"durian.{name} must be a finite number >= 0, got {w}")
        if sum(weights.values()) <= 0:
            raise ValueError("durian: a_ori + a_percep + a_reason must be > 0")
        check_eps("durian", "eps", self.eps)


def shared_std_advantage(lg: LocalGroups, group_of_prompt: torch.Tensor, num_groups: int, eps: float) -> torch.Tensor:
    """A_i = (r_i - mean_local(i)) / (std_a + eps), std_a = Bessel std of every reward in i's
    difficulty group a around the pooled mean. group_of_prompt: [K] long in 0..num_groups-1."""
    row_group = grp.take(group_of_prompt, lg.idx)  # [N]
    std = grp.group_std(lg.rewards, row_group, num_groups)  # [num_groups]; empty or 1-row groups -> 0
    return lg.centred() / (grp.take(std, row_group) + eps)


def perceptual_groups(inputs: AdvantageInputs, lg: LocalGroups) -> tuple[torch.Tensor, dict[str, float]]:
    """[K] group 0 (H <= q25), 1 (middle), 2 (H >= q75) per prompt, from visual_entropy [N]."""
    ve = inputs.visual_entropy.to(torch.float64)  # [N]
    h_max = grp.group_max(ve, lg.idx, lg.k)  # [K]
    h_min = grp.group_min(ve, lg.idx, lg.k)
    if bool(((h_max - h_min) > 1e-6 * h_max.abs().clamp_min(1.0)).any()):
        raise ValueError(
            "AdvantageInputs.visual_entropy must be the same for every response of one prompt (it is the "
            "prompt image's entropy); compute it once per prompt and repeat it over the prompt's G rows"
        )
    q25, q75 = torch.quantile(h_max, torch.tensor([0.25, 0.75], dtype=torch.float64, device=ve.device)).tolist()
    groups = torch.ones(lg.k, dtype=torch.long, device=ve.device)
    groups[h_max >= q75] = 2
    groups[h_max <= q25] = 0  # wins ties: with every H equal all prompts share one group
    return groups, {"percep_q25": q25, "percep_q75": q75}


def reasoning_groups(inputs: AdvantageInputs, lg: LocalGroups, cfg: DurianConfig) -> tuple[torch.Tensor, int]:
    """[K] equal-frequency bin 0..b-1 of each prompt's confidence c_p; returns (bins, b).

    Prompts are ranked by c_p (ties by prompt id), bin = floor(rank * b / K), so each bin holds
    K/b prompts (+-1); with fewer prompts than bins every prompt is its own bin.
    """
    s = inputs.seq_logprob.to(torch.float64)  # [N]
    if cfg.length_normalize:
        s = s / inputs.response_lengths.to(torch.float64).clamp_min(1.0)
    conf = grp.group_mean(s, lg.idx, lg.k, lg.count)  # [K]
    order = torch.sort(conf, stable=True).indices  # [K]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(lg.k, device=order.device)
    return rank * cfg.bins // lg.k, cfg.bins


@ESTIMATORS.register(
    "durian", config=DurianConfig, description="Durian: GRPO + difficulty-group shared-std advantages"
)
def durian(inputs: AdvantageInputs, cfg: DurianConfig) -> AdvantageOutput:
    """Durian advantage (arXiv 2602.21743): a weighted sum of GRPO and shared-std
    advantages over perceptual and reasoning difficulty groups of the whole batch.

    visual_entropy [N] (the prompt's H, equal over its rows) drives the perceptual view;
    seq_logprob [N] (summed response log-prob) the reasoning view. A view whose input is None
    (or whose weight is 0) is skipped and the remaining weights are renormalised; the metrics
    percep_used / reason_used say which views ran. Every term is 0 for a local group of equal
    rewards (its numerator r_i - mean_local is 0), so such a group gets A = 0.
    """
    lg = LocalGroups.of(inputs)
    std_local = lg.std()  # [K]
    terms = {"grpo": (cfg.a_ori, lg.centred() / (grp.take(std_local, lg.idx) + cfg.eps))}  # name -> (weight, A [N])
    metrics: dict[str, float] = {"percep_used": 0.0, "reason_used": 0.0}
    if inputs.visual_entropy is not None and cfg.a_percep > 0:
        groups, extra = perceptual_groups(inputs, lg)
        terms["percep"] = (cfg.a_percep, shared_std_advantage(lg, groups, 3, cfg.eps))
        metrics.update(extra, percep_used=1.0)
    if inputs.seq_logprob is not None and cfg.a_reason > 0:
        groups, nb = reasoning_groups(inputs, lg, cfg)
        terms["reason"] = (cfg.a_reason, shared_std_advantage(lg, groups, nb, cfg.eps))
        metrics["reason_used"] = 1.0
    total = sum(w for w, _ in terms.values())
    if total <= 0:
        raise ValueError(
            "durian: every available view has weight 0 (a_ori = 0 and the perceptual/reasoning inputs are "
            "missing or weighted 0); raise durian.a_ori or supply visual_entropy / seq_logprob"
        )
    adv = torch.zeros_like(lg.rewards)  # [N]
    for name, (w, a) in terms.items():
        adv = adv + (w / total) * a
        metrics[f"weight_{name}"] = w / total
        metrics[f"abs_adv_{name}"] = float(a.abs().mean())
    return finish(adv, inputs, metrics)


# The engine computes these optional AdvantageInputs fields only for estimators that ask.
durian.requires = ("seq_logprob", "visual_entropy")
