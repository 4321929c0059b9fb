"""`dapo_filter`: DAPO dynamic sampling (arXiv 2503.14476) around any other selector.

After rollout, every local group whose accuracy (or reward) is the same for all G responses
is dropped — it gives GRPO a zero advantage and only dilutes the batch — and the inner
selector is asked for more prompts until as many prompts as one inner batch survive. After
`max_gen_batches` generation rounds without a full batch, `on_exhausted: partial` (default)
trains on what it has, with a warning and a counter; `error` stops with a message saying
what to change (peers crash there with no such option).

Metrics: the pass rate (share of groups kept) and the extra generation cost, so the price of
the filter is visible next to its effect.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from grpo_zoo.configuration import PluginSpec, build_plugin, plugin
from grpo_zoo.registry import SELECTORS
from grpo_zoo.samplers._common import check_feedback, feedback_signal
from grpo_zoo.types import Prompt, Question, StepFeedback

log = logging.getLogger(__name__)
OWNER = "selector 'dapo_filter'"


class DynamicSamplingExhausted(RuntimeError):
    """dapo_filter ran out of generation rounds with `on_exhausted: error`."""


@dataclass
class DapoFilterConfig:
    """Options of the `dapo_filter` selector."""

    inner: Any = plugin(SELECTORS, "uniform")
    """The selector whose prompts are filtered (a name, or a mapping with name: and its options)."""
    metric: Literal["accuracy", "reward"] = "accuracy"
    """What must vary inside a group for it to be kept: the accuracy term (DAPO's default) or
    the overall reward (keeps groups that differ only in format, which do carry a signal)."""
    max_gen_batches: int = 10
    """Generation rounds per step, the first included, before giving up on a full batch."""
    on_exhausted: Literal["partial", "error"] = "partial"
    """"partial": train on the kept groups (warning + counter). "error": stop the run."""
    trim: bool = True
    """Drop passing groups beyond one batch (as verl does), so every step trains on the same
    number of prompts; False keeps every passing group of the last round."""
    atol: float = 1e-9
    """Groups whose values differ by no more than this count as all-equal."""

    def __post_init__(self) -> None:
        if self.max_gen_batches < 1:
            raise ValueError(f"max_gen_batches must be >= 1 (generation rounds per step), got {self.max_gen_batches}")
        if self.atol < 0:
            raise ValueError(f"atol must be >= 0, got {self.atol}")


def resolve_inner(value: Any) -> PluginSpec:
    """The inner selector's PluginSpec from a name, a mapping, or a PluginSpec (config filled in)."""
    spec = value if isinstance(value, PluginSpec) else build_plugin(SELECTORS, value, "dapo_filter.inner")
    if spec.config is None:
        spec = PluginSpec(spec.name, SELECTORS.get(spec.name).config_cls())
    return spec


def mixed_groups(feedback: StepFeedback, metric: str, atol: float) -> torch.Tensor:
    """[B] bool: True for prompts whose responses are not all equal on `metric` (a group of one is equal)."""
    values = torch.as_tensor(feedback_signal(feedback, metric))  # [N] float64
    idx = feedback.prompt_index.cpu().long()
    b = len(feedback.prompts)
    hi = torch.full((b,), -float("inf"), dtype=torch.float64).scatter_reduce(0, idx, values, "amax")
    lo = torch.full((b,), float("inf"), dtype=torch.float64).scatter_reduce(0, idx, values, "amin")
    count = torch.bincount(idx, minlength=b)
    return (count > 1) & (hi - lo > atol)


@SELECTORS.register(
    "dapo_filter", config=DapoFilterConfig, description="DAPO dynamic sampling: drop all-equal groups, refill"
)
class DapoFilterSelector:
    """Wraps an inner selector; keeps only groups with varied rewards and refills the batch."""

    def __init__(self, pool: Sequence[Question], cfg: DapoFilterConfig | None = None, *, batch_size: int, seed: int):
        cfg = cfg if cfg is not None else DapoFilterConfig()
        self.cfg = cfg
        self.inner_spec = resolve_inner(cfg.inner)
        inner_cls = SELECTORS.get(self.inner_spec.name).obj
        self.inner = inner_cls(pool, self.inner_spec.config, batch_size=batch_size, seed=seed)
        self.exhausted_total = 0  # steps that ended without a full batch, over the run
        self._reset(step=0, target=0)

    def _reset(self, step: int, target: int) -> None:
        self.step = step
        self.target = target  # prompts one inner batch holds; the batch is full at this many kept
        self.gen_batches = 0
        self.generated = 0
        self.kept = 0
        self.groups_seen = 0
        self.groups_mixed = 0
        self.exhausted = False  # this step ended (or will end) without a full batch

    def select(self, step: int) -> list[Prompt]:
        prompts = self.inner.select(step)
        self._reset(step, len(prompts))
        self.gen_batches, self.generated = 1, len(prompts)
        return prompts

    def update(self, feedback: StepFeedback) -> dict[str, float]:
        """The inner selector learns from every response, kept or not; plus the filter's counters.

        An exhaustion that this round makes certain (last allowed round, batch still short) is
        counted here already, so the metrics the engine logs for this step include it.
        """
        metrics = dict(self.inner.update(feedback))
        check_feedback(OWNER, feedback)
        mixed = mixed_groups(feedback, self.cfg.metric, self.cfg.atol)
        self.groups_seen += int(mixed.numel())
        self.groups_mixed += int(mixed.sum())
        short = self.kept + int(mixed.sum()) < self.target
        if short and self.gen_batches >= self.cfg.max_gen_batches and self.cfg.on_exhausted == "partial":
            self._count_exhausted()
        metrics["dapo/pass_rate"] = self.groups_mixed / max(self.groups_seen, 1)
        metrics["dapo/gen_batches"] = float(self.gen_batches)
        metrics["dapo/extra_generation_share"] = self.generated / max(self.target, 1) - 1.0
        metrics["dapo/exhausted"] = float(self.exhausted)
        metrics["dapo/exhausted_total"] = float(self.exhausted_total)
        return metrics

    def _count_exhausted(self) -> None:
        if not self.exhausted:
            self.exhausted = True
            self.exhausted_total += 1

    def filter(self, feedback: StepFeedback) -> torch.Tensor:  # [B] bool
        keep = mixed_groups(feedback, self.cfg.metric, self.cfg.atol)
        if self.cfg.trim and self.target:
            room = max(self.target - self.kept, 0)
            keep &= torch.cumsum(keep.long(), 0) <= room
        self.kept += int(keep.sum())
        return keep

    def refill(self, step: int, kept_prompts: int, round: int) -> list[Prompt]:
        """More prompts from the inner selector, [] once `kept_prompts` fills a batch or rounds run out.

        The round count is this selector's own (it counts the first generation as 1); the
        engine's `round` argument is not needed.
        """
        if kept_prompts >= self.target:
            return []
        more: list[Prompt] = []
        if self.gen_batches < self.cfg.max_gen_batches:
            more = self.inner.refill(step, kept_prompts, round) or self.inner.select(step)
        if not more:
            self._exhausted(kept_prompts)
            return []
        self.gen_batches += 1
        self.generated += len(more)
        return more

    def _exhausted(self, kept_prompts: int) -> None:
        rate = self.groups_mixed / max(self.groups_seen, 1)
        what = (
            f"dapo_filter: after {self.gen_batches} generation batch(es) only {kept_prompts} of {self.target} prompts "
            f"had responses that were not all {self.cfg.metric}-equal (pass rate {rate:.1%})"
        )
        if self.cfg.on_exhausted == "error":
            raise DynamicSamplingExhausted(
                f"{what}. Raise algorithm.selector.max_gen_batches, set algorithm.selector.on_exhausted: partial "
                f"to train on the kept groups, raise rollout.group_size, or use data closer to the model's level."
            )
        self._count_exhausted()
        log.warning(
            "%s; training on the partial batch (on_exhausted: partial, %d time(s) so far)", what, self.exhausted_total
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "inner": self.inner.state_dict(),
            "inner_name": self.inner_spec.name,
            "exhausted_total": self.exhausted_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("inner_name") != self.inner_spec.name:
            raise ValueError(
                f"{OWNER}: checkpoint wraps selector '{state.get('inner_name')}' but this run's "
                f"algorithm.selector.inner is '{self.inner_spec.name}'; resume with the same inner selector"
            )
        self.inner.load_state_dict(state["inner"])
        self.exhausted_total = int(state["exhausted_total"])

    def histograms(self) -> dict[str, Any]:
        return self.inner.histograms()
