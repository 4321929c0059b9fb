"""DIVA-GRPO advantage: difficulty-weighted local + global GRPO (arXiv 2603.01106, ICLR 2026).

Local group = the G responses of one prompt (`prompt_ids`); global group = every response of
a question, original and variants (`question_ids`). Steps (ALGORITHMS.md, "DIVA-GRPO" 3):
  a. A_L, A_G = GRPO inside local and inside global groups;
  b. batch z-score of each over the valid responses (one value per response, not per token);
  c. difficulty weighting exp(k (D_i - Dbar_q) sign(A)) on A_G (after b by default);
  d. reward-range rescaling (RRB) per group, on local and global groups;
  e. A = alpha A_L + beta A_G.
The order a-e is the authors' (their trainer applies the same steps in this order).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from grpo_zoo.algorithms import _groups as grp
from grpo_zoo.algorithms.advantages import check_eps, finish
from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs, AdvantageOutput

MAX_WEIGHT_EXPONENT = 30.0  # |k (D_i - Dbar_q)| cap: unreachable for real labels (|D_i - Dbar_q| <= 16)


@dataclass
class DIVAConfig:
    """Options of the `diva` estimator. Defaults are the paper's main setting ("WAN" + RRB)."""

    k: float = 0.1
    """Difficulty-weighting strength: weight = exp(k (D_i - Dbar_q) sign(A)); 0 turns weighting off."""
    weight_stage: Literal["after_norm", "before_norm"] = "after_norm"
    """Weight after the batch z-score (paper's main "WAN") or before it ("WBN", the authors' code default)."""
    weight_on: Literal["global", "both"] = "global"
    """Weight A_G only (paper) or A_L as well; "both" also tilts the per-prompt signal by difficulty."""
    normalize: Literal["zscore", "none"] = "zscore"
    """Batch z-score of A_L and A_G over valid responses (paper); "none" keeps raw GRPO scales."""
    rrb: Literal["paper", "authors", "none"] = "paper"
    """Reward-range rescaling: "paper" multiplies by (max r - min r) / R_max of the group; "authors"
    multiplies by rrb_factor when every reward of the group is below rrb_threshold (released code)."""
    rrb_on: Literal["both", "local", "global"] = "both"
    """Which groups RRB rescales; the paper and the released script use both."""
    rrb_threshold: float = 0.15
    """Authors' RRB: a group with every reward below this (reward units) is damped."""
    rrb_factor: float = 0.1
    """Authors' RRB: the damping multiplier for such a group."""
    alpha: float = 1.0
    """Weight of the local advantage A_L in the sum."""
    beta: float = 1.0
    """Weight of the global advantage A_G in the sum."""
    eps: float = 1e-6
    """Added to every std (GRPO and z-score) so that a constant group or batch gives 0, not NaN."""

    def __post_init__(self) -> None:
        choices = {
            "weight_stage": ("after_norm", "before_norm"),
            "weight_on": ("global", "both"),
            "normalize": ("zscore", "none"),
            "rrb": ("paper", "authors", "none"),
            "rrb_on": ("both", "local", "global"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"diva.{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")
        for name in ("k", "rrb_threshold", "rrb_factor", "alpha", "beta"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"diva.{name} must be a finite number, got {getattr(self, name)}")
        check_eps("diva", "eps", self.eps)


def grpo_in_groups(r: torch.Tensor, idx: torch.Tensor, k: int, eps: float) -> torch.Tensor:
    """(r - mean_g) / (Bessel std_g + eps) for float64 rewards [N] and dense group labels [N]."""
    count = grp.group_count(idx, k)
    mean = grp.group_mean_exact(r, idx, k, count)
    std = grp.group_std(r, idx, k, mean, count)
    return (r - grp.take(mean, idx)) / (grp.take(std, idx) + eps)


def zscore_valid(a: torch.Tensor, valid: torch.Tensor, eps: float) -> torch.Tensor:
    """Batch z-score of a [N] with mean and Bessel std over the valid rows only; invalid rows -> 0.

    One value per response (the authors z-score a padded [N, T] tensor, which weights rows by
    T and counts padding). With no valid row at all, every row is used (all tokens are masked).
    """
    if bool(valid.all()) or not bool(valid.any()):
        mean = a.mean()
        std = a.std() if a.numel() > 1 else a.new_zeros(())
        return (a - mean) / (std + eps)
    sel = a[valid]
    mean = sel.mean()
    std = sel.std() if sel.numel() > 1 else sel.new_zeros(())
    return torch.where(valid, (a - mean) / (std + eps), torch.zeros_like(a))


def rrb_factor(r: torch.Tensor, idx: torch.Tensor, k: int, cfg: DIVAConfig, reward_max: float) -> torch.Tensor:
    """Per-row RRB multiplier [N] for the groups given by idx (float64)."""
    gmax = grp.group_max(r, idx, k)  # [K]
    if cfg.rrb == "paper":
        factor = (gmax - grp.group_min(r, idx, k)) / reward_max
    else:
        factor = torch.where(gmax < cfg.rrb_threshold, torch.full_like(gmax, cfg.rrb_factor), torch.ones_like(gmax))
    return grp.take(factor, idx)


def reward_max_of(inputs: AdvantageInputs) -> float:
    value = inputs.extras.get("reward_max", 1.0)
    try:
        value = float(value)
    except (TypeError, ValueError):
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"AdvantageInputs.extras['reward_max'] must be a finite number > 0, got {value!r}")
    return value


