"""`diva`: DIVA-GRPO's selector (arXiv 2603.01106) — difficulty state plus difficulty-adaptive variants.

Per step: B questions in seeded epoch order; for each, the original prompt (label D_q) and V
variants whose kind follows D_q (easy questions get harder variants, hard ones easier ones),
each labelled D_i = D_q + s. After rollout, D_q moves with the accuracy of the question's
global group (original + variants). Pair it with the `diva` estimator.

Randomness of a variant (its shift draw, paraphrase choice, transforms, noise) comes from a
Generator keyed on (seed, step, question_id, variant index), so a variant is reproducible on
its own and needs no checkpointed RNG; the epoch order's RNG is checkpointed. Unlike the
authors' code, the difficulty state is saved and restored and no question is ever dropped.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers import _diva_plan as plan
from grpo_zoo.samplers._common import (
    EpochOrder,
    check_batch_size,
    check_pool_length,
    index_of_questions,
    keep_every_prompt,
    keyed_rng,
    no_refill,
    original_prompt,
    per_question,
)
from grpo_zoo.types import Prompt, Question, StepFeedback
from grpo_zoo.variants import TRANSFORMS, add_hint, perturb_image, render_only_vision, rotation_note

OWNER = "selector 'diva'"
VARIANT_KINDS = (*plan.KINDS, "repeat")


@dataclass
class DivaSelectorConfig:
    """Options of the `diva` selector (defaults: the authors' sampler, the paper's update rule)."""

    num_variants: int = 1
    """V variants per question (the paper's main run: 1, so B questions give 2B prompts)."""
    sampler: Literal["shift", "tiers"] = "shift"
    """"shift" = the authors' sampler (s = round(N(mu(D), 1)); what produced the paper's results;
    a fresh question, D = 5, mostly gets perturbations). "tiers" = the paper's deterministic
    three tiers around 5 (easy: perturb, middle: paraphrase, hard: hint)."""
    update_rule: Literal["paper", "authors"] = "paper"
    """"paper": D += eta (0.5 - acc), clipped to [1, 9]. "authors": integer steps from an
    accuracy table (their released code)."""
    eta: float = 4.0
    """Step size of the paper rule: acc = 0 moves D up by eta / 2."""
    signal: Literal["reward", "accuracy"] = "reward"
    """acc_q = mean of reward / R_max over the global group (the authors', format term
    included), or of the accuracy term alone."""
    initial_difficulty: float = 5.0
    """D of a question never seen."""
    shift_mu: list[float] = field(default_factory=lambda: list(plan.SHIFT_MU))
    """mu(D) for D = 1..9 of the shift sampler (interpolated between integers)."""
    shift_std: float = 1.0
    """Std of the shift draw; 0 makes it deterministic (s = round(mu(D)))."""
    tier_band: float = 1.0
    """tiers: |D - 5| below this gives a paraphrase."""
    kinds: list[str] = field(default_factory=lambda: list(plan.KINDS))
    """Variant kinds allowed; a wanted kind not listed falls back (counted). Drop only_vision
    and perturb for a text-only model."""
    transforms: list[str] = field(default_factory=lambda: list(TRANSFORMS))
    """Image perturbations drawn from for perturbation variants."""
    only_vision_size: list[int] = field(default_factory=lambda: [224, 224])
    """Canvas (width, height) of an only-vision variant of a question with no image; with an
    image, its size is kept."""
    shuffle: bool = True
    """Reshuffle the pool every epoch (seeded)."""

    def __post_init__(self) -> None:
        if self.num_variants < 0:
            raise ValueError(f"num_variants must be >= 0, got {self.num_variants}")
        if not self.eta > 0:
            raise ValueError(f"eta must be > 0, got {self.eta}")
        if not 1.0 <= self.initial_difficulty <= 9.0:
            raise ValueError(f"initial_difficulty must be in [1, 9], got {self.initial_difficulty}")
        if len(self.shift_mu) != 9 or not all(np.isfinite(self.shift_mu)):
            raise ValueError(f"shift_mu must hold 9 finite numbers (mu for D = 1..9), got {self.shift_mu}")
        if not self.shift_std >= 0:
            raise ValueError(f"shift_std must be >= 0, got {self.shift_std}")
        bad = [k for k in self.kinds if k not in plan.KINDS]
        if bad:
            raise ValueError(f"kinds: unknown variant kind(s) {bad}; choose from {list(plan.KINDS)}")
        bad = [t for t in self.transforms if t not in TRANSFORMS]
        if bad:
            raise ValueError(f"transforms: unknown transform(s) {bad}; choose from {list(TRANSFORMS)}")
        if len(self.only_vision_size) != 2 or min(self.only_vision_size) < 1:
            raise ValueError(f"only_vision_size must be [width, height] > 0, got {self.only_vision_size}")


@SELECTORS.register(
    "diva", config=DivaSelectorConfig, description="DIVA-GRPO: per-question difficulty and difficulty-adaptive variants"
)
class DivaSelector:
    """Original + V variants per question, variant kind chosen by the question's difficulty."""

    def __init__(self, pool: Sequence[Question], cfg: DivaSelectorConfig | None = None, *, batch_size: int, seed: int):
        cfg = cfg if cfg is not None else DivaSelectorConfig()
        check_batch_size(OWNER, batch_size, len(pool))
        self.pool = pool
        self.cfg = cfg
        self.batch_size = batch_size
        self.seed = seed
        self.index = index_of_questions(pool)
        self.order = EpochOrder(len(pool), seed, cfg.shuffle)
        self.difficulty = np.full(len(pool), cfg.initial_difficulty, dtype=np.float64)  # D_q
        self.visits = np.zeros(len(pool), dtype=np.int64)  # updates received per question
        self.totals: Counter[str] = Counter()  # variants rolled out per kind, plus "fallback"
        self.last_shifts = np.zeros(0, dtype=np.float64)

    # ----------------------------------------------------------------------------------
    # Selection and variant construction
    # ----------------------------------------------------------------------------------
    def select(self, step: int) -> list[Prompt]:
        prompts: list[Prompt] = []
        for pos in self.order.next(self.batch_size):
            q, d = self.pool[pos], float(self.difficulty[pos])
            prompts.append(original_prompt(q, d, shift=0))
            prompts += [self.build_variant(q, d, step, v) for v in range(self.cfg.num_variants)]
        return prompts

    def wanted_plan(self, difficulty: float, rng: np.random.Generator) -> plan.VariantPlan:
        if self.cfg.sampler == "tiers":
            return plan.plan_for_shift(plan.tier_shift(difficulty, self.cfg.tier_band))
        return plan.plan_for_shift(plan.draw_shift(difficulty, rng, self.cfg.shift_mu, self.cfg.shift_std))

    def available(self, q: Question, kind: str) -> bool:
        if kind == "repeat":
            return True
        if kind not in self.cfg.kinds:
            return False
        if kind == "hint":
            return bool(q.hint_steps)
        if kind == "paraphrase":
            return bool(q.paraphrases)
        if kind == "perturb":
            return bool(q.images) and bool(self.cfg.transforms)
        return True  # only_vision renders the text even without an image

    def build_variant(self, q: Question, difficulty: float, step: int, v: int) -> Prompt:
        """Variant v of question q at `step`: deterministic in (seed, step, question_id, v)."""
        rng = keyed_rng(self.seed, step, q.question_id, v)
        wanted = self.wanted_plan(difficulty, rng)
        chosen = wanted
        if not self.available(q, wanted.kind):
            kind = next(k for k in plan.FALLBACKS[wanted.kind] if self.available(q, k))
            chosen = plan.fallback_plan(wanted, kind)
        problem, images, details = self._material(q, chosen, rng, (self.seed, step, q.question_id, v))
        extras = {
            "variant_index": v,
            "shift": chosen.shift,
            "wanted": wanted.kind,
            "fallback": chosen.kind != wanted.kind,
            **details,
        }
        return Prompt(
            question_id=int(q.question_id),
            problem=problem,
            answer=q.answer,
            images=images,
            variant=chosen.kind,
            difficulty=difficulty + chosen.shift,
            extras=extras,
        )

    def _material(
        self, q: Question, p: plan.VariantPlan, rng: np.random.Generator, key: tuple[int, ...]
    ) -> tuple[str, list[Any], dict[str, Any]]:
        """(problem text, images, extras) of a variant of kind p.kind."""
        if p.kind == "hint":
            k = len(q.hint_steps) if p.hint_steps is None else min(p.hint_steps, len(q.hint_steps))
            return add_hint(q.problem, q.hint_steps, k), list(q.images), {"hint_steps": k}
        if p.kind == "paraphrase":
            i = int(rng.integers(len(q.paraphrases)))
            return keep_image_tags(q.paraphrases[i], q), list(q.images), {"paraphrase_index": i}
        if p.kind == "perturb":
            return self._perturb(q, p, rng, key)
        if p.kind == "only_vision":
            first = q.images[0] if q.images else None
            size = first.size if first is not None else tuple(self.cfg.only_vision_size)
            image, pointer = render_only_vision(q.problem, first, size)
            return pointer + "\n<image>" * max(0, len(q.images) - 1), [image, *q.images[1:]], {}
        return q.problem, list(q.images), {}  # repeat

    def _perturb(
        self, q: Question, p: plan.VariantPlan, rng: np.random.Generator, key: tuple[int, ...]
    ) -> tuple[str, list[Any], dict[str, Any]]:
        allowed = [t for t in TRANSFORMS if t in self.cfg.transforms]  # canonical order: rotate first
        count = min(p.num_transforms, len(allowed))
        picked = sorted(rng.choice(len(allowed), size=count, replace=False).tolist())
        transforms = [allowed[i] for i in picked]
        images, info = [], {}
        for image in q.images:
            # Same parameters for every image of the question, so one rotation note is true for all.
            out, info = perturb_image(image, transforms, p.strength, keyed_rng(*key, 1))
            images.append(out)
        problem = rotation_note(q.problem, info["angle"]) if "angle" in info else q.problem
        return problem, images, info

    # ----------------------------------------------------------------------------------
    # Learning from the rollout
    # ----------------------------------------------------------------------------------
    def update(self, feedback: StepFeedback) -> dict[str, float]:
        """D_q from the global group's mean success (reward / R_max by default), then metrics."""
        pos, sums, counts = per_question(feedback, self.index, self.cfg.signal, OWNER)
        acc = sums / np.maximum(counts, 1.0)
        if len(pos):
            self.difficulty[pos] = plan.update_difficulty(self.difficulty[pos], acc, self.cfg.update_rule, self.cfg.eta)
            self.visits[pos] += 1
        variants = [p for p in feedback.prompts if p.variant != "original"]
        kinds = Counter(p.variant for p in variants)
        fallbacks = sum(bool(p.extras.get("fallback")) for p in variants)
        self.totals.update(kinds)
        self.totals["fallback"] += fallbacks
        self.last_shifts = np.asarray([float(p.extras.get("shift", 0)) for p in variants], dtype=np.float64)
        seen = self.difficulty[self.visits > 0]
        metrics = {
            "diva/difficulty_mean": float(self.difficulty[pos].mean()) if len(pos) else float("nan"),
            "diva/difficulty_std": float(self.difficulty[pos].std()) if len(pos) else float("nan"),
            "diva/difficulty_mean_seen": float(seen.mean()) if len(seen) else self.cfg.initial_difficulty,
            "diva/global_accuracy_mean": float(acc.mean()) if len(acc) else float("nan"),
            "diva/fallback_share": fallbacks / len(variants) if variants else 0.0,
            "diva/fallback_total": float(self.totals["fallback"]),
            "diva/variant_shift_mean": float(self.last_shifts.mean()) if variants else 0.0,
        }
        for kind in VARIANT_KINDS:
            metrics[f"diva/share_{kind}"] = kinds[kind] / len(variants) if variants else 0.0
        return {k: v for k, v in metrics.items() if np.isfinite(v)}

    filter = keep_every_prompt
    refill = no_refill

    # ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "difficulty": self.difficulty.tolist(),
            "visits": self.visits.tolist(),
            "order": self.order.state_dict(),
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("difficulty", "visits"):
            check_pool_length(OWNER, name, state[name], len(self.pool))
        d = np.asarray(state["difficulty"], dtype=np.float64)
        if not (np.isfinite(d).all() and (d >= 1).all() and (d <= 9).all()):
            raise ValueError(f"{OWNER}: checkpoint difficulties must lie in [1, 9]")
        self.order.load_state_dict(state["order"], OWNER)
        self.difficulty = d
        self.visits = np.asarray(state["visits"], dtype=np.int64)
        self.totals = Counter({str(k): int(v) for k, v in state["totals"].items()})

    def histograms(self) -> dict[str, Any]:
        """D of every question seen so far, of the whole pool, and the last variants' shifts (empty ones left out)."""
        hists = {
            "diva/difficulty": self.difficulty[self.visits > 0].copy(),
            "diva/difficulty_all": self.difficulty.copy(),
            "diva/variant_shift": self.last_shifts.copy(),
        }
        return {k: v for k, v in hists.items() if v.size}


def keep_image_tags(text: str, q: Question) -> str:
    """A paraphrase keeps as many `<image>` tags as the original (missing ones go in front)."""
    missing = q.problem.count("<image>") - text.count("<image>")
    return "<image>" * missing + text if missing > 0 else text
