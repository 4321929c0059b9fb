"""Metrics sinks: a JSONL file (the record benchmarks read), TensorBoard, and the console."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch


def group_diagnostics(rewards: torch.Tensor, prompt_index: torch.Tensor, accuracy: torch.Tensor) -> dict[str, float]:
    """ALGORITHMS.md diagnostics over local groups: effective gradient ratio and all-right/all-wrong shares.

    rewards, accuracy [N] (accuracy: the reward's accuracy term, 1 = correct); prompt_index [N] long.
    The effective gradient ratio is the share of groups whose rewards are not all equal. A group is
    all-correct when every answer is correct and all-wrong when none is, judged on accuracy: with a
    format term in the reward, wrong answers score 0.1 and an all-wrong group would never show
    under a reward == 0 test.
    """
    groups = torch.unique(prompt_index, return_inverse=True)[1]
    k = int(groups.max()) + 1

    def extremes(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lo = torch.full((k,), math.inf).scatter_reduce(0, groups, values.float(), "amin")
        hi = torch.full((k,), -math.inf).scatter_reduce(0, groups, values.float(), "amax")
        return lo, hi

    tol = 1e-6
    lo, hi = extremes(rewards)
    acc_lo, acc_hi = extremes(accuracy)
    return {
        "groups/effective_gradient_ratio": float(((hi - lo) > tol * max(float(hi.abs().max()), 1.0)).float().mean()),
        "groups/all_correct": float((acc_lo >= 1.0 - tol).float().mean()),
        "groups/all_wrong": float((acc_hi <= tol).float().mean()),
    }


def group_diagnostics_by_variant(rewards: torch.Tensor, prompt_index: torch.Tensor, accuracy: torch.Tensor,
                                 variants: list[str]) -> dict[str, float]:
    """group_diagnostics per prompt kind (variants[p] names prompt p's kind), when a batch mixes kinds.

    Keys groups/<kind>/{effective_gradient_ratio,all_correct,all_wrong}: which kinds of prompt
    (originals, hinted or perturbed variants, ...) carry the gradient signal. {} for one kind.
    """
    kinds = sorted(set(variants))
    if len(kinds) < 2:
        return {}
    row_kind = torch.tensor([kinds.index(v) for v in variants])[prompt_index]  # [N] index into kinds
    out = {}
    for i, kind in enumerate(kinds):
        rows = row_kind == i
        if not bool(rows.any()):
            continue
        for key, value in group_diagnostics(rewards[rows], prompt_index[rows], accuracy[rows]).items():
            out[key.replace("groups/", f"groups/{kind}/")] = value
    return out


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


class MetricsLogger:
    """Writes one JSON object per step to metrics.jsonl and scalars/histograms to TensorBoard."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None):
        self.path = run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        self._file = self.path.open("a")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step)

    def _truncate_after(self, step: int) -> None:
        # A resumed run rewrites the steps after its checkpoint, so the record has no duplicates.
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, step: int, metrics: dict[str, Any], histograms: dict[str, Any] | None = None) -> None:
        record = {"step": step, **{k: _plain(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            for key, values in (histograms or {}).items():
                values = np.asarray(values, dtype=np.float64)
                if values.size:
                    self._tb.add_histogram(key, values, step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
