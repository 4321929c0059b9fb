"""The testbed task: exact answers, disjoint splits, hint material, demonstration error rates."""

from __future__ import annotations

import math
import random
import re
import time
from collections import Counter

import numpy as np
import pytest

from grpo_zoo.testbed import task
from grpo_zoo.testbed.task import (
    ALPHABET,
    COLOURS,
    COUNT_ERROR_BY_TIER,
    MAX_RESPONSE_CHARS,
    PLURAL,
    SLIP_BY_K,
    SceneSpec,
    Shape,
    demo_accuracy,
    demonstration,
    make_questions,
    render_scene,
)

RESPONSE = re.compile(r"<think>(\d+) [a-z]+\.(?: (\d+)\+(\d+)=(\d+)\.)?</think>\\boxed\{(\d+)\}")


@pytest.fixture(scope="module")
def train():
    return make_questions("train", 1500, seed=0)


@pytest.fixture(scope="module")
def eval_set():
    return make_questions("eval", 512, seed=0)


def key(q):
    e = q.extras
    return (e["scene"], e["kind"], e["target"], e["k"])


def within(observed: int, trials: int, p: float) -> bool:
    """Binomial count within 4.5 sigma (+1 for p near 0 or 1) of its expectation."""
    return abs(observed - trials * p) <= 4.5 * math.sqrt(trials * p * (1 - p)) + 1


def blobs(image, colour) -> list[tuple[int, float]]:
    """Connected components of one exact colour: (pixel count, fill ratio of the bounding box)."""
    mask = np.all(np.asarray(image) == np.array(colour, dtype=np.uint8), axis=-1)
    seen = np.zeros_like(mask)
    out = []
    for y0, x0 in zip(*np.nonzero(mask)):
        if seen[y0, x0]:
            continue
        stack, pixels = [(y0, x0)], []
        seen[y0, x0] = True
        while stack:
            y, x = stack.pop()
            pixels.append((y, x))
            for ny, nx in ((y + 1, x), (y - 1, x), (y, x + 1), (y, x - 1)):
                if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        ys, xs = zip(*pixels)
        box = (max(ys) - min(ys) + 1) * (max(xs) - min(xs) + 1)
        out.append((len(pixels), len(pixels) / box))
    return out


def shape_of(fill: float) -> str:
    return "square" if fill > 0.95 else "circle" if fill > 0.65 else "triangle"


def test_deterministic_and_prefix_stable():
    a, b = make_questions("train", 60, seed=3), make_questions("train", 60, seed=3)
    assert [(q.problem, q.answer, q.hint_steps, q.paraphrases) for q in a] == [
        (q.problem, q.answer, q.hint_steps, q.paraphrases) for q in b
    ]
    assert all(x.images[0].tobytes() == y.images[0].tobytes() for x, y in zip(a, b))
    shorter = make_questions("train", 20, seed=3)
    assert [key(q) for q in shorter] == [key(q) for q in a[:20]]
    assert [q.question_id for q in a] == list(range(60))
    other = make_questions("train", 60, seed=4)
    assert sum(key(x) == key(y) for x, y in zip(a, other)) == 0


def test_splits_never_share_a_question(train, eval_set):
    train_keys = {key(q) for q in train}
    assert len(train_keys) == len(train)  # no duplicates inside a split
    assert len({key(q) for q in eval_set}) == len(eval_set)
    assert not train_keys & {key(q) for q in eval_set}
    # membership is a property of the question, so other seeds cannot leak either
    assert not train_keys & {key(q) for q in make_questions("eval", 200, seed=7)}


def test_answers_match_the_drawn_scene(train):
    background_checked = 0
    for q in train[:40]:
        spec: SceneSpec = q.extras["scene"]
        image = q.images[0]
        assert image.size == (112, 112) and image.mode == "RGB"
        found = []  # (colour, shape) of every blob in the picture
        for name, rgb in COLOURS.items():
            found += [(name, shape_of(fill)) for _, fill in blobs(image, rgb)]
        assert sorted(found) == sorted((s.colour, s.kind) for s in spec.shapes)
        target = q.extras["target"]
        drawn = sum(1 for colour, shape in found if target in ("", colour, PLURAL[shape]))
        assert int(q.answer) == drawn + q.extras["k"]
        assert q.extras["n_shapes"] == len(found)
        corner = image.getpixel((0, 0))
        background_checked += corner == spec.background
    assert background_checked == 40


def test_render_scene_low_resolution_and_bad_size():
    spec = SceneSpec((Shape("square", "red", 10, 10, 20), Shape("circle", "blue", 60, 60, 22)), (240, 240, 240))
    small = render_scene(spec, size=28)
    assert small.size == (28, 28)
    assert sum(n for n, _ in blobs(small, COLOURS["red"])) == 25  # 20 px -> 5 px square
    assert len(blobs(render_scene(spec), COLOURS["blue"])) == 1
    with pytest.raises(ValueError, match="size"):
        render_scene(spec, size=0)


def test_hint_steps_lead_to_the_answer(train):
    for q in train:
        e = q.extras
        assert len(q.hint_steps) == (2 if e["k"] else 1)
        assert int(q.hint_steps[0].split()[0]) == e["count"]
        if e["k"]:
            a, b, c = map(int, re.fullmatch(r"(\d+)\+(\d+)=(\d+)\.", q.hint_steps[1]).groups())
            assert (a, b, c) == (e["count"], e["k"], int(q.answer))
        else:
            assert e["count"] == int(q.answer)
        exact = demonstration(q, random.Random(0), hint_steps_shown=len(q.hint_steps))
        assert exact == f"<think>{' '.join(q.hint_steps)}</think>\\boxed{{{q.answer}}}"


