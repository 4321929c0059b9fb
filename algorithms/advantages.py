"""Baseline advantage estimators: grpo (+ lite_ppo), dr_grpo, rloo, reinforce_pp_baseline, grpo_passk, opo.

Every estimator is `fn(inputs: AdvantageInputs, cfg) -> AdvantageOutput` with one advantage
per response (the engine broadcasts it over tokens). Local group = the rows sharing a
`prompt_ids` value. Maths runs in float64 and the result is cast back to the reward dtype.
Formulas: /work/shared/ALGORITHMS.md, "Baseline estimators" and "More baselines".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from grpo_zoo.algorithms import _groups as grp
from grpo_zoo.registry import ESTIMATORS
from grpo_zoo.types import AdvantageInputs, AdvantageOutput


def output_dtype(rewards: torch.Tensor) -> torch.dtype:
    """The dtype advantages are returned in: the reward dtype when it is floating, else the default."""
    return rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()


def finish(adv: torch.Tensor, inputs: AdvantageInputs, metrics: dict[str, float]) -> AdvantageOutput:
    """Cast float64 advantages [N] back and wrap them with float metrics."""
    return AdvantageOutput(adv.to(output_dtype(inputs.rewards)), {k: float(v) for k, v in metrics.items()})


def check_eps(owner: str, name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{owner}.{name} must be > 0 (it keeps a constant group at 0 instead of NaN), got {value}")


@dataclass
class LocalGroups:
    """Float64 rewards and their local-group statistics, computed once per call."""

    rewards: torch.Tensor  # [N] float64
    idx: torch.Tensor  # [N] long, dense local-group label
    k: int  # number of local groups
    count: torch.Tensor  # [K] float64
    mean: torch.Tensor  # [K] float64

    @classmethod
    def of(cls, inputs: AdvantageInputs) -> LocalGroups:
        r = inputs.rewards.to(torch.float64)  # [N]
        idx, k = grp.dense_ids(inputs.prompt_ids)
        count = grp.group_count(idx, k)
        return cls(r, idx, k, count, grp.group_mean_exact(r, idx, k, count))

    def centred(self) -> torch.Tensor:  # [N] r_i - mean_local(i); exactly 0 for a group of one
        return self.rewards - grp.take(self.mean, self.idx)

    def std(self) -> torch.Tensor:  # [K] Bessel std, 0 for a group of one
        return grp.group_std(self.rewards, self.idx, self.k, self.mean, self.count)


def batch_std(values: torch.Tensor) -> torch.Tensor:
    """Bessel std over all rows of a float64 [N] tensor (0 for a single row)."""
    if values.numel() < 2:
        return values.new_zeros(())
    return values.std()


# ---------------------------------------------------------------------------------------
# grpo and lite_ppo
# ---------------------------------------------------------------------------------------


@dataclass
class GRPOConfig:
    """Options of `grpo` (DeepSeekMath, arXiv 2402.03300)."""

    scale: Literal["group", "batch", "none"] = "group"
    """What divides r_i - mean_local: "group" = the local Bessel std (GRPO); "batch" = the Bessel
    std of every reward of the step (TRL scale_rewards="batch", Lite PPO), steadier when many
    groups are nearly constant; "none" = nothing (then identical to dr_grpo)."""
    eps: float = 1e-6
    """Added to the std so that a constant group gives 0, not NaN; larger damps near-constant groups."""

    def __post_init__(self) -> None:
        if self.scale not in ("group", "batch", "none"):
            raise ValueError(f"grpo.scale must be 'group', 'batch' or 'none', got {self.scale!r}")
        check_eps("grpo", "eps", self.eps)


@dataclass
class LitePPOConfig(GRPOConfig):
    """Options of `lite_ppo` (arXiv 2508.08221): grpo with the batch-level std by default."""

    scale: Literal["group", "batch", "none"] = "batch"
    """As grpo.scale; Lite PPO's point is "batch" (group mean, batch std)."""


