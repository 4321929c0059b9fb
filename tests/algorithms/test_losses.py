"""Tests of loss_utils, ppo_clip / dapo / gspo, DAPO overlong shaping, and properties every
registered loss must have. Hand-worked numbers carry their arithmetic in comments."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_zoo.algorithms import extra_losses, loss_utils, losses, reward_shaping  # noqa: F401  (registration)
from grpo_zoo.algorithms.loss_utils import aggregate, kl_penalty, sampler_mismatch, tis_weights, token_ratio
from grpo_zoo.algorithms.losses import DAPOConfig, GSPOConfig, PPOClipConfig, gspo, ppo_clip
from grpo_zoo.algorithms.reward_shaping import overlong_penalty
from grpo_zoo.configuration import build
from grpo_zoo.registry import LOSSES
from grpo_zoo.types import LossInputs

D = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=D)


def one_row(log_ratios: list[float], adv: float, **kw) -> LossInputs:
    """One response whose tokens have the given log pi/pi_old; old_logp = -1 everywhere."""
    old = torch.full((1, len(log_ratios)), -1.0, dtype=D)
    logp = (old + t([log_ratios])).requires_grad_()
    return LossInputs(logp=logp, old_logp=old, advantages=t([adv]), mask=torch.ones_like(old), **kw)


def random_inputs(n: int = 4, length: int = 6, seed: int = 0, spread: float = 0.05, **kw) -> LossInputs:
    """Random batch with ragged lengths and one fully masked row; garbage (NaN) in padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(n, length, dtype=D)
    for i in range(n):
        mask[i, length - i :] = 0  # row i has length - i tokens
    mask[-1] = 0  # a fully masked row
    old = -torch.rand(n, length, generator=g, dtype=D) * 2 - 0.1
    logp = old + spread * torch.randn(n, length, generator=g, dtype=D)
    logp = logp.masked_fill(mask == 0, float("nan")).requires_grad_()
    adv = torch.randn(n, generator=g, dtype=D)
    return LossInputs(logp=logp, old_logp=old, advantages=adv, mask=mask, **kw)


def run(name: str, inputs: LossInputs, **cfg_kw):
    entry = LOSSES.get(name)
    return entry.obj(inputs, entry.config_cls(**cfg_kw))


# --------------------------------------------------------------------------------------
# loss_utils
# --------------------------------------------------------------------------------------

TOKEN_LOSS = t([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])  # the 9s are padding
MASK = t([[1, 1, 1], [1, 0, 0]])


@pytest.mark.parametrize(
    ("mode", "max_len", "expected"),
    [
        ("token-mean", 0, 2.5),  # (1 + 2 + 3 + 4) / 4 tokens
        ("seq-mean-token-mean", 0, 3.0),  # (6/3 + 4/1) / 2 rows = (2 + 4) / 2
        ("seq-mean-token-sum", 0, 5.0),  # (6 + 4) / 2
        ("seq-mean-token-sum-norm", 4, 1.25),  # (6/4 + 4/4) / 2
        ("seq-mean-token-sum-norm", 0, 5.0 / 3.0),  # max_len 0 -> T = 3: (6/3 + 4/3) / 2 = 10/6
    ],
)
def test_aggregate_hand_examples(mode, max_len, expected):
    assert aggregate(TOKEN_LOSS, MASK, mode, max_len).item() == pytest.approx(expected)
    # An extra fully masked row (with garbage) changes neither sums nor denominators.
    padded_loss = torch.cat([TOKEN_LOSS, t([[7.0, 7.0, 7.0]])])
    padded_mask = torch.cat([MASK, t([[0, 0, 0]])])
    assert aggregate(padded_loss, padded_mask, mode, max_len).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", loss_utils.AGGREGATIONS)
def test_aggregate_all_masked_is_zero(mode):
    assert aggregate(TOKEN_LOSS, torch.zeros_like(MASK), mode).item() == 0.0


def test_aggregate_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(TOKEN_LOSS, MASK, "token-sum")


def test_token_ratio_clamps_at_20():
    ratio = token_ratio(t([50.0, -50.0, 0.5]), t([0.0, 0.0, 0.0]))
    assert torch.allclose(ratio, t([math.exp(20), math.exp(-20), math.exp(0.5)]))


