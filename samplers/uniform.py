"""`uniform`: the plain GRPO data order — a seeded shuffle of the pool, epoch after epoch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers._common import EpochOrder, check_batch_size, keep_every_prompt, no_refill, original_prompt
from grpo_zoo.types import Prompt, Question, StepFeedback


@dataclass
class UniformConfig:
    """Options of the `uniform` selector."""

    shuffle: bool = True
    """Reshuffle the pool every epoch (seeded by train.seed). False walks the pool in dataset
    order, which is only useful for debugging: neighbouring rows are often correlated."""


@SELECTORS.register("uniform", config=UniformConfig, description="seeded shuffle of the pool, one epoch after another")
class UniformSelector:
    """B questions per step from a seeded permutation of the pool; no variants, no filtering.

    Each epoch visits every question once; a batch crossing an epoch boundary never repeats
    a question. `refill` returns [] (no dynamic sampling; wrap it in `dapo_filter` for that).
    """

    def __init__(self, pool: Sequence[Question], cfg: UniformConfig | None = None, *, batch_size: int, seed: int):
        cfg = cfg if cfg is not None else UniformConfig()
        check_batch_size("selector 'uniform'", batch_size, len(pool))
        self.pool = pool
        self.cfg = cfg
        self.batch_size = batch_size
        self.order = EpochOrder(len(pool), seed, cfg.shuffle)

    def select(self, step: int) -> list[Prompt]:
        return [original_prompt(self.pool[i]) for i in self.order.next(self.batch_size)]

    def update(self, feedback: StepFeedback) -> dict[str, float]:
        return {"uniform/epoch": float(self.order.epoch), "uniform/epoch_progress": self.order.cursor / len(self.pool)}

    filter = keep_every_prompt
    refill = no_refill

    def state_dict(self) -> dict[str, Any]:
        return {"order": self.order.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.order.load_state_dict(state["order"], "selector 'uniform'")

    def histograms(self) -> dict[str, Any]:
        return {}
