"""Shared pieces of every policy loss: ratios, aggregation, KL, rollout correction.

A loss plug-in computes a per-token loss [N, T] and hands it to `finish`, which applies the
parts every loss shares in one fixed order:

    token_loss * TIS weight (rollout correction, when the loss config enables it)
    + kl_coef * KL(policy || reference) (when LossInputs.kl_coef > 0)
    -> aggregate over valid tokens -> LossOutput(loss, metrics)

Padding never reaches the arithmetic: `prepare` zeroes padded log-probs before any ratio is
taken, so garbage (even NaN/-inf) in padded positions yields neither NaN losses nor NaN
gradients, and a fully masked row contributes nothing.

Metric keys written here: `kl` (mean KL per valid token, whenever ref_logp is given),
`tis_mismatch` (mean |old_logp - sampler_logp|, whenever sampler_logp is given),
`tis_weight_mean` and `tis_capped_fraction` (when TIS is on).

Rollout correction default: every loss config's `tis_cap` is "auto" unless the recipe sets it.
`build_run` resolves "auto" by the rollout backend (`resolve_tis_cap`): DEFAULT_TIS_CAP for an
external sampler (vLLM, whose numerics differ from the trainer's), None (off) for one that runs
the trainer's own model code (hf, ray), where the weights would all be 1. A number is kept as
given, and null turns TIS off even for an external sampler. Unresolved "auto" (a loss called
outside the engine) means off.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import torch

from grpo_zoo.types import LossInputs, LossOutput

Aggregation = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)
LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 4.9e8: large enough to never bind in sane training, finite in fp32
DEFAULT_TIS_CAP = 2.0  # C of truncated importance sampling (verl / Yao et al. 2025 "Your efficient RL framework...")
TIS_AUTO = "auto"  # tis_cap value meaning "the engine decides by the rollout backend" (the default)
TisCap = float | Literal["auto"] | None  # type of every loss config's tis_cap field


@dataclass
class Prepared:
    """LossInputs with padding neutralised, in the dtype the loss computes in."""

    logp: torch.Tensor  # [N, T] current log-probs, 0 on padding, grad flows
    old_logp: torch.Tensor  # [N, T] detached, 0 on padding
    adv: torch.Tensor  # [N, 1] advantages, detached, ready to broadcast over T
    mask: torch.Tensor  # [N, T] float 0/1
    valid: torch.Tensor  # [N, T] bool


def check_inputs(inputs: LossInputs) -> None:
    """Raise a ValueError naming the LossInputs field whose shape or value is wrong."""
    if inputs.logp.dim() != 2:
        raise ValueError(f"LossInputs.logp must be [N, T], got shape {tuple(inputs.logp.shape)}")
    shape = inputs.logp.shape
    for name in ("old_logp", "mask", "ref_logp", "sampler_logp"):
        value = getattr(inputs, name)
        if value is not None and value.shape != shape:
            raise ValueError(f"LossInputs.{name} must have the shape of logp {tuple(shape)}, got {tuple(value.shape)}")
    if inputs.advantages.shape != (shape[0],):
        raise ValueError(
            f"LossInputs.advantages must be [N] = ({shape[0]},), one per response, got {tuple(inputs.advantages.shape)}"
        )
    if inputs.kl_coef < 0:
        raise ValueError(f"LossInputs.kl_coef must be >= 0, got {inputs.kl_coef}")
    if inputs.kl_coef > 0 and inputs.ref_logp is None:
        raise ValueError("LossInputs.kl_coef > 0 needs ref_logp (the reference policy's log-probs); pass it or set 0")
    if inputs.kl_estimator not in ("k1", "k3"):
        raise ValueError(f"LossInputs.kl_estimator must be 'k1' or 'k3', got {inputs.kl_estimator!r}")
    if inputs.max_response_length < 0:
        raise ValueError(f"LossInputs.max_response_length must be >= 0 (0 = use T), got {inputs.max_response_length}")


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """Half precision log-probs are upcast: exp() of a bf16 log-ratio loses the clip region."""
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def prepare(inputs: LossInputs) -> Prepared:
    """Validate `inputs` and return padding-free tensors (see the module docstring for why)."""
    check_inputs(inputs)
    dtype = compute_dtype(inputs.logp)
    valid = inputs.mask > 0  # [N, T]
    # masked_fill, not multiply: 0 * NaN is NaN, and its backward would leak NaN gradients.
    logp = inputs.logp.to(dtype).masked_fill(~valid, 0.0)
    old_logp = inputs.old_logp.detach().to(dtype).masked_fill(~valid, 0.0)
    adv = inputs.advantages.detach().to(dtype).unsqueeze(-1)  # [N, 1]
    return Prepared(logp, old_logp, adv, valid.to(dtype), valid)


def log_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """log(pi / pi_old) per token, clamped to +-20 so exp() stays finite."""
    return (logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """Importance ratio pi / pi_old = exp(clamp(logp - old_logp, -20, 20)) per token. [N, T]"""
    return torch.exp(log_ratio(logp, old_logp))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over mask > 0; 0 (not NaN) when nothing is valid."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def row_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean over valid tokens, [N, T] -> [N]; 0 for a fully masked row."""
    mask = mask.to(x.dtype)
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def aggregate(token_loss: torch.Tensor, mask: torch.Tensor, mode: str, max_len: int = 0) -> torch.Tensor:
    """Reduce a per-token loss [N, T] to a scalar.

    Modes (DAPO arXiv 2503.14476 sec. 3.3; Dr.GRPO arXiv 2503.20783 sec. 3.1):
      token-mean              sum of all valid token losses / number of valid tokens
      seq-mean-token-mean     mean over rows of (row's token sum / row's token count)  (GRPO)
      seq-mean-token-sum      mean over rows of the row's token sum
      seq-mean-token-sum-norm mean over rows of (row's token sum / max_len)            (Dr.GRPO)
    max_len is a fixed length (the response limit) so no response is normalised by its own
    length; 0 means use T. The row means run over non-empty rows only, so a fully masked row
    adds nothing and changes no denominator; an all-masked batch gives 0.
    """
    mask = mask.to(token_loss.dtype)
    masked = token_loss * mask  # [N, T]
    if mode == "token-mean":
        return masked.sum() / mask.sum().clamp(min=1)
    tokens = mask.sum(-1)  # [N]
    rows = (tokens > 0).to(token_loss.dtype).sum().clamp(min=1)
    if mode == "seq-mean-token-mean":
        per_row = masked.sum(-1) / tokens.clamp(min=1)
    elif mode == "seq-mean-token-sum":
        per_row = masked.sum(-1)
    elif mode == "seq-mean-token-sum-norm":
        if max_len < 0:
            raise ValueError(f"max_len for seq-mean-token-sum-norm must be >= 0 (0 = use T), got {max_len}")
        per_row = masked.sum(-1) / float(max_len or token_loss.shape[-1])
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
    return per_row.sum() / rows


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020, "Approximating KL").

    k1 = logp - ref_logp (unbiased, high variance, can be negative);
    k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased, >= 0, low variance; GRPO's choice).
    The difference ref - logp is clamped to +-20 first so k3 stays finite. [N, T] -> [N, T]
    """
    delta = (ref_logp.detach() - logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    if kind == "k1":
        return -delta
    if kind == "k3":
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"unknown KL estimator {kind!r} (LossInputs.kl_estimator); choose 'k1' or 'k3'")


def tis_weights(old_logp: torch.Tensor, sampler_logp: torch.Tensor, cap: float = DEFAULT_TIS_CAP) -> torch.Tensor:
    """Truncated importance sampling weights w_t = min(pi_old_trainer / pi_sampler, C). [N, T], no grad.

    Corrects for an external sampler (vLLM) whose numerics differ from the trainer's: tokens the
    trainer finds likelier than the sampler did get weight > 1, capped at C to bound variance.
    """
    with torch.no_grad():
        return torch.exp(log_ratio(old_logp.detach(), sampler_logp.detach())).clamp(max=cap)


def sampler_mismatch(old_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean |old_logp - sampler_logp| over valid tokens: how far the sampler drifts from the trainer."""
    with torch.no_grad():
        return float(masked_mean((old_logp.detach() - sampler_logp.detach()).abs(), mask > 0))


