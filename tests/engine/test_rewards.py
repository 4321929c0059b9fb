"""Reward functions (grpo_zoo.rewards) and the time-limited reward runner (grpo_zoo.reward_runner).

This module deliberately imports neither torch nor anything heavy at the top: the pool's
worker processes import it to find `scripted_reward`, and each import costs start-up time.
"""

from __future__ import annotations

import math
import time

import pytest

from grpo_zoo.config import RewardConfig
from grpo_zoo.registry import REWARDS, RegistryError
from grpo_zoo.reward_runner import RewardRunner
from grpo_zoo.rewards import accuracy, exact_match, format_reward, last_boxed


def scripted_reward(response: str, answer: str, mode: str = "ok", **context: object) -> float:
    """A user reward whose behaviour the test picks through the context."""
    if mode == "raise":
        raise RuntimeError("deliberate failure")
    if mode == "hang":
        time.sleep(60)
    if mode == "nan":
        return math.nan
    if mode == "big":
        return 2.0
    return 0.25 if "<think>" in response else 0.75


SCRIPTED = f"{__name__}:scripted_reward"  # import path the worker processes resolve
SPECS = [("accuracy", 0.5), ("format", 0.1), (SCRIPTED, 0.4)]
RESPONSES = [
    "<think>2 + 1</think> The answer is \\boxed{3}.",  # right, formatted
    "\\boxed{\\frac{1}{2}}",  # right (0.5 in LaTeX), no think block
    "<think>hmm</think>\\boxed{4}",  # wrong, formatted
    "I give up",  # no box at all
]
ANSWERS = ["3", "0.5", "3", "3"]


@pytest.fixture(scope="module")
def pool():
    # One pool for the module: worker start-up (a fresh interpreter each) is the expensive part.
    with RewardRunner(SPECS, timeout_s=1.0, num_workers=2) as runner:
        yield runner


@pytest.fixture(scope="module")
def inline():
    return RewardRunner(SPECS, num_workers=0)


# ---- last_boxed ------------------------------------------------------------------------------


def test_last_boxed_nested_braces():
    assert last_boxed("so \\boxed{\\frac{1}{2}} done") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\{1, 2\\}}") == "\\{1, 2\\}"  # escaped braces are not grouping
    assert last_boxed("\\boxed {  7 }") == "7"


def test_last_boxed_several_boxes_gives_the_last():
    assert last_boxed("\\boxed{1} then \\boxed{2} finally \\boxed{3}") == "3"
    assert last_boxed("\\boxed{a + \\boxed{b}} x") == "a + \\boxed{b}"  # an inner box belongs to the outer


def test_last_boxed_none_and_unclosed():
    assert last_boxed("no answer here") is None
    assert last_boxed("\\boxed{12") is None  # cut off at max_new_tokens
    assert last_boxed("\\boxed{5} and then \\boxed{6") == "5"


# ---- built-in functions ----------------------------------------------------------------------


def test_builtins_are_registered():
    assert {"accuracy", "format", "exact_match"} <= set(REWARDS.names())
    assert REWARDS.get("format").obj is format_reward


@pytest.mark.parametrize(
    "response, answer, expected",
    [
        ("\\boxed{3}", "3", 1.0),
        ("\\boxed{4}", "3", 0.0),
        ("\\boxed{03}", "3", 1.0),  # integer fast path compares values
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # math-verify: LaTeX-equivalent
        ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
        ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
        ("\\boxed{3} no wait \\boxed{4}", "4", 1.0),  # the last box is the answer
        ("\\boxed{3} no wait \\boxed{4}", "3", 0.0),
        ("the answer is 3", "3", 0.0),  # no box, no credit
        ("\\boxed{3}", "\\boxed{3}", 1.0),  # a boxed gold answer is unwrapped
    ],
)
def test_accuracy(response, answer, expected):
    assert accuracy(response, answer) == expected


@pytest.mark.parametrize(
    "response",
    [
        "<think>count the shapes</think>\\boxed{3}",
        "  \n<think>x</think>\n\nThe answer is \\boxed{3}.\n",  # whitespace and text around the box
        "<think></think>\\boxed{\\frac{1}{2}}",  # empty thinking is allowed
    ],
)
def test_format_accepts(response):
    assert format_reward(response, "3") == 1.0


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{3}",  # no think block
        "Sure. <think>x</think>\\boxed{3}",  # text before <think>
        "<think>x \\boxed{3}</think> so 3",  # the box is inside the thinking
        "<think>x</think>",  # no box
        "<think>x</think>\\boxed{}",  # empty box
        "<think>x</think>\\boxed{3",  # unclosed box
        "<think>a</think><think>b</think>\\boxed{3}",  # two think blocks
        "<think>x\\boxed{3}",  # never closes the thinking
    ],
)
def test_format_rejects(response):
    assert format_reward(response, "3") == 0.0


