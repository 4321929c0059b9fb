"""`vade`: variance-aware dynamic sampling (VADE, arXiv 2511.18902).

Each question keeps Beta pseudo-counts (a_q, b_q); its success rate has the posterior
Beta(a_q + 1, b_q + 1). Before rollout, draw p_q from every candidate's posterior (Thompson
sampling), score I_q = p_q (1 - p_q)^2 — which peaks at p = 1/3 — and take the top B. After
rollout, with s successes out of G responses:
    selected:   a <- l1 a + s,   b <- l1 b + (G - s)       (decay first, then add; l1 = 0.2)
    unselected: a <- l2 a,       b <- l2 b                 (l2 = 0.999 per step)
Worked example of the paper's figure: G = 8, (0.1, 8.4), 1 correct ->
a = 0.2 * 0.1 + 1 = 1.02, b = 0.2 * 8.4 + 7 = 8.68.

The unselected decay is applied lazily: (a, b) are stored as of the step each question was
last updated and decayed by l2^(steps since) when read. That is the same arithmetic as
decaying everything every step, costs O(B) per update instead of O(pool), and stays right
when the engine calls update() several times in one step (dapo_filter refill rounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers._common import (
    check_batch_size,
    check_pool_length,
    index_of_questions,
    keep_every_prompt,
    no_refill,
    original_prompt,
    per_question,
    rng_state,
    seed_key,
    set_rng_state,
)
from grpo_zoo.types import Prompt, Question, StepFeedback

OWNER = "selector 'vade'"


@dataclass
class VadeConfig:
    """Options of the `vade` selector (defaults: the paper's full method)."""

    score: Literal["skewed", "variance"] = "skewed"
    """Informativeness of a drawn success rate p: "skewed" = p (1 - p)^2 (the paper; favours
    questions solved about 1/3 of the time), "variance" = p (1 - p) (ablation, peaks at 1/2)."""
    greedy: bool = False
    """Score the posterior mean instead of a Thompson draw (ablation): no exploration, so
    questions whose estimate is wrong are rarely revisited."""
    l1: float = 0.2
    """Decay of a selected question's old counts before the new ones are added; small values
    trust the latest rollout (the policy moves), 1 keeps the full history."""
    l2: float = 0.999
    """Per-step decay of an unselected question's counts: old evidence slowly loses weight so
    that stale questions drift back towards the uniform prior and get re-explored."""
    signal: Literal["accuracy", "reward"] = "accuracy"
    """What counts as a success: the accuracy term, or the overall reward / R_max (continuous
    rewards give fractional successes s = sum clip(r / R_max, 0, 1))."""
    candidates: int = 0
    """Questions drawn at random as this step's candidates before scoring; 0 = the whole pool
    (the paper). Set it for pools so large that scoring all of them each step is wasteful."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.l1 <= 1.0:
            raise ValueError(f"l1 must be in [0, 1] (decay of a selected question's counts), got {self.l1}")
        if not 0.0 < self.l2 <= 1.0:
            raise ValueError(f"l2 must be in (0, 1] (per-step decay of unselected counts), got {self.l2}")
        if self.candidates < 0:
            raise ValueError(f"candidates must be 0 (whole pool) or a positive count, got {self.candidates}")


def informativeness(p: np.ndarray, score: str) -> np.ndarray:
    """I(p) = p (1 - p)^2 ("skewed", VADE eq. for the selection score) or p (1 - p) ("variance")."""
    return p * (1.0 - p) ** 2 if score == "skewed" else p * (1.0 - p)


@SELECTORS.register(
    "vade", config=VadeConfig, description="VADE: Beta posteriors per question, Thompson draw, top-B by p(1-p)^2"
)
class VadeSelector:
    """Picks the B most informative questions by Thompson sampling from Beta posteriors."""

    def __init__(self, pool: Sequence[Question], cfg: VadeConfig | None = None, *, batch_size: int, seed: int):
        cfg = cfg if cfg is not None else VadeConfig()
        check_batch_size(OWNER, batch_size, len(pool))
        if cfg.candidates and cfg.candidates < batch_size:
            raise ValueError(f"{OWNER}: candidates ({cfg.candidates}) must be 0 or >= batch_size ({batch_size})")
        self.pool = pool
        self.cfg = cfg
        self.batch_size = batch_size
        self.index = index_of_questions(pool)
        n = len(pool)
        self.a = np.zeros(n, dtype=np.float64)  # pseudo-successes as of step last[q]
        self.b = np.zeros(n, dtype=np.float64)  # pseudo-failures as of step last[q]
        self.last = np.zeros(n, dtype=np.int64)  # step of each question's last update
        self.step = 0  # the step of the latest select(); update() applies to it
        self.picked: list[int] = []  # pool positions already selected in `self.step`
        self.rng = np.random.default_rng(seed_key(seed, 0x7ADE))

    # ----------------------------------------------------------------------------------
    def counts(self, step: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) of every question as of the end of `step` (default: the current step), [pool] each."""
        step = self.step if step is None else step
        factor = self.cfg.l2 ** np.maximum(step - self.last, 0).astype(np.float64)
        return self.a * factor, self.b * factor

    def posterior_mean(self, step: int | None = None) -> np.ndarray:  # [pool]
        a, b = self.counts(step)
        return (a + 1.0) / (a + b + 2.0)

    def select(self, step: int) -> list[Prompt]:
        """Top-B by I(p), p ~ Beta(a + 1, b + 1) as of the previous step.

        Called again in the same step (a dapo_filter refill), it skips questions already taken.
        """
        if step != self.step:
            self.step, self.picked = step, []
        available = np.setdiff1d(np.arange(len(self.pool)), np.asarray(self.picked, dtype=np.int64))
        if self.cfg.candidates and len(available) > self.cfg.candidates:
            available = np.sort(self.rng.choice(available, size=self.cfg.candidates, replace=False))
        if len(available) == 0:
            return []
        a, b = self.counts(step - 1)
        a, b = a[available], b[available]
        if self.cfg.greedy:
            p = (a + 1.0) / (a + b + 2.0)
        else:
            p = self.rng.beta(a + 1.0, b + 1.0)
        score = informativeness(p, self.cfg.score)
        top = np.argsort(-score, kind="stable")[: self.batch_size]
        chosen = [int(available[i]) for i in top]
        self.picked += chosen
        mean = (a[top] + 1.0) / (a[top] + b[top] + 2.0)
        return [original_prompt(self.pool[i], vade_posterior_mean=float(m)) for i, m in zip(chosen, mean)]

    def update(self, feedback: StepFeedback) -> dict[str, float]:
        """Decay-then-add for every question in the feedback; the rest decay lazily by l2."""
        pos, s, g = per_question(feedback, self.index, self.cfg.signal, OWNER)
        metrics: dict[str, float] = {}
        if len(pos):
            a_prev, b_prev = self.counts(self.step - 1)
            predicted = (a_prev[pos] + 1.0) / (a_prev[pos] + b_prev[pos] + 2.0)
            self.a[pos] = self.cfg.l1 * a_prev[pos] + s
            self.b[pos] = self.cfg.l1 * b_prev[pos] + (g - s)
            self.last[pos] = self.step
            rate = s / g
            metrics["vade/selected_posterior_mean"] = float(predicted.mean())
            metrics["vade/selected_success_rate"] = float(rate.mean())
            metrics["vade/mixed_group_share"] = float(((rate > 0) & (rate < 1)).mean())
        a, b = self.counts()
        metrics["vade/posterior_mean_mean"] = float(((a + 1.0) / (a + b + 2.0)).mean())
        metrics["vade/pseudo_count_mean"] = float((a + b).mean())
        metrics["vade/visited_share"] = float(((a + b) > 0).mean())
        return metrics

    filter = keep_every_prompt
    refill = no_refill

    # ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "a": self.a.tolist(),
            "b": self.b.tolist(),
            "last": self.last.tolist(),
            "step": self.step,
            "picked": list(self.picked),
            "rng": rng_state(self.rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("a", "b", "last"):
            check_pool_length(OWNER, name, state[name], len(self.pool))
        a = np.asarray(state["a"], dtype=np.float64)
        b = np.asarray(state["b"], dtype=np.float64)
        if not (np.isfinite(a).all() and np.isfinite(b).all() and (a >= 0).all() and (b >= 0).all()):
            raise ValueError(f"{OWNER}: checkpoint pseudo-counts must be finite and >= 0")
        set_rng_state(self.rng, state["rng"], OWNER)
        self.a, self.b = a, b
        self.last = np.asarray(state["last"], dtype=np.int64)
        self.step = int(state["step"])
        self.picked = [int(i) for i in state["picked"]]

    def histograms(self) -> dict[str, Any]:
        a, b = self.counts()
        return {"vade/posterior_mean": (a + 1.0) / (a + b + 2.0), "vade/pseudo_count": a + b}
