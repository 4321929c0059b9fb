"""The `uniform` selector: seeded shuffles, whole epochs, exact resume."""

from __future__ import annotations

from collections import Counter

import pytest

from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers.uniform import UniformConfig, UniformSelector


def ids(prompts):
    return [p.question_id for p in prompts]


def test_registered():
    assert SELECTORS.get("uniform").obj is UniformSelector


def test_each_epoch_visits_every_question_once(fakes):
    sel = UniformSelector(fakes.pool(10), UniformConfig(), batch_size=5, seed=0)
    for _ in range(3):
        epoch = ids(sel.select(0)) + ids(sel.select(1))
        assert sorted(epoch) == list(range(10))


def test_batches_crossing_epochs_never_repeat_and_counts_stay_even(fakes):
    sel = UniformSelector(fakes.pool(10), UniformConfig(), batch_size=4, seed=3)
    seen: Counter[int] = Counter()
    for step in range(20):  # 80 picks = exactly 8 epochs
        batch = ids(sel.select(step))
        assert len(set(batch)) == 4
        seen.update(batch)
    assert set(seen.values()) == {8}


def test_prompts_are_the_originals(fakes):
    pool = fakes.pool(6)
    prompt = UniformSelector(pool, batch_size=2, seed=0).select(0)[0]
    q = pool[prompt.question_id]
    assert (prompt.problem, prompt.answer, prompt.variant, prompt.difficulty) == (q.problem, q.answer, "original", None)
    assert prompt.images[0] is q.images[0]


def test_seeded_and_unshuffled_orders(fakes):
    pool = fakes.pool(12)
    a = ids(UniformSelector(pool, batch_size=4, seed=1).select(0))
    b = ids(UniformSelector(pool, batch_size=4, seed=1).select(0))
    c = ids(UniformSelector(pool, batch_size=4, seed=2).select(0))
    assert a == b and a != c
    plain = UniformSelector(pool, UniformConfig(shuffle=False), batch_size=4, seed=1)
    assert ids(plain.select(0)) == [0, 1, 2, 3]


def test_filter_keeps_all_and_refill_is_empty(fakes):
    sel = UniformSelector(fakes.pool(6), batch_size=3, seed=0)
    feedback = fakes.feedback(sel.select(0))
    assert "uniform/epoch" in sel.update(feedback)
    assert sel.filter(feedback).tolist() == [True] * 3
    assert sel.refill(0, 3, 1) == []
    assert sel.histograms() == {}


def test_batch_larger_than_pool_is_a_clear_error(fakes):
    with pytest.raises(ValueError, match="batch_size 8 is larger than the pool"):
        UniformSelector(fakes.pool(5), batch_size=8, seed=0)


def test_resume_continues_identically(fakes):
    pool = fakes.pool(7)
    ref = UniformSelector(pool, batch_size=3, seed=5)
    for step in range(4):
        ref.select(step)
    state = fakes.through_checkpoint(ref.state_dict())
    resumed = UniformSelector(pool, batch_size=3, seed=5)
    resumed.load_state_dict(state)
    for step in range(4, 12):
        assert ids(resumed.select(step)) == ids(ref.select(step))


def test_resume_with_another_pool_is_a_clear_error(fakes):
    state = UniformSelector(fakes.pool(7), batch_size=3, seed=5).state_dict()
    with pytest.raises(ValueError, match="same training data"):
        UniformSelector(fakes.pool(8), batch_size=3, seed=5).load_state_dict(state)