@ESTIMATORS.register("grpo", config=GRPOConfig, description="GRPO: (r - local mean) / (local or batch std + eps)")
def grpo(inputs: AdvantageInputs, cfg: GRPOConfig) -> AdvantageOutput:
    """GRPO advantage A_i = (r_i - mean_local) / (std + eps) (DeepSeekMath, arXiv 2402.03300, outcome supervision).

    std is the local group's Bessel std (scale="group"), the Bessel std of all N rewards
    (scale="batch", TRL's scale_rewards="batch"), or 1 without eps (scale="none").
    Edge cases: a group of one response or of equal rewards gives exactly 0.
    """
    lg = LocalGroups.of(inputs)
    centred = lg.centred()  # [N]
    if cfg.scale == "group":
        std_local = lg.std()  # [K]
        adv = centred / (grp.take(std_local, lg.idx) + cfg.eps)
        zero_std_share = float((std_local == 0).double().mean())
    elif cfg.scale == "batch":
        std_b = batch_std(lg.rewards)
        adv = centred / (std_b + cfg.eps)
        zero_std_share = float(std_b == 0)
    else:
        adv = centred
        zero_std_share = 0.0
    return finish(adv, inputs, {"zero_std_share": zero_std_share})


ESTIMATORS.alias(
    "lite_ppo", "grpo", config=LitePPOConfig, description="Lite PPO: grpo with group mean and batch std"
)


# ---------------------------------------------------------------------------------------
# dr_grpo, rloo, opo: mean-style baselines without a std
# ---------------------------------------------------------------------------------------


@dataclass
class DrGRPOConfig:
    """`dr_grpo` has no options (pair it with a loss aggregation that does not divide by length)."""


@ESTIMATORS.register("dr_grpo", config=DrGRPOConfig, description="Dr.GRPO: r - local mean, no std")
def dr_grpo(inputs: AdvantageInputs, cfg: DrGRPOConfig) -> AdvantageOutput:
    """Dr.GRPO advantage A_i = r_i - mean_local (arXiv 2503.20783: GRPO without the std).

    A group of one response gives 0.
    """
    lg = LocalGroups.of(inputs)
    return finish(lg.centred(), inputs, {})


@dataclass
class RLOOConfig:
    """`rloo` has no options."""