def test_exact_match_normalises():
    assert exact_match("\\boxed{\\text{Red}}", "red") == 1.0
    assert exact_match("\\boxed{ 1, 2 }", "1,2") == 1.0
    assert exact_match("\\boxed{blue}", "red") == 0.0
    assert exact_match("\\boxed{0.5}", "\\frac{1}{2}") == 0.0  # strings, not maths
    assert exact_match("red", "red") == 0.0  # no box


# ---- the runner ------------------------------------------------------------------------------


def test_default_weighting_is_09_accuracy_01_format():
    runner = RewardRunner.from_config(RewardConfig(num_workers=0))
    result = runner.score(RESPONSES, ANSWERS)
    # right+formatted 0.9+0.1, right only 0.9, formatted only 0.1, nothing 0
    assert result.overall.tolist() == pytest.approx([1.0, 0.9, 0.1, 0.0])
    assert result.accuracy.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert result.per_function["format"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert result.metrics["accuracy_mean"] == pytest.approx(0.5)
    assert result.metrics["reward_mean"] == pytest.approx(0.5)
    assert result.timeouts == result.errors == 0


def test_pool_equals_inline(pool, inline):
    responses, answers = RESPONSES * 3, ANSWERS * 3
    a = pool.score(responses, answers)
    b = inline.score(responses, answers)
    assert a.overall.tolist() == b.overall.tolist()
    for name in b.per_function:
        assert a.per_function[name].tolist() == b.per_function[name].tolist()
    # accuracy 0.5 + format 0.1 + scripted 0.4 * (0.25 with <think>, else 0.75)
    assert b.overall.tolist()[:4] == pytest.approx([0.7, 0.8, 0.2, 0.3])


@pytest.mark.parametrize("use_pool", [False, True])
def test_raising_reward_scores_zero_and_is_counted(use_pool, pool, inline):
    runner = pool if use_pool else inline
    contexts = [{}, {"mode": "raise"}, {}, {}]
    result = runner.score(RESPONSES, ANSWERS, contexts)
    assert result.per_function[SCRIPTED].tolist() == [0.25, 0.0, 0.25, 0.75]
    assert result.overall[1].item() == pytest.approx(0.5)  # accuracy still counts
    assert result.errors == 1 and result.timeouts == 0
    assert result.metrics[f"reward_{SCRIPTED}_errors"] == 1.0


def test_hanging_reward_times_out_and_pool_recovers(pool):
    contexts = [{}, {}, {"mode": "hang"}, {}] * 2
    started = time.monotonic()
    result = pool.score(RESPONSES * 2, ANSWERS * 2, contexts)
    assert time.monotonic() - started < 15  # 1 s limit + restarting one worker, not 60 s
    assert result.timeouts == 2 and result.errors == 0
    assert result.metrics[f"reward_{SCRIPTED}_timeouts"] == 2.0
    assert result.per_function[SCRIPTED].tolist() == [0.25, 0.75, 0.0, 0.75] * 2
    assert result.accuracy.tolist() == [1.0, 1.0, 0.0, 0.0] * 2  # other functions unaffected
    again = pool.score(RESPONSES, ANSWERS)
    assert again.timeouts == 0 and again.per_function[SCRIPTED].tolist() == [0.25, 0.75, 0.25, 0.75]


@pytest.mark.parametrize("mode", ["nan", "big"])
@pytest.mark.parametrize("use_pool", [False, True])
def test_invalid_value_is_an_error_naming_the_function(mode, use_pool, pool, inline):
    runner = pool if use_pool else inline
    with pytest.raises(ValueError, match="scripted_reward"):
        runner.score(RESPONSES, ANSWERS, [{}, {"mode": mode}, {}, {}])
    assert runner.score(RESPONSES, ANSWERS).errors == 0  # still usable afterwards


def test_mismatched_lengths():
    runner = RewardRunner([("accuracy", 1.0)], num_workers=0)
    with pytest.raises(ValueError, match="one answer"):
        runner.score(["a", "b"], ["a"])
    assert runner.score([], []).overall.numel() == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"specs": [("accuracy", 0.9), ("format", 0.2)]}, "sum to"),
        ({"specs": [("accuracy", -0.1)]}, "weight"),
        ({"specs": [("format", 1.0)]}, "accuracy_function"),
        ({"specs": [("accuracy", 0.5), ("accuracy", 0.5)]}, "twice"),
        ({"specs": [("accuracy", 1.0)], "timeout_s": 0}, "timeout_s"),
        ({"specs": [("accuracy", 1.0)], "num_workers": -1}, "num_workers"),
        ({"specs": [("nosuchmodule_xyz:fn", 1.0)], "accuracy_function": "nosuchmodule_xyz:fn"}, "cannot be imported"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RewardRunner(**kwargs)


def test_unknown_reward_name_lists_known_ones():
    with pytest.raises(RegistryError, match="accuracy"):
        RewardRunner([("acuracy", 1.0)], accuracy_function="acuracy", num_workers=0)
