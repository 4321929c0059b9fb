"""DIVA-GRPO's difficulty arithmetic (arXiv 2603.01106): state update and variant planning.

Pure functions, no selector state, so each rule can be tested on hand-worked numbers.
D is a question's difficulty in [1, 9] (higher = harder). A variant is described by a shift
s: its difficulty label is D_i = D_q + s, and s decides its kind:
    s < 0      hint, |s| reasoning steps (-1 -> 1, -2 -> 2, -3 -> 3, below -> all)
    s = 0      paraphrase
    s = 1..6   image perturbation: 1: 1 transform at 0.30, 2: 1 at 0.45, 3: 2 at 0.30,
               4: 2 at 0.45, 5: 3 at 0.30, 6: 4 at 0.45
    s = 7, 8   only-vision (question text rendered into the image)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KINDS: tuple[str, ...] = ("hint", "paraphrase", "perturb", "only_vision")
"""Variant kinds from easiest to hardest. "repeat" (the original text again) is the last resort."""

SHIFT_MU: tuple[float, ...] = (6.0, 5.0, 4.0, 3.0, 2.0, 1.0, -1.0, -3.0, -5.0)
"""The authors' sampler: mean shift mu(D) for D = 1, 2, ..., 9."""

PERTURB_LEVELS: dict[int, tuple[int, float]] = {
    1: (1, 0.30),
    2: (1, 0.45),
    3: (2, 0.30),
    4: (2, 0.45),
    5: (3, 0.30),
    6: (4, 0.45),
}
"""s -> (number of random transforms, strength) for perturbation variants."""

MAX_SHIFT = 8
ONLY_VISION_SHIFT = 7  # the label shift of an only-vision variant reached as a fallback

FALLBACKS: dict[str, tuple[str, ...]] = {
    # Next best kind when the wanted one has no material (no hint steps, no paraphrase, no
    # image) or is switched off: stay on the same side of "same difficulty", then go neutral.
    "hint": ("paraphrase", "repeat"),
    "paraphrase": ("repeat",),
    "perturb": ("only_vision", "paraphrase", "repeat"),
    "only_vision": ("perturb", "paraphrase", "repeat"),
}


@dataclass(frozen=True)
class VariantPlan:
    """What variant a shift asks for."""

    kind: str  # one of KINDS
    shift: int  # s; the label is D_q + s
    hint_steps: int | None = None  # hint: steps to reveal; None = all
    num_transforms: int = 0  # perturb: how many transforms
    strength: float = 0.0  # perturb: strength (noise sigma)


def shift_mean(difficulty: float, table: tuple[float, ...] | list[float] = SHIFT_MU) -> float:
    """mu(D) of the authors' shift sampler, linear between the integer entries (D clipped to [1, 9])."""
    d = float(np.clip(difficulty, 1.0, 9.0))
    return float(np.interp(d, np.arange(1.0, 10.0), np.asarray(table, dtype=np.float64)))


def draw_shift(
    difficulty: float,
    rng: np.random.Generator,
    table: tuple[float, ...] | list[float] = SHIFT_MU,
    std: float = 1.0,
) -> int:
    """s = round(N(mu(D), std)) clipped to [-8, 8] (DIVA authors' sampler; ties round half up)."""
    x = rng.normal(shift_mean(difficulty, table), std)
    return int(np.clip(math.floor(x + 0.5), -MAX_SHIFT, MAX_SHIFT))


def tier_shift(difficulty: float, band: float = 1.0) -> int:
    """The paper's deterministic tiers around the middle 5 (inferred strengths).

    |D - 5| < band: paraphrase (s = 0). Otherwise level L = round(|D - 5|) in 1..4:
    easy questions (D < 5) get a perturbation with s = 1, 3, 5, 6 for L = 1..4; hard ones
    (D > 5) a hint with L steps (L = 4: all steps), s = -L.
    """
    delta = float(difficulty) - 5.0
    if abs(delta) < band:
        return 0
    level = int(np.clip(math.floor(abs(delta) + 0.5), 1, 4))
    return (1, 3, 5, 6)[level - 1] if delta < 0 else -level


def plan_for_shift(shift: int) -> VariantPlan:
    """The variant kind and its parameters for shift s (table in the module docstring)."""
    s = int(np.clip(shift, -MAX_SHIFT, MAX_SHIFT))
    if s < 0:
        return VariantPlan("hint", s, hint_steps=-s if s >= -3 else None)
    if s == 0:
        return VariantPlan("paraphrase", 0)
    if s <= 6:
        count, strength = PERTURB_LEVELS[s]
        return VariantPlan("perturb", s, num_transforms=count, strength=strength)
    return VariantPlan("only_vision", s)


def fallback_plan(wanted: VariantPlan, kind: str) -> VariantPlan:
    """The plan to build when `wanted` falls back to `kind`; the label shift follows the kind built."""
    if kind == "perturb":
        return plan_for_shift(int(np.clip(wanted.shift, 1, 6)))
    if kind == "only_vision":
        return VariantPlan("only_vision", ONLY_VISION_SHIFT)
    if kind == "hint":
        return plan_for_shift(min(wanted.shift, -1))
    return VariantPlan(kind, 0)  # paraphrase or repeat: same difficulty


def update_difficulty(
    difficulty: np.ndarray, accuracy: np.ndarray, rule: str = "paper", eta: float = 4.0
) -> np.ndarray:
    """New D for each question from its global-group accuracy acc in [0, 1] (arrays [Q]).

    paper:   D_new = clip(D + eta (0.5 - acc), 1, 9)            (non-integer D)
    authors: acc > 0.8 -> -2; 0.6 < acc <= 0.8 -> -1; acc < 0.4 -> +1; else 0, on round(D),
             clipped to [1, 9]. Their "< 0.2 -> +2" branch comes after "< 0.4" and never runs,
             so it is left out.
    """
    d = np.asarray(difficulty, dtype=np.float64)
    acc = np.asarray(accuracy, dtype=np.float64)
    if rule == "paper":
        return np.clip(d + eta * (0.5 - acc), 1.0, 9.0)
    if rule == "authors":
        delta = np.select([acc > 0.8, acc > 0.6, acc < 0.4], [-2.0, -1.0, 1.0], default=0.0)
        return np.clip(np.floor(d + 0.5) + delta, 1.0, 9.0)
    raise ValueError(f"update_rule must be 'paper' or 'authors', got {rule!r}")
