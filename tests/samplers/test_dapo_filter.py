"""The `dapo_filter` selector: no zero-variance group ever passes; refill; partial and error modes."""

from __future__ import annotations

import logging

import pytest
import torch

from grpo_zoo.configuration import ConfigError, PluginSpec, build
from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers._common import original_prompt
from grpo_zoo.samplers.dapo_filter import (
    DapoFilterConfig,
    DapoFilterSelector,
    DynamicSamplingExhausted,
    mixed_groups,
)
from grpo_zoo.samplers.vade import VadeConfig, VadeSelector


def run_step(sel, fakes, step, group_size=4, rewards_fn=None, max_rounds=50):
    """The engine's loop: select, then update / filter / refill until the selector says done."""
    prompts, kept, rounds = sel.select(step), [], 0
    while prompts:
        rounds += 1
        n = len(prompts) * group_size
        rewards = rewards_fn(n, step * 100 + rounds) if rewards_fn else None
        fb = fakes.feedback(prompts, group_size=group_size, seed=step * 100 + rounds, rewards=rewards)
        metrics = sel.update(fb)
        keep = sel.filter(fb)
        assert keep.shape == (len(prompts),) and keep.dtype == torch.bool
        kept += [(p, fb.accuracy[fb.prompt_index == i]) for i, p in enumerate(prompts) if keep[i]]
        prompts = sel.refill(step, len(kept), rounds)
        assert rounds < max_rounds
    return kept, rounds, metrics


def test_registered():
    assert SELECTORS.get("dapo_filter").obj is DapoFilterSelector


def test_never_keeps_a_zero_variance_group_and_fills_the_batch(fakes):
    sel = DapoFilterSelector(fakes.pool(40), DapoFilterConfig(), batch_size=8, seed=0)
    for step in range(5):
        kept, rounds, metrics = run_step(sel, fakes, step, group_size=4)
        assert len(kept) == 8  # trimmed to exactly one batch
        for _, acc in kept:
            assert acc.max() > acc.min()
        assert 0 < metrics["dapo/pass_rate"] <= 1
        assert metrics["dapo/extra_generation_share"] == pytest.approx(rounds - 1)


def test_mixed_groups_on_hand_made_feedback(fakes):
    prompts = [original_prompt(q) for q in fakes.pool(4)]
    rewards = torch.tensor([1.0, 1, 1, 0.9, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1])
    fb = fakes.feedback(prompts, group_size=4, rewards=rewards)
    assert mixed_groups(fb, "reward", 1e-9).tolist() == [True, False, True, False]
    fb.accuracy = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1])
    assert mixed_groups(fb, "accuracy", 1e-9).tolist() == [False, False, True, False]
    one = fakes.feedback(prompts[:1], group_size=1, rewards=torch.tensor([1.0]))
    assert mixed_groups(one, "reward", 1e-9).tolist() == [False]  # a group of one has no variance


def test_partial_mode_gives_up_with_a_warning_and_a_counter(fakes, caplog):
    sel = DapoFilterSelector(fakes.pool(40), DapoFilterConfig(max_gen_batches=3), batch_size=4, seed=0)
    all_equal = lambda n, seed: torch.ones(n)  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="grpo_zoo.samplers.dapo_filter"):
        kept, rounds, metrics = run_step(sel, fakes, 0, rewards_fn=all_equal)
    assert kept == [] and rounds == 3
    assert metrics["dapo/exhausted"] == 1.0 and metrics["dapo/exhausted_total"] == 1.0
    assert "after 3 generation batch(es) only 0 of 4 prompts" in caplog.text
    _, _, metrics = run_step(sel, fakes, 1, rewards_fn=all_equal)
    assert metrics["dapo/exhausted_total"] == 2.0 and sel.exhausted_total == 2