def test_kl_penalty_hand_numbers():
    logp, ref = t([-1.0, -2.0, 0.0]), t([-2.0, -1.0, -100.0])
    # delta = ref - logp = [-1, 1, -100 -> clamped -20]
    # k1 = -delta = [1, -1, 20]
    assert torch.allclose(kl_penalty(logp, ref, "k1"), t([1.0, -1.0, 20.0]))
    # k3 = e^delta - delta - 1 = [e^-1 + 1 - 1, e - 1 - 1, e^-20 + 20 - 1]
    k3 = t([math.exp(-1), math.e - 2, math.exp(-20) + 19])
    assert torch.allclose(kl_penalty(logp, ref, "k3"), k3)
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(logp, ref, "k2")


def test_tis_weights_and_mismatch():
    old = t([[-1.0, -0.5, -2.0, -3.0]])
    sampler = t([[-1.5, -2.0, -1.0, 5.0]])
    mask = t([[1, 1, 1, 0]])  # the last token is padding
    # exp(old - sampler) = [e^0.5 = 1.6487, e^1.5 = 4.48 -> cap 2, e^-1 = 0.3679, ...]
    w = tis_weights(old, sampler, cap=2.0)
    assert torch.allclose(w[0, :3], t([math.exp(0.5), 2.0, math.exp(-1)]))
    assert not w.requires_grad
    # mean |old - sampler| over valid tokens = (0.5 + 1.5 + 1.0) / 3 = 1.0 (padding's 8 ignored)
    assert sampler_mismatch(old, sampler, mask) == pytest.approx(1.0)


def test_finish_applies_tis_only_when_enabled():
    # ratio 1 and A = 1: policy term -1 per token; TIS weights as above [1.6487, 2, 0.3679]
    inputs = one_row([0.0, 0.0, 0.0], 1.0)
    inputs.sampler_logp = inputs.old_logp + t([[-0.5, -1.5, 1.0]])
    out = ppo_clip(inputs, PPOClipConfig(tis_cap=2.0))
    assert out.loss.item() == pytest.approx(-(math.exp(0.5) + 2.0 + math.exp(-1)) / 3)
    assert out.metrics["tis_mismatch"] == pytest.approx(1.0)  # (0.5 + 1.5 + 1) / 3
    assert out.metrics["tis_capped_fraction"] == pytest.approx(1 / 3)
    off = ppo_clip(inputs, PPOClipConfig())
    assert off.loss.item() == pytest.approx(-1.0)
    assert off.metrics["tis_mismatch"] == pytest.approx(1.0)  # logged even when TIS is off
    assert "tis_weight_mean" not in off.metrics


def test_finish_adds_kl_and_its_gradient():
    # A = 0: the policy term vanishes; logp - ref = 1 on each of 2 tokens, k1 = 1, beta = 0.5
    inputs = one_row([0.3, -0.2], 0.0, kl_coef=0.5, kl_estimator="k1")
    inputs.ref_logp = inputs.logp.detach() - 1.0
    out = ppo_clip(inputs, PPOClipConfig())
    assert out.loss.item() == pytest.approx(0.5)  # token-mean of 0.5 * 1
    assert out.metrics["kl"] == pytest.approx(1.0)
    out.loss.backward()
    assert torch.allclose(inputs.logp.grad, t([[0.25, 0.25]]))  # d(0.5 k1)/dlogp / 2 tokens


def test_kl_without_reference_is_an_error():
    with pytest.raises(ValueError, match="ref_logp"):
        ppo_clip(one_row([0.0], 1.0, kl_coef=0.1), PPOClipConfig())


def test_bad_shapes_name_the_field():
    inputs = one_row([0.0, 0.0], 1.0)
    inputs.advantages = t([[1.0]])
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip(inputs, PPOClipConfig())
    inputs = one_row([0.0, 0.0], 1.0)
    inputs.mask = torch.ones(1, 3, dtype=D)
    with pytest.raises(ValueError, match="mask"):
        ppo_clip(inputs, PPOClipConfig())


# --------------------------------------------------------------------------------------
# ppo_clip / dapo
# --------------------------------------------------------------------------------------


