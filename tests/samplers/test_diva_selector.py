"""The `diva` selector: difficulty rules, variant kind by difficulty, fallbacks, determinism, resume."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers import _diva_plan as plan
from grpo_zoo.samplers.diva import DivaSelector, DivaSelectorConfig


def selector(fakes, n=6, batch_size=2, seed=0, pool=None, **cfg) -> DivaSelector:
    pool = pool if pool is not None else fakes.pool(n)
    return DivaSelector(pool, DivaSelectorConfig(**cfg), batch_size=batch_size, seed=seed)


def set_difficulty(sel: DivaSelector, values) -> None:
    state = sel.state_dict()
    state["difficulty"] = [float(v) for v in values]
    sel.load_state_dict(state)


def test_registered():
    assert SELECTORS.get("diva").obj is DivaSelector


# ---------------------------------------------------------------------------------------
# Difficulty update rules
# ---------------------------------------------------------------------------------------


def test_paper_rule_on_hand_worked_numbers():
    # D_new = clip(D + 4 (0.5 - acc), 1, 9)
    d = np.array([5.0, 5.0, 5.0, 8.5, 1.5, 6.0])
    acc = np.array([0.0, 1.0, 0.5, 0.0, 1.0, 0.25])
    # 5 + 2 = 7; 5 - 2 = 3; 5; 8.5 + 2 -> 9; 1.5 - 2 -> 1; 6 + 4 * 0.25 = 7
    np.testing.assert_allclose(plan.update_difficulty(d, acc, "paper", 4.0), [7, 3, 5, 9, 1, 7])


def test_authors_table_rule():
    acc = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.39, 0.1])
    # >0.8: -2; (0.6, 0.8]: -1; [0.4, 0.6]: 0; <0.4: +1 (their "<0.2: +2" never runs)
    d = plan.update_difficulty(np.full(8, 5.0), acc, "authors")
    np.testing.assert_array_equal(d, [3, 4, 4, 5, 5, 5, 6, 6])
    np.testing.assert_array_equal(plan.update_difficulty(np.array([1.0, 9.0]), np.array([1.0, 0.0]), "authors"), [1, 9])
    assert plan.update_difficulty(np.array([4.6]), np.array([0.5]), "authors")[0] == 5.0  # integers


def test_update_uses_the_global_group_mean_reward(fakes):
    # Original all right (reward 1), variant all wrong: global mean 0.5 -> D stays 5.
    # With accuracy as the signal and rewards 0.9 * acc + 0.1: the same rows.
    sel = selector(fakes, n=2, batch_size=1)
    prompts = sel.select(0)
    qid = prompts[0].question_id
    fb = fakes.feedback(prompts, group_size=4, rewards=torch.tensor([1.0] * 4 + [0.0] * 4))
    metrics = sel.update(fb)
    assert sel.difficulty[qid] == 5.0 and metrics["diva/global_accuracy_mean"] == 0.5
    fb = fakes.feedback(prompts, group_size=4, rewards=torch.tensor([0.5] * 8), reward_max=2.0)
    sel.update(fb)  # mean reward / R_max = 0.25 -> 5 + 4 * 0.25 = 6
    assert sel.difficulty[qid] == pytest.approx(6.0)
    acc_sel = selector(fakes, n=2, batch_size=1, signal="accuracy")
    prompts = acc_sel.select(0)
    fb = fakes.feedback(prompts, group_size=4, rewards=torch.tensor([0.1] * 8))
    fb.accuracy = torch.zeros(8)
    acc_sel.update(fb)  # accuracy 0 -> 5 + 2
    assert acc_sel.difficulty[prompts[0].question_id] == 7.0


# ---------------------------------------------------------------------------------------
# Variant kind by difficulty
# ---------------------------------------------------------------------------------------


def test_tiers_pick_the_right_kind_for_each_difficulty(fakes):
    expected = {1: ("perturb", 6), 2: ("perturb", 5), 3: ("perturb", 3), 4: ("perturb", 1), 5: ("paraphrase", 0),
                6: ("hint", -1), 7: ("hint", -2), 8: ("hint", -3), 9: ("hint", -4)}  # fmt: skip
    sel = selector(fakes, n=9, batch_size=9, sampler="tiers", shuffle=False)
    set_difficulty(sel, range(1, 10))
    prompts = sel.select(0)
    variants = [p for p in prompts if p.variant != "original"]
    for d, p in zip(range(1, 10), variants):
        kind, shift = expected[d]
        assert (p.variant, p.extras["shift"]) == (kind, shift), d
        assert p.difficulty == d + shift
    strengths = [p.extras["strength"] for p in variants[:4]]
    counts = [len(p.extras["transforms"]) for p in variants[:4]]
    assert counts == [4, 3, 2, 1] and strengths == [0.45, 0.30, 0.30, 0.30]
    assert [p.extras["hint_steps"] for p in variants[5:]] == [1, 2, 3, 3]  # 9 -> all 3 steps
    assert plan.tier_shift(4.5) == 0 and plan.tier_shift(3.4) == 3


def test_shift_table_and_interpolation():
    assert [plan.shift_mean(d) for d in range(1, 10)] == [6, 5, 4, 3, 2, 1, -1, -3, -5]
    assert plan.shift_mean(4.5) == 2.5 and plan.shift_mean(6.5) == 0.0 and plan.shift_mean(8.25) == -3.5
    assert plan.shift_mean(0.0) == 6 and plan.shift_mean(12.0) == -5  # clipped to [1, 9]


def test_shift_plans():
    assert plan.plan_for_shift(-1) == plan.VariantPlan("hint", -1, hint_steps=1)
    assert plan.plan_for_shift(-3).hint_steps == 3 and plan.plan_for_shift(-4).hint_steps is None
    assert plan.plan_for_shift(0).kind == "paraphrase"
    levels = [(plan.plan_for_shift(s).num_transforms, plan.plan_for_shift(s).strength) for s in range(1, 7)]
    assert levels == [(1, 0.30), (1, 0.45), (2, 0.30), (2, 0.45), (3, 0.30), (4, 0.45)]
    assert plan.plan_for_shift(7).kind == plan.plan_for_shift(8).kind == "only_vision"


@pytest.mark.parametrize("d", [1, 2, 3, 4, 4.5, 5, 6, 6.5, 7, 8, 9])
def test_shift_draws_follow_the_table(d):
    rng = np.random.default_rng(int(d * 10))
    shifts = np.array([plan.draw_shift(d, rng) for _ in range(4000)])
    assert shifts.mean() == pytest.approx(plan.shift_mean(d), abs=0.1)
    assert shifts.min() >= -8 and shifts.max() <= 8


def test_shift_sampler_picks_the_right_kind_for_each_difficulty(fakes):
    # mu = 6, 5, 4, 3, 2, 1, -1, -3, -5: D <= 6 mostly perturbed, D >= 7 mostly hinted.
    sel = selector(fakes, n=9, batch_size=9, num_variants=1)
    set_difficulty(sel, range(1, 10))
    kinds = {d: Counter() for d in range(1, 10)}
    for step in range(150):
        for p in sel.select(step):
            if p.variant != "original":
                kinds[int(sel.difficulty[p.question_id])][p.variant] += 1
    for d in range(1, 7):
        assert kinds[d].most_common(1)[0][0] == "perturb", (d, kinds[d])
    for d in range(7, 10):
        assert kinds[d].most_common(1)[0][0] == "hint", (d, kinds[d])
    assert kinds[1]["only_vision"] > 0.15 * 150  # s >= 7 about 31% of the time at mu = 6
    assert kinds[5]["hint"] <= 6  # a fresh question rarely gets a hint (P(s < 0) = 0.6%, ~1 in 150)


def test_original_plus_v_variants_per_question(fakes):
    sel = selector(fakes, n=8, batch_size=3, num_variants=2)
    prompts = sel.select(0)
    assert len(prompts) == 9
    for i in range(0, 9, 3):
        group = prompts[i : i + 3]
        assert group[0].variant == "original" and group[0].difficulty == 5.0
        assert len({p.question_id for p in group}) == 1
        assert [p.extras["variant_index"] for p in group[1:]] == [0, 1]
        for p in group[1:]:
            assert p.difficulty == 5.0 + p.extras["shift"]
            assert p.answer == group[0].answer


def test_rotation_variant_states_the_angle(fakes):
    sel = selector(fakes, n=4, batch_size=4, transforms=["rotate"], sampler="tiers", shuffle=False)
    set_difficulty(sel, [1, 2, 3, 4])
    for p in sel.select(0):
        if p.variant == "perturb":
            assert p.extras["transforms"] == ["rotate"]
            assert f"rotated {p.extras['angle']:g} degrees" in p.problem


# ---------------------------------------------------------------------------------------
# Fallbacks
# ---------------------------------------------------------------------------------------


def test_missing_material_falls_back_and_is_counted(fakes):
    rng = np.random.default_rng(0)
    pool = [
        fakes.question(0, rng, hints=False),  # wants a hint -> paraphrase
        fakes.question(1, rng, hints=False, paraphrase=False),  # wants a hint -> repeat
        fakes.question(2, rng, image=False),  # wants a perturbation -> only-vision
        fakes.question(3, rng, image=False, paraphrase=False),  # perturbation, only-vision off -> repeat
    ]
    sel = DivaSelector(pool, DivaSelectorConfig(sampler="tiers", shuffle=False), batch_size=4, seed=0)
    set_difficulty(sel, [8, 8, 2, 2])
    variants = [p for p in sel.select(0) if p.variant != "original"]
    assert [p.variant for p in variants] == ["paraphrase", "repeat", "only_vision", "only_vision"]
    assert all(p.extras["fallback"] for p in variants)
    assert [p.difficulty for p in variants] == [8, 8, 9, 9]  # label follows the kind built: D + 0, D + 7
    ov = variants[2]
    assert len(ov.images) == 1 and ov.images[0].size == (224, 224) and ov.problem.count("<image>") == 1
    metrics = sel.update(fakes.feedback(sel.select(1)))
    assert metrics["diva/fallback_share"] == 1.0 and metrics["diva/fallback_total"] == 4
    no_ov = DivaSelector(pool, DivaSelectorConfig(sampler="tiers", kinds=["hint", "paraphrase", "perturb"],
                                                  shuffle=False), batch_size=4, seed=0)  # fmt: skip
    set_difficulty(no_ov, [8, 8, 2, 2])
    assert [p.variant for p in no_ov.select(0) if p.variant != "original"] == ["paraphrase", "repeat",
                                                                               "paraphrase", "repeat"]  # fmt: skip


def test_paraphrase_keeps_the_image_tag(fakes):
    rng = np.random.default_rng(0)
    q = fakes.question(0, rng)
    q.paraphrases = ["What is the sum?"]  # the dataset column lost the <image> tag
    sel = DivaSelector([q], DivaSelectorConfig(sampler="tiers"), batch_size=1, seed=0)
    variant = sel.select(0)[1]
    assert variant.variant == "paraphrase" and variant.problem == "<image>What is the sum?"
    assert variant.images[0] is q.images[0]


def test_kind_shares_are_logged(fakes):
    sel = selector(fakes, n=10, batch_size=10)
    prompts = sel.select(0)
    metrics = sel.update(fakes.feedback(prompts))
    shares = {k: v for k, v in metrics.items() if k.startswith("diva/share_")}
    assert set(shares) == {f"diva/share_{k}" for k in ("hint", "paraphrase", "perturb", "only_vision", "repeat")}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert np.isfinite(list(metrics.values())).all()
    hist = sel.histograms()
    assert hist["diva/difficulty"].shape == (10,) and hist["diva/variant_shift"].shape == (10,)
    assert set(selector(fakes).histograms()) == {"diva/difficulty_all"}  # nothing seen yet: no empty arrays


# ---------------------------------------------------------------------------------------
# Determinism, resume, config errors
# ---------------------------------------------------------------------------------------


def test_variants_are_deterministic_in_seed_step_question_and_index(fakes):
    pool = fakes.pool(5)
    q = pool[3]
    a = selector(fakes, pool=pool, seed=4).build_variant(q, 5.0, 7, 0)
    b = selector(fakes, pool=pool, seed=4).build_variant(q, 5.0, 7, 0)
    assert fakes.prompt_key(a) == fakes.prompt_key(b)
    others = [
        selector(fakes, pool=pool, seed=5).build_variant(q, 5.0, 7, 0),
        selector(fakes, pool=pool, seed=4).build_variant(q, 5.0, 8, 0),
        selector(fakes, pool=pool, seed=4).build_variant(q, 5.0, 7, 1),
    ]
    assert all(fakes.prompt_key(o) != fakes.prompt_key(a) for o in others)


def test_resume_continues_identically(fakes):
    pool = fakes.pool(9)
    ref = selector(fakes, pool=pool, batch_size=4, seed=3, num_variants=2)
    for step in range(3):
        ref.update(fakes.feedback(ref.select(step), seed=step))
    resumed = selector(fakes, pool=pool, batch_size=4, seed=3, num_variants=2)
    resumed.load_state_dict(fakes.through_checkpoint(ref.state_dict()))
    np.testing.assert_array_equal(resumed.difficulty, ref.difficulty)
    assert (ref.difficulty != 5.0).any()
    for step in range(3, 6):
        got, want = resumed.select(step), ref.select(step)
        assert [fakes.prompt_key(p) for p in got] == [fakes.prompt_key(p) for p in want]
        assert resumed.update(fakes.feedback(got, seed=step)) == ref.update(fakes.feedback(want, seed=step))


def test_no_question_is_ever_dropped(fakes):
    sel = selector(fakes, n=10, batch_size=3)
    seen = set()
    for step in range(4):
        prompts = sel.select(step)
        seen |= {p.question_id for p in prompts}
        sel.update(fakes.feedback(prompts, rewards=torch.ones(len(prompts) * 4)))  # all solved
    assert seen == set(range(10))


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_variants": -1}, "num_variants"),
        ({"eta": 0.0}, "eta"),
        ({"initial_difficulty": 10.0}, "initial_difficulty"),
        ({"shift_mu": [1.0, 2.0]}, "shift_mu"),
        ({"kinds": ["hint", "mirror"]}, "kinds"),
        ({"transforms": ["swirl"]}, "transforms"),
        ({"only_vision_size": [0, 5]}, "only_vision_size"),
    ],
)
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        DivaSelectorConfig(**kwargs)
