"""User reward functions that misbehave (issue #7), beyond tests/engine/test_rewards.py.

Raises, exits, or crashes its worker: 0 for that response, counted and logged, the pool
recovers. Returns NaN, inf, a value outside [0, 1], a string or a number too big for a float:
a ValueError naming the function. A hypothesis fuzz covers the returned values.
This module imports nothing heavy at the top: the pool's worker processes import it.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_zoo.reward_runner import RewardRunner


def misbehaving_reward(response: str, answer: str, mode: str = "ok", value: object = None, **context: object) -> float:
    """A user reward whose behaviour the test picks through the context."""
    if mode == "value":
        return value  # type: ignore[return-value]
    if mode == "exit":
        sys.exit(3)
    if mode == "crash":
        os._exit(7)  # the worker process dies without a word
    if mode == "hang":
        time.sleep(60)
    if mode == "raise":
        raise KeyError("missing field")
    return 0.5


NAME = f"{__name__}:misbehaving_reward"
SPECS = [("exact_match", 0.5), (NAME, 0.5)]
RESPONSES = ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "\\boxed{4}"]
ANSWERS = ["1", "2", "9", "9"]


@pytest.fixture(scope="module")
def pool():
    with RewardRunner(SPECS, accuracy_function="exact_match", timeout_s=1.0, num_workers=1) as runner:
        yield runner


@pytest.fixture(scope="module")
def inline():
    return RewardRunner(SPECS, accuracy_function="exact_match", num_workers=0)


def test_crashing_and_hanging_worker_score_zero_and_pool_recovers(pool, caplog):
    contexts = [{}, {"mode": "crash"}, {"mode": "hang"}, {"mode": "exit"}]
    with caplog.at_level(logging.WARNING, logger="grpo_zoo.reward_runner"):
        result = pool.score(RESPONSES, ANSWERS, contexts)
    assert result.per_function[NAME].tolist() == [0.5, 0.0, 0.0, 0.0]
    assert result.accuracy.tolist() == [1.0, 1.0, 0.0, 0.0]  # the other function is unaffected
    assert result.errors == 2 and result.timeouts == 1  # crash + exit, hang
    assert result.metrics[f"reward_{NAME}_errors"] == 2.0 and result.metrics[f"reward_{NAME}_timeouts"] == 1.0
    assert caplog.text.count(f"reward function '{NAME}'") == 3  # each logged, naming the function
    again = pool.score(RESPONSES, ANSWERS)
    assert again.errors == again.timeouts == 0 and again.per_function[NAME].tolist() == [0.5] * 4


def test_worker_killed_while_idle_is_replaced_without_charging_a_response(pool):
    pool.score(RESPONSES[:1], ANSWERS[:1])  # make sure a worker is up
    worker = pool._workers[0].process
    worker.kill()
    worker.join(5)
    result = pool.score(RESPONSES, ANSWERS)
    assert result.errors == 0 and result.per_function[NAME].tolist() == [0.5] * 4


def test_inline_exit_is_an_error_not_the_end_of_the_run(inline):
    result = inline.score(RESPONSES, ANSWERS, [{}, {"mode": "exit"}, {"mode": "raise"}, {}])
    assert result.per_function[NAME].tolist() == [0.5, 0.0, 0.0, 0.5] and result.errors == 2


@pytest.mark.parametrize("value", [math.inf, -math.inf, -0.5, 1.5, "0.5", 10**400, [0.5]])
def test_invalid_values_name_the_function(inline, value):
    with pytest.raises(ValueError, match=f"reward function '{NAME}' returned .* for response 1"):
        inline.score(RESPONSES, ANSWERS, [{}, {"mode": "value", "value": value}, {}, {}])


def test_invalid_value_from_a_worker_names_the_function(pool):
    with pytest.raises(ValueError, match=NAME):
        pool.score(RESPONSES, ANSWERS, [{}, {}, {"mode": "value", "value": float("nan")}, {}])
    assert pool.score(RESPONSES, ANSWERS).errors == 0


VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=False),
    st.floats(min_value=0.0, max_value=1.0, allow_subnormal=False),
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=10**300, max_value=10**400),
    st.booleans(),
    st.none(),
    st.text(max_size=4),
)


def valid(value: object) -> bool:
    if isinstance(value, str) or value is None:
        return False
    try:
        x = float(value)  # type: ignore[arg-type]
    except (OverflowError, TypeError, ValueError):
        return False
    return math.isfinite(x) and -1e-6 <= x <= 1 + 1e-6


@settings(max_examples=200, deadline=None)
@given(values=st.lists(VALUES, min_size=1, max_size=4))
def test_fuzz_reward_values(values):
    runner = RewardRunner([(NAME, 1.0)], accuracy_function=NAME, reward_max=1.0, num_workers=0)
    contexts = [{"mode": "value", "value": v} for v in values]
    n = len(values)
    if all(valid(v) for v in values):
        result = runner.score(["r"] * n, ["a"] * n, contexts)
        got = result.overall.tolist()
        assert all(0.0 <= g <= 1.0 for g in got)  # in [0, R_max], float noise clamped
        assert got == pytest.approx([min(max(float(v), 0.0), 1.0) for v in values], abs=1e-6)
    else:
        first_bad = next(i for i, v in enumerate(values) if not valid(v))
        with pytest.raises(ValueError, match=f"reward function '{NAME}' returned .* for response {first_bad}"):
            runner.score(["r"] * n, ["a"] * n, contexts)