def test_ppo_clip_positive_advantage():
    # A = +1, ratios [1.1, 1.5, 0.5]; clip range [0.8, 1.2]
    # 1.1: max(-1.1, -1.1) = -1.1 | 1.5: max(-1.5, -1.2) = -1.2 (clipped) | 0.5: max(-0.5, -0.8) = -0.5
    inputs = one_row([math.log(1.1), math.log(1.5), math.log(0.5)], 1.0)
    out = ppo_clip(inputs, PPOClipConfig())
    assert out.loss.item() == pytest.approx((-1.1 - 1.2 - 0.5) / 3)
    assert out.metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert out.metrics["ratio_max"] == pytest.approx(1.5)
    out.loss.backward()
    # d(-A r)/dlogp = -A r, / 3 tokens; the clipped token gets nothing
    assert torch.allclose(inputs.logp.grad, t([[-1.1 / 3, 0.0, -0.5 / 3]]))


@pytest.mark.parametrize(("dual_clip", "expected", "grad_big"), [(None, 8.4 / 4, 5.0 / 4), (3.0, 6.4 / 4, 0.0)])
def test_ppo_clip_negative_advantage_and_dual_clip(dual_clip, expected, grad_big):
    # A = -1, ratios [1.5, 0.5, 5, 1.1]:
    # 1.5: max(1.5, 1.2) = 1.5 | 0.5: max(0.5, 0.8) = 0.8 (clipped) | 5: max(5, 1.2) = 5 | 1.1: 1.1
    # no dual clip: (1.5 + 0.8 + 5 + 1.1) / 4 = 8.4 / 4; dual clip c = 3 caps 5 at -A c = 3: 6.4 / 4
    inputs = one_row([math.log(1.5), math.log(0.5), math.log(5.0), math.log(1.1)], -1.0)
    out = ppo_clip(inputs, PPOClipConfig(dual_clip=dual_clip))
    assert out.loss.item() == pytest.approx(expected)
    if dual_clip is not None:
        assert out.metrics["dual_clip_fraction"] == pytest.approx(1 / 4)
    out.loss.backward()
    assert torch.allclose(inputs.logp.grad, t([[1.5 / 4, 0.0, grad_big, 1.1 / 4]]))


def test_dual_clip_does_not_touch_positive_advantages():
    inputs = one_row([math.log(5.0)], 1.0)
    assert ppo_clip(inputs, PPOClipConfig(dual_clip=3.0)).loss.item() == pytest.approx(-1.2)


def test_ratio_far_from_one_is_clamped_and_finite():
    inputs = one_row([60.0, -60.0], -1.0)
    out = ppo_clip(inputs, PPOClipConfig())
    # exp(60) clamps to exp(20); max(exp(20), 1.2) and max(exp(-20), 0.8) for A = -1
    assert out.loss.item() == pytest.approx((math.exp(20) + 0.8) / 2)
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(20))
    capped = ppo_clip(inputs, PPOClipConfig(dual_clip=3.0))
    assert capped.loss.item() == pytest.approx((3.0 + 0.8) / 2)


def test_dapo_is_ppo_clip_with_clip_higher():
    entry = LOSSES.get("dapo")
    assert entry.obj is ppo_clip  # an alias, not a copy
    assert entry.config_cls is DAPOConfig
    assert DAPOConfig().eps_high == 0.28 and DAPOConfig().eps_low == 0.2
    # A = 1, ratio 1.25: ppo_clip caps at 1.2, dapo lets it through (< 1.28); ratio 1.3 -> 1.28
    inputs = one_row([math.log(1.25), math.log(1.3)], 1.0)
    assert ppo_clip(inputs, PPOClipConfig()).loss.item() == pytest.approx((-1.2 - 1.2) / 2)
    assert ppo_clip(inputs, DAPOConfig()).loss.item() == pytest.approx((-1.25 - 1.28) / 2)


