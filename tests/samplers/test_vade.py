"""The `vade` selector: the paper's update and decay on hand-worked numbers, the p = 1/3 preference."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers._common import original_prompt
from grpo_zoo.samplers.vade import VadeConfig, VadeSelector, informativeness


def with_counts(sel: VadeSelector, a, b, step: int = 0) -> None:
    """Load pseudo-counts (as of the end of `step`) through the public state round trip."""
    state = sel.state_dict()
    state.update(a=list(map(float, a)), b=list(map(float, b)), last=[step] * len(a), step=step, picked=[])
    sel.load_state_dict(state)


def feedback_for(fakes, pool, qids, rewards, group_size):
    prompts = [original_prompt(pool[q]) for q in qids]
    return fakes.feedback(prompts, group_size=group_size, rewards=torch.tensor(rewards, dtype=torch.float32))


def test_registered():
    assert SELECTORS.get("vade").obj is VadeSelector


def test_paper_worked_example_update_and_unselected_decay(fakes):
    # Paper figure: G = 8, (a, b) = (0.1, 8.4), 1 correct of 8, l1 = 0.2:
    #   a = 0.2 * 0.1 + 1 = 1.02,  b = 0.2 * 8.4 + 7 = 8.68.
    # An unselected question decays by l2 = 0.999: (2, 3) -> (1.998, 2.997).
    pool = fakes.pool(2)
    sel = VadeSelector(pool, VadeConfig(), batch_size=1, seed=0)
    with_counts(sel, [0.1, 2.0], [8.4, 3.0], step=0)
    sel.select(1)
    sel.update(feedback_for(fakes, pool, [0], [1, 0, 0, 0, 0, 0, 0, 0], group_size=8))
    a, b = sel.counts()
    assert a[0] == pytest.approx(1.02, abs=1e-12) and b[0] == pytest.approx(8.68, abs=1e-12)
    assert a[1] == pytest.approx(1.998, abs=1e-12) and b[1] == pytest.approx(2.997, abs=1e-12)


def test_lazy_decay_equals_decaying_every_step(fakes):
    # Question 1 is skipped for 3 steps, then selected: (4, 6) -> 0.999^3 (4, 6) -> 0.2 * that + (s, G - s).
    pool = fakes.pool(2)
    sel = VadeSelector(pool, VadeConfig(), batch_size=1, seed=0)
    with_counts(sel, [1.0, 4.0], [1.0, 6.0], step=0)
    for step in (1, 2, 3):
        sel.select(step)
        sel.update(feedback_for(fakes, pool, [0], [1, 1, 0, 0], group_size=4))
    a, b = sel.counts()
    assert a[1] == pytest.approx(4.0 * 0.999**3) and b[1] == pytest.approx(6.0 * 0.999**3)
    sel.select(4)
    sel.update(feedback_for(fakes, pool, [1], [1, 0, 0, 0], group_size=4))
    a, b = sel.counts()
    assert a[1] == pytest.approx(0.2 * 4.0 * 0.999**3 + 1) and b[1] == pytest.approx(0.2 * 6.0 * 0.999**3 + 3)
    # Question 0: step 3 gave (0.2 a2 + 2, 0.2 b2 + 2), then one step of l2 decay at step 4.
    a0 = b0 = 1.0
    for _ in range(3):
        a0, b0 = 0.2 * a0 + 2, 0.2 * b0 + 2
    assert a[0] == pytest.approx(a0 * 0.999) and b[0] == pytest.approx(b0 * 0.999)


def test_continuous_rewards_give_fractional_successes(fakes):
    # signal = reward, R_max = 2: rewards (1, 1, 2, 0) -> s = 0.5 + 0.5 + 1 + 0 = 2.0 of G = 4.
    pool = fakes.pool(1)
    sel = VadeSelector(pool, VadeConfig(signal="reward", l1=0.0), batch_size=1, seed=0)
    prompts = sel.select(0)
    fb = fakes.feedback(prompts, group_size=4, rewards=torch.tensor([1.0, 1.0, 2.0, 0.0]), reward_max=2.0)
    sel.update(fb)
    a, b = sel.counts()
    assert (a[0], b[0]) == (2.0, 2.0)


def pick_counts(sel: VadeSelector, steps: int) -> Counter[int]:
    counts: Counter[int] = Counter()
    for step in range(1, steps + 1):
        counts.update(p.question_id for p in sel.select(step))
    return counts


def test_prefers_posterior_mean_near_one_third(fakes):
    # Sharp posteriors (100 pseudo-counts) at means 0.05, 1/3, 0.6, 0.9; I(p) = p (1 - p)^2 peaks at 1/3.
    means = np.array([0.05, 1 / 3, 0.6, 0.9])
    sel = VadeSelector(fakes.pool(4), VadeConfig(l2=1.0), batch_size=1, seed=0)
    with_counts(sel, 100 * means, 100 * (1 - means))
    counts = pick_counts(sel, 400)
    assert counts.most_common(1)[0][0] == 1
    assert counts[1] > 0.8 * 400


def test_variance_score_prefers_one_half_and_greedy_is_deterministic(fakes):
    means = np.array([0.1, 1 / 3, 0.5, 0.9])
    sel = VadeSelector(fakes.pool(4), VadeConfig(score="variance", l2=1.0), batch_size=1, seed=0)
    with_counts(sel, 100 * means, 100 * (1 - means))
    assert pick_counts(sel, 300).most_common(1)[0][0] == 2
    greedy = VadeSelector(fakes.pool(4), VadeConfig(greedy=True, l2=1.0), batch_size=2, seed=0)
    with_counts(greedy, 100 * means, 100 * (1 - means))
    assert [p.question_id for p in greedy.select(1)] == [1, 2]  # I(1/3) = 0.148 > I(0.5) = 0.125
    assert informativeness(np.array([1 / 3]), "skewed")[0] == pytest.approx(4 / 27)


def test_fresh_questions_are_explored_uniformly(fakes):
    sel = VadeSelector(fakes.pool(10), VadeConfig(), batch_size=2, seed=1)
    counts = pick_counts(sel, 500)
    assert len(counts) == 10 and min(counts.values()) > 50


def test_second_select_in_a_step_skips_taken_questions(fakes):
    sel = VadeSelector(fakes.pool(6), VadeConfig(), batch_size=2, seed=0)
    first = {p.question_id for p in sel.select(3)}
    second = {p.question_id for p in sel.select(3)}
    third = {p.question_id for p in sel.select(3)}
    assert len(first | second | third) == 6
    assert sel.select(3) == []
    assert len(sel.select(4)) == 2


def test_candidate_pool_option(fakes):
    sel = VadeSelector(fakes.pool(20), VadeConfig(candidates=5), batch_size=3, seed=0)
    assert len(sel.select(0)) == 3
    with pytest.raises(ValueError, match="candidates"):
        VadeSelector(fakes.pool(20), VadeConfig(candidates=2), batch_size=3, seed=0)


@pytest.mark.parametrize(
    "kwargs, field", [({"l1": 1.5}, "l1"), ({"l2": 0.0}, "l2"), ({"candidates": -1}, "candidates")]
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        VadeConfig(**kwargs)


def test_metrics_and_histograms(fakes):
    pool = fakes.pool(8)
    sel = VadeSelector(pool, VadeConfig(), batch_size=4, seed=0)
    prompts = sel.select(0)
    metrics = sel.update(fakes.feedback(prompts, group_size=4, seed=1))
    for key in ("vade/posterior_mean_mean", "vade/selected_posterior_mean", "vade/mixed_group_share"):
        assert np.isfinite(metrics[key])
    hist = sel.histograms()
    assert hist["vade/posterior_mean"].shape == (8,) and hist["vade/pseudo_count"].shape == (8,)
    assert sel.filter(fakes.feedback(prompts)).all() and sel.refill(0, 4, 1) == []


def test_resume_continues_identically(fakes):
    pool = fakes.pool(12)
    ref = VadeSelector(pool, VadeConfig(), batch_size=3, seed=7)
    for step in range(3):
        ref.update(fakes.feedback(ref.select(step), seed=step))
    resumed = VadeSelector(pool, VadeConfig(), batch_size=3, seed=7)
    resumed.load_state_dict(fakes.through_checkpoint(ref.state_dict()))
    for step in range(3, 8):
        got, want = resumed.select(step), ref.select(step)
        assert [fakes.prompt_key(p) for p in got] == [fakes.prompt_key(p) for p in want]
        resumed.update(fakes.feedback(got, seed=step))
        ref.update(fakes.feedback(want, seed=step))
    np.testing.assert_array_equal(resumed.histograms()["vade/posterior_mean"], ref.histograms()["vade/posterior_mean"])


def test_unknown_question_in_feedback_is_a_clear_error(fakes):
    sel = VadeSelector(fakes.pool(3), VadeConfig(), batch_size=1, seed=0)
    stranger = original_prompt(fakes.question(99, np.random.default_rng(0)))
    with pytest.raises(ValueError, match="question_id 99"):
        sel.update(fakes.feedback([stranger]))
