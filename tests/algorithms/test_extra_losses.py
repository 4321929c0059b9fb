"""Hand-worked tests of cispo, sapo, gmpo, clip_cov and kl_cov (arithmetic in comments).

The properties every registered loss shares (finite, masked rows, zero advantages, gradcheck)
are parametrised over LOSSES.names() in test_losses.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from grpo_zoo.algorithms.extra_losses import (
    CISPOConfig,
    ClipCovConfig,
    GMPOConfig,
    KLCovConfig,
    SAPOConfig,
    cispo,
    clip_cov,
    gmpo,
    kl_cov,
    sapo,
)
from grpo_zoo.algorithms.losses import PPOClipConfig, ppo_clip
from grpo_zoo.registry import LOSSES
from grpo_zoo.types import LossInputs

D = torch.float64


def t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=D)


def batch(logp, old_logp, adv, mask=None) -> LossInputs:
    logp = t(logp).requires_grad_()
    mask = t(mask) if mask is not None else torch.ones_like(logp)
    return LossInputs(logp=logp, old_logp=t(old_logp), advantages=t(adv), mask=mask)


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_all_registered():
    assert {"cispo", "sapo", "gmpo", "clip_cov", "kl_cov"} <= set(LOSSES.names())


# --------------------------------------------------------------------------------------
# cispo
# --------------------------------------------------------------------------------------


def test_cispo_hand_example():
    # A = 2, old_logp = -1; logp [-1, -0.5, -2] -> ratios [1, e^0.5 = 1.6487, e^-1 = 0.3679]
    # weights clip(r, 0.8, 1.28) = [1, 1.28, 0.8]; loss_t = -w A logp = [2, 1.28, 3.2]
    # token-mean = 6.48 / 3 = 2.16; d/dlogp_t = -w_t A / 3 = [-2, -2.56, -1.6] / 3
    inputs = batch([[-1.0, -0.5, -2.0]], [[-1.0, -1.0, -1.0]], [2.0])
    out = cispo(inputs, CISPOConfig())
    assert out.loss.item() == pytest.approx(2.16)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 3)
    out.loss.backward()
    # Unlike PPO, clipped tokens keep a gradient (bounded by the clipped weight).
    assert torch.allclose(inputs.logp.grad, t([[-2.0, -2.56, -1.6]]) / 3)


# --------------------------------------------------------------------------------------
# sapo
# --------------------------------------------------------------------------------------


def test_sapo_hand_example():
    # row 0: A = +1 (tau 1), ratio 1: f = sigmoid(0) 4 / 1 = 2, loss -2
    # row 1: A = -1 (tau 1.05), ratio 1: f = 0.5 * 4 / 1.05 = 1.9048, loss +1.9048
    # row 2: A = +1 (tau 1), ratio 2: s = sigmoid(1) = 0.7311, f = 2.9242, loss -2.9242
    # seq-mean-token-mean over three one-token rows: (-2 + 1.9048 - 2.9242) / 3
    inputs = batch([[-1.0], [-1.0], [-1.0 + math.log(2.0)]], [[-1.0], [-1.0], [-1.0]], [1.0, -1.0, 1.0])
    out = sapo(inputs, SAPOConfig())
    s = sigmoid(1.0)
    assert out.loss.item() == pytest.approx((-2.0 + 2.0 / 1.05 - 4 * s) / 3)
    # gate = 4 s (1 - s): 1 on-policy, 4 * 0.7311 * 0.2689 = 0.7864 at ratio 2
    assert out.metrics["gate_mean"] == pytest.approx((1.0 + 1.0 + 4 * s * (1 - s)) / 3)
    out.loss.backward()
    # d(-A f(r))/dlogp = -A 4 s (1 - s) r: [-1, +1, -0.7864 * 2], each / 3 rows
    assert torch.allclose(inputs.logp.grad, t([[-1.0], [1.0], [-4 * s * (1 - s) * 2]]) / 3)


def test_sapo_rejects_bad_tau():
    with pytest.raises(ValueError, match="tau"):
        SAPOConfig(tau_neg=0.0)


# --------------------------------------------------------------------------------------
# gmpo
# --------------------------------------------------------------------------------------


def test_gmpo_hand_example():
    # eps = 0.4 in log space.
    # row 0, A = +1, log-ratios [0.2, 0.6, -0.5]: pessimistic clip only above -> d = [0.2, 0.4, -0.5]
    #   mean d = 0.1 / 3, ratio e^(1/30) = 1.03389, loss -1.03389
    # row 1, A = -1, log-ratios [-0.6, 0.5]: clip only below -> d = [-0.4, 0.5], mean 0.05,
    #   ratio e^0.05 = 1.05127, loss +1.05127
    # mean over sequences: (-1.03389 + 1.05127) / 2
    old = [[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]
    logp = [[-0.8, -0.4, -1.5], [-1.6, -0.5, -1.0]]
    inputs = batch(logp, old, [1.0, -1.0], mask=[[1, 1, 1], [1, 1, 0]])
    out = gmpo(inputs, GMPOConfig())
    r0, r1 = math.exp(0.1 / 3), math.exp(0.05)
    assert out.loss.item() == pytest.approx((-r0 + r1) / 2)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert out.metrics["ratio_max"] == pytest.approx(r1)
    out.loss.backward()
    # d loss_i / d logp_t = -A_i ratio_i / |o_i| on unclipped tokens, / 2 sequences
    g0, g1 = -r0 / 3 / 2, r1 / 2 / 2
    assert torch.allclose(inputs.logp.grad, t([[g0, 0.0, g0], [0.0, g1, 0.0]]))


# --------------------------------------------------------------------------------------
# clip_cov
# --------------------------------------------------------------------------------------


def cov_batch() -> LossInputs:
    # A = [+2, -2] (mean over the 4 tokens 0); logp [[0, -4], [-4, 0]] (mean -2)
    # cov = (A - 0)(logp + 2): row 0 [2 * 2, 2 * -2] = [4, -4]; row 1 [-2 * -2, -2 * 2] = [4, -4]
    # Candidates (1 < cov < 5, not clipped): (0, 0) and (1, 0).
    return batch([[0.0, -4.0], [-4.0, 0.0]], [[0.0, -4.0], [-4.0, 0.0]], [2.0, -2.0])


def test_clip_cov_detaches_the_picked_tokens():
    inputs = cov_batch()
    out = clip_cov(inputs, ClipCovConfig(token_share=0.5))  # max(1, floor(0.5 * 4)) = 2 tokens
    reference = ppo_clip(cov_batch(), PPOClipConfig())
    assert out.loss.item() == pytest.approx(reference.loss.item())  # detach keeps the value
    assert out.metrics["touched_fraction"] == pytest.approx(0.5)
    out.loss.backward()
    # ratio 1 everywhere: untouched tokens get -A / 4 tokens
    assert torch.allclose(inputs.logp.grad, t([[0.0, -0.5], [0.0, 0.5]]))


def test_clip_cov_skips_tokens_already_clipped():
    inputs = cov_batch()
    inputs.old_logp = inputs.old_logp.clone()
    inputs.old_logp[0, 0] = -math.log(1.5)  # ratio 1.5 with A > 0: clipped, so not a candidate
    out = clip_cov(inputs, ClipCovConfig(token_share=0.5))
    assert out.metrics["touched_fraction"] == pytest.approx(0.25)  # only (1, 0)
    out.loss.backward()
    assert torch.allclose(inputs.logp.grad, t([[0.0, -0.5], [0.0, 0.5]]))


def test_clip_cov_random_pick_is_seeded_and_local():
    # The default share picks max(1, floor(2e-4 * 4)) = 1 of the 2 candidates, at random.
    picks = set()
    for seed in range(12):
        state = torch.get_rng_state()
        first = cov_batch()
        first.seed = seed
        clip_cov(first, ClipCovConfig()).loss.backward()
        assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
        again = cov_batch()
        again.seed = seed
        clip_cov(again, ClipCovConfig()).loss.backward()
        assert torch.equal(first.logp.grad, again.logp.grad)  # same seed, same pick
        assert int((first.logp.grad == 0).sum()) == 1
        picks.add(tuple(first.logp.grad.flatten().tolist()))
    assert len(picks) == 2  # both candidates come up across seeds


def test_clip_cov_rejects_bad_bounds():
    with pytest.raises(ValueError, match="cov_lb"):
        ClipCovConfig(cov_lb=5.0, cov_ub=1.0)
    with pytest.raises(ValueError, match="token_share"):
        ClipCovConfig(token_share=0.0)


# --------------------------------------------------------------------------------------
# kl_cov
# --------------------------------------------------------------------------------------


def kl_cov_batch() -> LossInputs:
    # A = [+2, -2]; logp [[0, -4], [-3, -1]] (mean -2); old = logp - 0.1 -> log-ratio 0.1
    # cov = A (logp + 2): row 0 [4, -4]; row 1 [-2 * -1, -2 * 1] = [2, -2]
    return batch([[0.0, -4.0], [-3.0, -1.0]], [[-0.1, -4.1], [-3.1, -1.1]], [2.0, -2.0])


@pytest.mark.parametrize(("share", "touched"), [(0.25, [[1, 0], [0, 0]]), (0.5, [[1, 0], [1, 0]])])
def test_kl_cov_hand_example(share, touched):
    inputs = kl_cov_batch()
    out = kl_cov(inputs, KLCovConfig(token_share=share))
    touched = t(touched)
    r = math.exp(0.1)
    # -A r sums to (-2 - 2 + 2 + 2) r = 0; the penalty adds 0.1 * |0.1| per touched token; / 4 tokens
    assert out.loss.item() == pytest.approx(0.1 * 0.1 * touched.sum().item() / 4)
    assert out.metrics["touched_fraction"] == pytest.approx(touched.mean().item())
    out.loss.backward()
    # d/dlogp = (-A r + coef sign(log-ratio) [touched]) / 4
    adv = t([[2.0, 2.0], [-2.0, -2.0]])
    assert torch.allclose(inputs.logp.grad, (-adv * r + 0.1 * touched) / 4)


def test_kl_cov_never_penalises_non_positive_covariance():
    inputs = kl_cov_batch()
    out = kl_cov(inputs, KLCovConfig(token_share=1.0))  # asks for all 4, only 2 have cov > 0
    assert out.metrics["touched_fraction"] == pytest.approx(0.5)