@pytest.mark.parametrize(
    "kwargs",
    [{"eps_low": 1.0}, {"eps_high": -0.1}, {"dual_clip": 1.0}, {"aggregation": "sum"}, {"tis_cap": 0.0}],
)
def test_ppo_clip_config_rejects_bad_values(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        PPOClipConfig(**kwargs)


# --------------------------------------------------------------------------------------
# gspo
# --------------------------------------------------------------------------------------


def test_gspo_hand_example():
    # row 0, A = +1, log-ratios [0.1, 0.3]: s = e^0.2 = 1.2214 -> clipped to 1 + 4e-4, loss -1.0004
    # row 1, A = -1, log-ratios [-0.2, 0, -0.4]: s = e^-0.2 = 0.8187 -> max(0.8187, 0.9997) = 0.9997
    # row 2, A = 0.5, log-ratios [1e-4, 3e-4]: s = e^2e-4 inside the range, loss -0.5 e^2e-4
    # seq-mean-token-mean: (-1.0004 + 0.9997 - 0.5 e^2e-4) / 3
    old = torch.full((3, 3), -1.0, dtype=D)
    lr = t([[0.1, 0.3, 0.0], [-0.2, 0.0, -0.4], [1e-4, 3e-4, 0.0]])
    mask = t([[1, 1, 0], [1, 1, 1], [1, 1, 0]])
    logp = (old + lr).requires_grad_()
    inputs = LossInputs(logp=logp, old_logp=old, advantages=t([1.0, -1.0, 0.5]), mask=mask)
    out = gspo(inputs, GSPOConfig())
    assert out.loss.item() == pytest.approx((-1.0004 + 0.9997 - 0.5 * math.exp(2e-4)) / 3)
    assert out.metrics["clip_fraction"] == pytest.approx(5 / 7)  # rows 0 and 1: 5 of 7 tokens
    assert out.metrics["ratio_max"] == pytest.approx(math.exp(0.2))
    out.loss.backward()
    # clipped rows get no gradient; row 2: -A s / |o| / rows = -0.5 e^2e-4 / 2 / 3 per token
    g = -0.5 * math.exp(2e-4) / 2 / 3
    assert torch.allclose(logp.grad, t([[0, 0, 0], [0, 0, 0], [g, g, 0]]))


def test_gspo_token_gradient_equals_sequence_objective():
    # Without clipping GSPO-token with A_it = A_i has the gradient of -A exp(mean_t log r) (eq. 14).
    inputs = random_inputs(spread=0.01)
    cfg = GSPOConfig(eps_low=0.5, eps_high=0.5)
    gspo(inputs, cfg).loss.backward()
    grad = inputs.logp.grad.clone()
    logp = inputs.logp.detach().masked_fill(inputs.mask == 0, 0).requires_grad_()
    lr = (logp - inputs.old_logp) * inputs.mask
    rows = inputs.mask.sum(-1) > 0
    seq = torch.exp(lr.sum(-1) / inputs.mask.sum(-1).clamp(min=1))
    (-(inputs.advantages * seq)[rows].mean()).backward()
    assert torch.allclose(grad, logp.grad)


# --------------------------------------------------------------------------------------
# DAPO overlong shaping
# --------------------------------------------------------------------------------------


def test_overlong_penalty_hand_numbers():
    # L_max = 10, L_buf = 4: free up to 6 tokens, then -(len - 6) / 4
    lengths = torch.tensor([3, 6, 7, 8, 10, 12])
    expected = t([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])  # 12 > L_max: the paper's -1
    assert torch.allclose(overlong_penalty(lengths, 10, 4).to(D), expected)
    assert torch.equal(overlong_penalty(lengths, 10, 0), torch.zeros(6))  # buffer 0 = off


def test_overlong_penalty_errors():
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty(torch.tensor([1]), 10, 11)
    with pytest.raises(ValueError, match="lengths"):
        overlong_penalty(torch.ones(2, 2), 10, 4)
    with pytest.raises(ValueError, match="max_len"):
        overlong_penalty(torch.tensor([1]), 0, 0)


# --------------------------------------------------------------------------------------
# Properties every registered loss has
# --------------------------------------------------------------------------------------

ALL = LOSSES.names()


@pytest.mark.parametrize("name", ALL)
def test_every_loss_is_finite_on_random_input(name):
    inputs = random_inputs(n=6, length=8, seed=3, spread=0.5)
    out = run(name, inputs)
    assert out.loss.dim() == 0 and torch.isfinite(out.loss)
    out.loss.backward()
    assert torch.isfinite(inputs.logp.grad).all()
    assert (inputs.logp.grad[inputs.mask == 0] == 0).all()  # padding gets no gradient
    assert all(math.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", ALL)
def test_every_loss_with_kl_and_tis_and_float32(name):
    inputs = random_inputs(seed=4, spread=0.3, kl_coef=0.05, kl_estimator="k3")
    inputs.ref_logp = inputs.old_logp - 0.2
    inputs.sampler_logp = inputs.old_logp + 0.3
    for field in ("logp", "old_logp", "mask", "ref_logp", "sampler_logp", "advantages"):
        setattr(inputs, field, getattr(inputs, field).detach().float())
    inputs.logp.requires_grad_()
    out = run(name, inputs, tis_cap=2.0)
    assert torch.isfinite(out.loss) and out.loss.dtype == torch.float32
    assert {"kl", "tis_mismatch", "tis_weight_mean"} <= set(out.metrics)


@pytest.mark.parametrize("name", ALL)
def test_every_loss_zero_advantages_give_zero(name):
    inputs = random_inputs(seed=5, spread=0.3)
    inputs.advantages = torch.zeros_like(inputs.advantages)
    out = run(name, inputs)
    assert out.loss.item() == 0.0
    out.loss.backward()
    assert torch.count_nonzero(inputs.logp.grad) == 0


@pytest.mark.parametrize("name", ALL)
def test_every_loss_ignores_fully_masked_rows(name):
    inputs = random_inputs(n=4, seed=6, spread=0.3)
    base = run(name, inputs).loss.item()
    # Append an empty row whose log-probs are garbage: same loss, no NaN.
    inputs.logp = torch.cat([inputs.logp.detach(), torch.full((1, 6), float("nan"), dtype=D)]).requires_grad_()
    inputs.old_logp = torch.cat([inputs.old_logp, torch.full((1, 6), -1e30, dtype=D)])
    inputs.mask = torch.cat([inputs.mask, torch.zeros(1, 6, dtype=D)])
    inputs.advantages = torch.cat([inputs.advantages, t([5.0])])
    out = run(name, inputs)
    assert out.loss.item() == pytest.approx(base, rel=1e-12)
    out.loss.backward()
    assert torch.isfinite(inputs.logp.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_every_loss_all_masked_batch(name):
    inputs = random_inputs()
    inputs.mask = torch.zeros_like(inputs.mask)
    out = run(name, inputs)
    assert out.loss.item() == 0.0


@pytest.mark.parametrize("name", ALL)
def test_every_loss_ratio_far_from_one_is_finite(name):
    inputs = random_inputs(seed=7)
    shift = torch.where(torch.arange(6) % 2 == 0, 60.0, -60.0).to(D)
    inputs.logp = (inputs.logp.detach() + shift).requires_grad_()
    out = run(name, inputs)
    assert torch.isfinite(out.loss)
    out.loss.backward()
    assert torch.isfinite(inputs.logp.grad).all()


@pytest.mark.parametrize("name", ALL)
def test_every_loss_config_builds_from_yaml_data(name):
    entry = LOSSES.get(name)
    cfg = build(entry.config_cls, {"tis_cap": 2, "aggregation": "seq-mean-token-sum-norm"}, f"algorithm.loss.{name}")
    assert cfg.tis_cap == 2.0
    inputs = random_inputs(max_response_length=16)
    assert torch.isfinite(entry.obj(inputs, cfg).loss)


# Gradient checks (float64, away from clip kinks) by finite differences. gspo's tight clip is
# widened so the differences stay inside one branch. cispo's weight is a stop-gradient of the
# ratio, so its finite differences move old_logp and sampler_logp along with logp: the ratio
# and TIS weights then stay fixed, which is exactly what the stop-gradient promises.
GRADCHECK_CFG = {"gspo": {"eps_low": 0.5, "eps_high": 0.5}}
FROZEN_RATIO = {"cispo"}


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("with_extras", [False, True], ids=["plain", "kl+tis"])
def test_every_loss_gradcheck(name, with_extras):
    base = random_inputs(n=3, length=4, seed=11, spread=0.05)
    base.mask[-1, :2] = 1  # give the last row two tokens so every row type is exercised
    logp0 = base.old_logp + 0.05 * torch.randn(base.old_logp.shape, generator=torch.Generator().manual_seed(1), dtype=D)
    entry = LOSSES.get(name)
    cfg = entry.config_cls(**GRADCHECK_CFG.get(name, {}), tis_cap=2.0 if with_extras else None)
    extras = {}
    if with_extras:
        extras = {"ref_logp": base.old_logp - 0.3, "sampler_logp": base.old_logp + 0.2, "kl_coef": 0.1}

    def f(logp):
        old, kw = base.old_logp, dict(extras)
        if name in FROZEN_RATIO:
            old = logp - (logp0 - base.old_logp)  # same ratio at every probe; detached inside the loss
            if with_extras:
                kw["sampler_logp"] = old + 0.2
        inputs = LossInputs(logp=logp, old_logp=old, advantages=base.advantages, mask=base.mask, **kw)
        return entry.obj(inputs, cfg).loss

    assert torch.autograd.gradcheck(f, (logp0.clone().requires_grad_(),), eps=1e-6, atol=1e-7)
