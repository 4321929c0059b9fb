"""The testbed task: count coloured shapes in a procedurally drawn 112x112 image.

Every question has a verifiable integer answer, its solution as exact short steps (the DIVA
hint material), three paraphrases (templates), and a known difficulty. `demonstration`
writes the imperfect supervised warm-up targets that ARCHITECTURE.md ("Measured on this
kind of machine", "What worked") found RL needs: count errors that grow with the number of
shapes, arithmetic slips on the plus step, the boxed answer following the faulty steps, and
the hardest tier always undercounted by one, so a warm-up base has questions it always
solves, questions it never solves without a hint (pass@8 near 0), and mixed ones between.

Texts are short because the testbed tokenizer is character level:
    problem   "<image>How many shapes, plus 3?"
    steps     ["5 shapes.", "5+3=8."]
    response  "<think>5 shapes. 5+3=8.</think>\\boxed{8}"
"""

from __future__ import annotations

import hashlib
import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from PIL import Image, ImageDraw

from grpo_zoo.types import Question

CANVAS = 112  # image side in pixels (16 image tokens for the testbed VLM)
SHAPES = ("circle", "square", "triangle")
PLURAL = {"circle": "circles", "square": "squares", "triangle": "triangles"}
COLOURS = {"red": (214, 39, 40), "green": (44, 160, 44), "blue": (31, 90, 200), "yellow": (222, 180, 20)}
MIN_SHAPES, MAX_SHAPES = 1, 8
MIN_SIZE, MAX_SIZE = 10, 22  # shape bounding-box side; small so noise/low-res/occlusion hide them
FEW_SHAPES, FEW_MIN_SIZE = 2, 14  # scenes of <= FEW_SHAPES shapes draw no shape smaller than FEW_MIN_SIZE
GAP = 3  # pixels kept free between bounding boxes, so shapes never touch
MAX_K = 5  # "plus k" uses k in 1..MAX_K

# Which question kinds are drawn, and how often. Filter kinds ("how many red shapes") are the
# perception-limited tail the warm-up cannot learn well; hints turn them from all-wrong to mixed.
KIND_WEIGHTS = {"total": 0.45, "total_plus": 0.30, "colour": 0.07, "colour_plus": 0.055, "shape": 0.07,
                "shape_plus": 0.055}
# A two-ended spread: scenes of 1-2 (larger) shapes supply the all-right groups and scenes of
# 7-8 the all-wrong ones (ARCHITECTURE.md condition 3 asks >= 15% of each at G = 8).
N_WEIGHTS = (4.0, 2.0, 0.8, 0.8, 0.6, 0.6, 1.2, 1.2)  # for n = 1..8

# Demonstration error model (ARCHITECTURE.md "What worked", sharpened at both ends so that
# both always-right and never-right questions exist). Tier = (n - 1) // 2 for n shapes in
# the scene: 1-2, 3-4, 5-6, 7-8. Tiers >= UNDERCOUNT_TIER err only by undercounting, the last
# tier by two (so a base whose perception is off by one still rarely lands on the answer).
COUNT_ERROR_BY_TIER = (0.02, 0.25, 0.60, 1.00)
UNDERCOUNT_TIER = 2
# Arithmetic slips on the plus step grow with k; their mean over k = 1..5 is 0.30.
SLIP_BY_K = {1: 0.03, 2: 0.10, 3: 0.25, 4: 0.50, 5: 0.62}
# Level = tier of the demonstrations' accuracy p: 0 p >= .9 (always solved) ... 4 p = 0 (never).
LEVEL_BOUNDS = (0.9, 0.6, 0.3, 1e-9)
EVAL_BUCKETS = 4  # a question hashing to bucket 0 belongs to eval, any other to train

ALPHABET: str = "\n" + "".join(chr(c) for c in range(32, 127))  # newline + all printable ASCII