def difficulty_metrics(d: torch.Tensor | None) -> dict[str, float]:
    """Difficulty histogram over rows: share per integer level 1..9 (labels rounded and clipped)."""
    if d is None:
        return {"difficulty_missing": 1.0}
    levels = d.round().clamp(1, 9).long()  # [N]
    share = torch.bincount(levels, minlength=10)[1:].double() / d.numel()  # [9]
    out = {"difficulty_missing": 0.0, "difficulty_mean": float(d.mean())}
    out.update({f"difficulty_share_{i + 1}": float(s) for i, s in enumerate(share)})
    return out


@ESTIMATORS.register("diva", config=DIVAConfig, description="DIVA-GRPO: difficulty-weighted local + global GRPO")
def diva(inputs: AdvantageInputs, cfg: DIVAConfig) -> AdvantageOutput:
    """DIVA-GRPO advantage (arXiv 2603.01106; steps a-e in the module docstring).

    Difficulty D_i comes from `inputs.difficulty` [N]; Dbar_q is the mean D over the rows of
    the same question. When difficulty is None every D is equal, so every weight is 1 (the
    metric difficulty_missing says so). R_max for the paper's RRB is
    `inputs.extras["reward_max"]` (default 1.0). A group of one response has A = 0 before the
    z-score; the z-score then shifts every row by the batch mean, so no single row is promised 0.
    """
    r = inputs.rewards.to(torch.float64)  # [N]
    lidx, lk = grp.dense_ids(inputs.prompt_ids)
    qidx, qk = grp.dense_ids(inputs.question_ids)
    reward_max = reward_max_of(inputs)
    a_local = grpo_in_groups(r, lidx, lk, cfg.eps)  # [N]
    a_global = grpo_in_groups(r, qidx, qk, cfg.eps)  # [N]

    d = None if inputs.difficulty is None else inputs.difficulty.to(torch.float64)
    if d is None or cfg.k == 0:
        exponent = torch.zeros_like(r)  # weight 1 everywhere
    else:
        d_bar = grp.group_mean(d, qidx, qk)  # [Q]
        exponent = (cfg.k * (d - grp.take(d_bar, qidx))).clamp(-MAX_WEIGHT_EXPONENT, MAX_WEIGHT_EXPONENT)  # [N]

    def weighted(a: torch.Tensor) -> torch.Tensor:
        return torch.exp(exponent * torch.sign(a)) * a

    if cfg.weight_stage == "before_norm":
        a_global = weighted(a_global)
        a_local = weighted(a_local) if cfg.weight_on == "both" else a_local
    if cfg.normalize == "zscore":
        valid = inputs.response_lengths > 0  # [N]
        a_local = zscore_valid(a_local, valid, cfg.eps)
        a_global = zscore_valid(a_global, valid, cfg.eps)
    if cfg.weight_stage == "after_norm":
        a_global = weighted(a_global)
        a_local = weighted(a_local) if cfg.weight_on == "both" else a_local

    metrics: dict[str, float] = {}
    if cfg.rrb != "none":
        if cfg.rrb_on in ("both", "local"):
            f_local = rrb_factor(r, lidx, lk, cfg, reward_max)
            a_local = a_local * f_local
            metrics["rrb_local_factor_mean"] = float(f_local.mean())
        if cfg.rrb_on in ("both", "global"):
            f_global = rrb_factor(r, qidx, qk, cfg, reward_max)
            a_global = a_global * f_global
            metrics["rrb_global_factor_mean"] = float(f_global.mean())

    adv = cfg.alpha * a_local + cfg.beta * a_global  # [N]
    metrics.update(
        {
            "abs_adv_local": float(a_local.abs().mean()),
            "abs_adv_global": float(a_global.abs().mean()),
            "weighted_share": float((exponent != 0).double().mean()),
            "weight_exponent_abs_mean": float(exponent.abs().mean()),  # mean |log weight|
            "weight_clamped_share": float((exponent.abs() >= MAX_WEIGHT_EXPONENT).double().mean()),
            "variants_per_question": lk / qk,
        }
    )
    metrics.update(difficulty_metrics(d))
    return finish(adv, inputs, metrics)