def test_texts_shape_and_alphabet(train, eval_set):
    assert set("Hint: Think step by step. Answer in \\boxed{}.\n<think></think>") <= set(ALPHABET)
    rng = random.Random(0)
    for q in train + eval_set:
        texts = [q.problem, *q.paraphrases, *q.hint_steps, q.answer, demonstration(q, rng)]
        assert set("".join(texts)) <= set(ALPHABET)
        assert 2 <= len(q.paraphrases) <= 4 and q.problem not in q.paraphrases
        assert all(t.count("<image>") == 1 for t in [q.problem, *q.paraphrases])
        assert len(q.problem) <= 70 and len(q.images) == 1


def test_demonstration_error_rates():
    """Per tier and per k, over 2000 draws each: count errors, slips, undercounts, boxed follows the steps."""
    pool = make_questions("train", 600, seed=1)
    cases = {}
    for q in pool:  # one question per (kind family, tier, k)
        cases.setdefault((q.extras["kind"], q.extras["tier"], q.extras["k"]), q)
    assert {t for _, t, _ in cases} == {0, 1, 2, 3} and {k for *_, k in cases} == {0, 1, 2, 3, 4, 5}
    rng = random.Random(0)
    for (kind, tier, k), q in cases.items():
        draws, miscounts, slips, right = 2000, 0, 0, 0
        for _ in range(draws):
            m = RESPONSE.fullmatch(demonstration(q, rng, paraphrased=bool(rng.getrandbits(1))))
            count, boxed = int(m.group(1)), int(m.group(5))
            true = q.extras["count"]
            floor = 1 if kind.startswith("total") else 0
            if tier == 3 and true - 2 >= floor:
                assert count in (true, true - 2)  # the last tier undercounts by two
            else:
                assert abs(count - true) <= 1
            if tier >= task.UNDERCOUNT_TIER and true > floor:
                assert count <= true  # the hard tiers only undercount
            miscounts += count != q.extras["count"]
            if k:
                a, b, c = map(int, m.group(2, 3, 4))
                assert (a, b, c) == (count, k, boxed)
                slips += c != a + b
                assert not (count != q.extras["count"] and boxed == int(q.answer))  # a slip never fixes a miscount
            else:
                assert boxed == count
            right += boxed == int(q.answer)
        assert within(miscounts, draws, COUNT_ERROR_BY_TIER[tier]), (kind, tier, k, miscounts)
        if k:
            assert within(slips, draws, SLIP_BY_K[k]), (kind, tier, k, slips)
        assert within(right, draws, demo_accuracy(q)), (kind, tier, k, right)
    assert abs(sum(SLIP_BY_K.values()) / len(SLIP_BY_K) - 0.30) < 1e-9


def test_demonstrations_copy_shown_hints(train):
    rng = random.Random(0)
    for q in [q for q in train if q.extras["k"] and q.extras["tier"] == 3][:20]:
        for _ in range(20):
            response = demonstration(q, rng, hint_steps_shown=1)
            assert response.startswith(f"<think>{q.hint_steps[0]} ")
        draws = 1000
        right = sum(demonstration(q, rng, hint_steps_shown=1).endswith(f"{{{q.answer}}}") for _ in range(draws))
        assert within(right, draws, 1 - SLIP_BY_K[q.extras["k"]])
        assert demo_accuracy(q) == 0 and demo_accuracy(q, hint_steps_shown=2) == 1
    for q in train[:200]:  # paraphrased prompts: same draws from the same generator state
        assert demonstration(q, random.Random(5)) == demonstration(q, random.Random(5), paraphrased=True)


def test_difficulty_spread(train, eval_set):
    """Levels span always-solved to never-solved; the G = 8 regime of ARCHITECTURE.md condition 3 exists."""
    for pool in (train, eval_set):
        levels = Counter(q.extras["level"] for q in pool)
        shares = [levels[level] / len(pool) for level in range(5)]
        assert shares[0] >= 0.15 and shares[4] >= 0.15, shares
        assert all(s >= 0.02 for s in shares), shares  # every level exists (the middle ones are thinner)
        p = np.array([q.extras["demo_accuracy"] for q in pool])
        assert (p**8).mean() >= 0.17 and ((1 - p) ** 8).mean() >= 0.17  # all-right / all-wrong groups at G = 8
        assert 0.4 <= p.mean() <= 0.65
        kinds = Counter(q.extras["kind"] for q in pool)
        assert set(kinds) == set(task.KIND_WEIGHTS)
        assert Counter(q.extras["n_shapes"] for q in pool).keys() == set(range(1, 9))


def test_max_response_chars_bounds_every_demonstration(train):
    rng = random.Random(0)
    longest = max(len(demonstration(q, rng)) for q in train for _ in range(3))
    assert longest <= MAX_RESPONSE_CHARS <= longest + 6


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="split"):
        make_questions("test", 3, seed=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n must be"):
        make_questions("train", -1, seed=0)
    q = make_questions("train", 1, seed=0)[0]
    with pytest.raises(ValueError, match="hint_steps_shown"):
        demonstration(q, random.Random(0), hint_steps_shown=-1)
    q.extras = {}
    with pytest.raises(ValueError, match="make_questions"):
        demonstration(q, random.Random(0))


def test_generation_speed():
    start = time.process_time()
    make_questions("train", 4000, seed=11)
    make_questions("eval", 512, seed=11)
    assert time.process_time() - start < 8.0  # measured ~0.8 s CPU