_TEMPLATES = {
    "total": ("How many shapes are there?", "Count the shapes.", "What is the number of shapes?",
              "How many shapes do you see?"),
    "total_plus": ("How many shapes, plus {k}?", "Count the shapes and add {k}.", "Number of shapes plus {k} is?",
                   "Add {k} to the number of shapes."),
    "colour": ("How many {t} shapes?", "Count the {t} shapes.", "What is the number of {t} shapes?",
               "How many shapes are {t}?"),
    "colour_plus": ("How many {t} shapes, plus {k}?", "Count the {t} shapes and add {k}.",
                    "Number of {t} shapes plus {k} is?", "Add {k} to the number of {t} shapes."),
    "shape": ("How many {t} are there?", "Count the {t}.", "What is the number of {t}?", "How many {t} do you see?"),
    "shape_plus": ("How many {t}, plus {k}?", "Count the {t} and add {k}.", "Number of {t} plus {k} is?",
                   "Add {k} to the number of {t}."),
}


@dataclass(frozen=True)
class Shape:
    """One filled shape; (x, y) is the top-left corner of its size x size bounding box."""

    kind: str  # one of SHAPES
    colour: str  # a key of COLOURS
    x: int
    y: int
    size: int


@dataclass(frozen=True)
class SceneSpec:
    """Everything `render_scene` draws: non-overlapping shapes on a light background."""

    shapes: tuple[Shape, ...]
    background: tuple[int, int, int]
    canvas: int = CANVAS  # the coordinate frame of the shapes

    def count(self, target: str = "") -> int:
        """Shapes matching `target` (a colour, a plural shape word, or "" for all)."""
        return sum(1 for s in self.shapes if target in ("", s.colour, PLURAL[s.kind]))


def render_scene(spec: SceneSpec, size: int = CANVAS) -> Image.Image:
    """Draw `spec` as a size x size RGB image; size != spec.canvas rescales the coordinates.

    A smaller size is a genuine low-resolution rendering (shapes of a few pixels), not a
    resized copy. Shapes never overlap, so each is one connected blob of its colour.
    """
    if size < 1:
        raise ValueError(f"render_scene: size must be >= 1 pixel, got {size}")
    image = Image.new("RGB", (size, size), spec.background)
    draw = ImageDraw.Draw(image)
    scale = size / spec.canvas

    def px(v: int) -> int:  # round half up: Python's round() would make equal shapes differ by a pixel
        return int(v * scale + 0.5)

    for s in spec.shapes:
        x0, y0 = px(s.x), px(s.y)
        x1, y1 = max(x0, px(s.x + s.size) - 1), max(y0, px(s.y + s.size) - 1)
        fill = COLOURS[s.colour]
        if s.kind == "circle":
            draw.ellipse((x0, y0, x1, y1), fill=fill)
        elif s.kind == "square":
            draw.rectangle((x0, y0, x1, y1), fill=fill)
        else:  # triangle, pointing up
            draw.polygon(((x0 + x1) / 2, y0, x1, y1, x0, y1), fill=fill)
    return image


def _random_scene(rng: random.Random, n: int) -> SceneSpec:
    """Rejection-sample n non-overlapping shapes (restarting the scene if one does not fit)."""
    while True:
        shapes: list[Shape] = []
        for _ in range(n):
            size = rng.randint(FEW_MIN_SIZE if n <= FEW_SHAPES else MIN_SIZE, MAX_SIZE)
            for _ in range(100):
                x, y = rng.randint(1, CANVAS - size - 1), rng.randint(1, CANVAS - size - 1)
                if all(x + size + GAP <= o.x or o.x + o.size + GAP <= x or y + size + GAP <= o.y
                       or o.y + o.size + GAP <= y for o in shapes):
                    shapes.append(Shape(rng.choice(SHAPES), rng.choice(list(COLOURS)), x, y, size))
                    break
            else:
                break
        if len(shapes) == n:
            grey = rng.randint(228, 250)
            return SceneSpec(tuple(shapes), (grey, grey, min(255, grey + rng.randint(-6, 6))))