def test_partial_mode_keeps_what_it_found(fakes):
    # Only the first prompt of each round is mixed: 2 rounds give 2 of 4 prompts.
    def first_mixed(n, seed):
        r = torch.ones(n)
        r[0] = 0.0
        return r

    sel = DapoFilterSelector(fakes.pool(40), DapoFilterConfig(max_gen_batches=2), batch_size=4, seed=0)
    kept, rounds, metrics = run_step(sel, fakes, 0, rewards_fn=first_mixed)
    assert len(kept) == 2 and rounds == 2 and metrics["dapo/pass_rate"] == 0.25


def test_error_mode_says_what_to_change(fakes):
    sel = DapoFilterSelector(
        fakes.pool(40), DapoFilterConfig(max_gen_batches=2, on_exhausted="error"), batch_size=4, seed=0
    )
    with pytest.raises(DynamicSamplingExhausted, match="max_gen_batches.*on_exhausted: partial"):
        run_step(sel, fakes, 0, rewards_fn=lambda n, seed: torch.zeros(n))


def test_inner_selector_by_name_mapping_or_spec(fakes):
    pool = fakes.pool(20)
    cfg = build(DapoFilterConfig, {"inner": {"name": "vade", "l1": 0.5}, "max_gen_batches": 4})
    sel = DapoFilterSelector(pool, cfg, batch_size=4, seed=0)
    assert isinstance(sel.inner, VadeSelector) and sel.inner.cfg.l1 == 0.5
    assert isinstance(
        DapoFilterSelector(pool, DapoFilterConfig(inner="vade"), batch_size=4, seed=0).inner, VadeSelector
    )
    spec = PluginSpec("vade", VadeConfig(l2=0.9))
    assert DapoFilterSelector(pool, DapoFilterConfig(inner=spec), batch_size=4, seed=0).inner.cfg.l2 == 0.9
    with pytest.raises(ConfigError, match="unknown selector 'vadee'"):
        DapoFilterSelector(pool, DapoFilterConfig(inner="vadee"), batch_size=4, seed=0)
    with pytest.raises(ConfigError, match="max_gen_batches"):
        build(DapoFilterConfig, {"max_gen_batches": 0})


@pytest.mark.parametrize("inner, target", [("uniform", 4), ("vade", 4), ("diva", 8)])
def test_wraps_every_selector(fakes, inner, target):
    # The batch is full at as many prompts as one inner batch: diva's holds original + 1 variant each.
    sel = DapoFilterSelector(fakes.pool(30), DapoFilterConfig(inner=inner), batch_size=4, seed=1)
    for step in range(3):
        kept, _, _ = run_step(sel, fakes, step)
        assert len(kept) == target
        assert all(acc.max() > acc.min() for _, acc in kept)


def test_untrimmed_keeps_every_passing_group(fakes):
    sel = DapoFilterSelector(fakes.pool(40), DapoFilterConfig(trim=False), batch_size=8, seed=0)
    kept, _, _ = run_step(sel, fakes, 0)
    assert len(kept) >= 8


def test_resume_continues_identically(fakes):
    pool = fakes.pool(30)
    cfg = DapoFilterConfig(inner="vade")
    ref = DapoFilterSelector(pool, cfg, batch_size=4, seed=2)
    for step in range(3):
        run_step(ref, fakes, step)
    resumed = DapoFilterSelector(pool, cfg, batch_size=4, seed=2)
    resumed.load_state_dict(fakes.through_checkpoint(ref.state_dict()))
    for step in range(3, 6):
        got, _, m1 = run_step(resumed, fakes, step)
        want, _, m2 = run_step(ref, fakes, step)
        assert [fakes.prompt_key(p) for p, _ in got] == [fakes.prompt_key(p) for p, _ in want] and m1 == m2
    other = DapoFilterSelector(pool, DapoFilterConfig(inner="uniform"), batch_size=4, seed=2)
    with pytest.raises(ValueError, match="same inner selector"):
        other.load_state_dict(ref.state_dict())