@ESTIMATORS.register("rloo", config=RLOOConfig, description="RLOO: r - mean of the other G-1 rewards")
def rloo(inputs: AdvantageInputs, cfg: RLOOConfig) -> AdvantageOutput:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv 2402.14740).

    A_i = r_i - mean_{j != i} r_j = G/(G-1) (r_i - mean_local), with G the size of the row's
    own local group (groups may differ in size). G = 1 has no "others": A = 0.
    """
    lg = LocalGroups.of(inputs)
    g = grp.take(lg.count, lg.idx)  # [N]
    factor = torch.where(g > 1, g / (g - 1).clamp_min(1.0), torch.zeros_like(g))
    return finish(factor * lg.centred(), inputs, {})


@dataclass
class OPOConfig:
    """`opo` has no options."""


@ESTIMATORS.register("opo", config=OPOConfig, description="OPO: r - length-weighted local mean")
def opo(inputs: AdvantageInputs, cfg: OPOConfig) -> AdvantageOutput:
    """On-Policy RL with Optimal reward baseline (arXiv 2505.23585).

    b = sum_j len_j r_j / sum_j len_j over the local group; A_i = r_i - b. len_j counts the
    valid tokens of response j. A group whose responses all have length 0 falls back to the
    plain mean (its tokens are all masked anyway). A group of one response gives 0 here
    (verl uses b = 0 there, i.e. A = r; we keep the "G = 1 -> 0" rule of every estimator).
    """
    lg = LocalGroups.of(inputs)
    lengths = inputs.response_lengths.to(torch.float64)  # [N]
    len_sum = grp.group_sum(lengths, lg.idx, lg.k)  # [K]
    lo = grp.group_min(lg.rewards, lg.idx, lg.k)  # [K]; shifting by it keeps a constant group exactly 0
    shifted = grp.group_sum(lengths * (lg.rewards - grp.take(lo, lg.idx)), lg.idx, lg.k)  # [K]
    baseline = torch.where(len_sum > 0, lo + shifted / len_sum.clamp_min(1e-300), lg.mean)  # [K]
    adv = lg.rewards - grp.take(baseline, lg.idx)
    adv = torch.where(grp.take(lg.count, lg.idx) > 1, adv, torch.zeros_like(adv))
    return finish(adv, inputs, {"empty_group_share": float((len_sum == 0).double().mean())})


# ---------------------------------------------------------------------------------------
# reinforce_pp_baseline: local mean, then token-level whitening over the batch
# ---------------------------------------------------------------------------------------


@dataclass
class ReinforcePPBaselineConfig:
    """Options of `reinforce_pp_baseline` (REINFORCE++ with a group baseline)."""

    eps: float = 1e-8
    """Added to the variance inside the sqrt of the whitening; keeps a constant batch finite."""

    def __post_init__(self) -> None:
        check_eps("reinforce_pp_baseline", "eps", self.eps)


@ESTIMATORS.register(
    "reinforce_pp_baseline",
    config=ReinforcePPBaselineConfig,
    description="REINFORCE++-baseline: r - local mean, whitened over all valid tokens",
)
def reinforce_pp_baseline(inputs: AdvantageInputs, cfg: ReinforcePPBaselineConfig) -> AdvantageOutput:
    """REINFORCE++-baseline (arXiv 2501.03262): x_i = r_i - mean_local, then whitening
    (x - mu) / sqrt(var + eps) over every valid token of the batch.

    Each response counts once per valid token (its advantage is the same on all of them), so
    mu = sum_i len_i x_i / L and var = sum_i len_i (x_i - mu)^2 / (L - 1) with L = total valid
    tokens (Bessel over tokens, as verl's masked_whiten). L < 2 gives var = 0; L = 0 (every
    token masked) returns zeros. The shift by mu means an all-equal group is not 0 here.
    """
    lg = LocalGroups.of(inputs)
    x = lg.centred()  # [N]
    lengths = inputs.response_lengths.to(torch.float64)  # [N]
    total = lengths.sum()
    if total <= 0:
        return finish(torch.zeros_like(x), inputs, {"token_mean": 0.0, "token_std": 0.0})
    mu = (lengths * x).sum() / total
    var = (lengths * (x - mu) ** 2).sum() / (total - 1) if total > 1 else x.new_zeros(())
    adv = (x - mu) / torch.sqrt(var + cfg.eps)
    return finish(adv, inputs, {"token_mean": float(mu), "token_std": float(var.sqrt())})


# ---------------------------------------------------------------------------------------
# grpo_passk: only the best response of a group learns
# ---------------------------------------------------------------------------------------


@dataclass
class GRPOPassKConfig:
    """Options of `grpo_passk` (arXiv 2503.19595)."""

    norm_by_std: bool = True
    """Divide r_max - r_second_max by the local Bessel std + eps (verl's default); off = raw gap."""
    eps: float = 1e-6
    """Added to the std so that a constant group gives 0, not NaN."""

    def __post_init__(self) -> None:
        check_eps("grpo_passk", "eps", self.eps)


@ESTIMATORS.register(
    "grpo_passk", config=GRPOPassKConfig, description="Pass@k GRPO: only the best response gets r_max - r_2nd"
)
def grpo_passk(inputs: AdvantageInputs, cfg: GRPOPassKConfig) -> AdvantageOutput:
    """Pass@k-style advantage (arXiv 2503.19595; verl compute_grpo_passk_outcome_advantage).

    Per local group, the best response gets A = r_max - r_second_max (divided by std_local +
    eps when norm_by_std), every other response 0. Ties for the best: the first in row order
    gets the (then zero) gap. Needs G >= 2 in every group: raises ValueError otherwise.
    """
    lg = LocalGroups.of(inputs)
    if bool((lg.count < 2).any()):
        one = int(torch.nonzero(lg.count < 2)[0])
        bad_id = int(inputs.prompt_ids[lg.idx == one][0])
        raise ValueError(
            f"grpo_passk needs G >= 2 responses per prompt, but AdvantageInputs.prompt_ids has a group "
            f"of 1 (prompt id {bad_id}); roll out at least 2 responses per prompt or use another estimator"
        )
    best = grp.group_first_argmax(lg.rewards, lg.idx, lg.k)  # [K] row index
    gap = grp.group_max(lg.rewards, lg.idx, lg.k) - grp.group_second_max(lg.rewards, lg.idx, lg.k, best)  # [K]
    if cfg.norm_by_std:
        gap = gap / (lg.std() + cfg.eps)
    adv = torch.zeros_like(lg.rewards)
    adv[best] = gap
    return finish(adv, inputs, {"nonzero_share": float((gap != 0).double().mean())})