def _count_word(count: int, kind: str, target: str) -> str:
    """The first solution step, e.g. "5 shapes.", "1 circle.", "2 red."."""
    if kind.startswith("colour"):
        return f"{count} {target}."
    noun = "shapes" if kind.startswith("total") else target
    if count == 1:
        noun = noun[:-1]  # all plurals here end in a plain "s"
    return f"{count} {noun}."


def _steps(kind: str, target: str, k: int, count: int, result: int | None = None) -> list[str]:
    """Solution steps for a counted value; `result` overrides count + k (an arithmetic slip)."""
    steps = [_count_word(count, kind, target)]
    if k:
        steps.append(f"{count}+{k}={count + k if result is None else result}.")
    return steps


def _level(p: float) -> int:
    return next((i for i, bound in enumerate(LEVEL_BOUNDS) if p >= bound), len(LEVEL_BOUNDS))


def demo_accuracy(question: Question, hint_steps_shown: int = 0) -> float:
    """Exact probability that `demonstration` boxes the right answer (slips never fix a miscount)."""
    info = _info(question)
    count_ok = 1.0 if hint_steps_shown >= 1 else 1.0 - COUNT_ERROR_BY_TIER[info["tier"]]
    plus_ok = 1.0 if not info["k"] or hint_steps_shown >= 2 else 1.0 - SLIP_BY_K[info["k"]]
    return count_ok * plus_ok


def _question(spec: SceneSpec, kind: str, target: str, k: int, index: int) -> Question:
    count = spec.count(target)
    n = len(spec.shapes)
    texts = ["<image>" + t.format(t=target, k=k) for t in _TEMPLATES[kind]]
    extras = {"kind": kind, "level": 0, "tier": (n - 1) // 2, "n_shapes": n, "count": count, "k": k,
              "target": target}
    q = Question(question_id=index, problem=texts[0], answer=str(count + k), images=[render_scene(spec)],
                 paraphrases=texts[1:], hint_steps=_steps(kind, target, k, count), extras=extras)
    q.extras["demo_accuracy"] = demo_accuracy(q)
    q.extras["level"] = _level(q.extras["demo_accuracy"])
    q.extras["scene"] = spec  # lets perturbations redraw the scene exactly (occlusion, low resolution)
    return q


def _draw(rng: random.Random) -> tuple[SceneSpec, str, str, int]:
    kind = rng.choices(list(KIND_WEIGHTS), weights=list(KIND_WEIGHTS.values()))[0]
    n = rng.choices(range(MIN_SHAPES, MAX_SHAPES + 1), weights=N_WEIGHTS)[0]
    spec = _random_scene(rng, n)
    target = ""
    if kind.startswith("colour"):
        target = rng.choice(list(COLOURS))
    elif kind.startswith("shape"):
        target = PLURAL[rng.choice(SHAPES)]
    k = rng.randint(1, MAX_K) if kind.endswith("_plus") else 0
    return spec, kind, target, k


def _split_of(spec: SceneSpec, kind: str, target: str, k: int) -> str:
    """Deterministic split membership of an exact question, the same for every seed and n."""
    key = repr((spec, kind, target, k)).encode()
    bucket = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") % EVAL_BUCKETS
    return "eval" if bucket == 0 else "train"


def make_questions(split: Literal["train", "eval"], n: int, seed: int, stream: str = "") -> list[Question]:
    """The first n questions of a split: deterministic per (split, seed, stream), and a prefix of any longer list.

    Train and eval never share an exact question (scene + question text): membership is a
    hash of the question itself, so this holds across any seeds, streams and sizes. Duplicates
    inside a split are skipped too, so the pool holds n distinct questions. `stream` names an
    independent sequence of the same split (the warm-up draws its demonstrations from one).
    """
    if n < 0:
        raise ValueError(f"make_questions: n must be >= 0, got {n}")
    return list(itertools.islice(question_stream(split, seed, stream), n))