def finish(
    token_loss: torch.Tensor,
    inputs: LossInputs,
    aggregation: str,
    *,
    tis_cap: float | str | None = None,
    metrics: dict[str, float] | None = None,
) -> LossOutput:
    """Apply TIS, add the KL term, aggregate, and fill the shared metrics.

    token_loss: [N, T] the loss's own per-token policy term (padding values are ignored).
    TIS multiplies only the policy term, as in verl: the KL term already uses the current
    policy's own log-probs and needs no sampler correction. tis_cap "auto" (not resolved by the
    engine) counts as off.
    """
    metrics = dict(metrics or {})
    tis_cap = None if tis_cap == TIS_AUTO else tis_cap
    p = prepare(inputs)
    if inputs.sampler_logp is not None:
        sampler = inputs.sampler_logp.detach().to(p.logp.dtype).masked_fill(~p.valid, 0.0)
        metrics["tis_mismatch"] = sampler_mismatch(p.old_logp, sampler, p.mask)
        if tis_cap is not None:
            weights = tis_weights(p.old_logp, sampler, tis_cap)  # [N, T]
            token_loss = token_loss * weights
            metrics["tis_weight_mean"] = float(masked_mean(weights, p.mask))
            raw = torch.exp(log_ratio(p.old_logp, sampler))
            metrics["tis_capped_fraction"] = float(masked_mean((raw > tis_cap).to(p.mask.dtype), p.mask))
    if inputs.ref_logp is not None:
        ref = inputs.ref_logp.detach().to(p.logp.dtype).masked_fill(~p.valid, 0.0)
        kl = kl_penalty(p.logp, ref, inputs.kl_estimator)  # [N, T]
        metrics["kl"] = float(masked_mean(kl.detach(), p.mask))
        if inputs.kl_coef > 0:
            token_loss = token_loss + inputs.kl_coef * kl
    token_loss = token_loss.masked_fill(~p.valid, 0.0)
    loss = aggregate(token_loss, p.mask, aggregation, inputs.max_response_length)
    return LossOutput(loss=loss, metrics=metrics)


def ratio_metrics(ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """ratio_mean / ratio_max over valid entries (1.0 when nothing is valid)."""
    with torch.no_grad():
        valid = mask > 0
        if not bool(valid.any()):
            return {"ratio_mean": 1.0, "ratio_max": 1.0}
        return {"ratio_mean": float(ratio[valid].mean()), "ratio_max": float(ratio[valid].max())}


def fraction(flag: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of valid tokens where `flag` is true."""
    with torch.no_grad():
        return float(masked_mean(flag.to(torch.float32), (mask > 0).to(torch.float32)))


def check_tis_cap(owner: str, tis_cap: float | str | None) -> None:
    """Shared __post_init__ check of the rollout-correction field of every loss config."""
    if tis_cap == TIS_AUTO or tis_cap is None:
        return
    if isinstance(tis_cap, str) or not tis_cap > 0:
        raise ValueError(
            f"{owner}.tis_cap must be > 0 (typically {DEFAULT_TIS_CAP}), 'auto' (on for an external sampler "
            f"such as vLLM, off otherwise) or null to turn TIS off; got {tis_cap!r}"
        )


def resolve_tis_cap(tis_cap: float | str | None, external_sampler: bool) -> float | None:
    """The cap a run uses: "auto" -> DEFAULT_TIS_CAP for an external sampler, else None; others as given.

    ALGORITHMS.md: rollout correction is on (C = 2.0) for a vLLM or any external sampler; with the
    trainer's own model sampling, pi_sampler = pi_old and every weight would be exactly 1.
    """
    if tis_cap == TIS_AUTO:
        return DEFAULT_TIS_CAP if external_sampler else None
    return tis_cap


def check_aggregation(owner: str, aggregation: str) -> None:
    """Shared __post_init__ check of the aggregation field of every loss config."""
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"{owner}.aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}")