def question_stream(split: Literal["train", "eval"], seed: int, stream: str = "") -> Iterator[Question]:
    """Endless distinct questions of a split (see `make_questions`), drawn lazily."""
    if split not in ("train", "eval"):
        raise ValueError(f"make_questions: split must be 'train' or 'eval', got {split!r}")
    rng = random.Random(f"grpo_zoo.testbed:{split}:{seed}" + (f":{stream}" if stream else ""))
    seen: set[tuple] = set()
    index = 0
    while True:
        spec, kind, target, k = _draw(rng)
        if (spec, kind, target, k) in seen or _split_of(spec, kind, target, k) != split:
            continue
        seen.add((spec, kind, target, k))
        yield _question(spec, kind, target, k, index)
        index += 1


def _info(question: Question) -> dict:
    missing = [key for key in ("kind", "tier", "count", "k", "target") if key not in question.extras]
    if missing:
        raise ValueError(f"question {question.question_id}: extras lack {missing}; it was not made by make_questions")
    return question.extras


def _miscount(rng: random.Random, count: int, tier: int, floor: int) -> int:
    """A wrong count: under by two in the last tier, under by one from UNDERCOUNT_TIER, else off by one
    either way; never under floor (then the nearest wrong count that is not)."""
    if tier == len(COUNT_ERROR_BY_TIER) - 1 and count - 2 >= floor:
        return count - 2
    if count - 1 < floor:
        return count + 1
    if tier >= UNDERCOUNT_TIER:
        return count - 1
    return count + rng.choice((-1, 1))


def demonstration(question: Question, rng: random.Random, *, hint_steps_shown: int = 0,
                  paraphrased: bool = False) -> str:
    """One imperfect warm-up target, `<think>STEP STEP</think>\\boxed{N}`.

    Step 1 miscounts with probability COUNT_ERROR_BY_TIER[tier] (`_miscount`: by one, always
    an undercount from tier 2 on, by two in the last tier); the plus step slips by one with
    probability SLIP_BY_K[k], never onto the true answer; the boxed answer is what the steps
    computed. Steps a hint showed in the prompt (`hint_steps_shown` = k > 0) are copied
    exactly, so hints make questions easier,
    as pre-training teaches an instruct model. `paraphrased` changes nothing: paraphrases are
    exactly as hard as originals. The exact accuracy is `demo_accuracy(question, k)`.
    """
    if hint_steps_shown < 0:
        raise ValueError(f"demonstration: hint_steps_shown must be >= 0, got {hint_steps_shown}")
    del paraphrased  # same error rates by design
    info = _info(question)
    kind, target, k, true_count = info["kind"], info["target"], info["k"], info["count"]
    count = true_count
    if hint_steps_shown < 1 and rng.random() < COUNT_ERROR_BY_TIER[info["tier"]]:
        count = _miscount(rng, true_count, info["tier"], floor=1 if kind.startswith("total") else 0)
    result = count + k
    if k and hint_steps_shown < 2 and rng.random() < SLIP_BY_K[k]:
        options = [r for r in (result - 1, result + 1) if r != true_count + k and r >= 0]
        result = rng.choice(options)
    steps = _steps(kind, target, k, count, result)
    return f"<think>{' '.join(steps)}</think>\\boxed{{{result}}}"


def _longest_response() -> int:
    """Worst case over every kind and target: a one-digit count and a two-digit result."""
    targets = {"total": [""], "colour": list(COLOURS), "shape": list(PLURAL.values())}
    longest = 0
    for kind in KIND_WEIGHTS:
        k = MAX_K if kind.endswith("_plus") else 0
        result = MAX_SHAPES + MAX_K + 1  # the largest sum, slipped upwards
        for target in targets[kind.split("_")[0]]:
            steps = _steps(kind, target, k, MAX_SHAPES + 1, result if k else None)
            longest = max(longest, len(f"<think>{' '.join(steps)}</think>\\boxed{{{result}}}"))
    return longest


MAX_RESPONSE_CHARS: int = _longest_response()  # for max_new_tokens with the char-level tokenizer
